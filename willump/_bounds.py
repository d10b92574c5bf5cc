"""Upper confidence bounds on the loss of an approximation against the full pipeline.

Which bound a metric gets (``bound="auto"``), all but the last valid at any number of rows:

- **exact** for rowwise metrics (accuracy, error rate, any per-row 0/1 metric): the exact
  unconditional test on worse and better rows (``willump._paired_exact``); both sides of the
  paired difference count.
- **exact** for ROC AUC: a betting bound on pair losses made independent (``willump._betting``).
- **exact** for F1: an exact bound on the rate of worse flips times the most such a flip can
  lower F1 (``f1_sensitivity_bound``).
- **paired bootstrap** for everything else (log loss, balanced accuracy, scorers, callables):
  asymptotic, used only when at least ``min_disagreements`` rows differ between the two
  pipelines as the metric sees them; below that the plan is refused. The report says so.

``bound="product"`` keeps the earlier rowwise rule (Clopper-Pearson on the disagreement rate
times the worse share, each at ``alpha / 2``) for comparison. Every bound has a *floor*: the
smallest loss it can certify with the rows at hand when nothing differs
(:func:`certifiable_floor`); a ``max_loss`` below it is refused for every metric.

A :class:`LossBound` decides ``within(max_loss)`` by the bound's own test (a p-value for the
exact rowwise test, cheaper than its bisection) and computes ``upper`` only when asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from scipy import stats

from . import _betting, _paired_exact
from ._metrics import Labels, Metric

#: bootstrap resamples used to certify a plan (the guarantee)
N_BOOTSTRAP = 1000
#: bootstrap resamples used to compare candidate plans before certification
N_BOOTSTRAP_SELECT = 200
#: rows that must differ between the pipelines (as the metric sees them) before a
#: bootstrap bound is trusted; below it the plan is refused
MIN_DISAGREEMENTS = 50
#: largest resamples x rows float64 block materialized at once
BOOTSTRAP_CHUNK_ELEMENTS = 1 << 22
#: resample counts kept in memory (uint8) up to this many bytes; beyond, chunks are redrawn
RESAMPLES_STORED_BYTES = 1 << 28
#: bound methods a caller may ask for
BOUNDS = ("auto", "exact", "product", "bootstrap")


class LossBound:
    """Loss of an approximation against the full pipeline, its upper confidence bound, and
    which bound produced it and why.

    ``upper`` may be computed lazily (``compute``); ``within(max_loss)`` uses ``test`` when
    given (a level-alpha test of ``loss >= max_loss``), else compares ``upper``."""

    def __init__(self, point: float, upper: float | None, method: str, detail: str = "", *,
                 compute: Callable[[], float] | None = None,
                 test: Callable[[float], bool] | None = None):
        if upper is None and compute is None:
            raise ValueError("a LossBound needs an upper value or a way to compute it")
        self.point = point
        self._upper = upper
        self._compute = compute
        self._test = test
        self.method = method
        self.detail = detail

    @property
    def upper(self) -> float:
        if self._upper is None:
            assert self._compute is not None
            self._upper = float(self._compute())
        return self._upper

    def within(self, max_loss: float) -> bool:
        """True when the bound certifies ``loss <= max_loss``."""
        if self._upper is not None or self._test is None:
            return self.upper <= max_loss
        return bool(self._test(max_loss))

    def __repr__(self) -> str:
        shown = "lazy" if self._upper is None else f"{self._upper:.5f}"
        return f"LossBound(point={self.point:+.5f}, upper={shown}, method={self.method!r})"


class JointBound(LossBound):
    """Several risks certified at once (Learn-then-Test): the overall loss within ``max_loss``
    and each segment's within ``segment_max_loss``. The plan passes only when every test
    rejects, an intersection-union test: valid at the same ``1 - confidence`` with no correction
    for the number of risks. ``upper`` is the overall bound; the segments' are in ``segments``."""

    def __init__(self, overall: LossBound, segments: dict[Any, LossBound], segment_max_loss: float,
                 sizes: dict[Any, int]):
        super().__init__(overall.point, overall._upper, overall.method, overall.detail,
                         compute=overall._compute, test=overall._test)
        self.overall = overall
        self.segments = segments
        self.segment_max_loss = segment_max_loss
        self.sizes = sizes

    @property
    def upper(self) -> float:
        return self.overall.upper

    def within(self, max_loss: float) -> bool:
        return self.overall.within(max_loss) and all(
            b.within(self.segment_max_loss) for b in self.segments.values())

    def failing_segments(self) -> list[Any]:
        return [s for s, b in self.segments.items() if not b.within(self.segment_max_loss)]

    @property
    def detail(self) -> str:  # type: ignore[override]
        failing = self.failing_segments()
        worst = "" if not failing else f"; segments over {self.segment_max_loss}: {failing[:5]}"
        return f"{self.overall.detail}; {len(self.segments)} segments each within {self.segment_max_loss}" \
            if not failing else f"{self.overall.detail}{worst}"

    @detail.setter
    def detail(self, value: str) -> None:
        pass


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


# --- rowwise bounds -----------------------------------------------------------------------
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


def product_paired_upper(worse: Any, better: Any, n: int, confidence: float) -> Any:
    """The earlier rowwise rule, ``d_hi * max(2 q_hi - 1, 0)`` (elementwise over arrays of
    counts): Clopper-Pearson limits of the disagreement rate and of the worse share among
    disagreements, each at ``alpha / 2``. Valid at any n, but it multiplies two worst cases;
    kept so ``bound="product"`` and the benchmarks can compare."""
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


def rowwise_floor(n: int, confidence: float, rule: str = "exact") -> float:
    """Smallest loss a rowwise bound certifies with n rows (no disagreement at all)."""
    if rule == "product":
        return product_paired_upper(0, 0, n, confidence)
    return _paired_exact.floor(n, confidence)


def rowwise_rows_needed(max_loss: float, confidence: float, rule: str = "exact") -> int:
    """Certification rows a rowwise bound needs to certify ``max_loss`` at best."""
    if max_loss <= 0:
        return math.inf  # type: ignore[return-value]
    if rule == "product":
        return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log1p(-max_loss))
    return _paired_exact.rows_needed(max_loss, confidence)


def rowwise_bound(worse_max: int, better_min: int, ambiguous: int, n: int, point: float,
                  confidence: float, rule: str = "exact", projected_from: int | None = None) -> LossBound:
    """Rowwise bound from counts. ``worse_max`` / ``better_min`` count rows worse / better
    under the least favourable routing of the ``ambiguous`` rows (rows a served runtime may
    route either way): the exact test's p-value grows with worse rows and shrinks with better
    ones, so those counts are its worst case over every routing; the product rule takes the
    largest bound over the outcomes the ambiguous rows allow. ``projected_from``: the counts
    were scaled from that many selection rows to n (a prediction, not a certificate)."""
    detail = f"{worse_max} worse, {better_min} better of {n} rows"
    if projected_from is not None:
        detail += f" (projected from {projected_from} selection rows)"
    if ambiguous:
        detail += f" ({ambiguous} within the routing tolerance counted at their worst)"
    if rule == "product":
        upper = float(np.max(product_paired_upper(worse_max, better_min + np.arange(ambiguous + 1), n,
                                                  confidence)))
        return LossBound(point, upper, "product paired (Clopper-Pearson x2)", detail)
    w, b, rows = int(worse_max), int(better_min), int(n)
    return LossBound(point, None, "exact paired (unconditional)", detail,
                     compute=lambda: _paired_exact.upper(w, b, rows, float(confidence)),
                     test=lambda m: _paired_exact.rejects(w, b, rows, m, confidence))


# --- F1 -----------------------------------------------------------------------------------
def f1_flip_counts(full_pred: np.ndarray, approx_pred: np.ndarray, labels: Labels,
                   targets: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Per F1 class: worse flips (a true positive lost or a false positive gained), rows the
    full pipeline predicts as the class, and rows labelled the class."""
    y = labels.index
    worse, predicted, positives = [], [], []
    for c in targets:
        lost_tp = (full_pred == c) & (approx_pred != c) & (y == c)
        new_fp = (full_pred != c) & (approx_pred == c) & (y != c)
        worse.append(int(np.sum(lost_tp | new_fp)))
        predicted.append(int(np.sum(full_pred == c)))
        positives.append(int(np.sum(y == c)))
    return worse, predicted, positives


def f1_sensitivity_bound(worse: list[int], predicted: list[int], positives: list[int], n: int,
                         confidence: float) -> float:
    """F1 lost <= 2u / (S - u) per class, u the share of worse flips and S = predicted-positive
    share + positive share of the full pipeline; better flips only raise F1. u at alpha/2, each
    part of S at alpha/4 (split over classes for macro F1). Exact at any n."""
    alpha = (1.0 - confidence) / 2.0
    a = alpha / len(worse)
    total = 0.0
    for w, p, k in zip(worse, predicted, positives, strict=True):
        u = cp_upper(w, n, a)
        s = cp_lower(p, n, a / 2) + cp_lower(k, n, a / 2)
        if s - u <= 0:
            return math.inf
        total += 2 * u / (s - u)
    return min(1.0, total / len(worse))


# --- exact bounds for score metrics ----------------------------------------------------------
def has_exact_bound(metric: Metric) -> bool:
    return metric.kind == "rowwise" or metric.builtin in ("roc_auc", "f1")


def exact_score_bound(metric: Metric, labels: Labels, full: np.ndarray, approx: np.ndarray,
                      confidence: float, seed: int = 0, project_to: int | None = None) -> LossBound:
    """The exact bound of ROC AUC or F1. ``project_to``: the bound these rows predict for a
    certification split of that many rows (counts scaled, or pair losses resampled)."""
    point = metric.utility(labels, full) - metric.utility(labels, approx)
    n = len(labels)
    if metric.builtin == "roc_auc":
        targets = [1] if full.shape[1] == 2 else list(range(full.shape[1]))
        level = 1.0 - (1.0 - confidence) / len(targets)
        values, seen = [], 0
        for index, c in enumerate(targets):
            h = _betting.pair_means(labels.index == c, full[:, c], approx[:, c], seed + index)
            seen += int(np.count_nonzero(h))
            if project_to is not None and len(h):
                share = min(np.mean(labels.index == c), 1 - np.mean(labels.index == c))
                size = max(1, round(project_to * share))
                h = h[np.random.default_rng(seed + 31 * index).integers(0, len(h), size)]
            values.append(_betting.betting_upper(h, level, seed + 7919 * (index + 1)) if len(h) else 1.0)
        detail = f"{seen} minority rows with a pair ordered differently"
        if project_to is not None:
            detail += f" (projected from {n} selection rows to {project_to})"
        return LossBound(point, float(min(1.0, np.mean(values))), "exact pairs (betting)", detail)
    assert metric.builtin == "f1"
    targets = metric.f1_targets(labels.classes)
    worse, predicted, positives = f1_flip_counts(full.argmax(axis=1), approx.argmax(axis=1), labels, targets)
    rows, detail = n, f"{sum(worse)} worse flips of {n} rows"
    if project_to is not None and n:
        scale = project_to / n
        worse = [round(w * scale) for w in worse]
        predicted = [round(p * scale) for p in predicted]
        positives = [round(k * scale) for k in positives]
        rows, detail = project_to, detail + f" (projected to {project_to} rows)"
    upper = f1_sensitivity_bound(worse, predicted, positives, rows, confidence)
    return LossBound(point, upper, "Clopper-Pearson x sensitivity", detail)


# --- floors ------------------------------------------------------------------------------------
def certifiable_floor(metric: Metric, method: str, labels: Labels, full: np.ndarray,
                      confidence: float) -> float:
    """Smallest loss the metric's bound can certify on these certification rows: the bound when
    the approximation agrees with the full pipeline everywhere. ROC AUC's is the rowwise floor
    of its minority class; a bootstrap metric's is the rowwise floor (no honest bound on n rows
    certifies less than an exact one on a 0/1 outcome)."""
    n = len(labels)
    if method == "product":
        return rowwise_floor(n, confidence, "product")
    if method == "exact" and metric.builtin == "roc_auc":
        return _betting.auc_floor(labels, full.shape[1], confidence)
    if method == "exact" and metric.builtin == "f1" and metric.kind != "rowwise":
        targets = metric.f1_targets(labels.classes)
        _, predicted, positives = f1_flip_counts(full.argmax(axis=1), full.argmax(axis=1), labels, targets)
        return f1_sensitivity_bound([0] * len(targets), predicted, positives, n, confidence)
    return rowwise_floor(n, confidence)


def rows_needed(metric: Metric, method: str, labels: Labels, max_loss: float, confidence: float,
                full: np.ndarray | None = None) -> int:
    """Certification rows the metric's bound needs for ``max_loss`` at best (ROC AUC: scaled by
    the minority share of these labels; F1: at the shares of positives and of the full pipeline's
    positive predictions these rows show, which ``full`` gives)."""
    base = rowwise_rows_needed(max_loss, confidence, "product" if method == "product" else "exact")
    n = len(labels)
    if method == "exact" and metric.builtin == "f1" and full is not None and n:
        targets = metric.f1_targets(labels.classes)
        _, predicted, positives = f1_flip_counts(full.argmax(axis=1), full.argmax(axis=1), labels, targets)

        def certifies(rows: int) -> bool:
            scaled = [[round(c * rows / n) for c in counts] for counts in (predicted, positives)]
            return f1_sensitivity_bound([0] * len(targets), *scaled, rows, confidence) <= max_loss

        lo, hi = 1, max(base, 2)
        while not certifies(hi):
            lo, hi = hi, hi * 2
            if hi > 1 << 40:
                return math.inf  # type: ignore[return-value]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if certifies(mid) else (mid, hi)
        return hi
    if method == "exact" and metric.builtin == "roc_auc" and n:
        classes = np.unique(labels.index[labels.index >= 0])
        shares = [min(np.mean(labels.index == c), 1 - np.mean(labels.index == c)) for c in classes]
        share = min(shares) if shares else 0.0
        return math.inf if share <= 0 else math.ceil(base / share)  # type: ignore[return-value]
    return base


# --- the guarded bootstrap ----------------------------------------------------------------------
def disagreements(metric: Metric, full: np.ndarray, approx: np.ndarray, labels: Labels | None = None,
                  seed: int = 0) -> int:
    """Rows whose part in the metric changes: predicted labels for label metrics; for ROC AUC
    minority rows with a pair ordered differently (not rows whose score moved, which is every
    row a cascade answers early); probabilities otherwise."""
    if metric.sees_labels_only:
        return int(np.sum(full.argmax(axis=1) != approx.argmax(axis=1)))
    if metric.builtin == "roc_auc" and labels is not None:
        targets = [1] if full.shape[1] == 2 else list(range(full.shape[1]))
        return sum(int(np.count_nonzero(_betting.pair_means(labels.index == c, full[:, c], approx[:, c],
                                                            seed + i)))
                   for i, c in enumerate(targets))
    return int(np.sum(np.any(full != approx, axis=1)))


def guarded_bootstrap_bound(metric: Metric, labels: Labels, full: np.ndarray, approx: np.ndarray,
                            resamples: Resamples, confidence: float, min_disagreements: int,
                            full_utilities: np.ndarray | None = None) -> LossBound:
    """Paired bootstrap when at least ``min_disagreements`` rows differ; otherwise the metric's
    exact bound (ROC AUC, F1, rowwise), or an infinite bound (refused) when it has none."""
    point = metric.utility(labels, full) - metric.utility(labels, approx)
    changed = disagreements(metric, full, approx, labels)
    if changed >= min_disagreements:
        if full_utilities is None:
            full_utilities = metric.utilities(labels, full, resamples.chunks())
        losses = full_utilities - metric.utilities(labels, approx, resamples.chunks())
        upper = float(np.quantile(losses, confidence))
        return LossBound(point, upper, "paired bootstrap",
                         f"{changed} rows differ >= {min_disagreements}; {resamples.count} resamples "
                         "(asymptotic, not exact)")
    if metric.builtin in ("roc_auc", "f1"):
        exact = exact_score_bound(metric, labels, full, approx, confidence)
        exact.detail = f"only {changed} rows differ < {min_disagreements}: " + exact.detail
        return exact
    return LossBound(point, math.inf, "refused",
                     f"only {changed} rows differ < {min_disagreements}: too few for a "
                     f"bootstrap, and {metric.name} has no exact bound")
