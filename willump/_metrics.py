"""Quality metrics and the paired confidence bound on the loss of an approximation.

Every metric here works in class-index space (``y`` holds indices into
``classes_``, ``proba`` is rows x classes) and can be evaluated under a matrix of
bootstrap count weights in one vectorized pass, so that thousands of paired
resamples cost about as much as one evaluation per resample row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

#: bootstrap resamples used to certify a plan (the guarantee)
N_BOOTSTRAP = 1000
#: bootstrap resamples used to compare candidate plans before certification
N_BOOTSTRAP_SELECT = 200


@dataclass(frozen=True)
class Metric:
    """A higher-is-better quality metric.

    ``fn(y_true, y_pred)`` receives original labels; with ``needs_proba`` it gets the
    probability matrix (columns in ``classes_`` order) instead of predicted labels.
    """

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float] | None = None
    needs_proba: bool = False

    def score(self, y: np.ndarray, proba: np.ndarray, classes: np.ndarray) -> float:
        ones = np.ones((1, len(y)))
        return float(self.weighted(y, proba, ones, classes)[0])

    def weighted(
        self, y: np.ndarray, proba: np.ndarray, weights: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        """The metric under each row of count weights (B x n) -> B values."""
        if self.name == "accuracy":
            correct = (proba.argmax(axis=1) == y).astype(np.float64)
            return weights @ correct / weights.sum(axis=1)
        if self.name == "f1":
            return _weighted_f1(y, proba.argmax(axis=1), proba.shape[1], weights)
        if self.name == "roc_auc":
            return _weighted_auc(y, proba, weights)
        return self._custom(y, proba, weights, classes)

    def _custom(self, y, proba, weights, classes) -> np.ndarray:
        assert self.fn is not None
        labels = classes[y]
        out = np.empty(weights.shape[0])
        positions = np.arange(len(y))
        for b, row in enumerate(weights):
            idx = np.repeat(positions, row.astype(np.int64))
            pred = proba[idx] if self.needs_proba else classes[proba[idx].argmax(axis=1)]
            out[b] = float(self.fn(labels[idx], pred))
        return out


METRICS = {
    "accuracy": Metric("accuracy"),
    "f1": Metric("f1"),
    "roc_auc": Metric("roc_auc", needs_proba=True),
}


def resolve_metric(metric: Any) -> Metric:
    """'accuracy' | 'f1' | 'roc_auc' | a callable(y_true, y_pred) -> float | a Metric."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)} or a callable; got {metric!r}")
        return METRICS[metric]
    if callable(metric):
        return Metric(getattr(metric, "__name__", "custom"), fn=metric)
    raise TypeError(f"metric must be a string, a callable or willump.Metric; got {type(metric).__name__}")


def _weighted_f1(y: np.ndarray, pred: np.ndarray, n_classes: int, weights: np.ndarray) -> np.ndarray:
    """Binary F1 of class index 1, or macro F1 over classes (as scikit-learn, 0/0 -> 0)."""
    classes = [1] if n_classes == 2 else range(n_classes)
    scores = []
    for c in classes:
        tp = weights @ ((pred == c) & (y == c)).astype(np.float64)
        fp = weights @ ((pred == c) & (y != c)).astype(np.float64)
        fn = weights @ ((pred != c) & (y == c)).astype(np.float64)
        denom = 2 * tp + fp + fn
        scores.append(np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0))
    return np.mean(scores, axis=0)


def _weighted_auc(y: np.ndarray, proba: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC (binary) or macro one-vs-rest AUC, ties counted half, under count weights."""
    n_classes = proba.shape[1]
    targets = [1] if n_classes == 2 else range(n_classes)
    return np.mean([_auc_one(proba[:, c], y == c, weights) for c in targets], axis=0)


def _auc_one(score: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    order = np.argsort(score, kind="stable")
    sorted_score = score[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    w = weights[:, order]
    pos = positive[order].astype(np.float64)
    p = np.add.reduceat(w * pos, starts, axis=1)
    n = np.add.reduceat(w * (1.0 - pos), starts, axis=1)
    below = np.cumsum(n, axis=1) - n
    total_p, total_n = p.sum(axis=1), n.sum(axis=1)
    denom = total_p * total_n
    num = (p * (below + 0.5 * n)).sum(axis=1)
    return np.divide(num, denom, out=np.full_like(num, 0.5), where=denom > 0)


def bootstrap_weights(n: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Multinomial resample counts (n_resamples x n); row b is resample b."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float64)


@dataclass
class LossBound:
    """Loss of an approximation against the full pipeline, with its upper bound."""

    point: float
    upper: float
    method: str


def bootstrap_loss_bound(
    metric: Metric,
    y: np.ndarray,
    proba_full: np.ndarray,
    proba_approx: np.ndarray,
    weights: np.ndarray,
    confidence: float,
    classes: np.ndarray,
    full_scores: np.ndarray | None = None,
) -> LossBound:
    """Paired percentile bootstrap: the ``confidence`` quantile of resampled losses.

    Both pipelines are scored on the same resamples, so the bound reflects only
    the rows where they disagree. ``full_scores`` may pass precomputed resampled
    scores of the full pipeline (they do not change between candidate plans).
    """
    if full_scores is None:
        full_scores = metric.weighted(y, proba_full, weights, classes)
    approx_scores = metric.weighted(y, proba_approx, weights, classes)
    losses = full_scores - approx_scores
    point = metric.score(y, proba_full, classes) - metric.score(y, proba_approx, classes)
    return LossBound(point, float(np.quantile(losses, confidence)), "paired bootstrap")


def exact_accuracy_loss_bound(
    y: np.ndarray, proba_full: np.ndarray, proba_approx: np.ndarray, confidence: float
) -> LossBound:
    """Exact (Clopper-Pearson) paired bound on the accuracy lost, conservative.

    loss = p+ - p-, where p+ (p-) is the rate of rows the full pipeline gets right
    and the approximation wrong (and vice versa). With d = p+ + p- the disagreement
    rate and q = p+ / d, loss = d (2q - 1) <= d_hi * max(2 q_hi - 1, 0), where d_hi
    and q_hi are exact one-sided upper limits at alpha / 2 each.
    """
    full_ok = proba_full.argmax(axis=1) == y
    approx_ok = proba_approx.argmax(axis=1) == y
    n = len(y)
    worse = int(np.sum(full_ok & ~approx_ok))
    better = int(np.sum(~full_ok & approx_ok))
    disagree = worse + better
    alpha = (1.0 - confidence) / 2.0
    d_hi = 1.0 if disagree == n else float(stats.beta.ppf(1 - alpha, disagree + 1, n - disagree))
    if disagree == 0:
        q_hi = 1.0
    elif worse == disagree:
        q_hi = 1.0
    else:
        q_hi = float(stats.beta.ppf(1 - alpha, worse + 1, disagree - worse))
    upper = d_hi * max(2.0 * q_hi - 1.0, 0.0)
    return LossBound((worse - better) / n, upper, "exact paired (Clopper-Pearson)")


def log_loss(y: np.ndarray, proba: np.ndarray, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true class."""
    return float(-np.mean(np.log(np.clip(proba[np.arange(len(y)), y], eps, 1.0))))
