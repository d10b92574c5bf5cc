"""Explanation detectors of a monitor: anomalies in a window, and the difference of two ranges.

Why here: both turn a View's row samples (window, reference or a second time range) into
explainer rows with Horvitz-Thompson weights and hand them to the APriori search; the detector
is the statistic (risk / global / share ratio, mean shift), the rule (support, ratio, lower
confidence bound, Bonferroni over the search space) and the window, and it returns the same
Explanation shape whatever the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from drift import _apriori
from drift._apriori import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_ORDER,
    DEFAULT_MIN_RATIO,
    DEFAULT_MIN_SUPPORT,
    Rows,
)
from drift._classify import Classifier, Predicate, as_classifier, check_columns, default_classifier
from drift._errors import NoReferenceError, SchemaError
from drift._explain import check_params, explanation_from
from drift._results import Explanation
from drift._sample import Sample
from drift._view import View, no_data

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MAX_ORDER",
    "DEFAULT_MIN_RATIO",
    "DEFAULT_MIN_SUPPORT",
    "explain_anomalies",
    "explain_difference",
]

#: Fewest sampled window rows before a window may judge itself (explain with no reference).
MIN_SELF_FIT_ROWS = 200


def attribute_indices(view: View, attributes: Sequence[str] | None) -> list[int]:
    """Positions (in the monitor's categorical columns) of the attributes to explain with."""
    cats = list(view.schema.cat_columns)
    if attributes is None:
        return [cats.index(a) for a in view.schema.attributes]
    if isinstance(attributes, str) or not isinstance(attributes, Sequence) or not attributes:
        raise TypeError("attributes must be a non-empty list of attribute names")
    unknown = [a for a in attributes if a not in cats]
    if unknown:
        raise SchemaError(f"attributes {unknown} are not categorical columns of the monitor "
                          f"(have {cats})")
    return [cats.index(a) for a in dict.fromkeys(attributes)]


def resolve_classifier(
    view: View, metric: str | None, classifier: Classifier | str | None, reference: Any,
    window_values: dict[str, np.ndarray], window_weight: np.ndarray,
) -> tuple[Classifier, str, str]:
    """(classifier, its name, what it was fitted on) to judge the window's rows with.

    Thresholds come from the reference. With no reference at all (none set, or the automatic
    one still collecting) and none asked for, the window judges itself, as MacroBase's default
    percentile classifier does: its own top 1% (or the configured tail) are the outliers.
    """
    numeric = view.schema.num_columns
    if classifier is None:
        if metric is None:
            raise ValueError("explain needs metric=<numeric column> or classifier=...")
        if metric not in numeric:
            raise SchemaError(f"metric {metric!r} is not a numeric column (have {list(numeric)})")
        clf = view.classifiers.get(metric) or default_classifier(metric)
        name = metric
    elif isinstance(classifier, str) and classifier in view.classifiers:
        clf, name = view.classifiers[classifier], classifier
    else:
        clf = as_classifier(classifier, "classifier")
        name = clf.expression if isinstance(clf, Predicate) else type(clf).__name__
    check_columns(clf, numeric, "classifier")
    if not clf.needs_fit:
        return clf, name, "fixed thresholds"
    registered = any(clf is c for c in view.classifiers.values())
    if reference in (None, "default") and registered and clf.fitted:
        return clf, name, "reference 'default'"
    try:
        ref = view.reference(reference)
    except NoReferenceError:
        if reference not in (None, "default"):
            raise
        if window_weight.size < MIN_SELF_FIT_ROWS:
            raise
        clf = clf.clone()
        clf.fit(window_values, window_weight)
        return clf, name, "window"
    sample = view.reference_sample(ref)
    clf = clf.clone()
    clf.fit(sample.column_values(numeric), sample.weight)
    return clf, name, f"reference {ref.name!r}"


def unit_info(view: View, sample: Sample) -> dict[str, Any]:
    """What support and intervals count: support always counts rows; with a request column
    the intervals count requests (design effects), and the sample's requests are reported."""
    if not view.clustered:
        return {"unit": "rows"}
    requests = 0 if sample.cluster is None else int(np.unique(sample.cluster).size)
    return {"unit": "requests", "requests_sampled": requests}


def explain_anomalies(
    view: View,
    metric: str | None,
    classifier: Classifier | str | None,
    ratio_metric: str,
    attributes: Sequence[str] | None,
    min_support: float,
    min_ratio: float,
    max_order: int,
    confidence: float,
    reference: Any,
) -> Explanation:
    check_params(min_support, min_ratio, max_order, confidence)
    if ratio_metric not in ("risk_ratio", "global_ratio", "mean_shift"):
        raise ValueError(
            f"ratio_metric must be 'risk_ratio', 'global_ratio' or 'mean_shift', got "
            f"{ratio_metric!r} (two ranges: use Monitor.mix_shift or Monitor.diff)"
        )
    idx = attribute_indices(view, attributes)
    names = [view.schema.cat_columns[i] for i in idx]
    sample = view.window_sample()
    info: dict[str, Any] = {"window": view.window_info(), "rows_sampled": sample.size,
                            "exact": sample.exact, **unit_info(view, sample)}
    numeric = view.schema.num_columns
    w = sample.weight
    var = sample.sampling_var
    cards = [view.labels.card(i) for i in idx]
    if ratio_metric == "mean_shift":
        if metric is None or metric not in numeric:
            raise SchemaError(f"ratio_metric='mean_shift' needs metric=<numeric column>, "
                              f"one of {list(numeric)}")
        if classifier is not None:
            raise ValueError("ratio_metric='mean_shift' compares means; do not pass a classifier")
        value = sample.num[numeric.index(metric)]
        keep = np.isfinite(value)
        rows = Rows(codes=sample.cat[idx][:, keep], cards=cards, target=w[keep], count=w[keep],
                    target_var=var[keep], count_var=var[keep], value=value[keep],
                    cluster=None if sample.cluster is None else sample.cluster[keep])
        info["metric"] = metric
    else:
        values = sample.column_values(numeric)
        clf, name, fitted_on = resolve_classifier(view, metric, classifier, reference, values, w)
        mask = clf.flags(values)
        flags = mask.astype(np.float64)
        rows = Rows(codes=sample.cat[idx], cards=cards, target=w * flags, count=w,
                    target_var=var * flags, count_var=var,
                    target_floor=sample.zero_cell_floor(mask),
                    count_floor=sample.zero_cell_floor(), cluster=sample.cluster)
        info["classifier"] = {"name": name, **clf.describe(), "fitted_on": fitted_on}
        info["metric"] = metric if metric is not None else _single_column(clf)
    found, totals = _apriori.mine(rows, ratio_metric, min_support, min_ratio, max_order,
                                  confidence)
    info["params"] = {"min_support": min_support, "min_ratio": min_ratio,
                      "max_order": max_order, "confidence": confidence}
    return explanation_from(
        "anomaly", found, totals, names, lambda a, code: view.label(idx[a], code),
        ratio_metric, info,
    )


def _single_column(clf: Classifier) -> str | None:
    cols = clf.columns
    return cols[0] if len(cols) == 1 else None


def explain_difference(
    view: View,
    reference: Any,
    attributes: Sequence[str] | None,
    direction: str,
    ratio_metric: str,
    min_support: float,
    min_ratio: float,
    max_order: int,
    confidence: float,
    kind: str = "mix_shift",
) -> Explanation:
    """Combinations that distinguish the window from a reference (a named baseline or another
    time range): MacroBase's two-relation DIFF. `share_ratio` compares each combination's share
    of window rows with its share of reference rows; `risk_ratio` is MacroBase's default, the
    window rows being the 'outliers' of the union."""
    check_params(min_support, min_ratio, max_order, confidence)
    if direction not in ("grew", "shrank"):
        raise ValueError(f"direction must be 'grew' or 'shrank', got {direction!r}")
    if ratio_metric not in ("share_ratio", "risk_ratio"):
        raise ValueError(f"ratio_metric must be 'share_ratio' or 'risk_ratio', got "
                         f"{ratio_metric!r}")
    if view.newest is None:
        raise no_data()
    ref = view.reference(reference)
    idx = attribute_indices(view, attributes)
    names = [view.schema.cat_columns[i] for i in idx]
    cur = view.window_sample()
    base = view.reference_sample(ref)
    if cur.size == 0:
        raise NoReferenceError("the window holds no rows", reason="empty_window",
                               http_message="the requested window holds no rows; pick a range "
                                            "with traffic")
    test, control = (cur, base) if direction == "grew" else (base, cur)
    codes = np.concatenate((test.cat[idx], control.cat[idx]), axis=1)
    zeros = np.zeros(control.size)
    rows = Rows(
        codes=codes, cards=[view.labels.card(i) for i in idx],
        target=np.concatenate((test.weight, zeros)),
        count=np.concatenate((test.weight, control.weight)),
        target_var=np.concatenate((test.sampling_var, zeros)),
        count_var=np.concatenate((test.sampling_var, control.sampling_var)),
        target_floor=test.zero_cell_floor(), count_floor=control.zero_cell_floor(),
        cluster=None if test.cluster is None else np.concatenate(
            (test.cluster, control.cluster + 2.0)),  # keys are in (0, 1): the sides kept apart
    )
    found, totals = _apriori.mine(rows, ratio_metric, min_support, min_ratio, max_order,
                                  confidence)
    info = {
        "window": view.window_info(),
        "reference": dict(ref.info),
        "direction": direction,
        "rows_sampled": cur.size,
        "reference_rows_sampled": base.size,
        "exact": cur.exact and base.exact,
        **unit_info(view, cur),
        "params": {"min_support": min_support, "min_ratio": min_ratio, "max_order": max_order,
                   "confidence": confidence},
    }
    metric = "share_ratio" if ratio_metric == "share_ratio" else "diff_risk_ratio"
    result = explanation_from(kind, found, totals, names,
                              lambda a, code: view.label(idx[a], code), metric, info)
    if direction == "shrank":
        # keep field meanings fixed: outlier_count / current_share always describe the window
        for row in result.rows:
            row["outlier_count"], row["reference_count"] = (
                row["reference_count"], row["outlier_count"])
            row["current_share"], row["reference_share"] = (
                row["reference_share"], row["current_share"])
    return result
