"""LightGBM settings shared by the tabular workloads."""

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


def lgbm(seed: int, **overrides: Any) -> LGBMClassifier:
    """An unfitted LGBMClassifier with the shared defaults, seeded and quiet."""
    params = {**LGBM_DEFAULTS, **overrides}
    return LGBMClassifier(**params, n_jobs=LGBM_THREADS, random_state=seed, verbose=-1)
