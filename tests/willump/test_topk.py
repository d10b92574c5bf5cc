"""Approximate top-K: precision against exact top-K, approximate flags, and fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from willump._planner import topk_ratio

from .synth import make_rows, three_groups


@pytest.fixture(scope="module")
def opt():
    X, y = make_rows(6000, seed=11)
    return willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, top_k=50,
                            verbose=False, profile_repeats=1, profile_single_rows=3, importance_repeats=1)


@pytest.fixture(scope="module")
def pool():
    return make_rows(3000, seed=12)[0]


def test_top_k_precision_against_exact(opt, pool):
    assert opt.topk_filter is not None
    for k in (10, 50, 100):
        approx = opt.top_k(pool, k)
        exact = opt.baseline.top_k(pool, k)
        assert len(approx.indices) == k
        precision = len(set(approx.indices) & set(exact.indices)) / k
        assert precision >= 0.9, (k, precision)
        assert approx.ratio is not None
        kept = ~approx.approximate
        assert kept.sum() == int(np.ceil(approx.ratio * k))
        # survivors carry the full model's score, and results are best first
        assert np.allclose(approx.scores[kept], exact.scores[kept])
        assert np.all(np.diff(approx.top_scores) <= 0)
        assert not approx.approximate[approx.indices].any()


def test_top_k_is_cheaper_than_exact(opt, pool):
    import time

    def seconds(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    exact = np.median([seconds(lambda: opt.baseline.top_k(pool, 20)) for _ in range(2)])
    approx = np.median([seconds(lambda: opt.top_k(pool, 20)) for _ in range(2)])
    assert approx * 2 < exact


def test_label_argument_and_bad_k(opt, pool):
    top0 = opt.top_k(pool, 10, label=0)
    scores0 = opt.baseline.predict_proba(pool)[:, 0]
    assert scores0[top0.indices].min() >= np.sort(scores0)[-40]
    with pytest.raises(ValueError, match="label 7 is not a class"):
        opt.top_k(pool, 10, label=7)
    with pytest.raises(ValueError, match="k must be between 1 and the number of rows"):
        opt.top_k(pool, 0)
    with pytest.raises(ValueError, match=r"k must be between 1 and the number of rows \(3000\)"):
        opt.top_k(pool, 3001)
    with pytest.raises(TypeError, match="k must be an integer"):
        opt.top_k(pool, 2.5)


def test_k_equal_to_pool_is_exact(opt, pool):
    rows = pool.iloc[:40]
    result = opt.top_k(rows, 40)
    assert result.ratio is None and not result.approximate.any()
    assert np.array_equal(result.indices, opt.baseline.top_k(rows, 40).indices)


def test_no_qualifying_ratio_returns_none():
    rng = np.random.default_rng(0)
    full = rng.random(500)
    noise = rng.random(500)  # a filter unrelated to the full score
    assert topk_ratio(noise, full, 50, 500, precision=0.95, quantile=0.99, rng=rng) is None
    assert topk_ratio(full, full, 50, 500, precision=0.95, quantile=0.99, rng=rng) == 1.0


def test_top_k_dict_is_json_ready(opt, pool):
    import json

    json.dumps(opt.top_k(pool, 5).to_dict())
