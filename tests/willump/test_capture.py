"""Capture: decorators, the graph, shared work, and clear errors for bad pipelines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import willump
from willump import PipelineError

from .synth import make_rows, three_groups


@pytest.fixture
def rows():
    return make_rows(80, seed=1)[0]


def test_calling_a_pipeline_returns_its_features(rows):
    out = three_groups(rows)
    assert len(out) == 3
    assert np.array_equal(out[0], rows[["a"]].to_numpy())


def test_graph_records_groups_columns_and_order(rows):
    graph = three_groups.capture(rows)
    assert graph.groups == ["cheap", "medium", "costly"]
    assert graph.columns == {"cheap": ["a"], "medium": ["b"], "costly": ["c"]}
    assert graph.widths == {"cheap": 1, "medium": 1, "costly": 1}
    assert not graph.conservative


def test_shared_upstream_step_runs_once_and_is_a_node(rows):
    calls = {"n": 0}

    @willump.feature
    def normalise(frame):
        calls["n"] += 1
        return (frame[["a", "b"]] - 1.0) * 2.0

    @willump.feature
    def left(frame):
        return normalise(frame)[["a"]]

    @willump.feature
    def right(frame):
        return normalise(frame)[["b"]] ** 2

    @willump.pipeline
    def shared(frame):
        return [left(frame), right(frame)]

    graph = shared.capture(rows)
    assert graph.shared_nodes() == ["normalise"]
    assert graph.closure(["right"]) == {"right", "normalise"}
    calls["n"] = 0
    shared(rows)
    assert calls["n"] == 1  # computed once for both groups
    result = shared.execute(rows)
    assert set(result.node_seconds) == {"left", "right", "normalise"}


def test_series_taken_twice_from_one_frame_is_shared(rows):
    calls = {"n": 0}

    @willump.feature
    def square(series):
        calls["n"] += 1
        return series.to_numpy() ** 2

    @willump.feature
    def g1(frame):
        return square(frame["a"])

    @willump.feature
    def g2(frame):
        return square(frame["a"]) + 1

    @willump.pipeline
    def p(frame):
        return [g1(frame), g2(frame)]

    p(rows)
    assert calls["n"] == 1


def test_top_level_helper_feeding_groups_is_a_dependency(rows):
    @willump.feature
    def lower(frame):
        return frame[["a", "b"]].abs()

    @willump.feature
    def first(x):
        return x[["a"]]

    @willump.feature
    def second(frame):
        return frame[["c"]]

    @willump.pipeline
    def p(frame):
        helper = lower(frame)
        return [first(helper), second(frame)]

    graph = p.capture(rows)
    assert graph.closure(["first"]) == {"first", "lower"}
    _, run = p.compute(rows, ["second"])
    assert "lower" not in run.node_seconds  # not needed, not computed
    _, run = p.compute(rows, ["first"])
    assert "lower" in run.node_seconds


def test_sparse_and_dataframe_outputs_are_accepted(rows):
    @willump.feature
    def sparse_group(frame):
        return sp.csr_matrix(frame[["a", "b"]].to_numpy())

    @willump.feature
    def frame_group(frame):
        return frame[["c"]].assign(flag=frame.c > 0)

    @willump.pipeline
    def p(frame):
        return [sparse_group(frame), frame_group(frame)]

    graph = p.capture(rows)
    assert graph.sparse == {"sparse_group": True, "frame_group": False}
    assert graph.widths == {"sparse_group": 2, "frame_group": 2}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda f: None, "returned None"),
        (lambda f: [], "empty list"),
        (lambda f: [f[["a"]].to_numpy()], "not returned by a @willump.feature"),
    ],
)
def test_bad_pipeline_bodies(rows, body, message):
    p = willump.pipeline(body)
    with pytest.raises(PipelineError, match=message):
        p.capture(rows)


def test_group_returning_wrong_row_count(rows):
    @willump.feature
    def short(frame):
        return frame[["a"]].to_numpy()[:-1]

    p = willump.pipeline(lambda f: [short(f)])
    with pytest.raises(PipelineError, match=r"'short' returned 63 rows for 64 input rows"):
        p.capture(rows)


def test_group_returning_text(rows):
    @willump.feature
    def words(frame):
        return np.array([["x"]] * len(frame))

    p = willump.pipeline(lambda f: [words(f)])
    with pytest.raises(PipelineError, match="'words' returned non-numeric"):
        p.capture(rows)


def test_group_returning_non_numeric_dataframe(rows):
    @willump.feature
    def labels(frame):
        return pd.DataFrame({"name": ["x"] * len(frame)})

    p = willump.pipeline(lambda f: [labels(f)])
    with pytest.raises(PipelineError, match=r"non-numeric columns \['name'\]"):
        p.capture(rows)


def test_group_returning_none(rows):
    @willump.feature
    def nothing(frame):
        return None

    p = willump.pipeline(lambda f: [nothing(f)])
    with pytest.raises(PipelineError, match="'nothing' returned None"):
        p.capture(rows)


def test_group_that_fits_on_the_batch_is_rejected(rows):
    @willump.feature
    def standardised(frame):  # depends on the whole batch's mean: not row-wise
        return ((frame[["a"]] - frame[["a"]].mean()) / frame[["a"]].std()).to_numpy()

    p = willump.pipeline(lambda f: [standardised(f)])
    with pytest.raises(PipelineError, match="depending on the other rows"):
        p.capture(rows)


def test_same_output_twice_is_rejected(rows):
    @willump.feature
    def a(frame):
        return frame[["a"]].to_numpy()

    p = willump.pipeline(lambda f: [a(f), a(f)])
    with pytest.raises(PipelineError, match="appears twice"):
        p.capture(rows)


def test_compute_before_capture_says_so(rows):
    p = willump.pipeline(lambda f: [willump.feature(lambda x: x[["a"]])(f)])
    with pytest.raises(PipelineError, match="has not been captured"):
        p.compute(rows, ["<lambda>"])


def test_feature_outside_a_pipeline_is_the_plain_function(rows):
    from .synth import cheap

    assert np.array_equal(cheap(rows), rows[["a"]].to_numpy())


def test_non_callable_is_rejected():
    with pytest.raises(TypeError, match="needs a function"):
        willump.feature(3)


def test_constant_column_reads_are_found(rows):
    frame = rows.assign(year=2013)

    @willump.feature
    def dated(f):
        return (f[["a"]].to_numpy() + f["year"].to_numpy()[:, None] - 2013)

    @willump.feature
    def plain(f):
        return f[["b"]].to_numpy()

    @willump.pipeline
    def p(f):
        return [dated(f), plain(f)]

    graph = p.capture(frame)
    assert graph.columns == {"dated": ["a", "year"], "plain": ["b"]}


@willump.feature
def _column_stat(x):
    return np.asarray(x, dtype=float).reshape(-1, 1)


@willump.pipeline
def _two_temporaries(frame):
    # two temporaries of one shape, dtype, name and index: a freed first one could hand its
    # buffer address (the memo's key) to the second
    return [_column_stat(frame.a * 2), _column_stat(frame.a + 100)]


@pytest.mark.parametrize("n", [1, 2, 10, 1000, 50_000])
def test_temporaries_with_reused_addresses_are_different_nodes(n):
    frame = pd.DataFrame({"a": np.arange(n, dtype=float)})
    out = _two_temporaries(frame)
    assert np.array_equal(out[0].ravel(), frame.a.to_numpy() * 2)
    assert np.array_equal(out[1].ravel(), frame.a.to_numpy() + 100)
    graph = _two_temporaries.capture(frame)
    assert graph.groups == ["_column_stat", "_column_stat#2"]
    blocks, _ = _two_temporaries.compute(frame, ["_column_stat#2"])
    assert np.array_equal(blocks["_column_stat#2"].ravel(), frame.a.to_numpy() + 100)


def test_node_keys_do_not_shift_when_a_group_with_nested_calls_is_skipped(rows):
    @willump.feature
    def helper(x):
        return np.asarray(x, dtype=float).reshape(-1, 1) * 3

    @willump.feature
    def uses_helper(frame):
        return helper(frame["a"]) + 1

    @willump.feature
    def plain(frame):
        return frame[["b"]].to_numpy()

    @willump.pipeline
    def p(frame):
        first = uses_helper(frame)
        return [first, plain(frame), helper(frame["c"])]

    graph = p.capture(rows)
    top_helper = graph.groups[2]
    for groups in (["plain"], [top_helper], ["uses_helper", top_helper]):
        blocks, _ = p.compute(rows, groups)  # uses_helper (and its nested call) skipped in two
        if top_helper in groups:
            assert np.allclose(blocks[top_helper].ravel(), rows["c"].to_numpy() * 3)
    assert np.allclose(p.compute(rows, ["uses_helper"])[0]["uses_helper"].ravel(), rows["a"] * 3 + 1)
