"""LightGBM settings shared by the tabular workloads: the full model and the cheap levels' model."""

from __future__ import annotations

from typing import Any

from lightgbm import LGBMClassifier

#: LightGBM threads. One: this machine has 2 cores shared with other work, and with more
#: threads than free cores OpenMP spin-waits made fits up to 30x and one-row predictions up
#: to 25x slower in our measurements (and timings unrepeatable).
LGBM_THREADS = 1
#: settings common to the tabular workloads (each may override some)
LGBM_DEFAULTS: dict[str, Any] = dict(
    n_estimators=200, learning_rate=0.05, num_leaves=31, min_child_samples=40,
    subsample=0.8, subsample_freq=1, colsample_bytree=0.8, reg_lambda=1.0,
)
#: share of the full model's trees that the cheap levels' model keeps
SMALL_TREE_SHARE = 0.2
#: The model of the cascade's cheap levels (willump's ``small_model``), chosen once, before
#: measuring, and the same for every LightGBM workload whatever its full model:
#:
#: - 1/5 of the default trees (40 of 200): LightGBM's prediction cost grows linearly with the
#:   number of trees, and in these workloads the model, not the features, is most of the cost,
#:   so a cheap level must have a much cheaper model, not only fewer feature groups;
#: - 5x the learning rate (0.25), keeping trees x learning rate (the total shrinkage, 10) as in
#:   the full model: the usual rule for trading trees against learning rate, so that 40 trees
#:   can still fit as far as 200 did instead of stopping a fifth of the way;
#: - 15 leaves (about half of the default 31): shallower trees, cheaper to walk, and a simpler
#:   model for the few groups a cheap level sees;
#: - everything else (rows and columns sampled, regularisation, threads, seed) as the defaults.
#:
#: The cheap level only has to be confident where the answer is easy; the certified loss
#: bound decides how many rows it may answer, and hard rows go on to the full model.
SMALL_LGBM: dict[str, Any] = dict(
    n_estimators=round(LGBM_DEFAULTS["n_estimators"] * SMALL_TREE_SHARE),
    learning_rate=LGBM_DEFAULTS["learning_rate"] / SMALL_TREE_SHARE,
    num_leaves=15,
)


def lgbm(seed: int, **overrides: Any) -> LGBMClassifier:
    """An unfitted LGBMClassifier with the shared defaults, seeded and quiet."""
    params = {**LGBM_DEFAULTS, **overrides}
    return LGBMClassifier(**params, n_jobs=LGBM_THREADS, random_state=seed, verbose=-1)


def small_lgbm(seed: int = 0) -> LGBMClassifier:
    """The unfitted model of the cheap levels (SMALL_LGBM over the shared defaults)."""
    return lgbm(seed, **SMALL_LGBM)
