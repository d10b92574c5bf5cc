"""Drift queries: per-column drift of the window, and per-segment (conditional) drift.

Why the gates: at serving volumes a KS or chi-squared test is significant for differences no
one cares about, and one noisy window should not page anyone. A column is flagged only when
(1) its Benjamini-Hochberg adjusted p-value across the window's columns is below `alpha`,
(2) its effect size, after subtracting the sketch's error bound, reaches the threshold,
(3) both sides hold at least `min_samples` rows, and (4) that happened in at least
persistence[0] of the last persistence[1] windows (windows ending at the newest pane and the
panes before it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from drift._column_tests import (
    DEFAULT_ALPHA,
    DEFAULT_CATEGORICAL_EFFECT,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_NUMERIC_EFFECT,
    SortedSample,
    benjamini_hochberg,
    categorical_test,
    numeric_sketch_test,
    weighted_categorical_test,
)
from drift._errors import SchemaError
from drift._results import DriftReport

if TYPE_CHECKING:
    from drift._monitor import Monitor
    from drift._summary import Summary

#: A column drifts when the gates hold in 2 of the last 3 windows.
DEFAULT_PERSISTENCE = (2, 3)
#: Segments tested by conditional_shift: single attribute values with at least this share ...
DEFAULT_MIN_SHARE = 0.05
#: ... at most this many, largest first.
DEFAULT_MAX_SEGMENTS = 50
#: A segment's drift is localized when its effect is this many times the effect outside it.
DEFAULT_LOCALIZATION = 2.0

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_CATEGORICAL_EFFECT",
    "DEFAULT_LOCALIZATION",
    "DEFAULT_MAX_SEGMENTS",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_MIN_SHARE",
    "DEFAULT_NUMERIC_EFFECT",
    "DEFAULT_PERSISTENCE",
    "column_drift",
    "conditional_shift",
]

DRIFT_COLUMNS = [
    "column", "kind", "test", "statistic", "statistic_upper", "p_value", "p_adjusted", "effect",
    "effect_name", "effect_error", "psi", "n_current", "n_reference", "new_categories",
    "new_category_share", "drifted_now", "windows_drifted", "drifted",
]


def _check_gates(alpha: float, numeric_effect: float, categorical_effect: float,
                 min_samples: int) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    for name, v in (("numeric_effect", numeric_effect),
                    ("categorical_effect", categorical_effect)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0, got {v!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise ValueError(f"min_samples must be a positive integer, got {min_samples!r}")


def _columns(monitor: Monitor, columns: Sequence[str] | None) -> list[tuple[str, str, int]]:
    """(name, kind, index within its kind) for the columns to test."""
    schema = monitor.schema
    cats, nums = list(schema.cat_columns), list(schema.num_columns)
    if columns is None:
        names = cats + nums
    else:
        if isinstance(columns, str) or not isinstance(columns, Sequence):
            raise TypeError("columns must be a list of column names")
        names = list(dict.fromkeys(columns))
        unknown = [c for c in names if c not in cats and c not in nums]
        if unknown:
            raise SchemaError(f"columns {unknown} are not monitored (have {cats + nums})")
    return [(c, "categorical", cats.index(c)) if c in cats else (c, "numeric", nums.index(c))
            for c in names]


def _test_column(kind: str, i: int, cur: Summary, ref: Summary) -> dict[str, Any]:
    if kind == "numeric":
        out = numeric_sketch_test(cur.nums[i], ref.nums[i])
        out["effect_name"] = "wasserstein_normalized"
        return out
    cc, rc = cur.cats[i], ref.cats[i]
    c_codes, c_counts = cc.items()
    r_codes, r_counts = rc.items()
    out = categorical_test(c_codes, c_counts, cc.other_mass, r_codes, r_counts, rc.other_mass,
                           cc.error, rc.error)
    out["effect_name"] = "jensen_shannon"
    return out


def _gate(res: dict[str, Any], kind: str, alpha: float, numeric_effect: float,
          categorical_effect: float, min_samples: int) -> bool:
    p, effect = res.get("p_adjusted"), res.get("effect")
    if p is None or effect is None:
        return False
    threshold = numeric_effect if kind == "numeric" else categorical_effect
    lower = effect - (res.get("effect_error") or 0.0)
    enough = (res.get("n_current") or 0) >= min_samples and (
        res.get("n_reference") or 0) >= min_samples
    return bool(p < alpha and lower >= threshold and enough)


def column_drift(
    monitor: Monitor,
    reference: str,
    columns: Sequence[str] | None,
    alpha: float,
    numeric_effect: float,
    categorical_effect: float,
    min_samples: int,
    persistence: tuple[int, int],
) -> DriftReport:
    _check_gates(alpha, numeric_effect, categorical_effect, min_samples)
    if (not isinstance(persistence, (tuple, list)) or len(persistence) != 2
            or not 1 <= int(persistence[0]) <= int(persistence[1])):
        raise ValueError(f"persistence must be (k, n) with 1 <= k <= n, got {persistence!r}")
    need, lookback = int(persistence[0]), int(persistence[1])
    ref = monitor.reference(reference)
    cols = _columns(monitor, columns)
    info: dict[str, Any] = {
        "window": monitor.window_info(), "reference": dict(ref.info),
        "params": {"alpha": alpha, "numeric_effect": numeric_effect,
                   "categorical_effect": categorical_effect, "min_samples": min_samples,
                   "persistence": [need, lookback]},
    }
    newest = monitor._newest
    if newest is None:
        return DriftReport("drift", [], DRIFT_COLUMNS, {**info, "windows_evaluated": 0})
    windows: list[list[dict[str, Any]]] = []
    for back in range(lookback):
        summary = monitor.window_summary(newest - back)
        if summary is None:
            continue
        results = [_test_column(kind, i, summary, ref.summary) for _, kind, i in cols]
        adjusted = benjamini_hochberg([r.get("p_value") for r in results])
        for r, a, (name, kind, _) in zip(results, adjusted, cols, strict=True):
            r["p_adjusted"] = a
            r["column"], r["kind"] = name, kind
            r["drifted_now"] = _gate(r, kind, alpha, numeric_effect, categorical_effect,
                                     min_samples)
        windows.append(results)
    if not windows or monitor._window_ids(newest) == []:
        return DriftReport("drift", [], DRIFT_COLUMNS, {**info, "windows_evaluated": 0})
    rows = windows[0]
    for j, r in enumerate(rows):
        count = sum(1 for w in windows if w[j]["drifted_now"])
        r["windows_drifted"] = count
        r["drifted"] = bool(count >= need)
    rows.sort(key=lambda r: (not r["drifted"], -(_num(r.get("effect"))), r["column"]))
    info["windows_evaluated"] = len(windows)
    info["drifted_columns"] = [r["column"] for r in rows if r["drifted"]]
    return DriftReport("drift", rows, DRIFT_COLUMNS, info)


def _num(v: Any) -> float:
    if v is None:
        return -math.inf
    f = float(v)
    return f if not math.isnan(f) else -math.inf


# ---------------------------------------------------------------------- conditional shift
def _segments(
    monitor: Monitor,
    segments: Sequence[Mapping[str, Any]] | None,
    min_share: float,
    max_segments: int,
) -> list[dict[str, Any]]:
    """Segments as {attribute: value}: the given ones, else the largest single values."""
    attrs = list(monitor.schema.attributes)
    if segments is not None:
        out = []
        for seg in segments:
            if not isinstance(seg, Mapping) or not seg:
                raise TypeError("segments must be a list of non-empty dicts attribute -> value")
            unknown = [a for a in seg if a not in attrs]
            if unknown:
                raise SchemaError(f"segment {dict(seg)} uses unknown attribute(s) {unknown}")
            out.append(dict(seg))
        return out
    summary = monitor.window_summary()
    if summary is None or summary.n == 0:
        return []
    candidates = []
    cats = list(monitor.schema.cat_columns)
    for a in attrs:
        i = cats.index(a)
        codes, counts = summary.cats[i].items()
        for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
            share = count / summary.n
            if share >= min_share and share < 1.0:
                candidates.append((share, a, monitor.label(i, code)))
    candidates.sort(key=lambda c: (-c[0], c[1], str(c[2])))
    return [{a: v} for _, a, v in candidates[:max_segments]]


def _segment_mask(monitor: Monitor, sample_cat: np.ndarray, segment: Mapping[str, Any]
                  ) -> np.ndarray:
    cats = list(monitor.schema.cat_columns)
    mask = np.ones(sample_cat.shape[1], dtype=bool)
    for a, v in segment.items():
        i = cats.index(a)
        code = monitor._encoders[i].code_of(v)
        if code is None:
            return np.zeros(sample_cat.shape[1], dtype=bool)
        mask &= sample_cat[i] == code
    return mask


CONDITIONAL_COLUMNS_TAIL = [
    "column", "test", "statistic", "p_value", "p_adjusted", "effect", "effect_outside",
    "localized", "drifted", "n_current", "n_reference", "mean_current", "mean_reference",
]


def conditional_shift(
    monitor: Monitor,
    reference: str,
    columns: Sequence[str] | None,
    segments: Sequence[Mapping[str, Any]] | None,
    min_share: float,
    max_segments: int,
    alpha: float,
    numeric_effect: float,
    categorical_effect: float,
    min_samples: int,
    localization: float,
) -> DriftReport:
    _check_gates(alpha, numeric_effect, categorical_effect, min_samples)
    if not 0.0 < min_share < 1.0:
        raise ValueError(f"min_share must be in (0, 1), got {min_share!r}")
    if isinstance(max_segments, bool) or not isinstance(max_segments, int) or max_segments < 1:
        raise ValueError(f"max_segments must be a positive integer, got {max_segments!r}")
    if not localization >= 1.0:
        raise ValueError(f"localization must be >= 1, got {localization!r}")
    ref = monitor.reference(reference)
    schema = monitor.schema
    if columns is None:
        # input features by default (metrics inside segments are what explain() covers)
        num = schema.num_features or schema.num_columns
        cols = [(c, "numeric", schema.num_columns.index(c)) for c in num]
        cols += [(c, "categorical", schema.cat_columns.index(c)) for c in schema.cat_features]
    else:
        cols = _columns(monitor, columns)
        bad = [c for c, kind, _ in cols if kind == "categorical" and c in schema.attributes]
        if bad:
            raise SchemaError(f"{bad} are attributes (segments are made of them); test features "
                              "or metrics inside segments")
    segs = _segments(monitor, segments, min_share, max_segments)
    attrs = list(schema.attributes)
    columns_out = [*attrs, *CONDITIONAL_COLUMNS_TAIL]
    info: dict[str, Any] = {
        "window": monitor.window_info(), "reference": dict(ref.info), "segments": segs,
        "params": {"alpha": alpha, "numeric_effect": numeric_effect,
                   "categorical_effect": categorical_effect, "min_samples": min_samples,
                   "localization": localization, "min_share": min_share},
    }
    cur = monitor.window_sample()
    base = monitor.reference_sample(ref.name)
    if not segs or cur.size == 0:
        return DriftReport("conditional_shift", [], columns_out, info)
    masks = [(_segment_mask(monitor, cur.cat, s), _segment_mask(monitor, base.cat, s))
             for s in segs]
    rows = []
    for name, kind, i in cols:
        if kind == "numeric":
            sorted_sample = SortedSample(cur.num[i], base.num[i], cur.weight, base.weight)
        for seg, (mc, mr) in zip(segs, masks, strict=True):
            if kind == "numeric":
                inside, outside = sorted_sample.compare(mc, mr)
            else:
                inside = weighted_categorical_test(cur.cat[i][mc], cur.weight[mc],
                                                   base.cat[i][mr], base.weight[mr])
                outside = weighted_categorical_test(cur.cat[i][~mc], cur.weight[~mc],
                                                    base.cat[i][~mr], base.weight[~mr])
            row = {a: None for a in attrs}
            row.update(seg)
            row.update(
                column=name, test=inside["test"], statistic=inside.get("statistic"),
                p_value=inside.get("p_value"), effect=inside.get("effect"),
                effect_outside=outside.get("effect"), n_current=inside.get("n_current"),
                n_reference=inside.get("n_reference"),
                mean_current=inside.get("mean_current"),
                mean_reference=inside.get("mean_reference"),
                _kind=kind,
            )
            rows.append(row)
    adjusted = benjamini_hochberg([r["p_value"] for r in rows])
    for r, a in zip(rows, adjusted, strict=True):
        r["p_adjusted"] = a
        kind = r.pop("_kind")
        r["drifted"] = _gate({**r, "effect_error": 0.0}, kind, alpha, numeric_effect,
                             categorical_effect, min_samples)
        eff, out_eff = r["effect"], r["effect_outside"]
        r["localized"] = bool(
            r["drifted"] and eff is not None and (
                out_eff is None or eff >= localization * out_eff
            )
        )
    rows.sort(key=lambda r: (not r["localized"], not r["drifted"], -_num(r["effect"]),
                             r["column"], str(sorted((k, str(v)) for k, v in r.items()
                                                     if k in attrs and v is not None))))
    info["localized"] = sum(1 for r in rows if r["localized"])
    return DriftReport("conditional_shift", rows, columns_out, info)
