"""willump.from_sklearn: FeatureUnion / ColumnTransformer branches as feature groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

import willump
from willump import PipelineError


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    n = 3000
    df = pd.DataFrame({
        "a": rng.normal(size=n),
        "b": rng.normal(size=n),
        "cat": rng.choice(list("xyz"), n),
        "text": rng.choice(["good day", "bad day", "so so", "great"], n),
    })
    y = ((2 * df.a + (df.cat == "x") + 0.5 * (df.text == "great") + rng.normal(size=n) * 0.5) > 0.5)
    return df, y.astype(int).to_numpy()


def column_pipeline():
    ct = ColumnTransformer(
        [("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["cat"]),
         ("txt", TfidfVectorizer(), "text")]
    )
    return Pipeline([("features", ct), ("clf", LogisticRegression())])


def test_column_transformer_branches_become_groups(frame):
    df, y = frame
    wp = willump.from_sklearn(column_pipeline())
    opt = willump.optimize(wp, X=df, y=y, max_loss=0.02, verbose=False)
    assert opt.pipeline.graph.groups == ["num", "cat", "txt"]
    assert opt.pipeline.graph.columns == {"num": ["a", "b"], "cat": ["cat"], "txt": ["text"]}
    assert wp.graph_ is None  # optimize captured its own copy
    assert isinstance(opt.levels[-1].model, LogisticRegression)
    assert opt.predict(df[:10]).shape == (10,)


def test_fitted_pipeline_matches_sklearn(frame):
    df, y = frame
    sk = column_pipeline().fit(df, y)
    wp = willump.from_sklearn(sk)
    wp.capture(df)
    features = np.hstack([b.toarray() if hasattr(b, "toarray") else b
                          for b in wp.compute(df, wp.graph.groups)[0].values()])
    expected = sk[:-1].transform(df)
    expected = expected.toarray() if hasattr(expected, "toarray") else expected
    np.testing.assert_allclose(features, expected)


def test_feature_union_with_preprocessing_and_remainder(frame):
    df, y = frame
    numeric = FunctionTransformer(lambda d: d[["a", "b"]].to_numpy())
    union = FeatureUnion([("scaled", StandardScaler()), ("squared", FunctionTransformer(np.square))],
                         transformer_weights={"squared": 0.5})
    sk = Pipeline([("pick", numeric), ("union", union), ("clf", LogisticRegression())])
    wp = willump.from_sklearn(sk)
    wp = willump.optimize(wp, X=df, y=y, max_loss=0.02, verbose=False).pipeline
    assert wp.graph.groups == ["scaled", "squared"]
    assert wp.graph.shared_nodes() == ["preprocess"]
    blocks, _ = wp.compute(df[:5], ["squared"])
    np.testing.assert_allclose(blocks["squared"], 0.5 * df[["a", "b"]].to_numpy()[:5] ** 2)

    ct = ColumnTransformer([("num", StandardScaler(), ["a"])], remainder="passthrough")
    wp2 = willump.from_sklearn(Pipeline([("f", ct), ("clf", LogisticRegression())]))
    with pytest.raises(PipelineError, match="non-numeric"):
        willump.optimize(wp2, X=df, y=y, verbose=False)  # remainder holds text columns
    wp3 = willump.from_sklearn(Pipeline([("f", ct), ("clf", LogisticRegression())]))
    wp3 = willump.optimize(wp3, X=df[["a", "b"]], y=y, max_loss=0.02, verbose=False).pipeline
    assert wp3.graph.groups == ["num", "remainder"]


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (Pipeline([("s", StandardScaler()), ("clf", LogisticRegression())]), "no FeatureUnion"),
        (Pipeline([("u", FeatureUnion([("s", StandardScaler())])), ("s2", StandardScaler()),
                   ("clf", LogisticRegression())]), "between the feature union"),
        (Pipeline([("u", FeatureUnion([("s", StandardScaler())])), ("s2", StandardScaler())]),
         "no predict_proba"),
    ],
)
def test_unsupported_shapes_are_explained(pipeline, message):
    with pytest.raises(PipelineError, match=message):
        willump.from_sklearn(pipeline)


def test_not_a_pipeline():
    with pytest.raises(TypeError, match="sklearn.pipeline.Pipeline"):
        willump.from_sklearn(LogisticRegression())


def test_a_fitted_pipeline_is_refitted_on_willump_train_rows_only(frame):
    """Found by review as untested: an already-fitted union may have seen the rows willump
    certifies on; optimize fits fresh copies on its train split (the scaler's mean shows it)."""
    from .synth import default_splits

    df, y = frame
    sk = column_pipeline().fit(df, y)  # fitted on every row, certification rows included
    wp = willump.from_sklearn(sk)
    with pytest.warns(willump.WillumpWarning, match="already fitted"):
        opt = willump.optimize(wp, X=df, y=y, max_loss=0.02, verbose=False,
                               fixed_costs={"num": 1e-6, "cat": 1e-6, "txt": 1e-4})
    train = default_splits(df, y).train
    scaler, _, _ = opt.pipeline.branch("num")
    np.testing.assert_allclose(scaler.mean_, df[["a", "b"]].iloc[train].mean().to_numpy())
    assert not np.allclose(scaler.mean_, sk.named_steps["features"].named_transformers_["num"].mean_)
    assert f"fitted by willump on its {len(train)} train rows" in opt.report().feature_state
    mine, _, _ = wp.branch("num")  # the caller's wrapper and pipeline are left as they were
    np.testing.assert_allclose(mine.mean_, sk.named_steps["features"].named_transformers_["num"].mean_)
    X_cert, y_cert = df.iloc[:500], y[:500]
    kept = willump.optimize(willump.from_sklearn(sk), X=df.iloc[500:], y=y[500:], max_loss=0.05,
                            refit=False, cert=(X_cert, y_cert), verbose=False,
                            fixed_costs={"num": 1e-6, "cat": 1e-6, "txt": 1e-4})
    np.testing.assert_allclose(kept.pipeline.branch("num")[0].mean_,
                               sk.named_steps["features"].named_transformers_["num"].mean_)
