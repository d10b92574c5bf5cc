"""Approximate top-K: precision against exact top-K, coverage when the pool dwarfs the held-out
rows, a ratio table built once (no calibration on the request path), and fallbacks."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from willump._topk import build_ratio_table

from . import synth
from .synth import make_rows, quiet, three_groups


@pytest.fixture(scope="module")
def opt():
    synth.SLEEPING = False
    X, y = make_rows(12_000, seed=11)  # 4,800 held-out rows: enough to see the top 2-10% of a pool
    try:
        return willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.01, top_k=100,
                                **quiet(three_groups))
    finally:
        synth.SLEEPING = True


@pytest.fixture(scope="module")
def pool():
    return make_rows(3000, seed=12)[0]


def test_top_k_precision_against_exact(opt, pool):
    assert opt.topk_filter is not None
    assert "estimated" in str(opt.report())
    approximated = []
    for k in (10, 50, 100, 300):
        approx = opt.top_k(pool, k)
        exact = opt.baseline.top_k(pool, k)
        assert len(approx.indices) == k
        if approx.ratio is None:  # a tail too thin for the held-out rows: scored exactly
            assert np.array_equal(approx.indices, exact.indices) and not approx.approximate.any()
            continue
        approximated.append(k)
        precision = len(set(approx.indices) & set(exact.indices)) / k
        assert precision >= 0.9, (k, precision)
        kept = ~approx.approximate
        assert kept.sum() == math.ceil(approx.ratio * k)
        assert kept.sum() < len(pool) / 2  # the filter spares the full pipeline most rows
        # survivors carry the full model's score, and results are best first
        assert np.allclose(approx.scores[kept], exact.scores[kept])
        assert np.all(np.diff(approx.top_scores) <= 0)
        assert not approx.approximate[approx.indices].any()
    assert 10 not in approximated  # the top 0.3% of 3,000 rows is 16 of the 4,800 held-out rows
    assert 300 in approximated


def _scores(n, rng, noise=0.5):
    z = rng.normal(size=n)
    return 1 / (1 + np.exp(-2 * (z + noise * rng.normal(size=n)))), 1 / (1 + np.exp(-2 * z))


def _coverage(table, k, pool, pools, rng, precision=0.95, quantile=0.99):
    ratio = table.ratio_for(k, pool, precision, quantile)
    if ratio is None:
        return None, 1.0  # scored exactly: precision 1
    kept = math.ceil(ratio * k)
    hits = 0
    for _ in range(pools):
        cheap, full = _scores(pool, rng)
        top = np.argpartition(-full, k)[:k]
        hits += np.isin(top, np.argpartition(-cheap, kept)[:kept]).mean() >= precision
    return ratio, hits / pools


@pytest.mark.parametrize(("held", "k", "pool"), [(2400, 10, 100_000), (24_000, 1000, 100_000),
                                                 (2400, 100, 2400), (2400, 50, 20_000)])
def test_precision_target_holds_in_fresh_pools_larger_than_the_held_out_rows(held, k, pool):
    """k=10 of 100,000 with 2,400 held-out rows used to be calibrated at k=1 and held its
    precision in 73% of pools against a 99% target."""
    rng = np.random.default_rng(held + k)
    table = build_ratio_table(*_scores(held, rng))
    ratio, covered = _coverage(table, k, pool, 60, rng)
    assert covered >= 0.95, (ratio, covered)  # 99% target; 60 pools
    if (held, k) == (2400, 10):
        assert ratio is None  # the top 0.01% is a tail 2,400 rows cannot show: exact
    if (held, pool) in ((24_000, 100_000), (2400, 2400)):
        assert ratio is not None and ratio <= 12  # where the rows show the tail, it approximates


def test_queries_read_the_table_and_never_recalibrate(opt, monkeypatch):
    import pickle

    import willump._topk as topk

    f = opt.topk_filter
    assert f is not None
    before = pickle.dumps(f)

    def no_calibration(*args, **kwargs):
        raise AssertionError("a query rebuilt a ratio table")

    monkeypatch.setattr(topk, "build_ratio_table", no_calibration)
    monkeypatch.setattr(topk, "build_filter", no_calibration)
    label = len(opt.classes_) - 1
    queries = [(k, pool) for k in (1, 10, 50, 100, 500) for pool in (200, 3000, 10**6)]
    with ThreadPoolExecutor(8) as threads:
        answers = [list(threads.map(lambda q: f.ratio_for(q[0], q[1], label), queries)) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    assert pickle.dumps(f) == before  # nothing on the request path writes to the filter


def test_a_filter_that_misranks_the_very_top_rows_is_not_trusted():
    """Found by review: the cheap score equals the full one except in the top 0.3%, where the
    cheap groups cannot see what makes those rows top. Wider tails look excellent; the thin
    tail the query asks about does not. No ratio may be approved there."""
    rng = np.random.default_rng(5)

    def scores(n):
        z = rng.normal(size=n)
        cheap = z + 0.3 * rng.normal(size=n)
        top = z > 2.75
        cheap[top] = rng.normal(size=top.sum())
        return cheap, z

    approved = 0
    for _ in range(20):
        table = build_ratio_table(*scores(2400))
        approved += table.ratio_for(100, 10_000, 0.95, 0.99) is not None
    assert approved == 0


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
    full = rng.random(5000)
    assert build_ratio_table(rng.random(5000), full).ratio_for(50, 500, 0.95, 0.99) is None
    assert build_ratio_table(full, full).ratio_for(50, 500, 0.95, 0.99) == 1.0


def test_top_k_dict_is_json_ready(opt, pool):
    json.dumps(opt.top_k(pool, 5).to_dict())
