"""Validated monitor configuration, with the defaults of every windowing and memory knob.

Why separate: the constructor arguments are checked once, stored as given, and compared with the
configuration saved in a state directory, so a restarted monitor refuses a different setup
instead of silently mixing codes or column orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from drift._classify import Classifier, ErrorFlag, as_classifier, check_columns, default_classifier
from drift._counts import DEFAULT_MAX_VALUES
from drift._encode import DEFAULT_MAX_CODES, DEFAULT_MAX_VALUE_LENGTH, TRUNCATION_MARKER
from drift._frontier import DEFAULT_FRONTIER_BATCHES
from drift._reservoir import DEFAULT_FLAGGED_RESERVOIR_SIZE, DEFAULT_RESERVOIR_SIZE
from drift._sketch import DEFAULT_RELATIVE_ACCURACY

#: Pane length: the unit of time for windows, persistence and per-pane series.
DEFAULT_PANE_SECONDS = 60.0
#: Panes in the sliding window that queries judge.
DEFAULT_WINDOW_PANES = 10
#: A pane closes (is persisted) once event time passes its end by this much.
DEFAULT_ALLOWED_LATENESS_SECONDS = 5.0
#: Closed panes kept individually (counts and sketches, no rows) after they leave the window.
DEFAULT_DETAIL_PANES = 60
#: Panes merged into one rollup once they are older than the detail horizon.
DEFAULT_ROLLUP_PANES = 60
#: History horizon, in panes, for rollups and per-pane series: two days of 1-minute panes, so
#: "the same time yesterday" stays answerable all day.
DEFAULT_RETENTION_PANES = 2880
#: Rows sampled per stratum for a reference baseline.
DEFAULT_REFERENCE_RESERVOIR_SIZE = 100_000
#: Rows kept per pane (unflagged, flagged) once a pane leaves the window (detail panes and
#: rollups), so time-range queries older than the window still have rows to explain with.
DEFAULT_HISTORY_RESERVOIR_SIZE = 1000
DEFAULT_HISTORY_FLAGGED_RESERVOIR_SIZE = 500
#: Rows dated further than this past the time frontier (drift._frontier; or past the monitor's
#: clock, when it has one) are quarantined (held, counted, released when time reaches them)
#: instead of closing every pane.
DEFAULT_MAX_FUTURE_SECONDS = 300.0
#: Most classifiers a monitor runs at ingest (one bit each in a uint32).
MAX_CLASSIFIERS = 32

FEATURE_KINDS = ("numeric", "categorical")
#: Settings a reopened monitor may change: they decide what is kept from now on, not what the
#: stored state means.
ADOPTABLE = frozenset({"retention_panes", "max_future_seconds", "history_reservoir_size",
                       "history_flagged_reservoir_size", "frontier_batches"})


def _names(value: Any, argument: str, allow_empty: bool) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{argument} must be a list of column names, got {value!r}")
    names = list(value)
    if not names and not allow_empty:
        raise ValueError(f"{argument} must name at least one column")
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"{argument} must hold non-empty strings, got {n!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{argument} names {dup} more than once")
    return names


@dataclass
class Config:
    """Everything that fixes the meaning of stored state (saved with it)."""

    attributes: list[str]
    metrics: list[str]
    features: dict[str, str | None]  # None: kind inferred from the first batch
    classifiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    level_column: str | None = None
    cheap_level: Any = None
    confidence_column: str | None = None
    error_column: str | None = None
    timestamp_column: str = "timestamp"
    pane_seconds: float = DEFAULT_PANE_SECONDS
    window_panes: int = DEFAULT_WINDOW_PANES
    allowed_lateness_seconds: float = DEFAULT_ALLOWED_LATENESS_SECONDS
    detail_panes: int = DEFAULT_DETAIL_PANES
    rollup_panes: int = DEFAULT_ROLLUP_PANES
    retention_panes: int = DEFAULT_RETENTION_PANES
    max_values: int = DEFAULT_MAX_VALUES
    max_codes: int = DEFAULT_MAX_CODES
    max_value_length: int = DEFAULT_MAX_VALUE_LENGTH
    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY
    reservoir_size: int = DEFAULT_RESERVOIR_SIZE
    flagged_reservoir_size: int = DEFAULT_FLAGGED_RESERVOIR_SIZE
    reference_reservoir_size: int = DEFAULT_REFERENCE_RESERVOIR_SIZE
    auto_reference_panes: int | None = None
    seed: int = 0
    high_tail_metrics: list[str] | None = None
    history_reservoir_size: int = DEFAULT_HISTORY_RESERVOIR_SIZE
    history_flagged_reservoir_size: int = DEFAULT_HISTORY_FLAGGED_RESERVOIR_SIZE
    max_future_seconds: float = DEFAULT_MAX_FUTURE_SECONDS
    request_column: str | None = None
    frontier_batches: int = DEFAULT_FRONTIER_BATCHES

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, other: Config) -> list[str]:
        """Settings that differ from stored state and would change its meaning (knobs in
        `ADOPTABLE` only change what is kept from now on, so a reopened monitor adopts them)."""
        mine, theirs = self.to_json(), other.to_json()
        out = []
        for key in mine:
            if key in ADOPTABLE:
                continue
            a, b = mine[key], theirs.get(key)
            if key == "features":
                # an inferred kind (None) matches whatever was inferred before
                if set(a) != set(b or {}) or any(
                    a[k] is not None and b[k] is not None and a[k] != b[k] for k in a
                ):
                    out.append(f"features: {a} != stored {b}")
            elif key not in theirs and a == Config.__dataclass_fields__[key].default:
                continue  # state written before the knob existed, default kept
            elif a != b:
                out.append(f"{key}: {a!r} != stored {b!r}")
        return out


def build_config(
    attributes: Sequence[str],
    metrics: Sequence[str],
    features: Sequence[str] | Mapping[str, str],
    classifiers: Mapping[str, Classifier | str] | None,
    level_column: str | None,
    cheap_level: Any,
    confidence_column: str | None,
    error_column: str | None,
    **knobs: Any,
) -> tuple[Config, dict[str, Classifier]]:
    """Check every argument; returns the config and the ordered classifier registry."""
    attrs = _names(attributes, "attributes", allow_empty=True)
    mets = _names(metrics, "metrics", allow_empty=True)
    if isinstance(features, Mapping):
        feats: dict[str, str | None] = {}
        for name, kind in features.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"features must map column names to kinds, got key {name!r}")
            if kind not in FEATURE_KINDS:
                raise ValueError(
                    f"features[{name!r}] must be 'numeric' or 'categorical', got {kind!r}"
                )
            feats[name] = kind
    else:
        feats = dict.fromkeys(_names(features, "features", allow_empty=True))
    for arg, col in (("level_column", level_column), ("confidence_column", confidence_column),
                     ("error_column", error_column)):
        if col is not None and (not isinstance(col, str) or not col):
            raise TypeError(f"{arg} must be a column name or None, got {col!r}")
    if level_column is not None and level_column not in attrs:
        attrs.append(level_column)  # the cascade level is a categorical attribute
    for col in (confidence_column, error_column):
        if col is not None and col not in mets:
            mets.append(col)
    if not attrs:
        raise ValueError("attributes must name at least one column (or set level_column)")
    clash = sorted((set(attrs) & set(mets)) | (set(attrs) & set(feats)) | (set(mets) & set(feats)))
    if clash:
        raise ValueError(f"column(s) {clash} appear in more than one of attributes, metrics, "
                         "features")
    ts_col = knobs.get("timestamp_column", "timestamp")
    if not isinstance(ts_col, str) or not ts_col:
        raise TypeError(f"timestamp_column must be a column name, got {ts_col!r}")
    if ts_col in set(attrs) | set(mets) | set(feats):
        raise ValueError(f"timestamp column {ts_col!r} cannot also be an attribute/metric/feature")
    req_col = knobs.get("request_column")
    if req_col is not None:
        if not isinstance(req_col, str) or not req_col:
            raise TypeError(f"request_column must be a column name or None, got {req_col!r}")
        if req_col in set(attrs) | set(mets) | set(feats) | {ts_col}:
            raise ValueError(f"request column {req_col!r} cannot also be an attribute, metric, "
                             "feature or the timestamp (request ids are keys, not values)")
    _check_knobs(knobs)
    if cheap_level is not None and not isinstance(cheap_level, (str, int, float, bool)):
        raise TypeError(f"cheap_level must be a str, int, float or bool, got {cheap_level!r}")

    registry: dict[str, Classifier] = {}
    tails = knobs.get("high_tail_metrics")
    if tails is not None:
        tails = _names(tails, "high_tail_metrics", allow_empty=True)
        bad = [t for t in tails if t not in mets]
        if bad:
            raise ValueError(f"high_tail_metrics names {bad}, which are not metrics {mets}")
    for m in mets:
        if m == error_column:
            registry[m] = ErrorFlag(m)
        else:
            registry[m] = default_classifier(m, None if tails is None else m in tails)
    numeric = tuple(mets) + tuple(k for k, v in feats.items() if v == "numeric")
    for name, spec in (classifiers or {}).items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"classifiers must be keyed by non-empty names, got {name!r}")
        clf = as_classifier(spec, f"classifiers[{name!r}]")
        if any(feats.get(c, "x") is None for c in clf.columns):
            raise ValueError(
                f"classifiers[{name!r}] uses a feature whose kind is not known yet; declare "
                "features as a dict such as {'age': 'numeric'}"
            )
        check_columns(clf, numeric, f"classifiers[{name!r}]")
        registry[name] = clf
    if len(registry) > MAX_CLASSIFIERS:
        raise ValueError(f"at most {MAX_CLASSIFIERS} classifiers, got {len(registry)}")
    cfgs = {}
    for name, clf in registry.items():
        try:
            cfgs[name] = clf.to_config()
        except NotImplementedError:
            cfgs[name] = {"kind": "custom", "type": type(clf).__name__}
    if tails is not None:
        knobs["high_tail_metrics"] = tails
    config = Config(
        attributes=attrs, metrics=mets, features=feats, classifiers=cfgs,
        level_column=level_column, cheap_level=cheap_level,
        confidence_column=confidence_column, error_column=error_column, **knobs,
    )
    return config, registry


def _check_knobs(knobs: dict[str, Any]) -> None:
    positive_float = ("pane_seconds", "relative_accuracy")
    for key in positive_float:
        v = knobs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise ValueError(f"{key} must be a positive number, got {v!r}")
    acc = knobs.get("relative_accuracy")
    if acc is not None and not acc < 0.5:
        raise ValueError(f"relative_accuracy must be below 0.5, got {acc!r}")
    lateness = knobs.get("allowed_lateness_seconds")
    if lateness is not None and (not isinstance(lateness, (int, float)) or lateness < 0):
        raise ValueError(f"allowed_lateness_seconds must be >= 0, got {lateness!r}")
    ints = ("window_panes", "detail_panes", "rollup_panes", "retention_panes", "max_values",
            "max_codes", "max_value_length", "reservoir_size", "flagged_reservoir_size",
            "reference_reservoir_size", "history_reservoir_size", "history_flagged_reservoir_size",
            "frontier_batches")
    future = knobs.get("max_future_seconds")
    if future is not None and (isinstance(future, bool) or not isinstance(future, (int, float))
                               or not future > 0):
        raise ValueError(f"max_future_seconds must be a positive number, got {future!r}")
    for key in ints:
        v = knobs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    if knobs.get("max_codes") is not None and knobs["max_codes"] < 2:
        raise ValueError("max_codes must be >= 2")
    length = knobs.get("max_value_length")
    if length is not None and length <= len(TRUNCATION_MARKER):
        raise ValueError(f"max_value_length must exceed {len(TRUNCATION_MARKER)} (the cut "
                         f"marker's length), got {length!r}")
    auto = knobs.get("auto_reference_panes")
    if auto is not None and (isinstance(auto, bool) or not isinstance(auto, int) or auto < 1):
        raise ValueError(f"auto_reference_panes must be a positive integer or None, got {auto!r}")
    seed = knobs.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
