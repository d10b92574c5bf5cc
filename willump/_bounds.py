"""Upper confidence bounds on the loss of an approximation against the full pipeline.

Three bounds, chosen by the metric's kind (``bound="auto"``):

- **exact paired** (rowwise metrics: accuracy, error rate, per-row correctness): with
  ``w`` rows where the full pipeline is right and the approximation wrong, and ``b`` the
  reverse, ``loss = p+ - p-`` is bounded by ``d_hi * max(2 q_hi - 1, 0)`` where ``d_hi`` is
  the exact (Clopper-Pearson) upper limit of the disagreement rate and ``q_hi`` that of
  the share of disagreements that are worse, each at ``alpha / 2``. Valid at any n; with
  no disagreement at all it is ``1 - (alpha / 2) ** (1 / n)``, the certifiable floor.
- **guarded paired bootstrap** (other metrics): the ``confidence`` quantile of the loss
  over paired resamples, used only when at least ``min_disagreements`` rows differ
  between the two pipelines (as the metric sees them). A bootstrap over a handful of
  differing rows sees "no worse row" and says 0 however few rows there are, which is
  how the old default certified losses it could not see.
- **sensitivity** (the guard's fallback for ROC AUC and F1): a Clopper-Pearson bound on
  the rate of differing (or worse) rows times how much such rows can change the metric
  at most. Exact and conservative. Metrics without a known sensitivity (log loss, user
  callables, scorers) get no bound when too few rows differ: the plan is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from ._metrics import Labels, Metric

#: bootstrap resamples used to certify a plan (the guarantee)
N_BOOTSTRAP = 1000
#: bootstrap resamples used to compare candidate plans before certification
N_BOOTSTRAP_SELECT = 200
#: rows that must differ between the pipelines (as the metric sees them) before a
#: bootstrap bound is trusted; below it the sensitivity bound (or none) applies
MIN_DISAGREEMENTS = 50
#: largest resamples x rows float64 block materialized at once
BOOTSTRAP_CHUNK_ELEMENTS = 1 << 22
#: resample counts kept in memory (uint8) up to this many bytes; beyond, chunks are redrawn
RESAMPLES_STORED_BYTES = 1 << 28
#: bound methods a caller may ask for
BOUNDS = ("auto", "exact", "bootstrap")


@dataclass
class LossBound:
    """Loss of an approximation against the full pipeline, its upper bound, and which
    bound produced it and why."""

    point: float
    upper: float
    method: str
    detail: str = ""


# --- resamples ----------------------------------------------------------------------------
class Resamples:
    """Paired bootstrap resample counts, seeded, handed out as float64 chunks of at most
    ``chunk_elements``: no resamples x rows float64 matrix is ever built, and every evaluation
    sees the same resamples (paired across plans). Counts are kept (as uint8) when they fit in
    ``stored_bytes``; beyond that each chunk is drawn again from its own seed when asked for,
    so memory stays bounded whatever the number of rows."""

    def __init__(self, n: int, count: int, rng: np.random.Generator,
                 chunk_elements: int = BOOTSTRAP_CHUNK_ELEMENTS, stored_bytes: int = RESAMPLES_STORED_BYTES):
        self.n = n
        self.count = count
        self.chunk = max(1, chunk_elements // max(n, 1))
        starts = range(0, count, self.chunk)
        self._seeds = [int(x) for x in rng.integers(0, 2**63 - 1, size=len(starts))]
        self.counts = None
        if count * n <= stored_bytes:
            self.counts = np.vstack([self._draw(i) for i in range(len(self._seeds))]) if count else \
                np.zeros((0, n), dtype=np.uint8)

    def _draw(self, index: int) -> np.ndarray:
        rows = min(self.chunk, self.count - index * self.chunk)
        rng = np.random.default_rng(self._seeds[index])
        draws = rng.integers(0, self.n, size=(rows, self.n)) + (np.arange(rows) * self.n)[:, None]
        counts = np.bincount(draws.ravel(), minlength=rows * self.n).reshape(rows, self.n)
        return np.minimum(counts, 255).astype(np.uint8)

    def chunks(self) -> Iterator[np.ndarray]:
        for index in range(len(self._seeds)):
            start = index * self.chunk
            block = self.counts[start:start + self.chunk] if self.counts is not None else self._draw(index)
            yield block.astype(np.float64)


# --- exact bounds -------------------------------------------------------------------------
def cp_upper(k: int, n: int, alpha: float) -> float:
    """Exact one-sided (Clopper-Pearson) upper limit of a binomial rate at level alpha."""
    if n <= 0 or k >= n:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def cp_lower(k: int, n: int, alpha: float) -> float:
    """Exact one-sided (Clopper-Pearson) lower limit of a binomial rate at level alpha."""
    if n <= 0 or k <= 0:
        return 0.0
    return float(stats.beta.ppf(alpha, k, n - k + 1))


def exact_paired_upper(worse: Any, better: Any, n: int, confidence: float) -> Any:
    """``d_hi * max(2 q_hi - 1, 0)``: exact, conservative bound on p+ - p- (elementwise over
    arrays of counts)."""
    alpha = (1.0 - confidence) / 2.0
    worse, better = np.asarray(worse, dtype=np.int64), np.asarray(better, dtype=np.int64)
    disagree = worse + better
    inner = np.minimum(disagree, n - 1)
    d_hi = np.where(disagree >= n, 1.0, stats.beta.ppf(1 - alpha, inner + 1, np.maximum(n - inner, 1)))
    w = np.minimum(worse, np.maximum(disagree - 1, 0))
    q_hi = np.where((disagree == 0) | (worse >= disagree), 1.0,
                    stats.beta.ppf(1 - alpha, w + 1, np.maximum(disagree - w, 1)))
    out = d_hi * np.maximum(2.0 * q_hi - 1.0, 0.0)
    return float(out) if out.ndim == 0 else out


def certifiable_floor(n: int, confidence: float) -> float:
    """Smallest loss the exact paired bound can certify with n rows (no disagreement at all)."""
    return exact_paired_upper(0, 0, n, confidence)


def rows_needed(max_loss: float, confidence: float) -> int:
    """Certification rows the exact paired bound needs to certify ``max_loss`` at best."""
    if max_loss <= 0:
        return math.inf  # type: ignore[return-value]
    alpha = (1.0 - confidence) / 2.0
    return math.ceil(math.log(alpha) / math.log1p(-max_loss))


def rowwise_bound(worse_max: int, better_min: int, ambiguous: int, n: int, point: float,
                  confidence: float) -> LossBound:
    """Exact paired bound for a rowwise metric. ``worse_max`` / ``better_min`` count rows
    worse / better under the least favourable routing of the ``ambiguous`` rows (rows a
    served runtime may route either way); the bound is the largest over the outcomes
    those rows allow, so it holds for whichever routing serves."""
    upper = float(np.max(exact_paired_upper(worse_max, better_min + np.arange(ambiguous + 1), n, confidence)))
    detail = f"{worse_max} worse, {better_min} better of {n} rows"
    if ambiguous:
        detail += f" ({ambiguous} within the routing tolerance counted at their worst)"
    return LossBound(point, upper, "exact paired (Clopper-Pearson)", detail)


# --- sensitivity bounds (the bootstrap guard's exact fallback) -----------------------------
def auc_sensitivity_bound(changed: int, labels: Labels, n_classes: int, confidence: float) -> float:
    """|AUC(full) - AUC(approx)| <= d / min class share, where d is the share of rows whose
    score changed: a changed positive moves at most 1/P of the pairs, a negative 1/N.
    d's upper limit at alpha/2; the two lower limits of each class (its share and the rest's)
    at alpha/(4 * classes) each, so the whole spends alpha = 1 - confidence."""
    alpha = (1.0 - confidence) / 2.0
    n = len(labels)
    d_hi = cp_upper(changed, n, alpha)
    targets = [1] if n_classes == 2 else list(range(n_classes))
    shares = []
    for c in targets:
        k = int(np.sum(labels.index == c))
        a = alpha / (2 * len(targets))
        shares.append(min(cp_lower(k, n, a), cp_lower(n - k, n, a)))
    share = min(shares)
    return math.inf if share <= 0 else min(1.0, d_hi / share)


def f1_sensitivity_bound(worse_by_class: list[int], full_pred: np.ndarray, labels: Labels,
                         n_classes: int, confidence: float) -> float:
    """F1 lost <= 2u / (S - u) per class, u the share of worse flips (a true positive lost
    or a false positive gained) and S = predicted-positive share + positive share of the
    full pipeline; better flips only raise F1. u at alpha/2, each part of S at alpha/4
    (split over classes for macro F1)."""
    alpha = (1.0 - confidence) / 2.0
    n = len(labels)
    targets = [1] if n_classes == 2 else list(range(n_classes))
    a = alpha / len(targets)
    total = 0.0
    for c, worse in zip(targets, worse_by_class, strict=True):
        u = cp_upper(worse, n, a)
        s = cp_lower(int(np.sum(full_pred == c)), n, a / 2) + cp_lower(int(np.sum(labels.index == c)), n, a / 2)
        if s - u <= 0:
            return math.inf
        total += 2 * u / (s - u)
    return min(1.0, total / len(targets))


def f1_worse_flips(full_pred: np.ndarray, approx_pred: np.ndarray, labels: Labels,
                   n_classes: int) -> list[int]:
    """Per F1 class: rows where the approximation loses a true positive or adds a false one."""
    targets = [1] if n_classes == 2 else list(range(n_classes))
    y = labels.index
    out = []
    for c in targets:
        lost_tp = (full_pred == c) & (approx_pred != c) & (y == c)
        new_fp = (full_pred != c) & (approx_pred == c) & (y != c)
        out.append(int(np.sum(lost_tp | new_fp)))
    return out


def disagreements(metric: Metric, full: np.ndarray, approx: np.ndarray) -> int:
    """Rows whose input to the metric differs: predicted labels for label metrics,
    probabilities otherwise."""
    if metric.sees_labels_only:
        return int(np.sum(full.argmax(axis=1) != approx.argmax(axis=1)))
    return int(np.sum(np.any(full != approx, axis=1)))


def sensitivity_bound(metric: Metric, labels: Labels, full: np.ndarray, approx: np.ndarray,
                      changed: int, confidence: float) -> float | None:
    """The exact fallback for a score metric, or None when the metric has none."""
    if metric.builtin == "roc_auc":
        return auc_sensitivity_bound(changed, labels, full.shape[1], confidence)
    if metric.builtin == "f1":
        full_pred, approx_pred = full.argmax(axis=1), approx.argmax(axis=1)
        worse = f1_worse_flips(full_pred, approx_pred, labels, full.shape[1])
        return f1_sensitivity_bound(worse, full_pred, labels, full.shape[1], confidence)
    return None


# --- the guarded bootstrap ------------------------------------------------------------------
def guarded_bootstrap_bound(metric: Metric, labels: Labels, full: np.ndarray, approx: np.ndarray,
                            resamples: Resamples, confidence: float, min_disagreements: int,
                            full_utilities: np.ndarray | None = None) -> LossBound:
    """Paired bootstrap when at least ``min_disagreements`` rows differ; otherwise the
    metric's exact sensitivity bound, or an infinite bound (refused) when it has none."""
    point = metric.utility(labels, full) - metric.utility(labels, approx)
    changed = disagreements(metric, full, approx)
    if changed >= min_disagreements:
        if full_utilities is None:
            full_utilities = metric.utilities(labels, full, resamples.chunks())
        losses = full_utilities - metric.utilities(labels, approx, resamples.chunks())
        upper = float(np.quantile(losses, confidence))
        return LossBound(point, upper, "paired bootstrap",
                         f"{changed} rows differ >= {min_disagreements}; {resamples.count} resamples")
    exact = sensitivity_bound(metric, labels, full, approx, changed, confidence)
    if exact is None:
        return LossBound(point, math.inf, "refused",
                         f"only {changed} rows differ < {min_disagreements}: too few for a "
                         f"bootstrap, and {metric.name} has no exact bound")
    return LossBound(point, exact, "Clopper-Pearson x sensitivity",
                     f"only {changed} rows differ < {min_disagreements}: exact bound on their "
                     "rate times the most they can change the metric")
