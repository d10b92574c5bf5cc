"""Feature stores: keyed tables of numeric features that lookup feature groups read.

A table maps a string key (``"N14228"``, ``"EWR|2013-01-01T10:00:00Z"``) to a fixed-width
row of floats. ``lookup(table, keys)`` returns one row per key, in order, NaN where a
key is unknown (tree models take NaN as "missing").

- :class:`InMemoryStore`: in-process, a pandas hash index per table (the default);
- :class:`RedisStore`: a real remote store, one Redis hash per table, rows as packed
  float64 bytes, read with pipelined ``HMGET``; remote lookups are where cascades pay most;
- :class:`SlowSegment`: a wrapper for demos that makes lookups of some keys slow (a
  planted misbehaving segment). The real stores never inject latency.

Stores pickle without their connections (a Redis store reconnects on first use), so an
optimized pipeline whose feature code closes over a store can be saved and loaded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

#: keys per HMGET command (bounds the size of one request and reply)
REDIS_LOOKUP_CHUNK = 5_000
#: field/value pairs per HSET command when loading a table
REDIS_WRITE_CHUNK = 5_000
#: key prefix of the Redis tables written by this module
REDIS_PREFIX = "willump:fs"


@runtime_checkable
class FeatureStore(Protocol):
    """What lookup feature groups need from a store."""

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        """Store ``frame`` (index: string keys, columns: numeric features) as ``table``."""

    def columns(self, table: str) -> list[str]:
        """The feature names of ``table``, in lookup order."""

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        """Rows x width float64 array for ``keys`` (NaN for unknown keys)."""


def _as_keys(keys: Any) -> np.ndarray:
    if isinstance(keys, (pd.Series, pd.Index)):
        return keys.to_numpy(dtype=object, na_value="")
    arr = np.asarray(keys, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"keys must be one-dimensional, got shape {arr.shape}")
    return arr


def _validated_frame(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame for table {table!r} must be a DataFrame, got {type(frame).__name__}")
    if frame.index.has_duplicates:
        dup = frame.index[frame.index.duplicated()][:3].tolist()
        raise ValueError(f"table {table!r} has duplicate keys, e.g. {dup}")
    bad = [str(c) for c, t in frame.dtypes.items()
           if not (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))]
    if bad:
        raise ValueError(f"table {table!r} has non-numeric columns {bad}; encode them as numbers")
    out = frame.astype(np.float64)
    out.index = out.index.astype(str)
    return out


class InMemoryStore:
    """Tables held in process: a hash index over the keys and a float64 matrix per table."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[pd.Index, np.ndarray, list[str]]] = {}

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        frame = _validated_frame(table, frame)
        index = pd.Index(frame.index.to_numpy(dtype=object), dtype=object)
        self._tables[table] = (index, frame.to_numpy(), [str(c) for c in frame.columns])

    def _table(self, table: str) -> tuple[pd.Index, np.ndarray, list[str]]:
        try:
            return self._tables[table]
        except KeyError:
            raise KeyError(f"table {table!r} is not in the store; it has {sorted(self._tables)}") from None

    def columns(self, table: str) -> list[str]:
        return list(self._table(table)[2])

    def tables(self) -> list[str]:
        return sorted(self._tables)

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        index, values, _ = self._table(table)
        position = index.get_indexer(_as_keys(keys))
        out = values[position]  # position -1 picks the last row: overwrite those
        out[position < 0] = np.nan
        return out

    def __repr__(self) -> str:
        return f"InMemoryStore(tables={self.tables()})"


class RedisStore:
    """Tables in Redis: hash ``{prefix}:{table}`` maps key -> packed float64 row;
    ``{prefix}:{table}:columns`` holds the column names as JSON.

    ``url`` is a redis URL (``redis://127.0.0.1:6379/0``). Needs the ``redis`` client.
    """

    def __init__(self, url: str, prefix: str = REDIS_PREFIX, *, timeout_s: float = 10.0):
        self.url = url
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._client: Any = None
        self._columns: dict[str, list[str]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import redis
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "RedisStore needs the redis client: pip install 'redis>=5'"
                ) from exc
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
        return self._client

    def _key(self, table: str) -> str:
        return f"{self.prefix}:{table}"

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        frame = _validated_frame(table, frame)
        values = np.ascontiguousarray(frame.to_numpy(), dtype="<f8")
        keys = frame.index.tolist()
        name = self._key(table)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(name)
        for start in range(0, len(keys), REDIS_WRITE_CHUNK):
            chunk = {k: values[i].tobytes() for i, k in enumerate(keys[start:start + REDIS_WRITE_CHUNK], start)}
            pipe.hset(name, mapping=chunk)
        pipe.set(f"{name}:columns", json.dumps([str(c) for c in frame.columns]))
        pipe.execute()
        self._columns[table] = [str(c) for c in frame.columns]

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            raw = self.client.get(f"{self._key(table)}:columns")
            if raw is None:
                raise KeyError(f"table {table!r} is not in the Redis store at {self.url}")
            self._columns[table] = list(json.loads(raw))
        return list(self._columns[table])

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        width = len(self.columns(table))
        keys = _as_keys(keys)
        name = self._key(table)
        if len(keys) == 0:
            return np.zeros((0, width))
        missing = np.full(width, np.nan, dtype="<f8").tobytes()
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(keys), REDIS_LOOKUP_CHUNK):
            pipe.hmget(name, keys[start:start + REDIS_LOOKUP_CHUNK].tolist())
        replies = pipe.execute()
        raw = b"".join(v if v is not None else missing for reply in replies for v in reply)
        return np.frombuffer(raw, dtype="<f8").reshape(len(keys), width).copy()

    def drop(self, tables: Iterable[str]) -> None:
        """Delete tables (and their column lists) from Redis."""
        names = [n for t in tables for n in (self._key(t), f"{self._key(t)}:columns")]
        if names:
            self.client.delete(*names)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"


class SlowSegment:
    """A store wrapper that plants a slow segment: lookups in ``table`` that touch any of
    ``keys`` wait ``delay_s`` once per call (a round trip to a slow shard) plus
    ``per_key_s`` per slow key. For demos and tests of latency explanations only.

    ``match`` decides which keys are slow: ``"exact"`` (key in ``keys``) or ``"prefix"``
    (key starts with one of ``keys``, e.g. a destination in ``"SFO|..."``).
    """

    def __init__(
        self,
        store: FeatureStore,
        table: str,
        keys: Sequence[str],
        delay_s: float = 0.005,
        per_key_s: float = 0.0,
        match: str = "exact",
    ):
        if match not in ("exact", "prefix"):
            raise ValueError(f"match must be 'exact' or 'prefix', got {match!r}")
        if delay_s < 0 or per_key_s < 0:
            raise ValueError(f"delay_s and per_key_s must be >= 0, got {delay_s}, {per_key_s}")
        if isinstance(keys, str):
            raise TypeError("keys must be a collection of keys, not one string")
        self.store = store
        self.table = table
        self.keys = tuple(str(k) for k in keys)
        self.delay_s = float(delay_s)
        self.per_key_s = float(per_key_s)
        self.match = match
        self.slow_calls = 0

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        self.store.put_table(table, frame)

    def columns(self, table: str) -> list[str]:
        return self.store.columns(table)

    def slow_mask(self, keys: Any) -> np.ndarray:
        """Which of ``keys`` fall in the slow segment."""
        arr = _as_keys(keys)
        if self.match == "exact":
            return np.isin(arr, np.asarray(self.keys, dtype=object))
        return np.array([str(k).startswith(self.keys) for k in arr], dtype=bool)

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        out = self.store.lookup(table, keys)
        if table == self.table:
            slow = int(self.slow_mask(keys).sum())
            if slow:
                self.slow_calls += 1
                time.sleep(self.delay_s + self.per_key_s * slow)
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "store":  # during unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.store, name)

    def __repr__(self) -> str:
        return (f"SlowSegment({self.store!r}, table={self.table!r}, keys={list(self.keys)}, "
                f"delay_s={self.delay_s}, per_key_s={self.per_key_s})")
