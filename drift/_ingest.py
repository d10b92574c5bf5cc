"""Turn an incoming batch (DataFrame, Arrow table, list of dicts, dict of columns) into arrays.

Why one place: every entry point (ingest, set_reference, explain on a frame) validates the same
way and fails with an exception that names the column, before any state is touched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from drift._encode import Encoder, expand_runs, run_starts
from drift._errors import SchemaError

#: Numeric timestamps above this are taken for milliseconds by mistake (year 5138 in seconds).
MAX_EPOCH_SECONDS = 1e11


@dataclass(frozen=True)
class Schema:
    """Column roles: categorical columns are attributes then categorical features."""

    attributes: tuple[str, ...]
    cat_features: tuple[str, ...]
    metrics: tuple[str, ...]
    num_features: tuple[str, ...]
    timestamp: str = "timestamp"
    #: column holding the request id of each row (rows of a request share it), if any
    request: str | None = None

    @property
    def cat_columns(self) -> tuple[str, ...]:
        return self.attributes + self.cat_features

    @property
    def num_columns(self) -> tuple[str, ...]:
        return self.metrics + self.num_features

    @property
    def required(self) -> tuple[str, ...]:
        return self.cat_columns + self.num_columns


@dataclass
class Parsed:
    """A validated batch: row count, event times (epoch seconds) and encoded columns."""

    n: int
    ts: np.ndarray  # float64 seconds
    cat: np.ndarray  # int32 (n_cat, n)
    num: np.ndarray  # float64 (n_num, n)
    stamped: bool = False  # no timestamp column: times are the monitor's own ingest time
    #: 64-bit hash of each row's request id (None: no request column); rows whose id is
    #: missing get distinct keys
    request: np.ndarray | None = None

    def take(self, keep: np.ndarray) -> Parsed:
        """The rows where `keep` (a mask) holds."""
        return Parsed(n=int(np.count_nonzero(keep)), ts=self.ts[keep], cat=self.cat[:, keep],
                      num=self.num[:, keep],
                      request=None if self.request is None else self.request[keep],
                      stamped=self.stamped)


def _is_arrow(obj: object) -> bool:
    return type(obj).__module__.split(".")[0] == "pyarrow" and hasattr(obj, "to_pandas")


def to_frame(batch: object, argument: str = "batch") -> pd.DataFrame:
    """A DataFrame view of any accepted batch type; TypeError naming `argument` otherwise."""
    if isinstance(batch, pd.DataFrame):
        frame = batch
    elif _is_arrow(batch):
        frame = batch.to_pandas()  # type: ignore[attr-defined]
    elif isinstance(batch, Mapping):
        try:
            frame = pd.DataFrame(dict(batch))
        except ValueError as exc:
            raise SchemaError(f"{argument}: columns could not form a table ({exc})") from exc
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        bad = next((i for i, r in enumerate(batch) if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise TypeError(
                f"{argument} is a list, so every element must be a dict of column -> value; "
                f"element {bad} is {type(batch[bad]).__name__}"
            )
        frame = pd.DataFrame.from_records(list(batch)) if len(batch) else pd.DataFrame()
    else:
        raise TypeError(
            f"{argument} must be a pandas DataFrame, a pyarrow Table, a list of dicts or a dict "
            f"of columns, not {type(batch).__name__}"
        )
    if frame.columns.has_duplicates:
        dup = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
        raise SchemaError(f"{argument} has duplicate column name(s) {dup}")
    return frame


def numeric_column(series: pd.Series, column: str) -> np.ndarray:
    """float64 values of a numeric column (NaN for missing); SchemaError naming it otherwise."""
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype):
        return series.to_numpy(dtype=np.float64, na_value=np.nan)
    if pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype):
        raise SchemaError(f"column {column!r} must be numeric, got {dtype}")
    try:
        return pd.to_numeric(series, errors="raise").to_numpy(dtype=np.float64, na_value=np.nan)
    except (ValueError, TypeError) as exc:
        values = series.to_numpy(dtype=object)
        bad = next(
            (v for v in values if v is not None and pd.notna(v) and not _is_number(v)), None
        )
        raise SchemaError(
            f"column {column!r} must be numeric; found {bad!r} ({type(bad).__name__})"
        ) from exc


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def timestamps(frame: pd.DataFrame, column: str, now: float | None) -> np.ndarray:
    """Event times in epoch seconds; ingest time for every row when the column is absent."""
    n = len(frame)
    if column not in frame.columns:
        return np.full(n, time.time() if now is None else now, dtype=np.float64)
    series = frame[column]
    dtype = series.dtype
    if pd.api.types.is_datetime64_any_dtype(dtype):
        if getattr(dtype, "tz", None) is not None:
            series = series.dt.tz_convert("UTC").dt.tz_localize(None)
        values = series.to_numpy(dtype="datetime64[ns]")
        if np.isnat(values).any():
            raise SchemaError(
                f"column {column!r} has {int(np.isnat(values).sum())} missing timestamp(s)"
            )
        return values.view(np.int64) * 1e-9
    if pd.api.types.is_bool_dtype(dtype):
        raise SchemaError(f"column {column!r} must hold datetimes or epoch seconds, got bool")
    if pd.api.types.is_numeric_dtype(dtype):
        out = series.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        try:
            parsed = pd.to_datetime(series, utc=True, format="mixed")
        except (ValueError, TypeError) as exc:
            raise SchemaError(
                f"column {column!r} must hold datetimes or epoch seconds; could not parse "
                f"({exc})"
            ) from exc
        return timestamps(pd.DataFrame({column: parsed}), column, now)
    bad = ~np.isfinite(out)
    if bad.any():
        raise SchemaError(f"column {column!r} has {int(bad.sum())} missing or non-finite value(s)")
    if n and float(np.abs(out).max()) > MAX_EPOCH_SECONDS:
        raise SchemaError(
            f"column {column!r} holds numbers up to {float(np.abs(out).max()):.0f}, which look "
            "like epoch milliseconds; pass epoch seconds or datetimes"
        )
    return out


def parse(
    frame: pd.DataFrame,
    schema: Schema,
    encoders: Sequence[Encoder],
    now: float | None = None,
    argument: str = "batch",
) -> Parsed:
    """Validate and encode one batch; state is untouched when this raises."""
    missing = [c for c in schema.required if c not in frame.columns]
    if missing:
        raise SchemaError(
            f"{argument} is missing column(s) {missing}; expected attributes "
            f"{list(schema.cat_columns)} and numeric columns {list(schema.num_columns)}"
        )
    n = len(frame)
    ts = timestamps(frame, schema.timestamp, now)
    num = np.empty((len(schema.num_columns), n), dtype=np.float64)
    for i, col in enumerate(schema.num_columns):
        num[i] = numeric_column(frame[col], col)
    # encoding last: a failure here can at most leave unused codes behind, never counts
    cat = np.empty((len(schema.cat_columns), n), dtype=np.int32)
    for i, (col, enc) in enumerate(zip(schema.cat_columns, encoders, strict=True)):
        try:
            cat[i] = enc.encode(frame[col])
        except TypeError as exc:
            bad = next((v for v in frame[col] if not _hashable(v)), None)
            raise SchemaError(
                f"column {col!r} holds an unhashable value of type {type(bad).__name__} "
                f"({bad!r}); categorical values must be str, int, float or bool"
            ) from exc
    # a batch without the request column (an offline reference, say): its rows stand alone
    request = (request_keys(frame[schema.request])
               if schema.request is not None and schema.request in frame.columns else None)
    return Parsed(n=n, ts=ts, cat=cat, num=num, request=request,
                  stamped=schema.timestamp not in frame.columns)


def request_keys(values: pd.Series) -> np.ndarray:
    """A 64-bit key per row, equal for equal request ids (any hashable: str, int ...). Rows
    without an id stand alone: each gets a key of its own (its position, tagged)."""
    arr = values.to_numpy(dtype=object)
    starts = run_starts(arr)  # a request's rows come together: one hash per request
    heads = pd.Series(arr if starts is None else arr[starts], dtype=object)
    keys = pd.util.hash_pandas_object(heads, index=False, categorize=False).to_numpy(
        dtype=np.uint64, copy=True)
    if starts is not None:
        keys = expand_runs(keys, starts, arr.size)
    missing = pd.isna(arr)
    if missing.any():
        alone = np.flatnonzero(missing).astype(np.uint64)
        keys[missing] = (alone * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(0xA5A5A5A5A5A5A5A5)
    return keys


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
