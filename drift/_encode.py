"""Dictionary encoding of categorical columns into stable integer codes.

Why: every count, sketch and combination search downstream works on small integers with numpy;
strings are hashed once per batch here (pandas' hash table via `Index.get_indexer`, about
15 ns a value) and never again. Codes are append-only for the monitor's lifetime, so panes,
references and the database agree on them.
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


class Encoder:
    """Value <-> code map of one categorical column; append-only, bounded by `max_codes`."""

    def __init__(self, column: str, max_codes: int = DEFAULT_MAX_CODES) -> None:
        self.column = column
        self.max_codes = int(max_codes)
        self.values: list[object] = []
        self._lookup: dict[object, int] = {}
        self._index = pd.Index([], dtype=object)
        self._index_codes = np.zeros(0, dtype=np.int32)
        self._missing_code: int | None = None
        self._other_code: int | None = None
        self.overflow = 0  # values mapped to OTHER because the encoder was full
        self.persisted = 0  # how many codes the store already holds

    def __len__(self) -> int:
        return len(self.values)

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
        elif value is OTHER:
            self._other_code = code
        return code

    def _rebuild_index(self) -> None:
        keys = [np.nan if v is MISSING else v for v in self.values if v is not OTHER]
        self._index = pd.Index(keys) if keys else pd.Index([], dtype=object)
        # positions in the index skip OTHER; map index position -> code
        self._index_codes = np.array(
            [c for c, v in enumerate(self.values) if v is not OTHER], dtype=np.int32
        )

    def extend(self, values: list[object]) -> None:
        """Add values in order (used when restoring from the store)."""
        for v in values:
            self._add(v)
        self._rebuild_index()

    def encode(self, series: pd.Series) -> np.ndarray:
        """Codes (int32) for a column; unseen values get new codes."""
        if isinstance(series.dtype, pd.CategoricalDtype):
            cats = series.cat.categories
            cat_codes = self.encode(pd.Series(cats, dtype=object)) if len(cats) else np.zeros(
                0, dtype=np.int32
            )
            raw = series.cat.codes.to_numpy()
            if (raw < 0).any():
                missing = self._missing_code
                if missing is None:
                    missing = self._admit([MISSING])[0]
                    self._rebuild_index()
                lookup = np.append(cat_codes, np.int32(missing))
            else:
                lookup = cat_codes
            return lookup[raw].astype(np.int32, copy=False)
        if not len(self.values):
            first = self._encode_first(series)
            if first is not None:
                return first
            pos = np.full(len(series), -1, dtype=np.intp)
        else:
            pos = self._index.get_indexer(series)
        unknown = pos < 0
        if unknown.any():
            raw = series.to_numpy(dtype=object)[unknown]
            fresh: list[object] = []
            seen: set = set()
            for v in pd.unique(raw):
                nv = normalize_value(v, self.column)
                if nv not in self._lookup and nv not in seen:
                    seen.add(nv)
                    fresh.append(nv)
            if fresh:
                self._admit(fresh)
                self._rebuild_index()
            codes = np.empty(len(series), dtype=np.int32)
            known = ~unknown
            codes[known] = self._index_codes[pos[known]]
            # the fresh values are in the index now; only values it cannot match (None next to
            # NaN, 1.0 next to 1, overflow) still need a Python lookup
            again = self._index.get_indexer(raw) if len(self._index) else np.full(raw.size, -1)
            sub = np.where(again >= 0, self._index_codes[np.maximum(again, 0)], -1)
            still = np.flatnonzero(again < 0)
            for i in still:
                sub[i] = self._code_or_other(normalize_value(raw[i], self.column))
            codes[unknown] = sub
            return codes
        return self._index_codes[pos]

    def _encode_first(self, series: pd.Series) -> np.ndarray | None:
        """One factorize pass for an empty encoder (whole tables); None if values collide."""
        local, uniques = pd.factorize(series, use_na_sentinel=True)
        values = [normalize_value(v, self.column) for v in uniques]
        if len(set(values)) != len(values) or MISSING in values:
            return None
        if len(values) + 1 >= self.max_codes:
            return None  # the slow path handles overflow
        codes = np.asarray([self._add(v) for v in values], dtype=np.int32)
        if (local < 0).any():
            codes = np.append(codes, np.int32(self._add(MISSING)))
        self._rebuild_index()
        return codes[local] if codes.size else np.zeros(len(series), dtype=np.int32)

    def _code_or_other(self, value: object) -> int:
        code = self._lookup.get(value)
        if code is None:
            self.overflow += 1
            code = self._other_code
            assert code is not None
        return code

    def _admit(self, fresh: list[object]) -> list[int]:
        out = []
        for v in fresh:
            if len(self.values) >= self.max_codes - 1 and v is not MISSING:
                if self._other_code is None:
                    self._add(OTHER)
                out.append(self._other_code)
                continue
            out.append(self._add(v))
        return out
