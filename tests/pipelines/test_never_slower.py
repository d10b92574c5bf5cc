"""Workload.optimize keeps a certified cascade only when it pays (willump's min_speedup and
verify_speedup), and hands the workload's small model to the cheap levels."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from pipelines import _lgbm
from pipelines.workload import Workload

FAST = dict(verbose=False, profile_repeats=2, profile_single_rows=3, importance_repeats=1)
#: seconds per row the slow model sleeps: far above the feature groups
MODEL_SECONDS_PER_ROW = 50e-6
#: seconds per call the round-trip model sleeps, whatever the number of rows
MODEL_SECONDS_PER_CALL = 0.03
#: seconds per row of the second feature group (a lookup), so that the first is the cheap one
LOOKUP_SECONDS_PER_ROW = 2e-6
#: the groups' and the models' costs as the cost model reads them (fixed: the plan must not
#: depend on a loaded machine's timings)
FIXED_COSTS = {"first": 1e-7, "second": LOOKUP_SECONDS_PER_ROW, "<model>": MODEL_SECONDS_PER_ROW}


def _pause(seconds: float) -> None:
    """The models' and the lookup's own time (a test replaces it with a clock it advances)."""
    time.sleep(seconds)


class SlowModel(LogisticRegression):
    """A logistic regression whose predictions cost a fixed time per row (the model dominates)."""

    def predict_proba(self, X):
        _pause(MODEL_SECONDS_PER_ROW * X.shape[0])
        return super().predict_proba(X)


class RoundTripModel(LogisticRegression):
    """A logistic regression behind a remote call: a fixed time per call, however few rows.

    willump's cost model counts model costs per row at batch size, so it expects the full
    model to cost only the share of rows a cascade passes on; timed for real, the cascade
    still pays the whole round trip and is no faster than the full pipeline."""

    def predict_proba(self, X):
        _pause(MODEL_SECONDS_PER_CALL)
        return super().predict_proba(X)


@willump.feature
def first(df):
    return df[["a"]].to_numpy()


@willump.feature
def second(df):
    _pause(LOOKUP_SECONDS_PER_ROW * len(df))
    return df[["b"]].to_numpy()


@willump.pipeline
def two_groups(df):
    return [first(df), second(df)]


def _workload(model, small_model=None, b_weight: float = 1.5, n: int = 6000) -> Workload:
    """Both groups matter, so either one alone is confident only away from the boundary and
    many rows reach the full model (most rows answer early when ``b_weight`` is small)."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n)})
    y = (2 * X["a"] + b_weight * X["b"] + 0.3 * rng.logistic(size=n) > 0).astype(int).to_numpy()
    return Workload("two_groups", "synthetic", two_groups, model, X, y, X.iloc[:100], y[:100],
                    "accuracy", 0.01, {"first": "a", "second": "b"}, small_model=small_model)


def test_a_cascade_expected_slower_is_not_kept():
    w = _workload(SlowModel())
    slow = w.optimize(keep_slower_cascade=True, fixed_costs=FIXED_COSTS, **FAST).report()
    assert slow.plan == "cascade" and slow.expected_speedup < 1.0  # what willump would keep
    assert slow.measured_speedup is None  # keep_slower_cascade: no timing check
    opt = w.optimize(fixed_costs=FIXED_COSTS, **FAST)
    report = opt.report()
    assert report.plan == "full" and len(opt.levels) == 1
    assert "min_speedup" in report.reason and "too little signal" not in report.reason
    assert report.expected_speedup == 1.0 and report.loss_bound is None
    assert [lv.fraction_answered for lv in report.levels] == [1.0]
    np.testing.assert_allclose(opt.predict_proba(w.X_test), opt.baseline.predict_proba(w.X_test))


def test_a_cascade_expected_faster_but_measured_slower_is_not_kept(monkeypatch):
    import willump._models
    import willump._speed

    w = _workload(RoundTripModel(), small_model=LogisticRegression(), b_weight=0.3)
    # the groups' costs fixed (which group is the cheap one must not depend on a loaded
    # machine's timings); the models' profiles and the side-by-side check are timed on a clock
    # that only the models' and the lookup's own time moves, not a stalled machine's
    clock = [0.0]
    monkeypatch.setattr(f"{__name__}._pause", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    timer = type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])})
    for module in (willump._speed, willump._models):
        monkeypatch.setattr(module, "time", timer)
    fixed = dict(fixed_costs={"first": 1e-7, "second": LOOKUP_SECONDS_PER_ROW}, verify_speedup=True)
    # willump's cost model expects the cascade at >= 1.5x; timed side by side it is about 1x
    unchecked = w.optimize(keep_slower_cascade=True, **fixed, **FAST).report()
    assert unchecked.plan == "cascade" and unchecked.expected_speedup >= 1.5
    opt = w.optimize(min_speedup=1.5, **fixed, **FAST)
    report = opt.report()
    assert report.plan == "full" and len(opt.levels) == 1
    assert report.measured_speedup is not None and report.measured_speedup < 1.5
    assert "measured" in report.reason and "below min_speedup 1.5" in report.reason


def test_the_small_model_serves_the_cheap_levels():
    small = LogisticRegression(C=0.01)
    w = _workload(LogisticRegression(), small_model=small)
    opt = w.optimize(keep_slower_cascade=True, max_loss=0.02, **FAST)  # a cascade, paying or not
    assert len(opt.levels) > 1 and opt.levels[-1].model.C == 1.0
    for level in opt.levels[:-1]:
        assert level.model.C == 0.01 and level.model is not small  # cloned, fitted


def test_the_lightgbm_small_model_is_smaller_by_the_stated_rule():
    full, small = _lgbm.lgbm(0), _lgbm.small_lgbm(0)
    assert small.n_estimators == full.n_estimators // 5 == 40
    assert small.num_leaves == 15 < full.num_leaves
    assert small.n_estimators * small.learning_rate == pytest.approx(
        full.n_estimators * full.learning_rate)  # the same total shrinkage
    assert small.n_jobs == full.n_jobs == _lgbm.LGBM_THREADS

