"""Quality metrics: what the loss of an approximation is measured in.

Every metric has an explicit **kind** (never inferred from its name):

- ``"rowwise"``: the mean over rows of a 0/1 outcome per row (accuracy, error rate, any
  per-row correctness). Its paired loss has an exact bound (see ``_bounds``).
- ``"score"``: any other function of all rows together (ROC AUC, F1, log loss, a user
  callable, a scikit-learn scorer). Its loss is bounded by a guarded paired bootstrap.

``greater_is_better`` gives the direction. Internally a metric is turned into a
higher-is-better *utility* (``sign * value``) so that ``loss = utility(full) -
utility(approx)`` whichever way the metric points.

Scoring data is a :class:`Labels`: the original labels (a label the model never saw
stays itself, so it can never equal a prediction) and their index in ``classes_``
(-1 for unseen labels). Built-in metrics work in index space under bootstrap count
weights, one chunk of resamples at a time.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

#: kinds of metric
KINDS = ("rowwise", "score")
#: what a callable metric receives as its second argument
RESPONSES = ("label", "proba", "score")
#: probabilities are clipped to this before taking logs (log loss)
LOG_LOSS_EPS = 1e-12


@dataclass(frozen=True)
class Labels:
    """True labels of a split: original values and their index in ``classes`` (-1: unseen)."""

    values: np.ndarray
    index: np.ndarray
    classes: np.ndarray

    @classmethod
    def of(cls, values: Any, classes: np.ndarray) -> Labels:
        values = np.asarray(values)
        lookup = {c: i for i, c in enumerate(np.asarray(classes).tolist())}
        index = np.array([lookup.get(v, -1) for v in values.tolist()], dtype=np.int64)
        return cls(values, index, np.asarray(classes))

    def __len__(self) -> int:
        return len(self.index)


@dataclass(frozen=True)
class Metric:
    """A quality metric with an explicit kind and direction.

    ``fn(y_true, y_pred)`` receives original labels and, by ``response``: predicted
    labels ("label"), the probability matrix in ``classes_`` order ("proba"), or
    scikit-learn's scorer convention ("score": the probability of the second class for
    binary problems, the matrix otherwise). For ``kind="rowwise"``, ``fn`` returns one
    0/1 value per row (1 = the row counts, e.g. correct) and the metric is their mean.

    Built-in metrics (``builtin`` set) are vectorized and need no ``fn``.
    """

    name: str
    fn: Callable[[np.ndarray, np.ndarray], Any] | None = None
    kind: str = "score"
    response: str = "label"
    greater_is_better: bool = True
    builtin: str | None = field(default=None, repr=False)
    #: the positive class of binary F1 (default: the second class of ``classes_``)
    pos_label: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric kind must be one of {KINDS}, got {self.kind!r}")
        if self.response not in RESPONSES:
            raise ValueError(f"metric response must be one of {RESPONSES}, got {self.response!r}")
        if self.builtin is None and not callable(self.fn):
            raise TypeError(f"metric {self.name!r} needs a callable fn")
        if self.pos_label is not None and self.builtin != "f1":
            raise ValueError(f"pos_label applies to the built-in f1 only, not to {self.name!r}")

    @classmethod
    def f1(cls, pos_label: Any = None) -> Metric:
        """Binary F1 of ``pos_label`` (default: the second class), macro F1 for more classes."""
        return dataclasses.replace(BUILTIN_METRICS["f1"], pos_label=pos_label,
                                   name="f1" if pos_label is None else f"f1[{pos_label!r}]")

    def f1_targets(self, classes: np.ndarray) -> list[int]:
        """Class indices F1 averages over: the positive class of a binary problem, all of them
        (macro) otherwise."""
        classes = np.asarray(classes)
        if len(classes) != 2:
            if self.pos_label is not None:
                raise ValueError(f"pos_label={self.pos_label!r} is for binary F1; these labels have "
                                 f"{len(classes)} classes (macro F1 uses them all)")
            return list(range(len(classes)))
        if self.pos_label is None:
            return [1]
        matches = np.flatnonzero(classes == self.pos_label)
        if matches.size == 0:
            raise ValueError(f"pos_label={self.pos_label!r} is not a class; classes: {classes.tolist()}")
        return [int(matches[0])]

    @property
    def sign(self) -> float:
        return 1.0 if self.greater_is_better else -1.0

    @property
    def sees_labels_only(self) -> bool:
        """True when only predicted labels matter (probability changes that keep the
        label cannot change the metric)."""
        return self.builtin in ("accuracy", "error_rate", "f1", "balanced_accuracy") or (
            self.builtin is None and self.response == "label")

    # --- values ----------------------------------------------------------------------
    def value(self, labels: Labels, proba: np.ndarray) -> float:
        """The metric in its own units on all rows."""
        return float(self.sign * self.utilities(labels, proba, [np.ones((1, len(labels)))])[0])

    def utility(self, labels: Labels, proba: np.ndarray) -> float:
        return self.sign * self.value(labels, proba)

    def row_values(self, labels: Labels, proba: np.ndarray) -> np.ndarray:
        """Per-row 0/1 values of a rowwise metric (in the metric's own sense)."""
        if self.kind != "rowwise":
            raise TypeError(f"metric {self.name!r} is not rowwise")
        if self.builtin == "accuracy":
            return (proba.argmax(axis=1) == labels.index).astype(np.float64)
        if self.builtin == "error_rate":
            return (proba.argmax(axis=1) != labels.index).astype(np.float64)
        assert self.fn is not None
        values = np.asarray(self.fn(labels.values, self._response(labels, proba)), dtype=np.float64)
        if values.shape != (len(labels),) or not np.isin(values, (0.0, 1.0)).all():
            raise ValueError(
                f"rowwise metric {self.name!r} must return one 0/1 value per row; got shape "
                f"{values.shape} with values {np.unique(values)[:5]}"
            )
        return values

    def row_good(self, labels: Labels, proba: np.ndarray) -> np.ndarray:
        """Per-row 'good' outcome of a rowwise metric (True where the row helps the metric)."""
        values = self.row_values(labels, proba) > 0.5
        return values if self.greater_is_better else ~values

    def utilities(self, labels: Labels, proba: np.ndarray, weight_chunks: Iterable[np.ndarray]) -> np.ndarray:
        """``sign * metric`` under each row of count weights, chunk by chunk -> one value per row."""
        out = [self._weighted(labels, proba, w) for w in weight_chunks]
        return self.sign * (np.concatenate(out) if out else np.zeros(0))

    def _weighted(self, labels: Labels, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
        y = labels.index
        if self.kind == "rowwise":
            return weights @ self.row_values(labels, proba) / weights.sum(axis=1)
        if self.builtin == "f1":
            return _weighted_f1(y, proba.argmax(axis=1), self.f1_targets(labels.classes), weights)
        if self.builtin == "roc_auc":
            return _weighted_auc(y, proba, weights)
        if self.builtin in ("log_loss", "neg_log_loss"):
            p_true = np.where(y >= 0, proba[np.arange(len(y)), np.maximum(y, 0)], 0.0)
            per_row = -np.log(np.clip(p_true, LOG_LOSS_EPS, 1.0))
            value = weights @ per_row / weights.sum(axis=1)
            return -value if self.builtin == "neg_log_loss" else value
        if self.builtin == "balanced_accuracy":
            return _weighted_balanced_accuracy(y, proba.argmax(axis=1), proba.shape[1], weights)
        return self._custom(labels, proba, weights)

    def _custom(self, labels: Labels, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
        assert self.fn is not None
        out = np.empty(weights.shape[0])
        positions = np.arange(len(labels))
        prepared = self._response(labels, proba)
        for b, row in enumerate(weights):
            idx = np.repeat(positions, row.astype(np.int64))
            out[b] = float(self.fn(labels.values[idx], prepared[idx]))
        return out

    def _response(self, labels: Labels, proba: np.ndarray) -> np.ndarray:
        if self.response == "label":
            return labels.classes[proba.argmax(axis=1)]
        if self.response == "score" and proba.shape[1] == 2:
            return proba[:, 1]
        return proba


def _weighted_f1(y: np.ndarray, pred: np.ndarray, targets: list[int], weights: np.ndarray) -> np.ndarray:
    """Binary F1 of one class index, or macro F1 over classes (as scikit-learn, 0/0 -> 0)."""
    scores = []
    for c in targets:
        tp = weights @ ((pred == c) & (y == c)).astype(np.float64)
        fp = weights @ ((pred == c) & (y != c)).astype(np.float64)
        fn = weights @ ((pred != c) & (y == c)).astype(np.float64)
        denom = 2 * tp + fp + fn
        scores.append(np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0))
    return np.mean(scores, axis=0)


def _weighted_balanced_accuracy(y: np.ndarray, pred: np.ndarray, n_classes: int,
                                weights: np.ndarray) -> np.ndarray:
    """Mean recall over the classes present in each resample (as scikit-learn)."""
    recalls, present = [], []
    for c in range(n_classes):
        total = weights @ (y == c).astype(np.float64)
        hits = weights @ ((y == c) & (pred == c)).astype(np.float64)
        recalls.append(np.divide(hits, total, out=np.zeros_like(total), where=total > 0))
        present.append(total > 0)
    present_arr = np.array(present)
    return np.sum(recalls, axis=0) / np.maximum(present_arr.sum(axis=0), 1)


def _weighted_auc(y: np.ndarray, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC (binary) or macro one-vs-rest AUC, ties counted half, under count weights."""
    targets = [1] if proba.shape[1] == 2 else range(proba.shape[1])
    return np.mean([_auc_one(proba[:, c], y == c, weights) for c in targets], axis=0)


def _auc_one(score: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    order = np.argsort(score, kind="stable")
    sorted_score = score[order]
    w = weights[:, order]
    pos = positive[order]
    p = w * pos
    neg = w - p
    total_p, total_n = p.sum(axis=1), neg.sum(axis=1)
    if np.all(sorted_score[1:] != sorted_score[:-1]):
        # no ties: a positive row beats every negative row before it
        num = (p * np.cumsum(neg, axis=1)).sum(axis=1)
    else:
        starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
        p_tie = np.add.reduceat(p, starts, axis=1)
        n_tie = np.add.reduceat(neg, starts, axis=1)
        below = np.cumsum(n_tie, axis=1) - n_tie
        num = (p_tie * (below + 0.5 * n_tie)).sum(axis=1)
    denom = total_p * total_n
    return np.divide(num, denom, out=np.full_like(num, 0.5), where=denom > 0)


# --- resolution --------------------------------------------------------------------------
BUILTIN_METRICS = {
    "accuracy": Metric("accuracy", kind="rowwise", builtin="accuracy"),
    "error_rate": Metric("error_rate", kind="rowwise", greater_is_better=False, builtin="error_rate"),
    "f1": Metric("f1", builtin="f1"),
    "roc_auc": Metric("roc_auc", response="proba", builtin="roc_auc"),
    "log_loss": Metric("log_loss", response="proba", greater_is_better=False, builtin="log_loss"),
    "neg_log_loss": Metric("neg_log_loss", response="proba", builtin="neg_log_loss"),
    "balanced_accuracy": Metric("balanced_accuracy", builtin="balanced_accuracy"),
}
#: scikit-learn score functions (called with default arguments) computed by a built-in; only
#: those whose result does not depend on which label value is "positive" (f1_score's pos_label=1
#: is a label value, the built-in f1 scores the second class index)
SAME_AS_BUILTIN = {
    ("accuracy_score", "predict"): "accuracy",
    ("balanced_accuracy_score", "predict"): "balanced_accuracy",
    ("log_loss", "predict_proba"): "neg_log_loss",
}


class _Replay(ClassifierMixin, BaseEstimator):
    """A 'classifier' that replays precomputed probabilities for row positions, so that a
    scikit-learn scorer can be called as it is meant to be: ``scorer(estimator, X, y)``."""

    def __init__(self, proba: Any = None, classes: Any = None):
        self.proba = proba
        self.classes = classes

    def fit(self, X: Any, y: Any) -> _Replay:  # pragma: no cover - never fitted
        return self

    @property
    def classes_(self) -> np.ndarray:
        return self.classes

    def predict_proba(self, X: Any) -> np.ndarray:
        return self.proba[np.asarray(X).ravel().astype(np.int64)]

    def predict(self, X: Any) -> np.ndarray:
        return self.classes[self.predict_proba(X).argmax(axis=1)]


def _is_scorer(obj: Any) -> bool:
    """A scikit-learn scorer: callable(estimator, X, y) made by make_scorer / get_scorer."""
    return callable(obj) and type(obj).__module__.startswith("sklearn.metrics") and hasattr(obj, "_sign")


def scorer_metric(scorer: Any, name: str | None = None) -> Metric:
    """A Metric from a scikit-learn scorer (its sign, response method and keyword arguments
    apply as in scikit-learn; higher is better).

    A scorer's score function is called directly on the response it asks for, with bootstrap
    counts as ``sample_weight`` when it takes one (about 4x faster per resample than going
    through the scorer object); a scorer this cannot mirror (a decision function, a custom
    scorer class) is called as scikit-learn calls it, on replayed probabilities.
    """
    label = name or getattr(getattr(scorer, "_score_func", None), "__name__", None) or "scorer"
    direct = _direct_scorer(scorer, label)
    if direct is not None:
        return direct

    def score(y_true: np.ndarray, rows: np.ndarray) -> float:
        # rows: a (positions, proba, classes) bundle built by _ScorerMetric._custom
        positions, proba, classes = rows
        return float(scorer(_Replay(proba, classes), positions.reshape(-1, 1), y_true))

    return _ScorerMetric(label, fn=score, response="proba")


def _direct_scorer(scorer: Any, label: str) -> Metric | None:
    func = getattr(scorer, "_score_func", None)
    sign = getattr(scorer, "_sign", None)
    method = getattr(scorer, "_response_method", None)
    kwargs = dict(getattr(scorer, "_kwargs", None) or {})
    if not callable(func) or sign not in (1, -1) or type(scorer).__name__ != "_Scorer":
        return None
    methods = (method,) if isinstance(method, str) else tuple(method or ())
    same = SAME_AS_BUILTIN.get((getattr(func, "__name__", ""), methods[0] if len(methods) == 1 else ""))
    if same is not None and not kwargs and getattr(func, "__module__", "").startswith("sklearn.metrics"):
        if sign == (-1 if same == "neg_log_loss" else 1):
            # the same function scikit-learn would call: vectorized over resamples
            return dataclasses.replace(BUILTIN_METRICS[same], name=label)
    if "predict" in methods:
        response = "label"
    elif "predict_proba" in methods:
        response = "score"
    else:
        return None
    try:
        weighted = "sample_weight" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        weighted = False

    def score(y_true: np.ndarray, y_pred: np.ndarray, sample_weight: Any = None) -> float:
        extra = {} if sample_weight is None else {"sample_weight": sample_weight}
        return float(sign * func(y_true, y_pred, **kwargs, **extra))

    return _WeightedMetric(label, fn=score, response=response, weighted=weighted)


@dataclass(frozen=True)
class _WeightedMetric(Metric):
    """A callable metric that takes bootstrap counts as ``sample_weight`` (no row copies)."""

    weighted: bool = True

    def _custom(self, labels: Labels, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
        if not self.weighted:
            return super()._custom(labels, proba, weights)
        assert self.fn is not None
        prepared = self._response(labels, proba)
        out = np.empty(weights.shape[0])
        for b, row in enumerate(weights):
            keep = row > 0
            out[b] = self.fn(labels.values[keep], prepared[keep], sample_weight=row[keep])
        return out


@dataclass(frozen=True)
class _ScorerMetric(Metric):
    """Metric over a scikit-learn scorer: resamples are passed as row positions."""

    def _custom(self, labels: Labels, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
        assert self.fn is not None
        out = np.empty(weights.shape[0])
        positions = np.arange(len(labels))
        for b, row in enumerate(weights):
            idx = np.repeat(positions, row.astype(np.int64))
            out[b] = self.fn(labels.values[idx], (idx, proba, labels.classes))
        return out


def resolve_metric(metric: Any) -> Metric:
    """A Metric from: a built-in name ('accuracy', 'error_rate', 'f1', 'roc_auc', 'log_loss'),
    a scikit-learn scorer name ('balanced_accuracy', 'neg_log_loss', ...), a scorer object
    (``sklearn.metrics.make_scorer``), a ``willump.Metric``, or a plain callable
    ``fn(y_true, y_pred_labels) -> float`` (higher is better; a callable is never replaced
    by a built-in, whatever its name)."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        if metric in BUILTIN_METRICS:
            return BUILTIN_METRICS[metric]
        from sklearn.metrics import get_scorer, get_scorer_names

        if metric in get_scorer_names():
            return scorer_metric(get_scorer(metric), name=metric)
        raise ValueError(
            f"metric must be one of {sorted(BUILTIN_METRICS)}, a scikit-learn scorer name, a "
            f"scorer, a willump.Metric or a callable; got {metric!r}"
        )
    if _is_scorer(metric):
        return scorer_metric(metric)
    if callable(metric):
        return Metric(getattr(metric, "__name__", "custom"), fn=metric)
    raise TypeError(
        f"metric must be a string, a scikit-learn scorer, a callable or willump.Metric; got "
        f"{type(metric).__name__}"
    )
