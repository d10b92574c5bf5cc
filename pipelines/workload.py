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
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score
from sklearn.model_selection import train_test_split

import willump

#: share of rows held out as the benchmark's test split
TEST_SIZE = 0.25
#: default confidence of the optimizer's loss bound
CONFIDENCE = 0.95
#: default k for top-K queries
TOP_K = 100
#: ``min_speedup`` passed to willump with ``keep_slower_cascade``: any positive speedup passes
ANY_SPEEDUP = 1e-9


@dataclass
class Workload:
    """Everything needed to optimize a pipeline and measure it against the baseline.

    ``model`` is an unfitted estimator (willump fits the full model from it);
    ``small_model`` is willump's ``small_model``, the model of the cascade's cheap levels and
    of the top-K filter (None: the same class and settings as ``model``);
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
    small_model: Any = None
    notes: list[str] = field(default_factory=list)

    def optimize(self, *, keep_slower_cascade: bool = False, **overrides: Any) -> willump.OptimizedPipeline:
        """``willump.optimize`` with this workload's metric, max_loss, confidence, k, seed and
        small model; keyword arguments override them (e.g. ``verbose=False``,
        ``profile_repeats=2``).

        willump keeps a certified cascade only when it pays: its expected cost must be below
        the full pipeline's (``min_speedup=1``), and timed side by side with the full pipeline
        on held-out rows it must measure at least as fast (``verify_speedup``); otherwise the
        full pipeline serves and ``report().reason`` says why. ``keep_slower_cascade`` turns
        both checks off (to study the cascade willump would otherwise drop).
        """
        kwargs: dict[str, Any] = dict(
            metric=self.metric, max_loss=self.max_loss, confidence=self.confidence,
            top_k=self.k, seed=self.seed, small_model=self.small_model,
        )
        if keep_slower_cascade:
            kwargs.update(min_speedup=ANY_SPEEDUP, verify_speedup=False)
        kwargs.update(overrides)
        return willump.optimize(self.pipeline, self.model, self.X_train, self.y_train, **kwargs)

    def summary(self) -> str:
        """A few lines: rows, classes, groups, model, metric."""
        classes, counts = np.unique(self.y_train, return_counts=True)
        share = ", ".join(f"{c}: {n / counts.sum():.1%}" for c, n in zip(classes, counts, strict=True))
        lines = [
            f"{self.name}: {self.description}",
            f"  rows: train {len(self.X_train)}, test {len(self.X_test)}; classes {share}",
            f"  model: {self.model!r}",
            f"  cheap levels' model: {'same as the model' if self.small_model is None else repr(self.small_model)}",
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


def score(metric: str, y: np.ndarray, proba: np.ndarray, classes: np.ndarray) -> float:
    """The workload metric as willump defines it: accuracy; F1 of the second class (binary)
    or macro F1; ROC AUC of the second class (binary) or macro one-vs-rest."""
    pred = classes[np.argmax(proba, axis=1)]
    if metric == "accuracy":
        return float(accuracy_score(y, pred))
    if metric == "f1":
        if len(classes) == 2:
            return float(f1_score(y, pred, pos_label=classes[1]))
        return float(f1_score(y, pred, average="macro", labels=classes))
    if metric == "roc_auc":
        if len(classes) == 2:
            return float(roc_auc_score(y == classes[1], proba[:, 1]))
        return float(roc_auc_score(y, proba, multi_class="ovr", average="macro", labels=classes))
    raise ValueError(f"metric {metric!r} is not one the benchmark can score")
