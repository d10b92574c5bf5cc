"""A bounded cache of feature rows for lookup-style groups (Willump cached remote lookups).

A group declared with ``@willump.feature(cache=N)`` whose output row depends on its input row
alone (checked at capture: row-wise and deterministic) keeps up to N rows, least recently used
first out, keyed by the row's values in ``cache_key`` (the lookup's key columns, which the
user names) or, by default, in every input column: a column missing from the key could make two
rows share a cached value they should not (a value absent from every sample capture sees). A batch then pays the group's
work only for the keys it has not seen (each distinct key once); a one-row call that hits pays
nothing. ``cache_ttl`` bounds how long a row is trusted (a store that changes); refitting the
pipeline's feature state clears every cache. Only the optimized pipeline's serving path uses
it: profiling and the baseline never do, so measured costs and the comparison stay honest.

Rows live in one preallocated matrix; a lookup is a dict probe per row and one gather, so a
warm batch costs well under a microsecond a row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np


class RowCache:
    """Least-recently-used rows with an optional time to live; thread-safe."""

    def __init__(self, size: int, ttl: float | None = None):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"cache must be a positive number of rows, got {size!r}")
        if ttl is not None and not ttl > 0:
            raise ValueError(f"cache_ttl must be positive seconds or None, got {ttl!r}")
        self.size = size
        self.ttl = ttl
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self._lock:
            #: bumped by every clear: rows computed before it are not stored after it
            self.generation = getattr(self, "generation", 0) + 1
            self._slot: dict[Hashable, int] = {}
            self._keys: list[Hashable] = []
            self._values: np.ndarray | None = None
            self._used = np.zeros(0, dtype=np.int64)
            self._born = np.zeros(0)
            self._tick = 0
            self.hits = 0
            self.misses = 0

    def lookup(self, keys: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray | None]:
        """(hit mask, the hit rows in order) for ``keys``; expired rows count as misses."""
        with self._lock:
            slots = np.fromiter((self._slot.get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
            hit = slots >= 0
            if self.ttl is not None and hit.any():
                hit[hit] = time.monotonic() - self._born[slots[hit]] <= self.ttl
            found = int(hit.sum())
            if not found:
                return hit, None
            self._tick += 1
            self._used[slots[hit]] = self._tick
            return hit, self._values[slots[hit]]

    def record(self, served: int, computed: int) -> None:
        """Count a call: ``served`` rows answered, ``computed`` of them by the group itself
        (the rest came from the cache or from an earlier row of the same batch)."""
        with self._lock:
            self.hits += served - computed
            self.misses += computed

    def store(self, keys: Sequence[Hashable], rows: np.ndarray, generation: int | None = None) -> None:
        """Keep ``rows`` (one per distinct key), evicting the least recently used; rows
        computed under an older ``generation`` (the state was refitted since) are dropped."""
        rows = rows[-self.size:]
        keys = list(keys)[-self.size:]
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            if self._values is None or self._values.shape[1] != rows.shape[1]:
                self._values = np.empty((self.size, rows.shape[1]), dtype=np.float64)
                self._used = np.zeros(self.size, dtype=np.int64)
                self._born = np.zeros(self.size)
                self._slot, self._keys = {}, []
            self._tick += 1
            now = time.monotonic()
            for key, row in zip(keys, rows, strict=True):
                slot = self._slot.get(key)
                if slot is None:
                    slot = self._free_slot()
                    self._slot[key] = slot
                    self._keys[slot] = key
                self._values[slot] = row
                self._used[slot] = self._tick
                self._born[slot] = now

    def _free_slot(self) -> int:
        if len(self._keys) < self.size:
            self._keys.append(None)
            return len(self._keys) - 1
        slot = int(np.argmin(self._used))
        del self._slot[self._keys[slot]]
        return slot

    def __len__(self) -> int:
        return len(self._slot)

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size, "ttl": self.ttl}  # rows and lock stay in this process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"], state.get("ttl"))


class _Missing:
    """The key of a missing value (NaN, None): equal to itself, unlike NaN."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def row_keys(frame: Any, columns: Sequence[Any]) -> list[Hashable]:
    """One hashable key per row: the values of ``columns``, missing values as MISSING."""
    if not len(columns):
        return [()] * len(frame)
    values = []
    for c in columns:
        column = frame[c]
        if column.isna().any():
            column = column.astype(object).where(column.notna(), MISSING)
        values.append(column.tolist())
    return list(zip(*values, strict=True))
