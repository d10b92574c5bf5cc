"""Explanation queries of a monitor: anomalies in the window, mix shift against a reference.

Why here: both turn the window's row sample (and the reference's) into explainer rows with
weights; the monitor only supplies state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from drift import _apriori
from drift._apriori import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_ORDER,
    DEFAULT_MIN_RATIO,
    DEFAULT_MIN_SUPPORT,
    Rows,
)
from drift._classify import Classifier, Predicate, as_classifier, check_columns
from drift._errors import NoReferenceError, SchemaError
from drift._explain import check_params, explanation_from
from drift._results import Explanation

if TYPE_CHECKING:
    from drift._monitor import Monitor

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MAX_ORDER",
    "DEFAULT_MIN_RATIO",
    "DEFAULT_MIN_SUPPORT",
    "explain_anomalies",
    "explain_mix_shift",
]


def attribute_indices(monitor: Monitor, attributes: Sequence[str] | None) -> list[int]:
    """Positions (in the monitor's categorical columns) of the attributes to explain with."""
    cats = list(monitor.schema.cat_columns)
    if attributes is None:
        return [cats.index(a) for a in monitor.schema.attributes]
    if isinstance(attributes, str) or not isinstance(attributes, Sequence) or not attributes:
        raise TypeError("attributes must be a non-empty list of attribute names")
    unknown = [a for a in attributes if a not in cats]
    if unknown:
        raise SchemaError(f"attributes {unknown} are not categorical columns of the monitor "
                          f"(have {cats})")
    return [cats.index(a) for a in dict.fromkeys(attributes)]


def resolve_classifier(
    monitor: Monitor, metric: str | None, classifier: Classifier | str | None, reference: str
) -> tuple[Classifier, str]:
    """The classifier to judge rows with, fitted on the reference if it needs data."""
    numeric = monitor.schema.num_columns
    if classifier is None:
        if metric is None:
            raise ValueError("explain needs metric=<numeric column> or classifier=...")
        if metric not in numeric:
            raise SchemaError(f"metric {metric!r} is not a numeric column (have {list(numeric)})")
        clf = monitor.classifiers.get(metric)
        if clf is None:
            from drift._classify import Percentile

            clf = Percentile(metric)
        name = metric
    elif isinstance(classifier, str) and classifier in monitor.classifiers:
        clf, name = monitor.classifiers[classifier], classifier
    else:
        clf = as_classifier(classifier, "classifier")
        name = clf.expression if isinstance(clf, Predicate) else type(clf).__name__
    check_columns(clf, numeric, "classifier")
    if clf.needs_fit:
        registered = any(clf is c for c in monitor.classifiers.values())
        if reference != "default" or not registered or not clf.fitted:
            ref = monitor.reference(reference)
            sample = monitor.reference_sample(ref.name)
            clf = clf.clone()
            clf.fit(sample.column_values(numeric), sample.weight)
    return clf, name


def explain_anomalies(
    monitor: Monitor,
    metric: str | None,
    classifier: Classifier | str | None,
    ratio_metric: str,
    attributes: Sequence[str] | None,
    min_support: float,
    min_ratio: float,
    max_order: int,
    confidence: float,
    reference: str,
) -> Explanation:
    check_params(min_support, min_ratio, max_order, confidence)
    if ratio_metric not in ("risk_ratio", "global_ratio", "mean_shift"):
        raise ValueError(
            f"ratio_metric must be 'risk_ratio', 'global_ratio' or 'mean_shift', got "
            f"{ratio_metric!r} (mix shift: use Monitor.mix_shift)"
        )
    idx = attribute_indices(monitor, attributes)
    names = [monitor.schema.cat_columns[i] for i in idx]
    sample = monitor.window_sample()
    info: dict[str, Any] = {"window": monitor.window_info(), "rows_sampled": sample.size,
                            "exact": sample.exact}
    numeric = monitor.schema.num_columns
    w = sample.weight
    var = sample.sampling_var
    if ratio_metric == "mean_shift":
        if metric is None or metric not in numeric:
            raise SchemaError(f"ratio_metric='mean_shift' needs metric=<numeric column>, "
                              f"one of {list(numeric)}")
        if classifier is not None:
            raise ValueError("ratio_metric='mean_shift' compares means; do not pass a classifier")
        value = sample.num[numeric.index(metric)]
        keep = np.isfinite(value)
        rows = Rows(codes=sample.cat[idx][:, keep], cards=_cards(monitor, idx),
                    target=w[keep], count=w[keep], target_var=var[keep], count_var=var[keep],
                    value=value[keep])
        info["metric"] = metric
    else:
        clf, name = resolve_classifier(monitor, metric, classifier, reference)
        flags = clf.flags(sample.column_values(numeric)).astype(np.float64)
        rows = Rows(codes=sample.cat[idx], cards=_cards(monitor, idx), target=w * flags,
                    count=w, target_var=var * flags, count_var=var)
        info["classifier"] = {"name": name, **clf.describe()}
        info["metric"] = metric
    found, totals = _apriori.mine(rows, ratio_metric, min_support, min_ratio, max_order,
                                  confidence)
    info["params"] = {"min_support": min_support, "min_ratio": min_ratio,
                      "max_order": max_order, "confidence": confidence}
    return explanation_from(
        "anomaly", found, totals, names, lambda a, code: monitor.label(idx[a], code),
        ratio_metric, info,
    )


def explain_mix_shift(
    monitor: Monitor,
    reference: str,
    attributes: Sequence[str] | None,
    direction: str,
    min_support: float,
    min_ratio: float,
    max_order: int,
    confidence: float,
) -> Explanation:
    check_params(min_support, min_ratio, max_order, confidence)
    if direction not in ("grew", "shrank"):
        raise ValueError(f"direction must be 'grew' or 'shrank', got {direction!r}")
    ref = monitor.reference(reference)
    idx = attribute_indices(monitor, attributes)
    names = [monitor.schema.cat_columns[i] for i in idx]
    cur = monitor.window_sample()
    base = monitor.reference_sample(ref.name)
    if cur.size == 0:
        raise NoReferenceError("the window holds no rows yet")
    test, control = (cur, base) if direction == "grew" else (base, cur)
    codes = np.concatenate((test.cat[idx], control.cat[idx]), axis=1)
    zeros = np.zeros(control.size)
    rows = Rows(
        codes=codes, cards=_cards(monitor, idx),
        target=np.concatenate((test.weight, zeros)),
        count=np.concatenate((test.weight, control.weight)),
        target_var=np.concatenate((test.sampling_var, zeros)),
        count_var=np.concatenate((test.sampling_var, control.sampling_var)),
    )
    found, totals = _apriori.mine(rows, "share_ratio", min_support, min_ratio, max_order,
                                  confidence)
    info = {
        "window": monitor.window_info(),
        "reference": dict(ref.info),
        "direction": direction,
        "rows_sampled": cur.size,
        "reference_rows_sampled": base.size,
        "exact": cur.exact and base.exact,
        "params": {"min_support": min_support, "min_ratio": min_ratio, "max_order": max_order,
                   "confidence": confidence},
    }
    result = explanation_from(
        "mix_shift", found, totals, names, lambda a, code: monitor.label(idx[a], code),
        "share_ratio", info,
    )
    if direction == "shrank":
        # keep field meanings fixed: outlier_count / current_share always describe the window
        for row in result.rows:
            row["outlier_count"], row["reference_count"] = (
                row["reference_count"], row["outlier_count"])
            row["current_share"], row["reference_share"] = (
                row["reference_share"], row["current_share"])
    return result


def _cards(monitor: Monitor, idx: list[int]) -> list[int]:
    return [max(len(monitor._encoders[i]), 1) for i in idx]
