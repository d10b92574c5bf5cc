"""What optimize does to the objects a user hands it, and what a user can do with the result:
nothing changes under an earlier result, results pickle, saves are atomic, and mistakes are
named (the feature group that raised or cannot be stored, a max_loss that cannot be had)."""

from __future__ import annotations

import pickle
import threading
import warnings

import joblib
import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import willump
from willump._artifact import save as save_artifact

from .synth import make_rows, no_sleep, quiet


@pytest.fixture(scope="module")
def task():
    return make_rows(4000, seed=21)


def _text_frame(n: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    words = np.where(rng.random(n) < 0.5, "good day", "bad night")
    y = ((a + (words == "good day") * 1.5 + rng.normal(0, 0.5, n)) > 0.7).astype(int)
    return pd.DataFrame({"a": a, "b": rng.normal(size=n), "text": words}), y


def _sk_pipeline():
    features = ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("txt", TfidfVectorizer(), "text")])
    return Pipeline([("features", features), ("clf", LogisticRegression())])


def test_a_second_optimize_on_the_same_wrapper_leaves_the_first_result_as_it_was():
    """The issue's case: a second optimize on the same from_sklearn wrapper moved the first
    result's probabilities by up to 0.40 and flipped 9 labels, silently."""
    df, y = _text_frame(3000, seed=1)
    wp = willump.from_sklearn(_sk_pipeline())
    costs = {"num": 1e-6, "txt": 1e-4}
    first = willump.optimize(wp, X=df, y=y, max_loss=0.03, verbose=False, fixed_costs=costs)
    before = first.predict_proba(df.iloc[:300])
    other = df.assign(a=df["a"] * 5 + 2, b=df["b"] - 3)  # other rows: other scaler statistics
    second = willump.optimize(wp, X=other, y=y, max_loss=0.03, verbose=False, fixed_costs=costs, seed=1)
    np.testing.assert_array_equal(first.predict_proba(df.iloc[:300]), before)
    assert second.pipeline is not first.pipeline and wp.graph_ is None


def test_optimized_pipelines_pickle_and_joblib_dump_when_their_module_imports(task, tmp_path):
    """The decorators shadow the functions they wrap (synth.no_sleep is the Pipeline, not the
    function), so pickle's lookup by name used to fail."""
    X, y = task
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, **quiet(no_sleep))
    rows = X.iloc[:200]
    want = opt.predict_proba(rows)
    again = pickle.loads(pickle.dumps(opt))
    np.testing.assert_array_equal(again.predict_proba(rows), want)
    joblib.dump(opt, tmp_path / "opt.joblib")
    np.testing.assert_array_equal(joblib.load(tmp_path / "opt.joblib").predict_proba(rows), want)
    # and saving still stores feature code of modules that are not installed by value
    opt.save(tmp_path / "artifact")
    np.testing.assert_array_equal(willump.load(tmp_path / "artifact").predict_proba(rows), want)


def test_a_failed_save_keeps_the_previous_artifact_and_a_failed_first_save_leaves_nothing(task, tmp_path,
                                                                                         monkeypatch):
    import cloudpickle

    X, y = task
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, **quiet(no_sleep))
    target = tmp_path / "art"
    opt.save(target)
    manifest = (target / "manifest.json").read_text()
    real = cloudpickle.dumps

    def failing(obj, *args, **kwargs):
        if isinstance(obj, willump.Report) or type(obj).__name__ == "LogisticRegression":
            raise OSError("disk full")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(cloudpickle, "dumps", failing)
    with pytest.raises((OSError, willump.ArtifactError)):
        opt.save(target)
    assert (target / "manifest.json").read_text() == manifest
    assert willump.load(target).predict_proba(X.iloc[:20]).shape == (20, 2)  # still whole
    fresh = tmp_path / "fresh"
    with pytest.raises((OSError, willump.ArtifactError)):
        save_artifact(opt, fresh)
    assert not fresh.exists() and [p.name for p in tmp_path.iterdir()] == ["art"]  # no leftovers
    monkeypatch.setattr(cloudpickle, "dumps", real)
    opt.save(fresh)  # the retry works
    assert willump.load(fresh).predict_proba(X.iloc[:20]).shape == (20, 2)


def test_max_loss_zero_is_refused_before_any_work(task):
    X, y = task

    @willump.feature
    def never(df):
        raise AssertionError("optimize ran the pipeline before refusing max_loss=0")

    @willump.pipeline
    def untouched(df):
        return [never(df)]

    for bad in (0, 0.0, -0.01, 1.0):
        with pytest.raises(ValueError, match="max_loss must be a number in"):
            willump.optimize(untouched, LogisticRegression(), X, y, max_loss=bad, verbose=False)


def test_an_error_inside_a_feature_group_names_the_group(task):
    X, y = task

    @willump.feature
    def fine(df):
        return df[["a"]].to_numpy()

    @willump.feature
    def broken(df):
        return df[["no_such_column"]].to_numpy()

    @willump.pipeline
    def body(df):
        return [fine(df), broken(df)]

    with pytest.raises(willump.FeatureError, match="feature group 'broken' raised KeyError") as raised:
        willump.optimize(body, LogisticRegression(), X, y, max_loss=0.03, verbose=False)
    assert raised.value.group == "broken" and isinstance(raised.value.__cause__, KeyError)


def test_an_unpicklable_feature_is_named_at_optimize_and_at_save(task, tmp_path):
    X, y = task
    lock = threading.Lock()

    @willump.feature
    def cheap(df):
        return df[["a"]].to_numpy()

    @willump.feature
    def guarded(df):
        with lock:
            return df[["b", "c"]].to_numpy()

    @willump.pipeline
    def locked(df):
        return [cheap(df), guarded(df)]

    with pytest.warns(willump.WillumpWarning, match="feature group 'guarded' cannot be pickled"):
        opt = willump.optimize(locked, LogisticRegression(), X, y, max_loss=0.03, verbose=False,
                               fixed_costs={"cheap": 1e-6, "guarded": 1e-4})
    with pytest.raises(willump.ArtifactError, match="feature group.*'guarded'.*cannot be pickled"):
        opt.save(tmp_path / "locked")
    assert not (tmp_path / "locked").exists()


def test_f1_of_a_named_positive_class(task):
    X, y = task
    labels = np.where(y == 1, "yes", "no")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", willump.WillumpWarning)
        opt = willump.optimize(no_sleep, LogisticRegression(), X, labels, metric=willump.Metric.f1(pos_label="no"),
                               max_loss=0.03, **quiet(no_sleep))
    assert opt.report().metric == "f1['no']"
    with pytest.raises(ValueError, match="pos_label='maybe' is not a class"):
        willump.optimize(no_sleep, LogisticRegression(), X, labels, metric=willump.Metric.f1(pos_label="maybe"),
                         max_loss=0.03, **quiet(no_sleep))


def test_segments_are_certified_jointly_with_the_overall_loss():
    """Learn-then-Test for several risks: a segment whose rows the cheap level gets wrong keeps
    the plan conservative (or the full pipeline) even when the overall loss would allow more."""
    X, y = make_rows(12_000, seed=31)
    rng = np.random.default_rng(0)
    region = np.where(rng.random(len(X)) < 0.2, "hard", "easy")
    X = X.assign(region=region)
    y = np.where((region == "hard") & (X["b"].to_numpy() > 0.8), 1 - y, y)  # 'hard' depends on b
    plain = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.02, **quiet(no_sleep))
    joint = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.02, segments="region",
                             segment_max_loss=0.02, **quiet(no_sleep))
    report = joint.report()
    assert plain.report().plan == "cascade"
    if report.plan == "cascade":
        assert {s["segment"] for s in report.segments} == {"easy", "hard"}
        assert all(s["bound"] <= 0.02 for s in report.segments)
        assert report.levels[0].fraction_answered <= plain.report().levels[0].fraction_answered
        assert "segments: 2" in str(report)
    with pytest.warns(willump.WillumpWarning, match="segment.*'rare'"):
        tiny = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.02,
                                segments=np.where(np.arange(len(X)) < 60, "rare", region), **quiet(no_sleep))
    assert tiny.report().plan == "full"
    with pytest.raises(ValueError, match="names no column"):
        willump.optimize(no_sleep, LogisticRegression(), X, y, segments="nope", **quiet(no_sleep))
    with pytest.raises(ValueError, match="segment_max_loss needs segments"):
        willump.optimize(no_sleep, LogisticRegression(), X, y, segment_max_loss=0.01, **quiet(no_sleep))
