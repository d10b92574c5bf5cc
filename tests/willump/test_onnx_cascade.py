"""The whole cascade as one ONNX model (willump._onnx_cascade, through willump.export_onnx): a
pipeline of scikit-learn featurizers exports with its routing, and ONNX Runtime answers raw
rows with the cascade's probabilities and levels; a pipeline of Python feature code is named
group by group as not exportable, and the per-level files are written all the same."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import willump
from tests.willump.test_sklearn import column_pipeline

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("skl2onnx")


def frame(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "cat": rng.choice(list("xyz"), n),
                       "text": rng.choice(["good day", "bad day", "so so", "great"], n)})
    y = (1.0 * df.a + (df.cat == "x") + 2.0 * (df.text == "great") + rng.normal(size=n) * 0.3) > 0.8
    return df, y.astype(int).to_numpy()


def run(directory, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """cascade.onnx on raw rows, as a user without willump feeds it: one [n, 1] input per column."""
    session = ort.InferenceSession(str(directory / "cascade.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: rows[[i.name]].to_numpy().astype(str) if rows[i.name].dtype == object
             else rows[[i.name]].to_numpy() for i in session.get_inputs()}
    proba, level = session.run(["probabilities", "level"], feeds)
    return proba, level


@pytest.fixture(scope="module")
def cascade():
    df, y = frame(4000, seed=1)
    opt = willump.optimize(willump.from_sklearn(column_pipeline()), X=df, y=y, max_loss=0.03, verbose=False,
                           fixed_costs={"num": 1e-6, "cat": 1e-4, "txt": 1e-2})
    assert opt.is_cascade
    return opt


def test_the_whole_cascade_answers_raw_rows_like_willump(cascade, tmp_path):
    with pytest.warns(willump.WillumpWarning, match="routing_tolerance"):  # certified for 0 difference
        summary = willump.export_onnx(cascade, tmp_path, frame(500, seed=2)[0])
    whole = summary["cascade"]
    assert whole["exported"] and whole["max_abs_diff"] < 1e-4 and whole["same_level_share"] == 1.0
    assert whole["inputs"] == ["a", "b", "cat", "text"] and whole["approximate"] == {}  # word TF-IDF is exact
    assert json.loads((tmp_path / "onnx.json").read_text())["cascade"]["file"] == "cascade.onnx"
    fresh, _ = frame(1500, seed=3)  # rows the export never checked
    proba, level = run(tmp_path, fresh)
    native, native_level = cascade.predict_with_levels(fresh)
    np.testing.assert_allclose(proba, native, atol=1e-4)
    assert (level == native_level).mean() > 0.999 and set(np.unique(level)) == {0, 1}  # both levels answer
    # one row; a batch the first level answers whole (the next level's branch does not run)
    assert np.allclose(run(tmp_path, fresh.iloc[:1])[0], native[:1], atol=1e-4)
    sure = fresh[native_level == 0].iloc[:7]
    p, lv = run(tmp_path, sure)
    assert (lv == 0).all() and np.allclose(p, native[native_level == 0][:7], atol=1e-4)


def test_three_levels_route_through_nested_branches(tmp_path):
    """A cascade of three levels (built by hand so that rows reach each): the second level's
    unsure rows go on to the third inside the second's branch."""
    from willump._blocks import hstack

    df, y = frame(4000, seed=4)
    base = willump.optimize(willump.from_sklearn(column_pipeline()), X=df, y=y, max_loss=0.03, verbose=False,
                            fixed_costs={"num": 1e-6, "cat": 1e-4, "txt": 1e-2})
    pipeline = base.pipeline
    blocks, _ = pipeline.compute(df, ["num", "cat", "txt"])
    levels = []
    for groups, threshold in ((("num",), 0.9), (("num", "cat"), 0.8), (("num", "cat", "txt"), None)):
        model = LogisticRegression(max_iter=500).fit(hstack([blocks[g] for g in groups]), y)
        levels.append(willump.Level(groups, model, threshold))
    opt = willump.OptimizedPipeline(pipeline, levels, base.classes_, base.baseline, None, base.report_)
    summary = willump.export_onnx(opt, tmp_path, df[:300])
    assert summary["cascade"]["exported"], summary["cascade"]
    fresh, _ = frame(1200, seed=5)
    proba, level = run(tmp_path, fresh)
    native, native_level = opt.predict_with_levels(fresh)
    assert set(np.unique(native_level)) == {0, 1, 2}
    np.testing.assert_allclose(proba, native, atol=1e-4)
    assert (level == native_level).mean() > 0.999


def test_python_feature_code_is_named_group_by_group_and_the_levels_still_export(tmp_path):
    from tests.willump.synth import make_rows, no_sleep

    X, y = make_rows(3000, seed=4)
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, verbose=False,
                           fixed_costs={"fast_a": 1e-6, "fast_bc": 1e-4}, routing_tolerance=1e-4)
    summary = willump.export_onnx(opt, tmp_path, X[:300])
    assert summary["cascade"]["exported"] is False and not (tmp_path / "cascade.onnx").exists()
    assert set(summary["cascade"]["why"]) == set(opt.pipeline.graph.groups)
    assert all("Python feature function" in why for why in summary["cascade"]["why"].values())
    assert len(summary["levels"]) == len(opt.levels)


def test_a_function_transformer_branch_is_named():
    from willump._onnx_cascade import unexportable

    df, y = frame(2000, seed=6)
    union = ColumnTransformer([("num", StandardScaler(), ["a", "b"]),
                               ("odd", FunctionTransformer(lambda d: d.to_numpy() ** 3), ["a"])])
    opt = willump.optimize(willump.from_sklearn(Pipeline([("f", union), ("clf", LogisticRegression())])),
                           X=df, y=y, max_loss=0.05, verbose=False)
    why = unexportable(opt)
    assert list(why) == ["odd"] and "FunctionTransformer" in why["odd"]


def test_a_feature_union_with_preprocessing_exports(tmp_path):
    """The shared preprocessing (steps before the union) and a FeatureUnion's weighted branches."""
    df, y = frame(3000, seed=7)
    numeric = ColumnTransformer([("pick", "passthrough", ["a", "b"])])
    union = FeatureUnion([("scaled", StandardScaler()), ("raw", FunctionTransformer(None))],
                         transformer_weights={"raw": 0.5})
    opt = willump.optimize(willump.from_sklearn(Pipeline([("pick", numeric), ("u", union), ("clf", LogisticRegression())])),
                           X=df, y=y, max_loss=0.05, verbose=False, fixed_costs={"scaled": 1e-6, "raw": 1e-3})
    summary = willump.export_onnx(opt, tmp_path, df[:300])
    assert summary["cascade"]["exported"], summary["cascade"]
    proba, level = run(tmp_path, frame(800, seed=8)[0])
    native, native_level = opt.predict_with_levels(frame(800, seed=8)[0])
    np.testing.assert_allclose(proba, native, atol=1e-4)
    assert (level == native_level).mean() > 0.999


def test_a_row_on_a_threshold_is_routed_as_willump_routes_it(tmp_path):
    """Level 0's threshold a hair above one row's largest probability: willump sends that row
    on, and so does the exported graph (it compares in float64, as willump does)."""
    from willump._blocks import hstack

    df, y = frame(3000, seed=9)
    base = willump.optimize(willump.from_sklearn(column_pipeline()), X=df, y=y, max_loss=0.03, verbose=False,
                            fixed_costs={"num": 1e-6, "cat": 1e-4, "txt": 1e-2})
    blocks, _ = base.pipeline.compute(df, ["num", "cat", "txt"])
    cheap = LogisticRegression(max_iter=500).fit(blocks["num"], y)
    full = LogisticRegression(max_iter=500).fit(hstack([blocks[g] for g in ("num", "cat", "txt")]), y)
    rows = frame(200, seed=10)[0]
    edge = float(cheap.predict_proba(base.pipeline.compute(rows, ["num"])[0]["num"]).max(axis=1)[17])
    levels = [willump.Level(("num",), cheap, edge + 1e-9), willump.Level(("num", "cat", "txt"), full, None)]
    opt = willump.OptimizedPipeline(base.pipeline, levels, base.classes_, base.baseline, None, base.report_)
    summary = willump.export_onnx(opt, tmp_path, rows)
    assert summary["cascade"]["same_level_share"] == 1.0, summary["cascade"]
    _, level = run(tmp_path, rows.iloc[15:20])
    assert list(level) == list(opt.predict_with_levels(rows.iloc[15:20])[1]) and level[2] == 1


def test_what_cannot_convert_is_found_inside_nested_steps():
    from sklearn.feature_extraction.text import TfidfVectorizer

    from willump._onnx_cascade import _unconvertible

    assert _unconvertible(Pipeline([("keep", "passthrough"), ("s", StandardScaler())])) is None
    nested = Pipeline([("u", FeatureUnion([("ok", StandardScaler()), ("odd", FunctionTransformer(np.log1p))]))])
    assert "FunctionTransformer" in _unconvertible(nested)
    assert "analyzer" in _unconvertible(TfidfVectorizer(analyzer=str.split))

    class Homemade:
        pass

    assert "no converter" in _unconvertible(Homemade())


def test_a_character_analyzer_is_named_approximate(tmp_path):
    """Character n-grams export but differ from scikit-learn's on some strings: the summary names
    the group; word TF-IDF (the other tests' groups) is exact and named nowhere."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    df, y = frame(2000, seed=11)
    union = ColumnTransformer([("num", StandardScaler(), ["a", "b"]),
                               ("chars", TfidfVectorizer(analyzer="char", ngram_range=(2, 3)), "text")])
    opt = willump.optimize(willump.from_sklearn(Pipeline([("f", union), ("clf", LogisticRegression())])),
                           X=df, y=y, max_loss=0.05, verbose=False, fixed_costs={"num": 1e-6, "chars": 1e-3})
    with pytest.warns(willump.WillumpWarning):
        summary = willump.export_onnx(opt, tmp_path, df[:200])
    assert list(summary["cascade"]["approximate"]) == ["chars"] and "char" in summary["cascade"]["approximate"]["chars"]
