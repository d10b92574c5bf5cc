"""A certified cascade that is not faster than the full pipeline is not kept."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

import willump
from pipelines.guard import full_unless_faster
from pipelines.workload import Workload

#: seconds per row the slow model sleeps: far above the feature groups
MODEL_SECONDS_PER_ROW = 50e-6


class SlowModel(LogisticRegression):
    """A logistic regression whose predictions cost a fixed time per row (the model dominates)."""

    def predict_proba(self, X):
        time.sleep(MODEL_SECONDS_PER_ROW * X.shape[0])
        return super().predict_proba(X)


@willump.feature
def first(df):
    return df[["a"]].to_numpy()


@willump.feature
def second(df):
    return df[["b"]].to_numpy()


@willump.pipeline
def model_bound(df):
    return [first(df), second(df)]


def _workload(n: int = 6000) -> Workload:
    """Both groups matter, so either one alone is confident only far from the boundary and
    many rows reach the full model: with the model dominating, any cascade is slower."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n)})
    y = (2 * X["a"] + 1.5 * X["b"] + 0.3 * rng.logistic(size=n) > 0).astype(int).to_numpy()
    return Workload("model_bound", "synthetic", model_bound, SlowModel(), X, y, X.iloc[:100],
                    y[:100], "accuracy", 0.01, {"first": "a", "second": "b"})


def test_slower_cascade_becomes_the_full_pipeline():
    w = _workload()
    fast = dict(verbose=False, profile_repeats=2, profile_single_rows=3, importance_repeats=1)
    raw = w.optimize(keep_slower_cascade=True, **fast)
    assert raw.report().plan == "cascade" and raw.report().expected_speedup < 1.0
    kept = full_unless_faster(raw)  # decided by the optimizer's own cost model
    report = kept.report()
    assert report.plan == "full" and len(kept.levels) == 1
    assert "no faster than the full pipeline" in report.reason
    remeasured = full_unless_faster(raw, w.X_train.iloc[:1000]).report()  # timed side by side
    assert remeasured.plan == "full" and "re-measured side by side on 1000" in remeasured.reason
    assert [lv.fraction_answered for lv in report.levels] == [1.0]
    assert report.expected_speedup == 1.0 and report.loss_bound is None
    np.testing.assert_allclose(kept.predict_proba(w.X_test), kept.baseline.predict_proba(w.X_test))
    assert raw.report().plan == "cascade"  # the original is left as it was
    assert w.optimize(**fast).report().plan == "full"
