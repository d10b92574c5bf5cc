"""Sketch statistics are within their stated error of exact statistics on raw data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from drift import QuantileSketch
from drift._sketch import ks_bounds, wasserstein
from drift._summary import pack, unpack

ACC = 0.01


def _sketch(x: np.ndarray, acc: float = ACC) -> QuantileSketch:
    s = QuantileSketch(acc)
    s.update(x)
    return s


@pytest.mark.parametrize("dist", ["lognormal", "normal", "with_zeros", "pareto"])
def test_quantiles_within_relative_accuracy(dist: str) -> None:
    rng = np.random.default_rng(1)
    x = {
        "lognormal": rng.lognormal(3, 1, 20_000),
        "normal": rng.normal(0, 5, 20_000),
        "with_zeros": np.where(rng.random(20_000) < 0.3, 0.0, rng.exponential(2, 20_000)),
        "pareto": rng.pareto(1.2, 20_000) + 1,
    }[dist]
    s = _sketch(x)
    qs = np.linspace(0, 1, 101)
    est = s.quantile(qs)
    exact = np.quantile(x, qs, method="inverted_cdf")
    bound = np.maximum(np.abs(exact) * ACC, s.min_value) * (1 + 1e-9)
    assert np.all(np.abs(est - exact) <= bound)


def test_moments_are_exact_and_merge_equals_one_pass() -> None:
    rng = np.random.default_rng(2)
    parts = [rng.normal(100, 3, n) for n in (10, 1000, 5000)]
    merged = QuantileSketch(ACC)
    for p in parts:
        merged.merge(_sketch(p))
    whole = np.concatenate(parts)
    single = _sketch(whole)
    assert merged.count == whole.size
    assert merged.mean == pytest.approx(whole.mean(), rel=1e-12)
    assert merged.variance == pytest.approx(whole.var(ddof=1), rel=1e-9)
    assert (merged.min, merged.max) == (whole.min(), whole.max())
    assert np.array_equal(merged.grid()[1], single.grid()[1])
    np.testing.assert_array_equal(merged.quantile([0.1, 0.5, 0.99]),
                                  single.quantile([0.1, 0.5, 0.99]))


def test_state_roundtrip() -> None:
    s = _sketch(np.random.default_rng(3).normal(0, 1, 500))
    t = QuantileSketch.from_state(s.to_state())
    np.testing.assert_array_equal(s.grid()[1], t.grid()[1])
    assert (s.count, s.mean, s.m2, s.min, s.max) == (t.count, t.mean, t.m2, t.min, t.max)


@pytest.mark.parametrize("shift", [0.0, 0.05, 0.3])
def test_ks_bounds_bracket_scipy(shift: float) -> None:
    rng = np.random.default_rng(4)
    a = rng.lognormal(2, 0.5, 4000)
    b = rng.lognormal(2 + shift, 0.5, 3000)
    low, high = ks_bounds(_sketch(a), _sketch(b))
    exact = stats.ks_2samp(a, b).statistic
    assert low <= exact + 1e-12 <= high + 2e-12
    assert high - low < 0.05  # buckets are narrow at 1% accuracy


def test_wasserstein_within_stated_bound() -> None:
    rng = np.random.default_rng(5)
    a = rng.normal(10, 2, 5000)
    b = rng.normal(10.5, 2.5, 4000) * np.where(rng.random(4000) < 0.1, -1, 1)
    est, bound = wasserstein(_sketch(a), _sketch(b))
    exact = stats.wasserstein_distance(a, b)
    assert abs(est - exact) <= bound


def test_cdf_exact_at_bucket_edges_and_clamped() -> None:
    x = np.arange(1.0, 1001.0)
    s = _sketch(x)
    assert s.cdf(0.5) == 0.0
    assert s.cdf(5000.0) == 1.0
    assert abs(s.cdf(500.0) - 0.5) <= 0.011  # one bucket of 1% relative width


def test_update_rejects_nan_and_bad_params() -> None:
    with pytest.raises(ValueError, match="NaN"):
        QuantileSketch().update(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="relative_accuracy"):
        QuantileSketch(relative_accuracy=0.0)
    with pytest.raises(ValueError, match="quantile"):
        _sketch(np.ones(3)).quantile(1.5)


# ---------------------------------------------------------------------- overflow buckets
def _within(est: np.ndarray, exact: np.ndarray, s: QuantileSketch) -> bool:
    bound = np.maximum(np.abs(exact - s.offset) * s.relative_accuracy, s.min_value)
    return bool(np.all(np.abs(est - exact) <= bound * (1 + 1e-9)))


@pytest.mark.parametrize("extreme", [1e300, np.inf, -1e300, -np.inf, 1e12])
def test_one_extreme_value_collapses_nothing(extreme: float) -> None:
    """Before: one 1e300 collapsed 4952 of 10,001 values and p99 read 2.7e264."""
    rng = np.random.default_rng(7)
    x = np.append(rng.normal(0, 1, 10_000), extreme)
    s = _sketch(x)
    assert s.collapsed == 0
    assert s.count == x.size
    beyond = abs(extreme) > s.max_magnitude
    assert s.overflow == int(beyond and extreme > 0)
    assert s.underflow == int(beyond and extreme < 0)
    qs = np.linspace(0.001, 0.999, 999)
    exact = np.quantile(x, qs, method="inverted_cdf")
    assert _within(s.quantile(qs), exact, s)  # p99 included
    assert s.quantile(1.0) == x.max() and s.quantile(0.0) == x.min()
    finite = x[np.isfinite(x)]
    assert s.infinite == x.size - finite.size
    assert s.mean == pytest.approx(finite.mean(), rel=1e-9)
    if np.isinf(extreme):  # moments of the finite values
        assert s.variance == pytest.approx(finite.var(ddof=1), rel=1e-9)
    assert s.cdf(10.0) == pytest.approx(np.mean(x <= 10.0), abs=1e-12)


def test_the_key_range_is_bounded_and_overflow_keeps_ranks() -> None:
    rng = np.random.default_rng(8)
    x = np.concatenate((rng.lognormal(0, 1, 5000), [1e30, 1e200, np.inf, -1e40, -np.inf]))
    s = _sketch(x)
    assert (s.overflow, s.underflow, s.infinite, s.collapsed) == (3, 2, 2, 0)
    assert s._pos.counts.size <= s.max_bins and s._neg.counts.size <= s.max_bins
    assert s.max_magnitude == pytest.approx(1e-9 * ((1 + ACC) / (1 - ACC)) ** 4096, rel=0.05)
    assert s.quantile(0.9999) == np.inf and s.quantile(0.0001) == -np.inf
    assert s.cdf(1e26) == pytest.approx(5002 / 5005)  # edge of the range: ranks exact
    low, high = ks_bounds(s, _sketch(x[2:-3]))
    assert low <= 5 / 5005 + 1e-12 and high < 0.05


def test_merge_and_pack_roundtrip_with_overflow() -> None:
    rng = np.random.default_rng(9)
    parts = [np.append(rng.normal(5, 2, 3000), e) for e in (1e300, -np.inf, 1e12)]
    parts.append(rng.normal(5, 2, 10))
    merged = QuantileSketch(ACC, offset=5.0)
    for p in parts:
        one = QuantileSketch(ACC, offset=5.0)
        one.update(p)
        merged.merge(one)
    whole = np.concatenate(parts)
    single = QuantileSketch(ACC, offset=5.0)
    single.update(whole)
    assert (merged.overflow, merged.underflow, merged.infinite) == (1, 1, 1)
    assert merged.count == single.count == whole.size
    assert np.array_equal(merged.grid()[1], single.grid()[1])
    assert merged.grid()[0] == single.grid()[0]
    finite = whole[np.isfinite(whole)]
    assert merged.mean == pytest.approx(finite.mean(), rel=1e-9)
    # through the store's byte format, as a pane is persisted
    state = unpack(pack({f"s0.{k}": v for k, v in merged.to_state().items()}))
    back = QuantileSketch.from_state({k[3:]: v for k, v in state.items()})
    assert (back.overflow, back.underflow, back.infinite, back.collapsed) == (1, 1, 1, 0)
    assert (back.count, back.mean, back.m2, back.min, back.max) == (
        merged.count, merged.mean, merged.m2, merged.min, merged.max)
    np.testing.assert_array_equal(back.grid()[1], merged.grid()[1])
    qs = [0.001, 0.5, 0.99, 1.0]
    np.testing.assert_array_equal(back.quantile(qs), merged.quantile(qs))
    back.merge(single)
    assert back.overflow == 2 and back.count == 2 * whole.size


def test_states_from_before_the_bounded_range_still_load() -> None:
    """An old state has 10 moments and may hold keys above the range: they fold into overflow."""
    s = _sketch(np.random.default_rng(10).normal(0, 1, 1000))
    state = s.to_state()
    state["moments"] = state["moments"][:10].copy()
    old = QuantileSketch.from_state(state)
    assert (old.overflow, old.underflow, old.infinite) == (0, 0, 0)
    np.testing.assert_array_equal(old.grid()[1], s.grid()[1])
    wide = dict(state)
    top = s._pos.offset + s._pos.counts.size
    wide["pos"] = np.concatenate((s._pos.counts, np.zeros(s._kmax - top + 1, np.int64), [2]))
    folded = QuantileSketch.from_state(wide)
    assert folded.overflow == 2
    assert folded._pos.offset + folded._pos.counts.size - 1 <= folded._kmax


def test_winsorised_wasserstein_within_stated_bound() -> None:
    rng = np.random.default_rng(11)
    a = np.append(rng.normal(0, 1, 5000), [1e12, np.inf])
    b = np.append(rng.normal(0.5, 1.5, 4000), -1e300)
    est, bound = wasserstein(_sketch(a), _sketch(b), -4.0, 4.0)
    exact = stats.wasserstein_distance(np.clip(a, -4, 4), np.clip(b, -4, 4))
    assert abs(est - exact) <= bound < 0.05
    assert wasserstein(_sketch(a), _sketch(b))[0] == np.inf
