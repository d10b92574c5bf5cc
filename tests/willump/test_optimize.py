"""The optimizer on synthetic pipelines with known costs and known signal.

Every statistical test passes fixed costs (``synth.quiet``), so its outcome does not depend on
how fast the machine is; each asserts that a cascade exists before checking what it names."""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from lightgbm import LGBMClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, make_scorer

import willump
from willump import Level, OptimizedPipeline, WillumpWarning
from willump._routing import route

from . import synth
from .synth import default_splits, make_rows, no_sleep, quiet, three_groups


@pytest.fixture(autouse=True)
def no_sleeps(monkeypatch):
    monkeypatch.setattr(synth, "SLEEPING", False)  # fixed costs: the sleeps only slow the tests


@pytest.fixture(scope="module")
def task():
    return make_rows(6000, seed=3)


@pytest.fixture(scope="module")
def opt(task):
    X, y = task
    synth.SLEEPING = False
    try:
        return willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, seed=0,
                                **quiet(three_groups))
    finally:
        synth.SLEEPING = True


def test_cheap_informative_group_answers_first(opt):
    report = opt.report()
    assert report.plan == "cascade"
    assert "cheap" in opt.levels[0].groups and "costly" not in opt.levels[0].groups
    assert opt.levels[-1].groups == ("cheap", "medium", "costly")
    assert report.loss_bound <= report.max_loss
    assert report.bound_method == "exact paired (unconditional)"  # accuracy: exact by default
    assert "worse" in report.bound_detail and "better" in report.bound_detail
    importance = {g.name: g.importance for g in report.groups}
    assert importance["cheap"] > importance["medium"] > 0
    assert report.costs_source.startswith("fixed")
    assert report.expected_speedup > 2.0


def test_profiling_measures_the_work_a_group_does(task, monkeypatch):
    """The one test that times: a sleep is never shorter than asked, so only a lower bound."""
    monkeypatch.setattr(synth, "SLEEPING", True)
    X, y = task
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, verbose=False,
                           profile_repeats=1, profile_single_rows=2, importance_repeats=1,
                           verify_speedup=False, top_k=None)
    costs = {g.name: g.cost_batch_us for g in opt.report().groups}
    assert costs["costly"] >= 0.9 * synth.COSTLY_COST * 1e6
    assert costs["medium"] >= 0.9 * synth.MEDIUM_COST * 1e6
    assert opt.report().costs_source == "measured"


def test_level_fractions_and_report_shape(opt):
    report = opt.report()
    assert sum(lv.fraction_answered for lv in report.levels) == pytest.approx(1.0)
    data = report.to_dict()
    json.dumps(data)  # JSON-ready
    assert {"groups", "levels", "loss_bound", "expected_speedup", "topk", "refit", "certifiable_floor",
            "bound_detail", "split", "feature_state"} <= set(data)
    text = str(report)
    for words in ("cost/row us", "importance", "threshold", "smallest loss an exact bound can certify",
                  "top-K (certified per query"):
        assert words in text
    if report.loss_bound is not None:
        # the certificate is max_loss; the bound at the searched threshold is not called a 95% bound
        assert f"certified: loss <= max_loss {report.max_loss} at 95%" in text
        assert "bound at this threshold alone" in text and "upper bound" not in text, text
    assert willump.Report.from_dict(data).to_dict() == data


def test_uninformative_cheap_groups_leave_the_full_pipeline(task):
    X, _ = task
    y = (X.c.to_numpy() * 3 + np.random.default_rng(0).logistic(size=len(X)) > 0).astype(int)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.005, **quiet(three_groups))
    report = opt.report()
    assert report.plan == "full"
    assert report.reason.startswith("full pipeline")
    assert len(opt.levels) == 1
    assert (opt.gears_[0].cert_rows, opt.gears_[0].cert_disagreed, report.cert_rows) == (None, None, None)
    assert np.array_equal(opt.predict_proba(X[:500]), opt.baseline.predict_proba(X[:500]))


def test_multiclass_uses_max_probability(task):
    X, _ = task
    _, y = make_rows(len(X), seed=3, n_classes=3)
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.02, **quiet(no_sleep))
    report = opt.report()
    assert report.plan == "cascade" and report.loss_bound <= 0.02
    assert opt.levels[0].threshold > 1 / 3
    proba, levels = opt.predict_with_levels(X[:300])
    assert proba.shape == (300, 3) and np.allclose(proba.sum(axis=1), 1.0)
    assert set(np.unique(levels)) == {0, 1}  # both levels answer some rows
    assert set(opt.predict(X[:300])) <= {0, 1, 2}


def test_lightgbm_model(task):
    X, y = task
    model = LGBMClassifier(n_estimators=40, num_leaves=15, verbose=-1)
    opt = willump.optimize(no_sleep, model, X, y, max_loss=0.02, **quiet(no_sleep))
    assert opt.report().plan == "cascade"
    assert [type(lv.model).__name__ for lv in opt.levels] == ["LGBMClassifier", "LGBMClassifier"]
    assert opt.levels[-1].model is not model  # willump's own copy, fitted on its train rows
    assert opt.predict_proba(X[:100]).shape == (100, 2)


@pytest.mark.parametrize(
    ("metric", "name", "methods"),
    [
        ("accuracy", "accuracy", {"exact paired (unconditional)"}),
        ("f1", "f1", {"Clopper-Pearson x sensitivity"}),
        ("roc_auc", "roc_auc", {"exact pairs (betting)"}),
        ("log_loss", "log_loss", {"paired bootstrap"}),
        ("neg_log_loss", "neg_log_loss", {"paired bootstrap"}),
        ("balanced_accuracy", "balanced_accuracy", {"paired bootstrap"}),
        (make_scorer(balanced_accuracy_score), "balanced_accuracy_score", {"paired bootstrap"}),
    ],
)
def test_metrics(task, metric, name, methods):
    X, y = task
    # label-based scorers see few rows change (label flips): allow a smaller bootstrap guard
    guard = {} if name in ("accuracy", "f1", "roc_auc", "log_loss", "neg_log_loss") else {"min_disagreements": 10}
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric=metric, max_loss=0.02,
                           **quiet(no_sleep), **guard)
    report = opt.report()
    assert report.metric == name
    assert report.plan == "cascade" and report.loss_bound <= 0.02
    assert report.bound_method in methods


def test_label_metrics_without_exact_bound_are_refused_when_few_labels_flip(task):
    X, y = task
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric="balanced_accuracy",
                           max_loss=0.02, **quiet(no_sleep))
    report = opt.report()
    assert report.plan == "full" and "refused because too few rows differed" in report.reason


def test_callable_metric_is_used_as_given(task):
    X, y = task
    calls = []

    def accuracy(y_true, y_pred):  # a user callable named like a built-in
        calls.append(len(y_true))
        return float(np.mean(y_true == y_pred))

    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric=accuracy, max_loss=0.03,
                           n_bootstrap=100, min_disagreements=10, **quiet(no_sleep))
    report = opt.report()
    assert calls, "the user's function was never called"
    assert report.metric == "accuracy" and report.plan == "cascade"
    assert report.bound_method != "exact paired (unconditional)"  # a callable is a score metric


def test_lower_is_better_metric_keeps_its_direction(task):
    X, y = task
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, metric="log_loss", max_loss=0.02,
                           **quiet(no_sleep))
    report = opt.report()
    assert report.plan == "cascade" and not report.greater_is_better
    # the cascade's log loss is higher (worse): the loss must come out positive
    assert report.optimized_score >= report.baseline_score
    assert report.loss == pytest.approx(report.optimized_score - report.baseline_score)


def test_roc_auc_is_bounded_exactly_by_default_and_by_bootstrap_on_request(task):
    X, y = task
    exact = willump.optimize(no_sleep, LogisticRegression(), X, y, metric="roc_auc", max_loss=0.02,
                             **quiet(no_sleep)).report()
    assert exact.plan == "cascade" and exact.bound_method == "exact pairs (betting)"
    assert "minority rows with a pair ordered differently" in exact.bound_detail
    boot = willump.optimize(no_sleep, LogisticRegression(), X, y, metric="roc_auc", max_loss=0.02,
                            bound="bootstrap", **quiet(no_sleep)).report()
    assert boot.bound_method in ("paired bootstrap", "exact pairs (betting)")


def test_three_level_chains_only_when_asked(task):
    X, y = task
    three = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, **quiet(three_groups))
    assert any(c.chain.count("->") == 2 for c in three.report().candidates)
    two = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, max_levels=2,
                           **quiet(three_groups))
    assert two.report().candidates and all(c.chain.count("->") == 1 for c in two.report().candidates)
    assert len(two.levels) <= 2


def _certified_probabilities(opt, X, y, levels, seed=0):
    """What certification computed for these levels on the certification rows: each level's
    model on blocks computed once for all rows, routed by willump's rule."""
    splits = default_splits(X, y, seed=seed)
    rows = X.iloc[splits.cert]
    blocks, _ = opt.pipeline.compute(rows, opt.pipeline.graph.groups)
    level_probas = [lv.model.predict_proba(np.hstack([blocks[g] for g in lv.groups])) for lv in levels]
    levels_, approx = route(level_probas, levels[0].threshold)
    return rows, levels_, approx


def test_what_serves_is_what_was_certified_two_levels(opt, task):
    X, y = task
    assert opt.report().plan == "cascade"
    rows, certified_levels, certified = _certified_probabilities(opt, X, y, opt.levels)
    served, served_levels = opt.predict_with_levels(rows)
    assert np.array_equal(served_levels, certified_levels)
    np.testing.assert_allclose(served, certified, rtol=0, atol=1e-12)
    # and the report's answered shares are those of the certification rows
    shares = np.bincount(certified_levels, minlength=len(opt.levels)) / len(certified_levels)
    assert [lv.fraction_answered for lv in opt.report().levels] == pytest.approx(shares.tolist())


def test_what_serves_is_what_was_certified_three_levels(opt, task):
    X, y = task
    train = X.iloc[:2000]
    blocks, _ = opt.pipeline.compute(train, opt.pipeline.graph.groups)

    def fitted(groups):
        return LogisticRegression().fit(np.hstack([blocks[g] for g in groups]), y[:2000])

    levels = [Level(("cheap",), fitted(("cheap",)), 0.8), Level(("cheap", "medium"), fitted(("cheap", "medium")), 0.8),
              opt.levels[-1]]
    three = OptimizedPipeline(opt.pipeline, levels, opt.classes_, opt.baseline, None, None)
    rows, certified_levels, certified = _certified_probabilities(three, X, y, levels)
    served, served_levels = three.predict_with_levels(rows)
    assert set(np.unique(certified_levels)) == {0, 1, 2}
    assert np.array_equal(served_levels, certified_levels)
    np.testing.assert_allclose(served, certified, rtol=0, atol=1e-12)


def test_max_loss_below_the_certifiable_floor_warns_and_serves_the_full_pipeline():
    X, y = make_rows(1000, seed=4)  # 350 certification rows: nothing below 0.0085 is certifiable
    with pytest.warns(WillumpWarning, match=r"max_loss=0.005 is below .* 350 certification rows .* "
                                            r"needs at least 598 certification rows"):
        opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.005, **quiet(no_sleep))
    report = opt.report()
    assert report.plan == "full" and "max_loss=0.005" in report.reason
    assert report.certifiable_floor == pytest.approx(0.0085, abs=1e-4)
    assert report.rows_needed == 598
    assert "0.0085" in str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WillumpWarning)  # above the floor: no warning
        willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, **quiet(no_sleep))


def test_routing_tolerance_widens_the_bound(task):
    X, y = task
    tight = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, **quiet(no_sleep))
    loose = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, routing_tolerance=0.02,
                             **quiet(no_sleep))
    assert tight.report().plan == loose.report().plan == "cascade"
    t, lo = tight.report(), loose.report()
    if t.levels[0].threshold == lo.levels[0].threshold:
        assert lo.loss_bound > t.loss_bound
    else:  # the wider bound stopped the fixed sequence earlier: a more conservative threshold
        assert lo.levels[0].threshold > t.levels[0].threshold
    assert "routing tolerance" in lo.bound_detail or lo.levels[0].threshold > t.levels[0].threshold


@willump.feature
def _noisy(df):
    return df[["b", "c"]].to_numpy() + np.random.default_rng().normal(0, 1e-3, (len(df), 2))


@willump.feature
def _plain_a(df):
    return df[["a"]].to_numpy()


@willump.pipeline
def _nondeterministic(df):
    return [_plain_a(df), _noisy(df)]


def test_nondeterministic_groups_get_no_cascade(task):
    X, y = task
    with pytest.warns(UserWarning, match="different values on two runs"):
        opt = willump.optimize(_nondeterministic, LogisticRegression(), X, y, max_loss=0.05, verbose=False,
                               fixed_costs={"_plain_a": 1e-6, "_noisy": 1e-4})
    report = opt.report()
    assert report.plan == "full" and "_noisy" in report.reason and "void" in report.reason


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(max_loss=-0.1), ValueError, "max_loss"),
        (dict(confidence=1.2), ValueError, "confidence"),
        (dict(metric="nope"), ValueError, "metric must be one of"),
        (dict(metric="log_loss", bound="exact"), ValueError, "bound='exact'"),
        (dict(bound="magic"), ValueError, "bound must be"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(holdout=1.5), ValueError, "holdout"),
        (dict(n_bootstrap=10), ValueError, "n_bootstrap"),
        (dict(split="weekly"), ValueError, "split must be"),
        (dict(split="group"), ValueError, "groups="),
        (dict(refit=False), ValueError, "cert="),
        (dict(cert=(np.zeros(3),)), TypeError, "cert must be a pair"),
        (dict(min_disagreements=0), ValueError, "min_disagreements"),
        (dict(routing_tolerance=0.7), ValueError, "routing_tolerance"),
        (dict(fixed_costs={"nope": 1.0}), ValueError, "fixed_costs names unknown"),
        (dict(fixed_costs={"fast_a": 1e-6}), ValueError, r"no cost for feature group\(s\) \['fast_bc'\]"),
        (dict(cost_mode="fast"), ValueError, "cost_mode"),
        (dict(confidence="0.95"), ValueError, "confidence must be a number"),
        (dict(holdout=None), ValueError, "holdout must be a number"),
        (dict(max_levels="3"), ValueError, "max_levels must be an integer"),
        (dict(order_by=np.r_[np.nan, np.arange(5999.0)], split="ordered"), ValueError, "order_by has missing"),
        (dict(split="group", groups=np.zeros(6000)), ValueError, "groups has 1 distinct"),
        (dict(cert=(make_rows(100, seed=1)[0], np.array(["0", "1"] * 50))), ValueError,
         "cert\\[1\\] holds text labels but y holds numeric"),
        (dict(cert=(make_rows(100, seed=1)[0].drop(columns=["c"]), np.zeros(100))), ValueError,
         r"cert\[0\] lacks column\(s\) \['c'\]"),
    ],
)
def test_bad_arguments_are_named(task, kwargs, error, message):
    X, y = task
    with pytest.raises(error, match=message):
        willump.optimize(no_sleep, LogisticRegression(), X, y, **({"verbose": False} | kwargs))


def test_bad_inputs_are_named(task):
    X, y = task
    with pytest.raises(ValueError, match=r"y must be a 1-D sequence of labels, got shape \(6000, 1\)"):
        willump.optimize(no_sleep, LogisticRegression(), X, y.reshape(-1, 1), verbose=False)
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
    willump.optimize(no_sleep, LogisticRegression(), X, y, **quiet(no_sleep))
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
                           verbose=False, importance_repeats=1, profile_repeats=1, profile_single_rows=5,
                           verify_speedup=False)
    report = opt.report()
    assert report.cost_mode == "row" and report.plan == "cascade"
    # the lookup sleeps 2 ms a call: measured one-row costs put it far above the local group
    costs = {g.name: g.cost_row_us for g in report.groups}
    assert costs["per_call_lookup"] >= 1800 and report.expected_speedup_row > 1.5


def test_a_cascade_that_does_not_pay_is_not_kept(task):
    X, y = task
    fixed = {"fast_a": 1e-5, "fast_bc": 1e-5}  # equally cheap groups: no subset is much cheaper
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.05, min_speedup=3.0,
                           verbose=False, fixed_costs=fixed)
    report = opt.report()
    assert report.plan == "full" and len(opt.levels) == 1
    assert "min_speedup 3" in report.reason and "cascades within max_loss" in report.reason


def test_small_model_settings(task):
    X, y = task
    seen = []

    def factory(groups):
        seen.append(groups)
        return LogisticRegression(C=0.1)

    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, small_model=factory,
                           **quiet(three_groups))
    assert opt.report().plan == "cascade"
    assert seen and all(isinstance(g, tuple) for g in seen)
    assert all(lv.model.C == 0.1 for lv in opt.levels[:-1])
    assert opt.levels[-1].model.C == 1.0
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02,
                           small_model=LGBMClassifier(n_estimators=10, verbose=-1), **quiet(three_groups))
    assert opt.report().plan == "cascade"
    assert all(type(lv.model).__name__ == "LGBMClassifier" for lv in opt.levels[:-1])
    assert type(opt.levels[-1].model).__name__ == "LogisticRegression"
    with pytest.raises(TypeError, match="small_model"):
        willump.optimize(three_groups, LogisticRegression(), X, y, small_model=object(), **quiet(three_groups))


# --- rows: fit hooks, splits, certification sets, bring-your-own model ----------------------
def _hooked_pipeline(seen: dict):
    """no_sleep's signal, with a fit hook that records the rows it was given."""

    @willump.feature
    def hooked_a(df):
        return df[["a"]].to_numpy() - seen.get("mean_a", 0.0)

    @willump.feature
    def hooked_bc(df):
        return df[["b", "c"]].to_numpy()

    @willump.pipeline
    def hooked(df):
        return [hooked_a(df), hooked_bc(df)]

    @hooked.fit
    def fit_state(X, y):
        seen["rows"] = X["row"].to_numpy().copy()
        seen["mean_a"] = float(X["a"].mean())

    return hooked


def _with_row_ids(X):
    return X.assign(row=np.arange(len(X)))


HOOKED_COSTS = {"hooked_a": 1e-6, "hooked_bc": 1e-4}


def test_fit_hook_sees_the_train_rows_only(task):
    X, y = task
    X = _with_row_ids(X)
    seen: dict = {}
    opt = willump.optimize(_hooked_pipeline(seen), LogisticRegression(), X, y, max_loss=0.02,
                           verbose=False, fixed_costs=HOOKED_COSTS)
    splits = default_splits(X, y)
    assert np.array_equal(np.sort(seen["rows"]), splits.train)
    assert not set(seen["rows"]) & set(splits.cert)
    assert f"fitted by willump on its {len(splits.train)} train rows" in opt.report().feature_state


def test_a_pipeline_without_fit_hook_says_willump_cannot_tell(opt):
    assert "no fit hook" in opt.report().feature_state


def test_ordered_split_certifies_on_the_newest_rows(task):
    X, y = task
    X = _with_row_ids(X).assign(when=np.arange(len(X))[::-1])  # newest rows first
    seen: dict = {}
    opt = willump.optimize(_hooked_pipeline(seen), LogisticRegression(), X, y, max_loss=0.02,
                           split="ordered", order_by="when", verbose=False, fixed_costs=HOOKED_COSTS)
    trained = np.sort(seen["rows"])
    splits = default_splits(X, y, split="ordered", order_by="when")
    assert len(trained) == len(splits.train) and trained.min() == len(X) - len(splits.train)  # the oldest
    report = opt.report()
    assert report.split.startswith("ordered by when")
    assert report.splits["certification"] == len(splits.cert) and splits.cert.max() < len(X) - len(trained)


def test_group_split_keeps_each_group_in_one_part(task):
    X, y = task
    user = np.arange(len(X)) // 7
    X = _with_row_ids(X).assign(user=user)
    seen: dict = {}
    willump.optimize(_hooked_pipeline(seen), LogisticRegression(), X, y, max_loss=0.02, split="group",
                     groups="user", verbose=False, fixed_costs=HOOKED_COSTS)
    splits = default_splits(X, y, split="group", groups="user")
    assert np.array_equal(np.sort(seen["rows"]), splits.train)
    assert not set(user[splits.train]) & set(user[splits.cert])
    assert not set(user[splits.select]) & set(user[splits.cert])


def test_supplied_certification_rows_certify(task):
    X, y = task
    X_cert, y_cert = make_rows(1500, seed=77)
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, cert=(X_cert, y_cert),
                           **quiet(no_sleep))
    report = opt.report()
    assert report.splits == {"train": 3600, "selection": 2400, "certification": 1500}
    assert "supplied" in report.split and report.plan == "cascade"
    certified = opt.predict(X_cert)
    assert report.optimized_score == pytest.approx(np.mean(certified == y_cert))


def test_a_fitted_model_is_refitted_with_a_warning_unless_refit_is_false(task):
    X, y = task
    mine = LogisticRegression(C=0.5).fit(np.hstack(no_sleep(X)), y)
    with pytest.warns(WillumpWarning, match="already fitted"):
        opt = willump.optimize(no_sleep, mine, X, y, max_loss=0.03, **quiet(no_sleep))
    assert opt.levels[-1].model is not mine
    assert f"fitted by willump on {len(default_splits(X, y).train)} train rows" in opt.report().models["full"]
    X_cert, y_cert = make_rows(2000, seed=78)
    served = willump.optimize(no_sleep, mine, X, y, max_loss=0.03, refit=False, cert=(X_cert, y_cert),
                              **quiet(no_sleep))
    assert served.levels[-1].model is mine and served.baseline.model is mine
    assert "as given (refit=False)" in served.report().models["full"]
    with pytest.raises(ValueError, match="not fitted"):
        willump.optimize(no_sleep, LogisticRegression(), X, y, refit=False, cert=(X_cert, y_cert),
                         **quiet(no_sleep))


def test_frames_with_other_indexes_are_split_by_position(task):
    X, y = task
    shuffled = X.set_index(pd.Index(np.arange(len(X))[::-1] * 3))
    opt = willump.optimize(no_sleep, LogisticRegression(), shuffled, y, max_loss=0.03, **quiet(no_sleep))
    assert opt.report().plan == "cascade"


def test_html_report_draws_its_plots_with_no_external_assets(opt, tmp_path):
    import re

    path = opt.report().to_html(tmp_path / "report" / "three.html")
    page = path.read_text()
    assert page.count("<svg") == 4  # groups, certification sequence, levels, top-K
    assert "certified threshold" in page and "max_loss 0.01" in page and "certified per query" in page
    assert "<script" not in page and "<link" not in page
    assert not re.search(r'(?:src|href)\s*=\s*["\']https?:', page)  # nothing fetched when viewed
    assert opt.report().reason in page.replace("&#x27;", "'").replace("&gt;", ">").replace("&lt;", "<")


def test_gears_are_cheaper_plans_certified_in_one_sequence(task, tmp_path):
    X, y = task
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.005, gears=(0.015, 0.04),
                           **quiet(three_groups))
    report = opt.report()
    assert report.plan == "cascade" and len(opt.gears_) >= 2 and len(report.gears) == len(opt.gears_) - 1
    shares = [opt.report().levels[0].fraction_answered] + [g["answered"][0] for g in report.gears]
    assert shares == sorted(shares) and shares[-1] > shares[0]  # looser gears answer more rows early
    for gear, row in zip(opt.gears_[1:], report.gears, strict=True):
        assert row["loss_bound"] <= gear.max_loss and gear.loss_bound == row["loss_bound"]
    assert opt.gears_[0].loss_bound == report.loss_bound <= 0.005
    rows = X.iloc[:400]
    _, base_levels = opt.predict_with_levels(rows)
    _, loose_levels = opt.gear(1).predict_with_levels(rows)
    assert (loose_levels == 0).sum() > (base_levels == 0).sum()
    assert "gears (certified jointly" in str(report)
    opt.save(tmp_path / "geared")
    loaded = willump.load(tmp_path / "geared")
    np.testing.assert_array_equal(loaded.gear(1).predict_proba(rows), opt.gear(1).predict_proba(rows))
    _check_certified_disagreement(opt, loaded, X, y, tmp_path)
    # a gear speaks for its own certificate, and is never saved as a plan under gear 0's
    loose = opt.gear(1)
    assert loose.gears_[0] is opt.gears_[1] and loose.gears_[1:] == opt.gears_[2:]
    assert (loose.report().max_loss, loose.report().loss_bound) == (0.015, opt.gears_[1].loss_bound)
    assert loose.report().loss is None and "loss n/a" in str(loose.report())
    assert report.max_loss == 0.005, "the plan's own report is left as it was"
    with pytest.raises(ValueError, match="gear 1 of a certified ladder"):
        loose.save(tmp_path / "gear-1")
    if len(opt.gears_) > 2:  # a view of a view counts in the plan's ladder
        assert loose.gear(1).gear_index_ == 2 and loose.gear(1).gears_[0] is opt.gears_[2]
    assert not (tmp_path / "gear-1").exists()
    with pytest.raises(ValueError, match="gear must be an integer"):
        opt.gear(len(opt.gears_))
    with pytest.raises(ValueError, match="gears must be looser"):
        willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, gears=(0.005,),
                         **quiet(three_groups))


def _check_certified_disagreement(opt, loaded, X, y, tmp_path):
    """Each gear carries what certification saw (a live audit's baseline): the certification
    rows and those whose predicted class differs from the full pipeline's, recounted here by
    serving the gear and the full pipeline on those rows; kept by save/load, None when an older
    artifact did not keep them."""
    report, n = opt.report(), opt.report().splits["certification"]
    rows = X.iloc[default_splits(X, y).cert]
    assert len(rows) == n
    full = opt.baseline.predict(rows)
    counts = [int(np.sum(opt.gear(i).predict(rows) != full)) for i in range(len(opt.gears_))]
    assert [(g.cert_rows, g.cert_disagreed) for g in opt.gears_] == [(n, c) for c in counts]
    assert all(0 <= c <= n for c in counts) and counts[-1] > 0  # the loosest gear does change answers
    assert (report.cert_rows, report.cert_disagreed) == (n, counts[0])
    assert [(g["cert_rows"], g["cert_disagreed"]) for g in report.gears] == [(n, c) for c in counts[1:]]
    assert [(g.cert_rows, g.cert_disagreed) for g in loaded.gears_] == [(n, c) for c in counts]
    # each gear's served confidence -> accuracy on the same rows (a label-free estimate's map):
    # monotone, within [0, 1], averaging to the gear's accuracy there (isotonic regression keeps means)
    labels = y[default_splits(X, y).cert]
    for i, gear in enumerate(opt.gears_):
        cal = gear.calibration
        assert cal is not None and cal["x"] == sorted(cal["x"]) and cal["y"] == sorted(cal["y"])
        assert 0.0 <= min(cal["y"]) <= max(cal["y"]) <= 1.0
        proba = opt.gear(i).predict_proba(rows)
        estimate = np.interp(proba.max(axis=1), cal["x"], cal["y"]).mean()
        assert estimate == pytest.approx(np.mean(opt.gear(i).predict(rows) == labels), abs=2e-3)
        assert loaded.gears_[i].calibration == cal
    manifest = json.loads((tmp_path / "geared" / "manifest.json").read_text())
    assert [(g["cert_rows"], g["cert_disagreed"]) for g in manifest["gears"]] == [(n, c) for c in counts[1:]]
    old = _without_certified_disagreement(tmp_path / "geared", tmp_path / "old")
    assert [(g.cert_rows, g.cert_disagreed) for g in willump.load(old).gears_] == [(None, None)] * len(counts)


def _without_certified_disagreement(root, copy):
    """A copy of the artifact as saved before gears kept cert_rows / cert_disagreed (report,
    pickled gears and manifest without them; checksums redone)."""
    import hashlib
    import shutil

    import cloudpickle

    shutil.copytree(root, copy)
    report = json.loads((copy / "report.json").read_text())
    for entry in [report, *report["gears"]]:
        del entry["cert_rows"], entry["cert_disagreed"]
    (copy / "report.json").write_text(json.dumps(report))
    gears = cloudpickle.loads((copy / "gears.pkl").read_bytes())
    for gear in gears:
        del gear.__dict__["cert_rows"], gear.__dict__["cert_disagreed"]
    (copy / "gears.pkl").write_bytes(cloudpickle.dumps(gears))
    manifest = json.loads((copy / "manifest.json").read_text())
    for gear in manifest["gears"]:
        del gear["cert_rows"], gear["cert_disagreed"]
    for name in ("report.json", "gears.pkl"):
        data = (copy / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_gear_that_fails_ends_the_sequence_for_looser_gears():
    """One fixed sequence: the certificates hold jointly only if a failure stops everything."""
    from willump._bounds import LossBound
    from willump._gears import certify_ladder
    from willump._planner import Sweep

    chain = (("a",), ("a", "b"))

    class Fixed:  # bounds by threshold; the same on both splits except where noted
        costly = False

        def __init__(self, bounds):
            self.bounds = bounds

        def evaluate(self, chain_, probas, t):
            return Sweep(chain_, t, LossBound(0.0, self.bounds[t], "fixed"), [0.5, 0.5], 1.0, 1.0, 100, 0)

    grid = [0.9, 0.8, 0.7, 0.6]
    selection = Fixed({0.9: 0.001, 0.8: 0.002, 0.7: 0.0025, 0.6: 0.009})
    cert = Fixed({0.9: 0.001, 0.8: 0.004, 0.7: 0.02, 0.6: 0.03})  # gear 0.005 fails at 0.7
    ladder = [(0.005, selection.evaluate(chain, None, 0.7)), (0.05, selection.evaluate(chain, None, 0.6))]
    results = certify_ladder(selection, cert, ladder, None, None, {chain: grid})
    assert results[0].accepted.threshold == 0.8
    assert results[1].accepted is None and results[1].tested == []  # never tested


def test_an_optimized_pipeline_refuses_to_serve_feature_state_refitted_after_it(task, tmp_path):
    """Found by review: a second optimize on the same pipeline object refitted the feature
    state under the first optimized pipeline (592 of 2,000 labels flipped, silently)."""
    X, y = task
    X = _with_row_ids(X)
    first = willump.optimize(_hooked_pipeline(seen := {}), LogisticRegression(), X, y, max_loss=0.03,
                             verbose=False, fixed_costs=HOOKED_COSTS)
    first.save(tmp_path / "first")
    pipeline = first.pipeline
    X2 = X.assign(a=X["a"] * 3 + 1)
    willump.optimize(pipeline, LogisticRegression(), X2, y, max_loss=0.03, verbose=False,
                     fixed_costs=HOOKED_COSTS)
    with pytest.raises(willump.PipelineError, match="refitted or recaptured after this optimized"):
        first.predict_proba(X.iloc[:10])
    with pytest.raises(willump.PipelineError, match="refitted or recaptured"):
        first.baseline.predict_proba(X.iloc[:10])
    saved = willump.load(tmp_path / "first")  # the artifact kept its own state
    assert saved.predict_proba(X.iloc[:10]).shape == (10, 2)
    assert seen  # the hook ran


def test_a_fitted_plan_skips_scikit_learns_argument_checks_where_it_predicts(opt, task):
    """The cascade and the baseline predict with scikit-learn's checks of its own arguments off
    (optimize ran the same calls with them on); the caller's configuration is left as it was."""
    import sklearn

    seen = []

    class Spy(LogisticRegression):
        def predict_proba(self, X):
            seen.append(sklearn.get_config()["skip_parameter_validation"])
            return super().predict_proba(X)

    X, _ = task
    level = opt.levels[0]
    spy = Spy().set_params(**level.model.get_params())
    spy.__dict__.update({k: v for k, v in vars(level.model).items() if k.endswith("_")})
    original = level.model
    try:
        level.model = spy
        opt.predict(X.iloc[:5])
    finally:
        level.model = original
    assert seen == [True] and sklearn.get_config()["skip_parameter_validation"] is False
    baseline = opt.baseline.model
    try:
        spy = Spy().set_params(**baseline.get_params())
        spy.__dict__.update({k: v for k, v in vars(baseline).items() if k.endswith("_")})
        opt.baseline.model = spy
        opt.baseline.predict(X.iloc[:5])
    finally:
        opt.baseline.model = baseline
    assert seen == [True, True]
