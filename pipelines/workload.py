"""A workload: a decorated pipeline, its model, the data split, and what "good" means.

Every workload module (``pipelines.toxic``, ``pipelines.flights``, ...) exposes
``build(data_dir=None, seed=0, ...) -> Workload``. The test split is held out of
everything the optimizer sees (vectorizers, lookup tables and models are fitted on
the training split only), so the benchmark measures on rows never used to choose
or certify a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
#: training rows on which a certified cascade's speedup is re-measured (see pipelines.guard)
REMEASURE_ROWS = 4096


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

        A certified cascade that is not faster than the full pipeline, re-measured side by
        side on up to REMEASURE_ROWS training rows, is replaced by the full pipeline (see
        :func:`pipelines.guard.full_unless_faster`) unless ``keep_slower_cascade``.
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
        from .guard import full_unless_faster

        rng = np.random.default_rng(self.seed)
        pick = np.sort(rng.choice(len(self.X_train), min(REMEASURE_ROWS, len(self.X_train)), replace=False))
        kept = full_unless_faster(opt, self.X_train.iloc[pick])
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

