"""Drift detectors: per-column drift of a window, and per-segment (conditional) drift.

Why the gates: at serving volumes a KS or chi-squared test is significant for differences no
one cares about, and one noisy window should not page anyone. A detector here is a statistic
(drift._column_tests), a decision rule (drift._rules: Benjamini-Hochberg across the window's
columns, the effect gate whose effect minus its sketch error must reach the threshold with
`min_samples` rows on both sides, and `Persistence`: k of the last n DISJOINT windows) and a
window (a View's range). A column whose error bound alone reaches the gate can never be
flagged; it is reported `undetectable` rather than silently quiet, as is a numeric column whose
spread outliers dominate (drift._column_tests.robust_spread); `info["undetectable_reasons"]`
says why for each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from drift._clusters import categorical_effect, column_effects, numeric_effect
from drift._column_tests import (
    SortedSample,
    categorical_test,
    numeric_sketch_test,
    segment_shift_pvalue,
    weighted_categorical_test,
)
from drift._composition import explained_by_mix, mix_reweightings
from drift._errors import SchemaError
from drift._results import DriftReport
from drift._rules import (
    DEFAULT_ALPHA,
    DEFAULT_CATEGORICAL_EFFECT,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_NUMERIC_EFFECT,
    DEFAULT_PERSISTENCE,
    EffectGate,
    Persistence,
    benjamini_hochberg,
)
from drift._sample import Sample
from drift._summary import Summary
from drift._view import View

#: Segments tested by conditional_shift: single attribute values with at least this share ...
DEFAULT_MIN_SHARE = 0.05
#: ... at most this many, largest first.
DEFAULT_MAX_SEGMENTS = 50
#: A segment's drift is localized when its effect is this many times the effect outside it.
DEFAULT_LOCALIZATION = 2.0
#: Floor on the effect outside a segment when localized rows are ranked by inside / outside
#: (a tenth of the default numeric gate), so a noise-level outside effect cannot make any
#: ratio unbounded.
LOCALIZATION_FLOOR = 0.01
#: Rows per side the per-segment tests use (larger samples are thinned uniformly): a KS test
#: on 60k rows resolves effects far below the gates; 300k rows only cost time.
SEGMENT_TEST_ROWS = 60_000
#: Fewest (effective) rows on each side of a segment before its column may be flagged. Lower
#: than the column gate's 200: a segment is a few percent of the reference (the demo's DEN is
#: 2% of a 700-row reference: 15 rows), so 200 rows a side would ask for a 10,000-row
#: reference before any segment could speak. What guards against chance here is the p-value
#: (KS at its finite-n distribution, chi-squared, BH across every segment x column); this
#: floor only keeps the effect from being read off a handful of rows.
DEFAULT_SEGMENT_MIN_SAMPLES = 10

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_CATEGORICAL_EFFECT",
    "DEFAULT_LOCALIZATION",
    "DEFAULT_MAX_SEGMENTS",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_MIN_SHARE",
    "DEFAULT_NUMERIC_EFFECT",
    "DEFAULT_PERSISTENCE",
    "DEFAULT_SEGMENT_MIN_SAMPLES",
    "column_drift",
    "conditional_shift",
]

DRIFT_COLUMNS = [
    "column", "kind", "test", "statistic", "statistic_upper", "p_value", "p_adjusted", "effect",
    "effect_name", "effect_error", "psi", "n_current", "n_reference", "new_categories",
    "new_category_share", "drifted_now", "windows_drifted", "undetectable", "drifted",
]


def tested_columns(view: View, columns: Sequence[str] | None) -> list[tuple[str, str, int]]:
    """(name, kind, index within its kind) for the columns to test."""
    schema = view.schema
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


def column_test(kind: str, i: int, cur: Summary, ref: Summary,
                deff: tuple[float, float] = (1.0, 1.0)) -> dict[str, Any]:
    """One column's test and effect of `cur` against `ref` (drift._sequential runs it per
    pane)."""
    if kind == "numeric":
        out = numeric_sketch_test(cur.nums[i], ref.nums[i], deff)
        out["effect_name"] = "wasserstein_robust"
        return out
    cc, rc = cur.cats[i], ref.cats[i]
    c_codes, c_counts = cc.items()
    r_codes, r_counts = rc.items()
    out = categorical_test(c_codes, c_counts, cc.other_mass, r_codes, r_counts, rc.other_mass,
                           cc.error, rc.error, deff=deff)
    out["effect_name"] = "jensen_shannon"
    return out


def column_drift(
    view: View,
    reference: Any,
    columns: Sequence[str] | None,
    gate: EffectGate,
    persistence: Persistence,
) -> DriftReport:
    ref = view.reference(reference)
    cols = tested_columns(view, columns)
    info: dict[str, Any] = {
        "window": view.window_info(), "reference": dict(ref.info),
        "params": {"alpha": gate.alpha, "numeric_effect": gate.numeric_effect,
                   "categorical_effect": gate.categorical_effect,
                   "min_samples": gate.min_samples, "persistence": [persistence.k, persistence.n],
                   "persistence_windows": "disjoint"},
    }
    if view.range is None or view.window_summary() is None:
        return DriftReport("drift", [], DRIFT_COLUMNS, {**info, "windows_evaluated": 0})
    windows: list[tuple[int, list[dict[str, Any]]]] = []
    ref_deffs = _design_effects(view, view.reference_sample(ref)) if view.clustered else None
    for back in range(persistence.n):
        summary = view.window_summary(view.shifted(back))
        if summary is None or summary.n == 0:
            continue
        if ref_deffs is None:
            results = [column_test(kind, i, summary, ref.summary) for _, kind, i in cols]
        else:
            cur_deffs = _design_effects(view, view.window_sample(view.shifted(back)))
            results = [column_test(kind, i, summary, ref.summary,
                                    (cur_deffs[kind][i], ref_deffs[kind][i]))
                       for _, kind, i in cols]
            for r, (_, kind, i) in zip(results, cols, strict=True):
                r["design_effect"] = cur_deffs[kind][i]
        adjusted = benjamini_hochberg([r.get("p_value") for r in results])
        for r, a, (name, kind, _) in zip(results, adjusted, cols, strict=True):
            r["p_adjusted"] = a
            r["column"], r["kind"] = name, kind
            r["drifted_now"] = gate.passes(r, kind)
            r["undetectable"] = gate.undetectable(r, kind)
            reason = _undetectable_reason(r, kind, gate)
            if reason is not None:
                r["undetectable"] = True
                r["undetectable_reason"] = reason
        windows.append((back, results))
    rows = windows[0][1] if windows and windows[0][0] == 0 else None
    if rows is None:
        return DriftReport("drift", [], DRIFT_COLUMNS, {**info, "windows_evaluated": 0})
    for j, r in enumerate(rows):
        count = sum(1 for _, w in windows if w[j]["drifted_now"])
        r["windows_drifted"] = count
        r["drifted"] = persistence.decide([w[j]["drifted_now"] for _, w in windows])
    rows.sort(key=lambda r: (not r["drifted"], -(_num(r.get("effect"))), r["column"]))
    info["windows_evaluated"] = len(windows)
    info["unit"] = "requests" if view.clustered else "rows"
    info["drifted_columns"] = [r["column"] for r in rows if r["drifted"]]
    info["undetectable_columns"] = [r["column"] for r in rows if r["undetectable"]]
    info["undetectable_reasons"] = {r["column"]: r["undetectable_reason"] for r in rows
                                    if r["undetectable"]}
    columns = [*DRIFT_COLUMNS, "design_effect"] if view.clustered else DRIFT_COLUMNS
    return DriftReport("drift", rows, columns, info)


def _design_effects(view: View, sample: Sample) -> dict[str, list[float]]:
    """Per column kind, each column's design effect measured on a sample's requests."""
    cats, nums = column_effects(sample.cat, sample.num, sample.weight, sample.cluster)
    return {"categorical": cats, "numeric": nums}


def _undetectable_reason(r: dict[str, Any], kind: str, gate: EffectGate) -> str | None:
    """Why a column cannot be judged at this gate (None when it can)."""
    threshold = gate.threshold(kind)
    if r.get("undetectable_reason"):
        return str(r["undetectable_reason"])
    core = r.get("core_effect")
    if core is not None and core < threshold:
        return (f"dominated by outliers: a 3-sigma shift of the middle half of the reference "
                f"reads at least {core:.3g} < {threshold:g} (outliers inflate its spread)")
    if r.get("undetectable"):
        return (f"sketch error alone reaches the gate ({r.get('effect_error', 0.0):.3g} >= "
                f"{threshold:g})")
    return None


def _num(v: Any) -> float:
    if v is None:
        return -math.inf
    f = float(v)
    return f if not math.isnan(f) else -math.inf


# ---------------------------------------------------------------------- conditional shift
def pick_segments(
    view: View,
    segments: Sequence[Mapping[str, Any]] | None,
    min_share: float,
    max_segments: int,
) -> list[dict[str, Any]]:
    """Segments as {attribute: value}: the given ones, else the largest single values.

    Public because cascade health judges the same segments as conditional shift."""
    attrs = list(view.schema.attributes)
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
    summary = view.window_summary()
    if summary is None or summary.n == 0:
        return []
    candidates = []
    cats = list(view.schema.cat_columns)
    for a in attrs:
        i = cats.index(a)
        codes, counts = summary.cats[i].items()
        for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
            share = count / summary.n
            if share >= min_share and share < 1.0:
                candidates.append((share, a, view.label(i, code)))
    candidates.sort(key=lambda c: (-c[0], c[1], str(c[2])))
    return [{a: v} for _, a, v in candidates[:max_segments]]


def segment_mask(view: View, sample_cat: np.ndarray, segment: Mapping[str, Any]
                 ) -> np.ndarray:
    """Rows of a sample inside `segment` (none when a value has no code in this view)."""
    cats = list(view.schema.cat_columns)
    mask = np.ones(sample_cat.shape[1], dtype=bool)
    for a, v in segment.items():
        i = cats.index(a)
        code = view.labels.code_of(i, v)
        if code is None:
            return np.zeros(sample_cat.shape[1], dtype=bool)
        mask &= sample_cat[i] == code
    return mask


CONDITIONAL_COLUMNS_TAIL = [
    "column", "test", "statistic", "p_value", "p_adjusted", "effect", "effect_outside",
    "localized", "drifted", "n_current", "n_reference", "mean_current", "mean_reference",
    "explained_by",
]


def conditional_shift(
    view: View,
    reference: Any,
    columns: Sequence[str] | None,
    segments: Sequence[Mapping[str, Any]] | None,
    min_share: float,
    max_segments: int,
    gate: EffectGate,
    localization: float,
) -> DriftReport:
    if not 0.0 < min_share < 1.0:
        raise ValueError(f"min_share must be in (0, 1), got {min_share!r}")
    if isinstance(max_segments, bool) or not isinstance(max_segments, int) or max_segments < 1:
        raise ValueError(f"max_segments must be a positive integer, got {max_segments!r}")
    if not localization >= 1.0:
        raise ValueError(f"localization must be >= 1, got {localization!r}")
    ref = view.reference(reference)
    schema = view.schema
    if columns is None:
        # input features by default (metrics inside segments are what explain() covers)
        num = schema.num_features or schema.num_columns
        cols = [(c, "numeric", schema.num_columns.index(c)) for c in num]
        cols += [(c, "categorical", schema.cat_columns.index(c)) for c in schema.cat_features]
    else:
        cols = tested_columns(view, columns)
        bad = [c for c, kind, _ in cols if kind == "categorical" and c in schema.attributes]
        if bad:
            raise SchemaError(f"{bad} are attributes (segments are made of them); test features "
                              "or metrics inside segments")
    segs = pick_segments(view, segments, min_share, max_segments)
    attrs = list(schema.attributes)
    columns_out = [*attrs, *CONDITIONAL_COLUMNS_TAIL]
    info: dict[str, Any] = {
        "window": view.window_info(), "reference": dict(ref.info), "segments": segs,
        "params": {"alpha": gate.alpha, "numeric_effect": gate.numeric_effect,
                   "categorical_effect": gate.categorical_effect,
                   "min_samples": gate.min_samples, "localization": localization,
                   "min_share": min_share},
    }
    cur = view.window_sample().thin(SEGMENT_TEST_ROWS)
    base = view.reference_sample(ref).thin(SEGMENT_TEST_ROWS)
    info["rows_used"] = [cur.size, base.size]
    if not segs or cur.size == 0:
        return DriftReport("conditional_shift", [], columns_out, info)
    masks = [(segment_mask(view, cur.cat, s), segment_mask(view, base.cat, s)) for s in segs]
    clustered = cur.cluster is not None and base.cluster is not None
    info["unit"] = "requests" if clustered else "rows"
    info["effect_name"] = "wasserstein_robust"
    rows = []
    sorted_samples: dict[int, SortedSample] = {}
    place: dict[int, tuple[str, int, int]] = {}  # row -> (kind, segment, column)
    for name, kind, i in cols:
        if kind == "numeric":
            sorted_sample = SortedSample(cur.num[i], base.num[i], cur.weight, base.weight)
            sorted_samples[i] = sorted_sample
        for k, (seg, (mc, mr)) in enumerate(zip(segs, masks, strict=True)):
            deff = _segment_effects(kind, cur, base, i, mc, mr) if clustered else (1.0, 1.0)
            if kind == "numeric":
                inside, outside = sorted_sample.compare(mc, mr)
                if clustered and inside.get("statistic") is not None:
                    inside["p_value"] = segment_shift_pvalue(
                        inside["statistic"], inside["auc"], inside["n_current"] / deff[0],
                        inside["n_reference"] / deff[1])
            else:
                inside = weighted_categorical_test(cur.cat[i][mc], cur.weight[mc],
                                                   base.cat[i][mr], base.weight[mr], deff)
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
            )
            place[id(row)] = (kind, k, i)
            if clustered:
                row["design_effect"] = deff[0]
            rows.append(row)
    adjusted = benjamini_hochberg([r["p_value"] for r in rows])
    attr_index = [(a, schema.cat_columns.index(a)) for a in attrs]
    reweightings: dict[int, list[tuple[str, np.ndarray]]] = {}
    for r, a in zip(rows, adjusted, strict=True):
        r["p_adjusted"] = a
        kind, k, i = place[id(r)]
        r["drifted"] = gate.passes({**r, "effect_error": 0.0}, kind)
        eff, out_eff = r["effect"], r["effect_outside"]
        r["localized"] = bool(
            r["drifted"] and eff is not None and (
                out_eff is None or eff >= localization * out_eff
            )
        )
        r["explained_by"] = None
        if r["drifted"]:
            mc, mr = masks[k]
            if k not in reweightings:  # one per segment, whatever the column
                reweightings[k] = mix_reweightings(
                    {schema.cat_columns.index(x) for x in segs[k]}, attr_index, cur, base, mc, mr, gate,
                    (lambda b, mc=mc, mr=mr: _segment_effects("categorical", cur, base, b, mc, mr))
                    if clustered else (lambda b: (1.0, 1.0)))
            r["explained_by"] = explained_by_mix(kind, i, reweightings[k], cur, base, mc, mr, gate,
                                                 sorted_samples.get(i))
            # a change of the segment's mix, not of the column: not where the shift happened
            r["localized"] = r["localized"] and r["explained_by"] is None

    def rank(r: dict[str, Any]) -> tuple:
        return (not r["localized"], not r["drifted"],
                not (r["p_adjusted"] is not None and r["p_adjusted"] < gate.alpha),
                -(_localization(r) if r["localized"] else _num(r["effect"])),
                -_num(r["effect"]), r["column"],
                str(sorted((k, str(v)) for k, v in r.items() if k in attrs and v is not None)))

    def test_of(kind: str, i: int, mc: np.ndarray, mr: np.ndarray) -> dict[str, Any]:
        if kind == "numeric":
            return sorted_samples[i].compare(mc, mr, outside=False)[0]
        return weighted_categorical_test(cur.cat[i][mc], cur.weight[mc], base.cat[i][mr],
                                         base.weight[mr])

    rows.sort(key=rank)
    _drop_riders([r for r in rows if r["drifted"] and not r["explained_by"]], place, masks,
                 segs, test_of, gate)
    rows.sort(key=rank)
    info["localized"] = sum(1 for r in rows if r["localized"])
    if clustered:
        columns_out = [*columns_out, "design_effect"]
    return DriftReport("conditional_shift", rows, columns_out, info)


def _drop_riders(
    ranked: list[dict[str, Any]],
    place: dict[int, tuple[str, int, int]],
    masks: list[tuple[np.ndarray, np.ndarray]],
    segs: list[dict[str, Any]],
    test_of: Callable[[str, int, np.ndarray, np.ndarray], dict[str, Any]],
    gate: EffectGate,
) -> None:
    """A drifted shift whose effect falls under the gate's threshold once the rows of a
    better-ranked localized segment leave it (carrier=WN's departures moved only on its Denver
    flights, dest=DEN's all did) is that segment's, not its own (an effect, not a test: the
    rows left may be too few for any test, which explains nothing): `explained_by` names the segment
    ("dest=DEN") and the row is not localized. Walks best first, as explain() drops riders
    (drift._minimality); only localized shifts that stand on their own explain others."""
    accepted: list[dict[str, Any]] = []
    for r in ranked:
        kind, k, i = place[id(r)]
        mc, mr = masks[k]
        for g in accepted:
            g_kind, g_k, g_i = place[id(g)]
            if g_i != i or g_kind != kind or not (mc & masks[g_k][0]).any():
                continue
            rest = test_of(kind, i, mc & ~masks[g_k][0], mr & ~masks[g_k][1]).get("effect")
            if rest is not None and rest < gate.threshold(kind):
                r["explained_by"] = ",".join(f"{a}={v}" for a, v in segs[g_k].items())
                r["localized"] = False
                break
        if r["localized"]:
            accepted.append(r)


def _localization(r: dict[str, Any]) -> float:
    """How much of a shift a segment holds: effect inside over effect outside (floored).

    Localized rows rank by it, not by effect: a segment that holds the whole change (dest=DEN,
    whose departures moved) reads ~0 outside, while one that merely overlaps it (carrier=WN,
    flying to DEN too) sees the change on both sides, however large its inside effect."""
    inside, outside = _num(r["effect"]), _num(r.get("effect_outside"))
    return inside / max(outside, LOCALIZATION_FLOOR)


def _segment_effects(kind: str, cur: Sample, base: Sample, i: int, mc: np.ndarray,
                     mr: np.ndarray) -> tuple[float, float]:
    """Design effects of column i inside a segment, in the window and in the reference sample:
    a segment's rows come in requests as the column's do (drift._clusters)."""
    effect = numeric_effect if kind == "numeric" else categorical_effect
    values = (lambda s: s.num[i]) if kind == "numeric" else (lambda s: s.cat[i])
    return (effect(values(cur)[mc], cur.weight[mc], cur.cluster[mc]),
            effect(values(base)[mr], base.weight[mr], base.cluster[mr]))
