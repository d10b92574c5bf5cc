"""Property tests: the cascade is the baseline when forced, keeps row order, and is row-wise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression

import willump
from willump import Level, OptimizedPipeline

from .synth import make_rows, three_groups

ROWS = 400


@pytest.fixture(scope="module")
def opt():
    X, y = make_rows(3000, seed=5)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, verbose=False,
                           profile_repeats=1, profile_single_rows=3, importance_repeats=1)
    assert opt.report().plan == "cascade"
    return opt


@pytest.fixture(scope="module")
def data():
    return make_rows(ROWS, seed=6)[0]


def _forced_to_full(opt) -> OptimizedPipeline:
    levels = [Level(lv.groups, lv.model, 1.0 + 1e-9) for lv in opt.levels[:-1]] + [opt.levels[-1]]
    return OptimizedPipeline(opt.pipeline, levels, opt.classes_, opt.baseline, None, opt.report_)


indices = st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=60)


@settings(max_examples=25, deadline=None)
@given(idx=indices)
def test_forced_threshold_equals_baseline_exactly(opt, data, idx):
    forced = _forced_to_full(opt)
    rows = data.iloc[idx]
    proba, levels = forced.predict_with_levels(rows)
    assert np.array_equal(proba, opt.baseline.predict_proba(rows))
    assert (levels == len(opt.levels) - 1).all()


@settings(max_examples=25, deadline=None)
@given(perm=st.permutations(list(range(50))))
def test_row_order_is_preserved(opt, data, perm):
    rows = data.iloc[:50]
    whole = opt.predict_proba(rows)
    shuffled = opt.predict_proba(rows.iloc[list(perm)])
    np.testing.assert_allclose(shuffled, whole[list(perm)], rtol=0, atol=1e-12)
    assert np.array_equal(opt.predict(rows.iloc[list(perm)]), opt.predict(rows)[list(perm)])


@settings(max_examples=25, deadline=None)
@given(idx=indices)
def test_any_subset_matches_the_whole_batch(opt, data, idx):
    whole_proba, whole_levels = opt.predict_with_levels(data)
    proba, levels = opt.predict_with_levels(data.iloc[idx])
    np.testing.assert_allclose(proba, whole_proba[idx], rtol=0, atol=1e-12)
    assert np.array_equal(levels, whole_levels[idx])


def _groups_computed(opt, rows) -> list[tuple[str, ...]]:
    """The group lists the pipeline computed while ``opt`` predicted ``rows``."""
    calls = []
    original = opt.pipeline.compute

    def spy(rows, groups, **options):
        calls.append(tuple(groups))
        return original(rows, groups, **options)

    opt.pipeline.compute = spy
    try:
        opt.predict(rows)
    finally:
        del opt.pipeline.compute
    return calls


def test_single_row_exits_early(opt, data):
    _, levels = opt.predict_with_levels(data)
    confident = int(np.flatnonzero(levels == 0)[0])
    calls = _groups_computed(opt, data.iloc[[confident]])
    assert calls == [opt.levels[0].groups]  # the expensive groups never ran


def test_unsure_rows_reuse_cheap_features(opt, data):
    _, levels = opt.predict_with_levels(data)
    unsure = np.flatnonzero(levels == len(opt.levels) - 1)[:5]
    computed = [g for call in _groups_computed(opt, data.iloc[unsure]) for g in call]
    assert sorted(computed) == sorted(opt.pipeline.graph.groups)  # each group once
