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

Text that cannot hurt: a value is stored, labelled and written to SQLite as given, so a string
holding a lone UTF-16 surrogate (valid JSON, no UTF-8 encoder takes it) would fail every later
commit, and one 1 MB id would stay in memory forever. Before a string value gets a code its
surrogates become U+FFFD and it is cut to `max_value_length` characters (the last one
`TRUNCATION_MARKER`); both are counted per column (rows; for a pandas Categorical column,
categories). Only values the hash table does not know are looked at (two C-level passes, about
80 ns a value), so known values pay nothing.
"""

from __future__ import annotations

import math
import re
import sys
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
#: Default longest categorical string value kept, in characters: enough for any label, model
#: version or client name; longer values (payloads, stack traces) are cut so that one value
#: cannot hold kilobytes in the encoder, the database and every answer that shows it.
DEFAULT_MAX_VALUE_LENGTH = 256
#: Last character of a value cut to `max_value_length` (so a cut value never equals a real one
#: of that length that happens to share its prefix, unless that one ends in the marker too).
TRUNCATION_MARKER = "\u2026"
#: Stands in for each lone surrogate (U+D800-U+DFFF) of a value: the Unicode replacement
#: character, as a UTF-8 decoder with errors="replace" would show it.
REPLACEMENT_CHARACTER = "\ufffd"
#: Any lone UTF-16 surrogate (a Python str cannot hold a valid pair: that is one code point).
_SURROGATE = re.compile("[\ud800-\udfff]")
#: clean_text flags: which repairs a value needed
INVALID_UNICODE = 1
TRUNCATED = 2


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


def clean_text(text: str, max_length: int = DEFAULT_MAX_VALUE_LENGTH) -> tuple[str, int]:
    """`text` as the monitor keeps it, with the repairs it needed (`INVALID_UNICODE` |
    `TRUNCATED`, 0 for none; then `text` itself is returned)."""
    flags = 0
    if not text.isascii() and _SURROGATE.search(text) is not None:
        text = _SURROGATE.sub(REPLACEMENT_CHARACTER, text)
        flags |= INVALID_UNICODE
    if len(text) > max_length:
        text = text[: max_length - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER
        flags |= TRUNCATED
    return text, flags


def normalize_value(value: object, column: str,
                    max_length: int = DEFAULT_MAX_VALUE_LENGTH) -> object:
    """A hashable plain-Python value for one categorical entry, or MISSING (text cleaned by
    `clean_text`)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return clean_text(str(value), max_length)[0]
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
    # intervals from pd.cut, dates, enums: shown by their text
    return clean_text(str(value), max_length)[0]


try:  # pandas' object hash table, the engine behind Index.get_indexer, updatable in place
    from pandas._libs.hashtable import PyObjectHashTable as _HashTable
except ImportError:  # pragma: no cover - a pandas without it: the public Index path
    _HashTable = None


#: Leading values sampled to decide whether a column comes in runs of equal values.
RUN_SAMPLE = 256
#: Share of equal neighbours in that sample above which lookups go by run (one per run).
RUN_SHARE = 0.5


def run_starts(arr: np.ndarray) -> np.ndarray | None:
    """Start of each run of equal neighbours, when the column mostly comes in runs.

    Serving writes one record per row, and a request's rows share its client, replica,
    version and id (the same object, np.full): hashing one value per run instead of per row
    is what keeps those columns cheap. None when runs are rare (a sample of the first
    RUN_SAMPLE values says so; comparing every neighbour would then only cost)."""
    n = arr.size
    if n < 4:
        return None
    k = min(n, RUN_SAMPLE)
    if np.count_nonzero(arr[1:k] == arr[: k - 1]) < RUN_SHARE * (k - 1):
        return None
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(arr[1:], arr[:-1], out=change[1:])
    return np.flatnonzero(change)


def expand_runs(values: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """Per-run values repeated over their runs (the inverse of taking run starts)."""
    return np.repeat(values, np.diff(np.append(starts, n)))


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
        starts = run_starts(arr)
        if starts is not None:
            return expand_runs(self._lookup(arr[starts]), starts, arr.size)
        return self._lookup(arr)

    def _lookup(self, arr: np.ndarray) -> np.ndarray:
        if self._table is not None:
            return self._table.lookup(arr).astype(np.int32, copy=False)
        if self._index is None:
            self._index = pd.Index(self._keys, dtype=object)
            self._index_codes = np.append(np.asarray(self._codes, dtype=np.int32), -1)
        return self._index_codes[self._index.get_indexer(arr)]

    def nbytes(self) -> int:
        """Bytes of the table itself (the keys are the encoder's values, counted there)."""
        if self._table is not None:
            return int(self._table.sizeof())
        index = 0 if self._index is None else int(self._index.memory_usage(deep=False))
        return (sys.getsizeof(self._keys) + sys.getsizeof(self._codes) + index
                + self._index_codes.nbytes)


#: Not-yet-admitted rows looked at per batch once admission is by frequency.
CANDIDATE_SAMPLE = 1024
#: Candidate values tracked (Misra-Gries) once admission is by frequency.
CANDIDATES = 4096
#: Sampled sightings a candidate needs before it gets a code.
ADMIT_COUNT = 20


class Encoder:
    """Value <-> code map of one categorical column; append-only, bounded by `max_codes`."""

    def __init__(self, column: str, max_codes: int = DEFAULT_MAX_CODES,
                 max_value_length: int = DEFAULT_MAX_VALUE_LENGTH) -> None:
        self.column = column
        self.max_codes = int(max_codes)
        self.max_value_length = int(max_value_length)
        self.values: list[object] = []
        self._lookup: dict[object, int] = {}
        self._hash = _Lookup()  # vectorized value -> code
        self._missing_code: int | None = None
        self._other_code: int | None = None
        self._candidates: dict[object, int] = {}
        self.overflow = 0  # rows mapped to OTHER because their value has no code
        self.invalid_unicode = 0  # rows whose value held lone surrogates (now U+FFFD)
        self.truncated = 0  # rows whose value was cut to max_value_length
        self._value_bytes = 0  # sys.getsizeof of every value held (kept as codes are added)
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
        return self._lookup.get(normalize_value(value, self.column, self.max_value_length))

    def nbytes(self) -> int:
        """Bytes this encoder keeps alive: its values (a 2 KB string is 2 KB, not a pointer),
        the list, dict and hash table that index them, and the admission candidates."""
        cand = self._candidates
        return (self._value_bytes + sys.getsizeof(self.values) + sys.getsizeof(self._lookup)
                + self._hash.nbytes() + sys.getsizeof(cand)
                + sum(sys.getsizeof(v) for v in cand))

    def _add(self, value: object) -> int:
        code = len(self.values)
        self.values.append(value)
        if value is not MISSING and value is not OTHER:  # the sentinels are shared
            self._value_bytes += sys.getsizeof(value)
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

    def _stored_forms(self, uniques: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The forms `uniques` are kept as (`clean_text`, `normalize_value`) and the repairs
        each needed; None when every value is kept as given (the usual case, checked without a
        Python step per value when all are str)."""
        objs = uniques.tolist()
        try:
            lengths = np.fromiter(map(len, objs), dtype=np.int64, count=len(objs))
            ascii_ = np.fromiter(map(str.isascii, objs), dtype=bool, count=len(objs))
        except TypeError:  # not all str: look at each
            suspects = range(len(objs))
        else:
            suspects = np.flatnonzero((lengths > self.max_value_length) | ~ascii_).tolist()
        forms: np.ndarray | None = None
        flags = np.zeros(len(objs), dtype=np.int8)
        for i in suspects:
            v = objs[i]
            if isinstance(v, str):
                new, flags[i] = clean_text(v, self.max_value_length)
                if not flags[i]:
                    continue
            elif isinstance(v, (Real, bool, np.bool_)):
                continue  # numbers and bools match their normalized form in the hash table
            else:  # dates, intervals, enums: kept by their text
                new = normalize_value(v, self.column, self.max_value_length)
            if forms is None:
                forms = np.array(objs, dtype=object)
            forms[i] = new
        return None if forms is None else (forms, flags)

    def _codes_for(self, uniques: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Codes for values the indexes did not match (mostly new values, or values kept in
        another form: cut or repaired text, dates kept as text)."""
        stored = self._stored_forms(uniques)
        if stored is None:
            return self._codes_for_kept(uniques, local)
        forms, flags = stored
        if flags.any():
            rows = np.bincount(local, minlength=uniques.size)
            self.invalid_unicode += int(rows[(flags & INVALID_UNICODE) != 0].sum())
            self.truncated += int(rows[(flags & TRUNCATED) != 0].sum())
        slot, kept = pd.factorize(forms)  # several values may share one kept form
        kept = np.asarray(kept, dtype=object)
        codes = self._find(kept)
        todo = np.flatnonzero(codes < 0)
        if todo.size:
            pos = np.full(kept.size, -1, dtype=np.int64)
            pos[todo] = np.arange(todo.size)
            rows_local = pos[slot[local]]
            codes[todo] = self._codes_for_kept(kept[todo], rows_local[rows_local >= 0])
        return codes[slot]

    def _codes_for_kept(self, uniques: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Codes for unmatched values already in the form they are kept in."""
        out = np.full(uniques.size, -1, dtype=np.int32)
        added = False
        if self.free:
            # first sight admission: a Python step per new distinct value, while codes are free
            for i, v in enumerate(uniques.tolist()):
                nv = normalize_value(v, self.column, self.max_value_length)
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
            nv = normalize_value(v, self.column, self.max_value_length)
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
        uniques = np.asarray(uniques, dtype=object)
        if self._stored_forms(uniques) is not None:
            return None  # the general path repairs and counts them
        values = [normalize_value(v, self.column, self.max_value_length) for v in uniques]
        if len(set(values)) != len(values) or MISSING in values:
            return None
        codes = np.asarray([self._add(v) for v in values], dtype=np.int32)
        if (local < 0).any():
            codes = np.append(codes, np.int32(self._add(MISSING)))
        return codes[local] if codes.size else np.zeros(len(series), dtype=np.int32)
