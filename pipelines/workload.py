"""A workload: a decorated pipeline, its model, the data split, and what "good" means.

Every workload module (``pipelines.toxic``, ``pipelines.flights``, ...) exposes
``build(data_dir=None, seed=0, ...) -> Workload``. The test split is held out of
everything the optimizer sees (vectorizers, lookup tables and models are fitted on
the training split only), so the benchmark measures on rows never used to choose
or certify a plan.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

import willump

#: share of rows held out as the benchmark's test split
TEST_SIZE = 0.25
#: default confidence of the optimizer's loss bound
CONFIDENCE = 0.95
#: default k for top-K queries
TOP_K = 100
#: a cascade must be expected to be faster than this multiple of the full pipeline to be kept
MIN_CASCADE_SPEEDUP = 1.0


@dataclass
class Workload:
    """Everything needed to optimize a pipeline and measure it against the baseline.

    ``model`` is an unfitted estimator (willump fits the full and the small models);
    ``topk_label`` is the class whose top-K rows are queried (None: the last class).
    ``store`` is the feature store the lookups go through, when the workload has one.
    """

    name: str
    description: str
    pipeline: willump.Pipeline
    model: Any
    X_train: pd.DataFrame
    y_train: np.ndarray
    X_test: pd.DataFrame
    y_test: np.ndarray
    metric: str
    max_loss: float
    groups: dict[str, str]
    seed: int = 0
    confidence: float = CONFIDENCE
    k: int = TOP_K
    topk_label: Any = None
    store: Any = None
    notes: list[str] = field(default_factory=list)

    def optimize(self, *, keep_slower_cascade: bool = False, **overrides: Any) -> willump.OptimizedPipeline:
        """``willump.optimize`` with this workload's metric, max_loss, confidence, k and seed;
        keyword arguments override them (e.g. ``verbose=False``, ``profile_repeats=2``).

        A cascade the optimizer expects to be *slower* than the full pipeline is replaced
        by the full pipeline (see :func:`full_unless_faster`) unless ``keep_slower_cascade``.
        """
        kwargs: dict[str, Any] = dict(
            metric=self.metric, max_loss=self.max_loss, confidence=self.confidence,
            top_k=self.k, seed=self.seed,
        )
        kwargs.update(overrides)
        verbose = kwargs.get("verbose", True)
        opt = willump.optimize(self.pipeline, self.model, self.X_train, self.y_train, **kwargs)
        if keep_slower_cascade:
            return opt
        kept = full_unless_faster(opt)
        if verbose and kept is not opt:
            print(f"pipelines: {kept.report().reason}")
        return kept

    def summary(self) -> str:
        """A few lines: rows, classes, groups, model, metric."""
        classes, counts = np.unique(self.y_train, return_counts=True)
        share = ", ".join(f"{c}: {n / counts.sum():.1%}" for c, n in zip(classes, counts, strict=True))
        lines = [
            f"{self.name}: {self.description}",
            f"  rows: train {len(self.X_train)}, test {len(self.X_test)}; classes {share}",
            f"  model: {self.model!r}",
            f"  metric {self.metric}, max_loss {self.max_loss}, confidence {self.confidence}, "
            f"top-K k={self.k}",
        ]
        lines += [f"  group {name}: {text}" for name, text in self.groups.items()]
        return "\n".join(lines)


def split(
    X: pd.DataFrame, y: np.ndarray, *, seed: int, test_size: float = TEST_SIZE
) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame, np.ndarray]:
    """Stratified, seeded train/test split; frames get a fresh RangeIndex."""
    y = np.asarray(y)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=seed, stratify=y
    )
    return X_train.reset_index(drop=True), y_train, X_test.reset_index(drop=True), y_test


def subsample(
    X: pd.DataFrame, y: np.ndarray, n_rows: int | None, *, seed: int
) -> tuple[pd.DataFrame, np.ndarray]:
    """At most ``n_rows`` rows, stratified and seeded (all rows when None)."""
    y = np.asarray(y)
    if n_rows is None or n_rows >= len(X):
        return X.reset_index(drop=True), y
    if n_rows < 100:
        raise ValueError(f"n_rows must be at least 100 (or None for all rows), got {n_rows}")
    X_sub, _, y_sub, _ = train_test_split(X, y, train_size=n_rows, random_state=seed, stratify=y)
    return X_sub.reset_index(drop=True), y_sub


def full_unless_faster(opt: willump.OptimizedPipeline,
                       min_speedup: float = MIN_CASCADE_SPEEDUP) -> willump.OptimizedPipeline:
    """The full pipeline in place of a certified cascade that is not expected to be faster.

    willump.optimize returns the cheapest cascade within ``max_loss`` even when its
    expected cost is above the full pipeline's (when the model, not the features,
    dominates the cost, a cheap level costs as much as the full pipeline). Such a plan
    only adds work, so this keeps the full pipeline instead, with a report that says
    why; the top-K filter is kept (it is planned, and only used, when it is cheaper).
    """
    report = opt.report()
    if report.plan != "cascade" or report.expected_speedup > min_speedup:
        return opt
    groups = list(opt.levels[-1].groups)
    note = (
        f"the certified cascade {' -> '.join(str(list(lv.groups)) for lv in opt.levels)} "
        f"(threshold {opt.levels[0].threshold:.4f}, loss bound {report.loss_bound:.4f}) was "
        f"expected at {report.expected_speedup:.2f}x, no faster than the full pipeline"
    )
    full = copy.copy(opt)
    full.levels = [opt.levels[-1]]
    full.report_ = replace(
        report,
        plan="full",
        reason=f"full pipeline: {note} (its cheap level costs about as much as the full "
        "pipeline: the model, not the features, dominates)",
        loss=None,
        loss_bound=None,
        optimized_score=report.baseline_score,
        expected_speedup=1.0,
        expected_speedup_row=1.0,
        groups=[replace(g, level=0) for g in report.groups],
        levels=[replace(report.levels[-1], index=0, groups=groups, threshold=None, fraction_answered=1.0)],
        models={k: v for k, v in report.models.items() if not k.startswith("level")},
        notes=[*report.notes, f"pipelines.full_unless_faster: {note}; kept the full pipeline"],
    )
    return full
