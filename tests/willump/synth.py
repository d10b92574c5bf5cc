"""Deterministic synthetic pipelines whose groups have known costs and known signal."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

import willump

#: per-row cost (seconds) of the medium and costly groups, enforced with sleep
MEDIUM_COST = 20e-6
COSTLY_COST = 200e-6


def make_rows(n: int, seed: int, weights=(3.0, 0.7, 0.3), n_classes: int = 2):
    """Columns a, b, c ~ N(0, 1); the label depends on them with the given weights."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({c: rng.normal(size=n) for c in "abc"})
    logit = weights[0] * df.a + weights[1] * df.b + weights[2] * df.c
    if n_classes == 2:
        y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    else:
        noisy = logit + rng.logistic(size=n) * 0.5
        y = np.digitize(noisy, np.quantile(noisy, np.linspace(0, 1, n_classes + 1)[1:-1]))
    return df, np.asarray(y)


#: set False to skip the cost sleeps (e.g. when scoring many fresh rows in a test)
SLEEPING = True


def _sleep_rows(seconds_per_row: float, rows: int) -> None:
    if seconds_per_row > 0 and SLEEPING:
        time.sleep(seconds_per_row * rows)


@willump.feature
def cheap(df):
    return df[["a"]].to_numpy()


@willump.feature
def medium(df):
    _sleep_rows(MEDIUM_COST, len(df))
    return df[["b"]].to_numpy()


@willump.feature
def costly(df):
    _sleep_rows(COSTLY_COST, len(df))
    return df[["c"]].to_numpy()


@willump.pipeline
def three_groups(df):
    return [cheap(df), medium(df), costly(df)]


@willump.feature
def fast_a(df):
    return df[["a"]].to_numpy()


@willump.feature
def fast_bc(df):
    return df[["b", "c"]].to_numpy()


@willump.pipeline
def no_sleep(df):
    """Same signal as three_groups, without the sleeps (for many quick runs)."""
    return [fast_a(df), fast_bc(df)]


#: per-row cost (seconds) of the calibration pipeline's expensive group
CALIBRATION_COST = 5e-6


@willump.feature
def slow_bc(df):
    _sleep_rows(CALIBRATION_COST, len(df))
    return df[["b", "c"]].to_numpy()


@willump.pipeline
def calibration(df):
    """Same signal as no_sleep, with an expensive second group so that cascades pay."""
    return [fast_a(df), slow_bc(df)]


#: per-row costs the statistical tests pass as ``fixed_costs`` (no timing: the outcome must not
#: depend on how fast or loaded the machine is); the same ratios the sleeps stand for
FIXED_COSTS = {
    "three_groups": {"cheap": 1e-6, "medium": MEDIUM_COST, "costly": COSTLY_COST},
    "no_sleep": {"fast_a": 1e-6, "fast_bc": 1e-4},
    "calibration": {"fast_a": 1e-6, "slow_bc": 1e-4},
}


def quiet(pipeline, **extra):
    """optimize() keyword arguments for a statistical test of ``pipeline``: fixed costs, no
    progress output, fewer importance repeats."""
    return dict(verbose=False, importance_repeats=2, fixed_costs=FIXED_COSTS[pipeline.name]) | extra


def default_splits(X, y, split: str = "random", seed: int = 0, **kwargs):
    """The rows optimize's default ("auto") split gives train, selection and certification."""
    from willump._split import auto_shares, make_splits

    holdout, certify_share = auto_shares(len(y))
    return make_splits(X, np.asarray(y), split=split, holdout=holdout, certify_share=certify_share, seed=seed,
                       **kwargs)
