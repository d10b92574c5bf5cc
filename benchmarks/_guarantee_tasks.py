"""Tasks the guarantee is simulated on (``benchmarks.guarantee``): labelled rows a user would
have, and fresh rows from the same distribution to measure the served plan's true loss on.

- ``logistic``: three standard normal columns, label logistic in ``2a + b + c``; the cheap group
  reads a, the costly one b and c. Cascades that lose little exist at every size.
- ``rare``: the same, plus a pattern in a share of rows (``RARE_SHARE``) that only the costly
  group sees and that makes the row positive: the cheap level answers those rows early and
  wrongly. The regime where the bootstrap over-certified ROC AUC.
- ``adult``: UCI Adult (32,561 rows, ``pipelines.adult``'s pipeline and LightGBM): each seed draws
  the labelled rows from the file, and the rest of the file is the fresh data.
- ``toxic``: Davidson's tweets (24,783 rows, ``pipelines.toxic``'s word and character TF-IDF and
  logistic regression), drawn the same way: a user with a few thousand labelled texts.

Costs are fixed (``fixed_costs``), so nothing depends on how fast the machine is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, roc_auc_score

import willump

#: label weights of the synthetic columns a (cheap group), b and c (costly group)
WEIGHTS = (2.0, 1.0, 1.0)
#: share of rows carrying the pattern only the costly group sees (``rare``): at 0.5% the earlier
#: default ROC AUC bound certified cascades that exceeded max_loss=0.005 on fresh data
RARE_SHARE = 0.005
#: fresh rows per seed for the synthetic tasks
FRESH_ROWS = 100_000


@willump.feature
def cheap_a(df):
    return df[["a"]].to_numpy()


@willump.feature
def costly_bc(df):
    return df[["b", "c"]].to_numpy()


@willump.feature
def costly_bcp(df):
    return df[["b", "c", "p"]].to_numpy()


@willump.pipeline
def two_groups(df):
    return [cheap_a(df), costly_bc(df)]


@willump.pipeline
def rare_groups(df):
    return [cheap_a(df), costly_bcp(df)]


def _synthetic(n: int, seed: int, rare_share: float) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({c: rng.normal(size=n) for c in "abc"})
    logit = WEIGHTS[0] * X.a + WEIGHTS[1] * X.b + WEIGHTS[2] * X.c
    if rare_share:
        X["p"] = (rng.random(n) < rare_share).astype(float)
        logit = logit + 6.0 * X["p"]
    return X, (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int).to_numpy()


@dataclass
class Task:
    """A pipeline, its models and fixed costs, and where its rows come from."""

    name: str
    pipeline: Callable[[], willump.Pipeline]
    model: Callable[[int], Any]
    costs: dict[str, float]
    draw: Callable[[int, int], tuple[pd.DataFrame, np.ndarray]]  # (rows, seed) -> labelled rows
    fresh: Callable[[int], tuple[pd.DataFrame, np.ndarray]]  # seed -> fresh rows
    small_model: Callable[[int], Any] | None = None

    def optimize(self, n: int, seed: int, **kwargs: Any) -> willump.OptimizedPipeline:
        X, y = self.draw(n, seed)
        small = None if self.small_model is None else self.small_model(seed)
        options = {"top_k": None, "verbose": False, "fixed_costs": self.costs, "small_model": small} | kwargs
        return willump.optimize(self.pipeline(), self.model(seed), X, y, seed=seed, **options)


def _logistic_task(name: str, share: float) -> Task:
    pipeline = rare_groups if share else two_groups
    costly = "costly_bcp" if share else "costly_bc"
    return Task(name, lambda: pipeline, lambda seed: LogisticRegression(), {"cheap_a": 1e-6, costly: 1e-4},
                lambda n, seed: _synthetic(n, seed, share),
                lambda seed: _synthetic(FRESH_ROWS, 10_000 + seed, share))


def _adult_task() -> Task:
    from pipelines import adult
    from pipelines.datasets import load_adult

    frame = load_adult(None)
    draw, fresh = _drawn_from(frame[adult.REQUEST_COLUMNS].reset_index(drop=True),
                              frame["income"].to_numpy(dtype=object))
    costs = {"numeric": 1e-6, "capital": 1e-6, "household": 2e-6, "work": 2e-5, "origin": 1e-5}
    return Task("adult", adult.make_pipeline, adult.model, costs, draw, fresh, small_model=adult.small_model)


def _drawn_from(X_all: pd.DataFrame, y_all: np.ndarray):
    """(draw, fresh) over a data file: each seed's labelled rows, and the rest of the file."""
    drawn: dict[int, np.ndarray] = {}

    def draw(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
        rows = np.random.default_rng(seed).permutation(len(X_all))[:n]
        drawn[seed] = rows
        return X_all.iloc[rows].reset_index(drop=True), y_all[rows]

    def fresh(seed: int) -> tuple[pd.DataFrame, np.ndarray]:
        rest = np.setdiff1d(np.arange(len(X_all)), drawn[seed])
        return X_all.iloc[rest].reset_index(drop=True), y_all[rest]

    return draw, fresh


def _toxic_task() -> Task:
    from pipelines import toxic
    from pipelines.datasets import load_davidson

    frame = load_davidson(None)
    X_all = pd.DataFrame({"tweet": frame["tweet"].astype(str).to_numpy()})
    y_all = (frame["class"].to_numpy() != 2).astype(int)  # offensive or hate
    draw, fresh = _drawn_from(X_all, y_all)
    # per-row costs measured on the project machine (REFERENCES.md: 56 ms and 1,420 ms per 6,196 rows)
    costs = {"word_tfidf": 9e-6, "char_tfidf": 2.3e-4}
    return Task("toxic", toxic.make_pipeline, lambda seed: toxic.model(), costs, draw, fresh)


def task(name: str) -> Task:
    """A task by name: 'logistic', 'rare', 'adult' or 'toxic'."""
    if name == "logistic":
        return _logistic_task("logistic", 0.0)
    if name == "rare":
        return _logistic_task("rare", RARE_SHARE)
    if name == "adult":
        return _adult_task()
    if name == "toxic":
        return _toxic_task()
    raise ValueError(f"task must be 'logistic', 'rare', 'adult' or 'toxic', got {name!r}")


def fresh_loss(opt: willump.OptimizedPipeline, metric: str, X: pd.DataFrame, y: np.ndarray, gear: int = 0) -> float:
    """The served plan's loss against the full pipeline on fresh rows, in the metric's favour."""
    served = opt.gear(gear)
    base, mine = opt.baseline.predict_proba(X), served.predict_proba(X)
    classes = opt.classes_
    if metric == "accuracy":
        return float(np.mean(classes[base.argmax(1)] == y) - np.mean(classes[mine.argmax(1)] == y))
    positive = y == classes[1]
    if metric == "roc_auc":
        return float(roc_auc_score(positive, base[:, 1]) - roc_auc_score(positive, mine[:, 1]))
    if metric == "f1":
        return float(f1_score(positive, base.argmax(1) == 1) - f1_score(positive, mine.argmax(1) == 1))
    raise ValueError(f"metric must be 'accuracy', 'roc_auc' or 'f1', got {metric!r}")
