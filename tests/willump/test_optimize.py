"""The optimizer on synthetic pipelines with known costs and known signal."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from lightgbm import LGBMClassifier
from sklearn.linear_model import LogisticRegression

import willump

from .synth import make_rows, no_sleep, three_groups

FAST = dict(verbose=False, profile_repeats=2, profile_single_rows=5, importance_repeats=2)


@pytest.fixture(scope="module")
def task():
    return make_rows(6000, seed=3)


@pytest.fixture(scope="module")
def opt(task):
    X, y = task
    return willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, seed=0, **FAST)


def test_cheap_informative_group_answers_first(opt):
    report = opt.report()
    assert report.plan == "cascade"
    assert "cheap" in opt.levels[0].groups and "costly" not in opt.levels[0].groups
    assert opt.levels[-1].groups == ("cheap", "medium", "costly")
    assert report.loss_bound <= report.max_loss
    importance = {g.name: g.importance for g in report.groups}
    assert importance["cheap"] > importance["medium"] > 0
    costs = {g.name: g.cost_batch_us for g in report.groups}
    assert costs["cheap"] < costs["medium"] < costs["costly"]
    assert 150 < costs["costly"] < 400  # 200 us of sleep per row, measured


def test_measured_speedup_follows_the_cost_model(opt):
    X, _y = make_rows(4000, seed=99)

    def seconds(fn):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn(X)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    measured = seconds(opt.baseline.predict_proba) / seconds(opt.predict_proba)
    expected = opt.report().expected_speedup
    assert expected > 2.0
    assert 0.6 * expected <= measured <= 1.5 * expected, (measured, expected)


def test_level_fractions_and_report_shape(opt):
    report = opt.report()
    assert sum(lv.fraction_answered for lv in report.levels) == pytest.approx(1.0)
    data = report.to_dict()
    json.dumps(data)  # JSON-ready
    assert {"groups", "levels", "loss_bound", "expected_speedup", "topk", "refit"} <= set(data)
    text = str(report)
    assert "cost/row us" in text and "importance" in text and "threshold" in text
    assert willump.Report.from_dict(data).to_dict() == data


def test_uninformative_cheap_groups_leave_the_full_pipeline(task):
    X, _ = task
    _, y = make_rows(len(X), seed=3, weights=(0.0, 0.0, 3.0))
    y = (X.c.to_numpy() * 3 + np.random.default_rng(0).logistic(size=len(X)) > 0).astype(int)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.002, **FAST)
    report = opt.report()
    assert report.plan == "full"
    assert report.reason.startswith("full pipeline")
    assert len(opt.levels) == 1
    assert np.array_equal(opt.predict_proba(X[:500]), opt.baseline.predict_proba(X[:500]))


def test_multiclass_uses_max_probability(task):
    X, _ = task
    _, y = make_rows(len(X), seed=3, n_classes=3)
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.02, **FAST)
    proba = opt.predict_proba(X[:300])
    assert proba.shape == (300, 3)
    assert np.allclose(proba.sum(axis=1), 1.0)
    assert set(opt.predict(X[:300])) <= {0, 1, 2}
    report = opt.report()
    if report.plan == "cascade":
        assert report.loss_bound <= 0.02
        assert opt.levels[0].threshold > 1 / 3


def test_lightgbm_model(task):
    X, y = task
    model = LGBMClassifier(n_estimators=40, num_leaves=15, verbose=-1)
    opt = willump.optimize(no_sleep, model, X, y, max_loss=0.02, **FAST)
    assert type(opt.levels[-1].model).__name__ == "LGBMClassifier"
    assert opt.predict_proba(X[:100]).shape == (100, 2)


@pytest.mark.parametrize("metric", ["roc_auc", "f1", "accuracy"])
def test_metrics(task, metric):
    X, y = task
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric=metric, max_loss=0.02, **FAST)
    report = opt.report()
    assert report.metric == metric
    if report.plan == "cascade":
        assert report.loss_bound <= 0.02


def test_callable_metric(task):
    X, y = task

    def balanced_accuracy(y_true, y_pred):
        return float(np.mean([np.mean(y_pred[y_true == c] == c) for c in np.unique(y_true)]))

    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric=balanced_accuracy,
                           max_loss=0.03, n_bootstrap=100, **FAST)
    assert opt.report().metric == "balanced_accuracy"


def test_exact_bound(task):
    X, y = task
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, bound="exact", **FAST)
    report = opt.report()
    assert "Clopper-Pearson" in report.bound_method
    assert report.plan == "cascade" and report.loss_bound <= 0.02


def test_two_levels_only_when_asked(task):
    X, y = task
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, max_levels=2, **FAST)
    assert len(opt.levels) <= 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(max_loss=-0.1), ValueError, "max_loss"),
        (dict(confidence=1.2), ValueError, "confidence"),
        (dict(metric="nope"), ValueError, "metric must be one of"),
        (dict(metric="roc_auc", bound="exact"), ValueError, "bound='exact'"),
        (dict(bound="magic"), ValueError, "bound must be"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(holdout=1.5), ValueError, "holdout"),
        (dict(n_bootstrap=10), ValueError, "n_bootstrap"),
    ],
)
def test_bad_arguments_are_named(task, kwargs, error, message):
    X, y = task
    with pytest.raises(error, match=message):
        willump.optimize(no_sleep, LogisticRegression(), X, y, **kwargs, **FAST)


def test_bad_inputs_are_named(task):
    X, y = task
    with pytest.raises(ValueError, match="X has 6000 rows but y has 10"):
        willump.optimize(no_sleep, LogisticRegression(), X, y[:10], verbose=False)
    with pytest.raises(ValueError, match="two classes"):
        willump.optimize(no_sleep, LogisticRegression(), X, np.zeros(len(X)), verbose=False)
    with pytest.raises(TypeError, match="predict_proba"):
        willump.optimize(no_sleep, object(), X, y, verbose=False)
    with pytest.raises(TypeError, match="model is required"):
        willump.optimize(no_sleep, None, X, y, verbose=False)
    with pytest.raises(TypeError, match="@willump.pipeline"):
        willump.optimize(lambda f: f, LogisticRegression(), X, y, verbose=False)
    with pytest.raises(ValueError, match="too few rows"):
        willump.optimize(no_sleep, LogisticRegression(), X[:60], y[:60], verbose=False)


def test_predict_rejects_rows_missing_columns(opt, task):
    X, _ = task
    with pytest.raises(ValueError, match=r"lack column\(s\) \['c'\]"):
        opt.predict(X.drop(columns=["c"]))


def test_empty_input_gives_empty_output(opt, task):
    X, _ = task
    assert opt.predict_proba(X.iloc[:0]).shape == (0, 2)
    assert opt.predict(X.iloc[:0]).shape == (0,)


def test_progress_is_silenced(task, capsys):
    X, y = task
    willump.optimize(no_sleep, LogisticRegression(), X, y, **FAST)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@willump.feature
def per_call_lookup(df):
    time.sleep(0.002)  # one round trip per call, whatever the batch size: a remote lookup
    return df[["b", "c"]].to_numpy()


@willump.feature
def local_a(df):
    return df[["a"]].to_numpy()


@willump.pipeline
def remote_pipeline(df):
    return [local_a(df), per_call_lookup(df)]


def test_row_cost_mode_plans_for_one_row_calls(task):
    X, y = task
    opt = willump.optimize(remote_pipeline, LogisticRegression(), X, y, max_loss=0.02, cost_mode="row",
                           **FAST)
    report = opt.report()
    assert report.cost_mode == "row" and report.plan == "cascade"
    assert report.expected_speedup_row > 1.5
    assert report.measured_speedup is not None and report.measured_speedup > 1.2
    with pytest.raises(ValueError, match="cost_mode"):
        willump.optimize(remote_pipeline, LogisticRegression(), X, y, cost_mode="fast", **FAST)


def test_a_cascade_that_does_not_pay_is_not_kept(task):
    X, y = task
    # every group equally cheap: no subset can be meaningfully cheaper than the full pipeline
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.05, min_speedup=3.0, **FAST)
    report = opt.report()
    assert report.plan == "full" and len(opt.levels) == 1
    assert "min_speedup 3" in report.reason or "at any threshold" in report.reason


def test_small_model_settings(task):
    X, y = task
    seen = []

    def factory(groups):
        seen.append(groups)
        return LogisticRegression(C=0.1)

    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, small_model=factory,
                           **FAST)
    assert seen and all(isinstance(g, tuple) for g in seen)
    assert all(lv.model.C == 0.1 for lv in opt.levels[:-1])
    assert opt.levels[-1].model.C == 1.0
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02,
                           small_model=LGBMClassifier(n_estimators=10, verbose=-1), **FAST)
    assert all(type(lv.model).__name__ == "LGBMClassifier" for lv in opt.levels[:-1])
    with pytest.raises(TypeError, match="small_model"):
        willump.optimize(three_groups, LogisticRegression(), X, y, small_model=object(), **FAST)
