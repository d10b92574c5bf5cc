"""Sketch statistics are within their stated error of exact statistics on raw data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from drift import QuantileSketch
from drift._sketch import ks_bounds, wasserstein

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


def test_update_rejects_non_finite_and_bad_params() -> None:
    with pytest.raises(ValueError, match="finite"):
        QuantileSketch().update(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="relative_accuracy"):
        QuantileSketch(relative_accuracy=0.0)
    with pytest.raises(ValueError, match="quantile"):
        _sketch(np.ones(3)).quantile(1.5)
