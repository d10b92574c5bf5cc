"""Dictionary encoding of categorical columns into stable integer codes.

Why: every count, sketch and combination search downstream works on small integers with numpy;
strings are hashed once per batch here (pandas' hash table via `Index.get_indexer`, about
15 ns a value) and never again. Codes are append-only for the monitor's lifetime, so panes,
references and the database agree on them.

Admission (a column may hold at most `max_codes` distinct values ever): the first half of the
codes go to values as they first appear; after that a value gets a code only once it has been
seen `ADMIT_COUNT` times in a bounded sample of not-yet-admitted rows (a Misra-Gries table of
about `CANDIDATES` entries, whose counts never overstate), so a heavy client that appears late still gets its own code while a
stream of one-off ids (request ids, timestamps as text) cannot use up the rest. Rows of values
without a code map to `<other>`, vectorized: after saturation no row is looked at in Python.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import pandas as pd

from drift._errors import SchemaError

#: Label shown for a missing (None/NaN) categorical value.
MISSING_LABEL = "<missing>"
#: Label shown for values that arrived after an encoder reached its capacity.
OTHER_LABEL = "<other>"
#: Default most distinct values one categorical column may ever hold.
DEFAULT_MAX_CODES = 100_000


class _Missing:
    """Sentinel for a missing categorical value (distinct from any real value)."""

    def __repr__(self) -> str:
        return MISSING_LABEL


class _Other:
    """Sentinel for values beyond an encoder's capacity."""

    def __repr__(self) -> str:
        return OTHER_LABEL


MISSING = _Missing()
OTHER = _Other()


def normalize_value(value: object, column: str) -> object:
    """A hashable plain-Python value for one categorical entry, or MISSING."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        f = float(value)
        if math.isnan(f):
            return MISSING
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    try:
        hash(value)
    except TypeError as exc:
        raise SchemaError(
            f"column {column!r} holds an unhashable value of type {type(value).__name__} "
            f"({value!r}); categorical values must be str, int, float or bool"
        ) from exc
    return str(value)  # intervals from pd.cut, dates, enums: shown by their text


try:  # pandas' object hash table, the engine behind Index.get_indexer, updatable in place
    from pandas._libs.hashtable import PyObjectHashTable as _HashTable
except ImportError:  # pragma: no cover - a pandas without it: the public Index path
    _HashTable = None


class _Lookup:
    """value -> code for a column, updated in place as codes are added.

    Uses pandas' PyObjectHashTable directly (2-3x faster than Index.get_indexer on 2-10k
    values, and no index rebuild per admission); falls back to a pandas Index."""

    def __init__(self) -> None:
        self._table = _HashTable() if _HashTable is not None else None
        self._keys: list[object] = []
        self._codes: list[int] = []
        self._index: pd.Index | None = None
        self._index_codes = np.zeros(0, dtype=np.int32)

    def add(self, key: object, code: int) -> None:
        if self._table is not None:
            self._table.set_item(key, code)
        else:
            self._keys.append(key)
            self._codes.append(code)
            self._index = None

    def find(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Codes of known values, -1 elsewhere (int32)."""
        arr = values.to_numpy(dtype=object) if isinstance(values, pd.Series) else np.asarray(
            values, dtype=object)
        if self._table is not None:
            return self._table.lookup(arr).astype(np.int32, copy=False)
        if self._index is None:
            self._index = pd.Index(self._keys, dtype=object)
            self._index_codes = np.append(np.asarray(self._codes, dtype=np.int32), -1)
        return self._index_codes[self._index.get_indexer(arr)]


#: Not-yet-admitted rows looked at per batch once admission is by frequency.
CANDIDATE_SAMPLE = 1024
#: Candidate values tracked (Misra-Gries) once admission is by frequency.
CANDIDATES = 4096
#: Sampled sightings a candidate needs before it gets a code.
ADMIT_COUNT = 20


class Encoder:
    """Value <-> code map of one categorical column; append-only, bounded by `max_codes`."""

    def __init__(self, column: str, max_codes: int = DEFAULT_MAX_CODES) -> None:
        self.column = column
        self.max_codes = int(max_codes)
        self.values: list[object] = []
        self._lookup: dict[object, int] = {}
        self._hash = _Lookup()  # vectorized value -> code
        self._missing_code: int | None = None
        self._other_code: int | None = None
        self._candidates: dict[object, int] = {}
        self.overflow = 0  # rows mapped to OTHER because their value has no code
        self.persisted = 0  # how many codes the store already holds

    def __len__(self) -> int:
        return len(self.values)

    @property
    def free(self) -> int:
        """Codes still given to values on first sight (then admission is by frequency)."""
        return max(self.max_codes // 2 - len(self.values), 0)

    @property
    def room(self) -> int:
        """Codes left at all (one is kept for `<other>`)."""
        return max(self.max_codes - 1 - len(self.values), 0)

    def label(self, code: int) -> object:
        value = self.values[code]
        if value is MISSING:
            return MISSING_LABEL
        if value is OTHER:
            return OTHER_LABEL
        return value

    def code_of(self, value: object) -> int | None:
        """Code of an existing value (None when never seen)."""
        return self._lookup.get(normalize_value(value, self.column))

    def _add(self, value: object) -> int:
        code = len(self.values)
        self.values.append(value)
        self._lookup[value] = code
        if value is MISSING:
            self._missing_code = code
            self._hash.add(np.nan, code)
        elif value is OTHER:
            self._other_code = code
        else:
            self._hash.add(value, code)
        return code

    def _find(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Codes of known values (-1 for unknown)."""
        return self._hash.find(values)

    def extend(self, values: list[object]) -> None:
        """Add values in order (used when restoring from the store)."""
        for v in values:
            self._add(v)

    def encode(self, series: pd.Series) -> np.ndarray:
        """Codes (int32) for a column; unseen values get new codes or `<other>`."""
        if isinstance(series.dtype, pd.CategoricalDtype):
            cats = series.cat.categories
            cat_codes = self.encode(pd.Series(cats, dtype=object)) if len(cats) else np.zeros(
                0, dtype=np.int32)
            raw = series.cat.codes.to_numpy()
            if (raw < 0).any():
                lookup = np.append(cat_codes, np.int32(self._missing()))
            else:
                lookup = cat_codes
            return lookup[raw].astype(np.int32, copy=False)
        if not self.values:
            first = self._encode_first(series)
            if first is not None:
                return first
        codes = self._find(series)
        unknown = np.flatnonzero(codes < 0)
        if unknown.size == 0:
            return codes
        raw = series.to_numpy(dtype=object)[unknown]
        na = pd.isna(raw)
        if na.any():
            codes[unknown[na]] = self._missing()
            unknown, raw = unknown[~na], raw[~na]
        if unknown.size:
            local, uniques = pd.factorize(raw)
            codes[unknown] = self._codes_for(np.asarray(uniques, dtype=object), local)[local]
        return codes

    def _missing(self) -> int:
        if self._missing_code is None:
            self._add(MISSING)
        assert self._missing_code is not None
        return self._missing_code

    def _other(self) -> int:
        if self._other_code is None:
            self._add(OTHER)
        assert self._other_code is not None
        return self._other_code

    def _codes_for(self, uniques: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Codes for values the indexes did not match (mostly new values)."""
        out = np.full(uniques.size, -1, dtype=np.int32)
        added = False
        if self.free:
            # first sight admission: a Python step per new distinct value, while codes are free
            for i, v in enumerate(uniques.tolist()):
                nv = normalize_value(v, self.column)
                code = self._lookup.get(nv)
                if code is None and self.free:
                    code = self._add(nv)
                    added = True
                if code is not None:
                    out[i] = code
        else:
            added = self._admit_frequent(uniques, local)
        rest = np.flatnonzero(out < 0)
        if rest.size:
            again = self._find(uniques[rest]) if added else np.full(rest.size, -1, np.int32)
            missing = again < 0
            if missing.any():
                other = self._other()
                again[missing] = other
                self.overflow += int(np.bincount(local, minlength=uniques.size)[rest[missing]]
                                     .sum())
            out[rest] = again
        return out

    def _admit_frequent(self, uniques: np.ndarray, local: np.ndarray) -> bool:
        """Count a strided sample of not-yet-admitted rows in a Misra-Gries table (counts are
        lower bounds, so a value admitted was truly seen that often); admit the frequent."""
        if not self.room:
            return False
        step = max(1, local.size // CANDIDATE_SAMPLE)
        sampled = np.bincount(local[::step], minlength=uniques.size)
        hot = np.flatnonzero(sampled)
        cand = self._candidates
        ready = []
        for v, count in zip(uniques[hot].tolist(), sampled[hot].tolist(), strict=True):
            total = cand.get(v, 0) + count
            cand[v] = total
            if total >= ADMIT_COUNT:
                ready.append(v)
        if len(cand) > 2 * CANDIDATES:  # amortized Misra-Gries decrement
            keys = list(cand)
            counts = np.fromiter(cand.values(), dtype=np.int64, count=len(keys))
            kth = int(np.partition(counts, counts.size - CANDIDATES - 1)[
                counts.size - CANDIDATES - 1])
            self._candidates = cand = {k: int(c) - kth for k, c in zip(keys, counts.tolist(),
                                                                       strict=True) if c > kth}
        added = False
        for v in ready:
            cand.pop(v, None)
            nv = normalize_value(v, self.column)
            if nv not in self._lookup and self.room:
                self._add(nv)
                added = True
        return added

    def _encode_first(self, series: pd.Series) -> np.ndarray | None:
        """One factorize pass for an empty encoder (whole tables); None if values collide."""
        values_in = series
        if isinstance(series.dtype, pd.StringDtype):
            # hashing the str objects directly is twice as fast as the string array's path
            values_in = series.to_numpy(dtype=object)  # a view; pd.NA factorizes as missing
        local, uniques = pd.factorize(values_in, use_na_sentinel=True)
        if len(uniques) + 1 >= self.max_codes // 2:
            return None  # the general path applies the admission rules
        values = [normalize_value(v, self.column) for v in uniques]
        if len(set(values)) != len(values) or MISSING in values:
            return None
        codes = np.asarray([self._add(v) for v in values], dtype=np.int32)
        if (local < 0).any():
            codes = np.append(codes, np.int32(self._add(MISSING)))
        return codes[local] if codes.size else np.zeros(len(series), dtype=np.int32)
