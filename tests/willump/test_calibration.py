"""The guarantee is calibrated where users go: about 1,000 labelled rows, the default bound.

Over many seeds, the certified plan's loss on fresh data exceeds max_loss in at most the share
the confidence allows (plus sampling slack), while most runs still approximate. Costs are fixed
(``fixed_costs``), so the outcome does not depend on how fast or loaded the machine is."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

import willump

from . import synth
from .synth import calibration, make_rows, quiet

SEEDS = 30
ROWS = 1000  # 240 certification rows: the certifiable floor is 0.0153
MAX_LOSS = 0.03
FRESH_ROWS = 100_000
WEIGHTS = (2.0, 1.0, 1.0)


def _loss(opt, metric: str, X, y) -> float:
    if metric == "accuracy":
        return float(np.mean(opt.baseline.predict(X) == y) - np.mean(opt.predict(X) == y))
    return float(roc_auc_score(y, opt.baseline.predict_proba(X)[:, 1]) - roc_auc_score(y, opt.predict_proba(X)[:, 1]))


@pytest.mark.slow
@pytest.mark.parametrize(("metric", "min_cascades"), [("accuracy", SEEDS // 2), ("roc_auc", SEEDS // 4)])
def test_fresh_data_loss_exceeds_max_loss_rarely(metric, min_cascades, monkeypatch):
    monkeypatch.setattr(synth, "SLEEPING", False)
    exceeded, cascades, losses = 0, 0, []
    for seed in range(SEEDS):
        X, y = make_rows(ROWS, seed=seed, weights=WEIGHTS)
        with warnings.catch_warnings():
            warnings.simplefilter("error", willump.WillumpWarning)  # MAX_LOSS is above the floor
            opt = willump.optimize(calibration, LogisticRegression(), X, y, metric=metric,
                                   max_loss=MAX_LOSS, seed=seed, top_k=None, **quiet(calibration))
        X_new, y_new = make_rows(FRESH_ROWS, seed=10_000 + seed, weights=WEIGHTS)
        loss = _loss(opt, metric, X_new, y_new)
        losses.append(loss)
        exceeded += loss > MAX_LOSS
        cascades += opt.report().plan == "cascade"
    # at 95% confidence about 1.5 of 30 runs may exceed; the target is at most 10%
    assert exceeded <= SEEDS // 10, (exceeded, losses)
    assert cascades >= min_cascades, cascades  # not vacuous: runs do approximate


@pytest.mark.slow
def test_gears_hold_their_losses_jointly(monkeypatch):
    """A ladder certified in one fixed sequence: over many seeds, the runs in which *any*
    certified gear's fresh-data loss exceeds its own max_loss stay rare."""
    monkeypatch.setattr(synth, "SLEEPING", False)
    gears = (0.05, 0.08)
    violated, geared = 0, 0
    for seed in range(SEEDS):
        X, y = make_rows(ROWS, seed=seed, weights=WEIGHTS)
        opt = willump.optimize(calibration, LogisticRegression(), X, y, max_loss=MAX_LOSS, gears=gears,
                               seed=seed, top_k=None, **quiet(calibration))
        X_new, y_new = make_rows(FRESH_ROWS, seed=20_000 + seed, weights=WEIGHTS)
        limits = [MAX_LOSS, *gears]
        bad = any(_loss(opt.gear(i), "accuracy", X_new, y_new) > opt.gears_[i].max_loss
                  for i in range(len(opt.gears_)) if opt.is_cascade)
        violated += bad
        geared += len(opt.gears_) > 1
        assert all(g.max_loss in limits for g in opt.gears_)
    assert violated <= SEEDS // 10, violated
    assert geared >= SEEDS // 2, geared  # most runs certify at least one looser gear


@pytest.mark.slow
@pytest.mark.parametrize(("metric", "rows", "max_loss"), [
    ("roc_auc", 2000, 0.005),  # about 700 certification rows
    ("roc_auc", 4800, 0.005),  # about 1,500
    ("accuracy", 2000, 0.005),
    ("f1", 4800, 0.005),
])
def test_the_hard_regime_a_rare_pattern_the_cheap_level_misses(metric, rows, max_loss):
    """The issue's hard regime through the public API: a pattern in 0.5% of rows only the costly
    group sees (benchmarks._guarantee_tasks 'rare'), few certification rows, a tight max_loss. At
    (roc_auc, 2,000 rows) the earlier default (a bootstrap) certified 3 of 30 seeds, and all 3
    exceeded max_loss on fresh data; the exact bound refuses there and certifies about half the
    seeds at 4,800 rows."""
    from benchmarks._guarantee_tasks import fresh_loss, task

    rare = task("rare")
    exceeded = 0
    for seed in range(SEEDS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", willump.WillumpWarning)
            opt = rare.optimize(rows, seed, metric=metric, max_loss=max_loss)
        if opt.is_cascade:
            X, y = rare.fresh(seed)
            exceeded += fresh_loss(opt, metric, X, y) > max_loss
    assert exceeded <= 1, exceeded  # deterministic seeds; 0 when written, 3 of 30 for the old AUC default
