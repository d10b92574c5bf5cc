"""Explanations as result rows, and `explain()` for plain tables (raw or pre-aggregated).

Why a table-level entry point next to the monitor: the same explainer answers "why are these
rows outliers" for any DataFrame, including MacroBase-style cube rows that carry a `count` and a
(possibly fractional) outlier count instead of one row per event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from drift import _apriori
from drift._apriori import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_ORDER,
    DEFAULT_MIN_RATIO,
    DEFAULT_MIN_SUPPORT,
    Found,
    Rows,
)
from drift._classify import Classifier, as_classifier
from drift._encode import Encoder
from drift._errors import SchemaError
from drift._ingest import numeric_column, to_frame
from drift._minimality import rank_key
from drift._results import Explanation

BASE_COLUMNS = ("support", "risk_ratio", "outlier_count", "total_count", "ratio", "ci_low",
                "ci_high", "order")
_EXTRA_COLUMNS = {
    "risk_ratio": ("global_ratio",),
    "global_ratio": ("global_ratio",),
    "share_ratio": ("reference_count", "current_share", "reference_share"),
    "diff_risk_ratio": ("reference_count", "current_share", "reference_share"),
    "mean_shift": ("mean_in", "mean_out"),
}


def explanation_from(
    kind: str,
    found: list[Found],
    totals: Mapping[str, float],
    attributes: Sequence[str],
    label: Callable[[int, int], Any],
    metric: str,
    info: Mapping[str, Any],
) -> Explanation:
    """Rank `found` deterministically and turn each into a row."""
    total_t = totals.get("target", 0.0)
    total_c = totals.get("count", 0.0)
    prepared = []
    for f in found:
        values = {a: label(a, code) for a, code in f.combo}
        text = tuple(f"{type(v).__name__}:{v}" for v in values.values())
        prepared.append((rank_key(f, text), f, values))
    prepared.sort(key=lambda p: p[0])
    rows = []
    for _, f, values in prepared:
        row: dict[str, Any] = {name: None for name in attributes}
        for a, v in values.items():
            row[attributes[a]] = v
        row.update(
            order=f.order, ratio=f.ratio, ci_low=f.ci_low, ci_high=f.ci_high,
            total_count=f.count,
        )
        if metric == "mean_shift":
            row.update(
                support=f.count / total_c if total_c else None,
                risk_ratio=None,
                outlier_count=None,
                mean_in=f.extra.get("mean_in"),
                mean_out=f.extra.get("mean_out"),
            )
        elif metric in ("share_ratio", "diff_risk_ratio"):
            ref_total = total_c - total_t
            ref = f.count - f.target
            row.update(
                support=f.target / total_t if total_t else None,
                risk_ratio=f.extra.get("risk_ratio"),
                outlier_count=f.target,
                reference_count=ref,
                current_share=f.target / total_t if total_t else None,
                reference_share=ref / ref_total if ref_total else None,
            )
        else:
            row.update(
                support=f.target / total_t if total_t else None,
                risk_ratio=f.extra.get("risk_ratio"),
                global_ratio=f.extra.get("global_ratio"),
                outlier_count=f.target,
            )
        rows.append(row)
    columns = [*attributes, *BASE_COLUMNS, *_EXTRA_COLUMNS[metric]]
    if any("design_effect" in f.extra for f in found):
        # intervals counted requests: how many rows one independent observation was worth
        for row, (_, f, _) in zip(rows, prepared, strict=True):
            row["design_effect"] = f.extra.get("design_effect")
        columns.append("design_effect")
    full_info = {
        "attributes": list(attributes),
        "ratio_metric": "risk_ratio" if metric == "diff_risk_ratio" else metric,
        "candidates_tested": int(totals.get("candidates", 0)),
        "search_space": int(totals.get("search_space", 0)),
        "interval_level": totals.get("interval_level"),
        "total_outliers" if metric != "mean_shift" else "total_rows": total_t,
        "total_rows": total_c,
        **info,
    }
    return Explanation(kind, rows, columns, full_info)


def check_params(min_support: float, min_ratio: float, max_order: int, confidence: float) -> None:
    if not isinstance(min_support, (int, float)) or not 0.0 < min_support <= 1.0:
        raise ValueError(f"min_support must be in (0, 1], got {min_support!r}")
    if not isinstance(min_ratio, (int, float)) or not min_ratio > 0:
        raise ValueError(f"min_ratio must be > 0, got {min_ratio!r}")
    if isinstance(max_order, bool) or max_order not in (1, 2, 3):
        raise ValueError(f"max_order must be 1, 2 or 3, got {max_order!r}")
    if not isinstance(confidence, float) or not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be a float in (0, 1), got {confidence!r}")


def explain(
    data: Any,
    attributes: Sequence[str],
    *,
    outlier: str | None = None,
    count: str | None = None,
    metric: str | None = None,
    classifier: Classifier | str | None = None,
    ratio_metric: str = "risk_ratio",
    min_support: float = DEFAULT_MIN_SUPPORT,
    min_ratio: float = DEFAULT_MIN_RATIO,
    max_order: int = DEFAULT_MAX_ORDER,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Explanation:
    """Attribute combinations over-represented among outliers of a table.

    Outliers come from `outlier` (a bool column, or outlier counts per row when rows are
    pre-aggregated with a `count` column; counts may be fractional), or from `classifier`
    (a fitted Classifier or a predicate string such as ``"latency_ms > 50"``).
    With ``ratio_metric="mean_shift"`` no outliers are needed: combinations are scored by
    mean(metric | combination) / mean(metric | rest).
    """
    frame = to_frame(data, "data")
    if isinstance(attributes, str) or not isinstance(attributes, Sequence) or not attributes:
        raise TypeError("attributes must be a non-empty list of column names")
    attributes = list(attributes)
    check_params(min_support, min_ratio, max_order, confidence)
    if ratio_metric not in ("risk_ratio", "global_ratio", "mean_shift"):
        raise ValueError(
            "ratio_metric must be 'risk_ratio', 'global_ratio' or 'mean_shift' "
            f"('share_ratio' compares two windows: use Monitor.mix_shift), got {ratio_metric!r}"
        )
    needed = list(attributes)
    for arg, col in (("outlier", outlier), ("count", count), ("metric", metric)):
        if col is not None:
            if not isinstance(col, str):
                raise TypeError(f"{arg} must be a column name, got {type(col).__name__}")
            needed.append(col)
    missing = [c for c in dict.fromkeys(needed) if c not in frame.columns]
    if missing:
        raise SchemaError(f"data is missing column(s) {missing}")
    n = len(frame)
    counts = None
    if count is not None:
        counts = numeric_column(frame[count], count)
        if not np.isfinite(counts).all() or (counts < 0).any():
            raise ValueError(f"count column {count!r} must hold finite values >= 0")
    value = None
    if ratio_metric == "mean_shift":
        if metric is None:
            raise ValueError("ratio_metric='mean_shift' needs metric=<numeric column>")
        if count is not None:
            raise ValueError("ratio_metric='mean_shift' needs raw rows, not a count column")
        value = numeric_column(frame[metric], metric)
        target = np.ones(n)
    elif outlier is not None:
        target = numeric_column(frame[outlier], outlier)
        if not np.isfinite(target).all() or (target < 0).any():
            raise ValueError(f"outlier column {outlier!r} must hold finite values >= 0")
        if counts is not None and (target > counts * (1 + 1e-9) + 1e-12).any():
            raise ValueError(f"outlier column {outlier!r} exceeds count column {count!r}")
        if counts is None and (target > 1).any():
            raise ValueError(
                f"outlier column {outlier!r} has values above 1; pass count=<column> for "
                "pre-aggregated rows"
            )
    elif classifier is not None:
        clf = as_classifier(classifier, "classifier")
        cols = [c for c in clf.columns if c not in frame.columns]
        if cols:
            raise SchemaError(f"classifier refers to column(s) {cols} missing from data")
        if not clf.fitted:
            raise ValueError(
                f"classifier {clf.describe()} is not fitted: fit it on reference values first, "
                "e.g. Percentile('latency_ms').fit({'latency_ms': reference_values})"
            )
        target = clf.flags({c: numeric_column(frame[c], c) for c in clf.columns}).astype(float)
        if counts is not None:
            target = target * counts
    else:
        raise ValueError("pass outlier=<column>, classifier=..., or ratio_metric='mean_shift'")
    encoders = [Encoder(a) for a in attributes]
    codes = np.empty((len(attributes), n), dtype=np.int64)
    for i, (a, enc) in enumerate(zip(attributes, encoders, strict=True)):
        codes[i] = enc.encode(frame[a])
    keep = None
    if value is not None:
        keep = np.isfinite(value)
        if not keep.all():
            codes, value, target = codes[:, keep], value[keep], target[keep]
    rows = Rows(codes=codes, cards=[max(len(e), 1) for e in encoders], target=target,
                count=counts, value=value)
    found, totals = _apriori.mine(rows, ratio_metric, min_support, min_ratio, max_order,
                                  confidence)
    info = {
        "params": {
            "min_support": min_support, "min_ratio": min_ratio, "max_order": max_order,
            "confidence": confidence,
        },
        "rows_used": int(rows.n),
        "rows_dropped_missing_metric": int(0 if keep is None else (~keep).sum()),
    }
    if classifier is not None and outlier is None and ratio_metric != "mean_shift":
        info["classifier"] = as_classifier(classifier, "classifier").describe()
    return explanation_from(
        "anomaly", found, totals, attributes,
        lambda a, code: encoders[a].label(code), ratio_metric, info,
    )


def diff(
    test: Any,
    control: Any,
    on: Sequence[str],
    *,
    count: str | None = None,
    ratio_metric: str = "share_ratio",
    min_support: float = DEFAULT_MIN_SUPPORT,
    min_ratio: float = DEFAULT_MIN_RATIO,
    max_order: int = DEFAULT_MAX_ORDER,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Explanation:
    """What distinguishes two tables (MacroBase SQL's two-relation DIFF).

    Attribute combinations over the columns `on` that are over-represented in `test` against
    `control` (two time ranges, two versions, two regions' traffic ...). ``"share_ratio"``
    (default) compares a combination's share of test rows with its share of control rows;
    ``"risk_ratio"`` (MacroBase's) treats test rows as the outliers of the union, which bounds
    it by about 1 / (test's share of the union): use it when `test` is much smaller. `count` names a column of row counts when both tables are pre-aggregated. Rows carry
    `support` (share of test rows), `ratio` with its simultaneous interval, `outlier_count`
    (test rows), `reference_count` (control rows), `current_share` / `reference_share`.
    """
    t_frame = to_frame(test, "test")
    c_frame = to_frame(control, "control")
    if isinstance(on, str) or not isinstance(on, Sequence) or not on:
        raise TypeError("on must be a non-empty list of column names")
    on = list(dict.fromkeys(on))
    check_params(min_support, min_ratio, max_order, confidence)
    if ratio_metric not in ("risk_ratio", "share_ratio"):
        raise ValueError(f"ratio_metric must be 'risk_ratio' or 'share_ratio', got "
                         f"{ratio_metric!r}")
    for arg, frame in (("test", t_frame), ("control", c_frame)):
        need = [*on, *([count] if count is not None else [])]
        missing = [c for c in need if c not in frame.columns]
        if missing:
            raise SchemaError(f"{arg} is missing column(s) {missing}")
    weights = []
    for arg, frame in (("test", t_frame), ("control", c_frame)):
        if count is None:
            weights.append(np.ones(len(frame)))
        else:
            w = numeric_column(frame[count], count)
            if not np.isfinite(w).all() or (w < 0).any():
                raise ValueError(f"{arg}: count column {count!r} must hold finite values >= 0")
            weights.append(w)
    encoders = [Encoder(a) for a in on]
    n_t, n_c = len(t_frame), len(c_frame)
    codes = np.empty((len(on), n_t + n_c), dtype=np.int64)
    for i, (a, enc) in enumerate(zip(on, encoders, strict=True)):
        codes[i, :n_t] = enc.encode(t_frame[a]) if n_t else []
        codes[i, n_t:] = enc.encode(c_frame[a]) if n_c else []
    if weights[0].sum() <= 0 or weights[1].sum() <= 0:
        raise ValueError("test and control must each hold at least one row")
    rows = Rows(codes=codes, cards=[max(len(e), 1) for e in encoders],
                target=np.concatenate((weights[0], np.zeros(n_c))),
                count=np.concatenate(weights))
    found, totals = _apriori.mine(rows, ratio_metric, min_support, min_ratio, max_order,
                                  confidence)
    info = {
        "params": {"min_support": min_support, "min_ratio": min_ratio, "max_order": max_order,
                   "confidence": confidence},
        "test_rows": float(weights[0].sum()),
        "control_rows": float(weights[1].sum()),
    }
    metric = "share_ratio" if ratio_metric == "share_ratio" else "diff_risk_ratio"
    return explanation_from("diff", found, totals, on,
                            lambda a, code: encoders[a].label(code), metric, info)
