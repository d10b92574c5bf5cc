"""Cascade health: is the cheap level still answering like it did on validated data?

Why first-class: a feature cascade answers most rows with a small model that was validated on
the reference distribution. If the share of rows it answers drops, or its confidence shifts
down, traffic has moved to where the approximation was not validated, even before accuracy
metrics (which need labels) can tell. Tested overall and per segment, against the reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from drift._clusters import proportion_effect
from drift._column_tests import SortedSample, kish
from drift._drift import SEGMENT_TEST_ROWS, pick_segments, segment_mask
from drift._results import CascadeHealth
from drift._rules import benjamini_hochberg
from drift._sample import Sample
from drift._view import View

#: Smallest drop (absolute, in share of rows) of the cheap level's share that counts.
DEFAULT_MIN_DROP = 0.05
#: False discovery rate across segments (Benjamini-Hochberg, level and confidence tested
#: separately); stricter than drift's because a degraded verdict is an alarm by itself.
DEFAULT_HEALTH_ALPHA = 0.01

MESSAGE = "the approximation is being used outside the data it was validated on"

COLUMNS_TAIL = [
    "n_current", "n_reference", "cheap_fraction", "reference_cheap_fraction",
    "cheap_fraction_change", "p_value", "p_adjusted", "confidence_median",
    "reference_confidence_median", "confidence_effect", "confidence_p_value", "degraded",
    "message",
]


def _share(weight: np.ndarray, mask: np.ndarray, hit: np.ndarray) -> tuple[float, float]:
    w = weight * mask
    total = float(w.sum())
    if total <= 0:
        return math.nan, 0.0
    return float((w * hit).sum() / total), kish(w[mask])


def cascade_health(
    view: View,
    reference: Any,
    min_share: float,
    max_segments: int,
    alpha: float,
    min_drop: float,
    confidence_effect: float,
    min_samples: int,
) -> CascadeHealth:
    cfg = view.config
    if cfg.level_column is None and cfg.confidence_column is None:
        raise ValueError(
            "cascade_health needs the Monitor's level_column and/or confidence_column"
        )
    if not 0.0 < min_drop < 1.0:
        raise ValueError(f"min_drop must be in (0, 1), got {min_drop!r}")
    ref = view.reference(reference)
    schema = view.schema
    attrs = [a for a in schema.attributes if a != cfg.level_column]
    cur = view.window_sample().thin(SEGMENT_TEST_ROWS)
    base = view.reference_sample(ref).thin(SEGMENT_TEST_ROWS)
    segs = [{}] + [s for s in pick_segments(view, None, min_share, max_segments)
                   if next(iter(s)) != cfg.level_column]
    info: dict[str, Any] = {
        "window": view.window_info(), "reference": dict(ref.info),
        "level_column": cfg.level_column, "confidence_column": cfg.confidence_column,
        "params": {"alpha": alpha, "min_drop": min_drop, "confidence_effect": confidence_effect,
                   "min_samples": min_samples, "min_share": min_share},
    }
    if cur.size == 0:
        info.update(healthy=True, message=None)
        return CascadeHealth([], [*attrs, *COLUMNS_TAIL], info)
    code = view.cheap_code()
    info["cheap_level"] = None if code is None else view.label(
        list(schema.cat_columns).index(cfg.level_column), code)
    if cfg.level_column is not None:
        li = list(schema.cat_columns).index(cfg.level_column)
        cur_hit = (cur.cat[li] == code) if code is not None else np.zeros(cur.size, bool)
        ref_hit = (base.cat[li] == code) if code is not None else np.zeros(base.size, bool)
    conf_sorted = None
    if cfg.confidence_column is not None:
        ci = list(schema.num_columns).index(cfg.confidence_column)
        conf_sorted = SortedSample(cur.num[ci], base.num[ci], cur.weight, base.weight)
    rows = []
    for seg in segs:
        mc = segment_mask(view, cur.cat, seg)
        mr = segment_mask(view, base.cat, seg)
        row: dict[str, Any] = {a: None for a in attrs}
        row.update(seg)
        n_c, n_r = kish(cur.weight[mc]), kish(base.weight[mr])
        row.update(n_current=n_c, n_reference=n_r)
        if cfg.level_column is not None:
            p_c, _ = _share(cur.weight, mc, cur_hit)
            p_r, _ = _share(base.weight, mr, ref_hit)
            row.update(cheap_fraction=p_c, reference_cheap_fraction=p_r,
                       cheap_fraction_change=p_c - p_r)
            # rows of a request are not independent draws: its share counts requests
            d_c = _share_effect(cur, mc, cur_hit)
            d_r = _share_effect(base, mr, ref_hit)
            row["p_value"] = _drop_pvalue(p_c, n_c / d_c, p_r, n_r / d_r)
        if conf_sorted is not None:
            res, _ = conf_sorted.compare(mc, mr, outside=False)
            row.update(confidence_effect=res.get("effect"),
                       confidence_p_value=res.get("p_value"),
                       confidence_median=res.get("median_current"),
                       reference_confidence_median=res.get("median_reference"),
                       _conf_mean=(res.get("mean_current"), res.get("mean_reference")))
        rows.append(row)
    adj_level = benjamini_hochberg([r.get("p_value") for r in rows])
    adj_conf = benjamini_hochberg([r.get("confidence_p_value") for r in rows])
    for r, a, b in zip(rows, adj_level, adj_conf, strict=True):
        r["p_adjusted"] = a
        enough = r["n_current"] >= min_samples and r["n_reference"] >= min_samples
        reasons = []
        change = r.get("cheap_fraction_change")
        if a is not None and a < alpha and change is not None and -change >= min_drop and enough:
            reasons.append(
                f"cheap-level share {r['reference_cheap_fraction']:.3f} -> "
                f"{r['cheap_fraction']:.3f}"
            )
        means = r.pop("_conf_mean", (None, None))
        eff = r.get("confidence_effect")
        if (b is not None and b < alpha and eff is not None and eff >= confidence_effect
                and means[0] is not None and means[1] is not None and means[0] < means[1]
                and enough):
            reasons.append(f"confidence fell (median {r['reference_confidence_median']:.3f} -> "
                           f"{r['confidence_median']:.3f})")
        r["degraded"] = bool(reasons)
        r["message"] = f"{MESSAGE}: {'; '.join(reasons)}" if reasons else None
    rows.sort(key=lambda r: (
        not r["degraded"],
        r.get("cheap_fraction_change") if r.get("cheap_fraction_change") is not None else 0.0,
        str(sorted((k, str(v)) for k, v in r.items() if k in attrs and v is not None)),
    ))
    healthy = not any(r["degraded"] for r in rows)
    info.update(healthy=healthy, message=None if healthy else MESSAGE,
                degraded_segments=sum(1 for r in rows if r["degraded"]))
    return CascadeHealth(rows, [*attrs, *COLUMNS_TAIL], info)


def _share_effect(sample: Sample, mask: np.ndarray, hit: np.ndarray) -> float:
    """Design effect of the cheap-level share within a segment (1 without request keys)."""
    if sample.cluster is None or not mask.any():
        return 1.0
    return proportion_effect(hit[mask].astype(np.int64), sample.weight[mask],
                             sample.cluster[mask])


def _drop_pvalue(p_c: float, n_c: float, p_r: float, n_r: float) -> float | None:
    """One-sided two-proportion z-test that the current share is below the reference's."""
    if not (n_c > 0 and n_r > 0) or math.isnan(p_c) or math.isnan(p_r):
        return None
    pooled = (p_c * n_c + p_r * n_r) / (n_c + n_r)
    var = pooled * (1 - pooled) * (1 / n_c + 1 / n_r)
    if var <= 0:
        return 1.0 if p_c >= p_r else 0.0
    z = (p_r - p_c) / math.sqrt(var)
    return float(stats.norm.sf(z))
