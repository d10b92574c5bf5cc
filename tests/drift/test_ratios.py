"""Risk-ratio boundary cases and interval behaviour."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from drift import explain
from drift._ratios import global_ratio, mean_shift, risk_ratio, share_ratio

ALPHA = 0.05


def _rr(o: float, n: float, total_o: float, total_n: float) -> tuple[float, float, float]:
    r, lo, hi = risk_ratio(np.array([o]), np.array([n]), total_o, total_n, ALPHA)
    return float(r[0]), float(lo[0]), float(hi[0])


def test_no_exposure_is_undefined() -> None:
    r, lo, hi = _rr(0.0, 0.0, 10.0, 1000.0)
    assert np.isnan(r) and np.isnan(lo) and np.isnan(hi)


def test_all_rows_exposed_is_undefined() -> None:
    r, _, _ = _rr(10.0, 1000.0, 10.0, 1000.0)
    assert np.isnan(r)


def test_all_outliers_exposed_is_infinite_with_finite_lower_bound() -> None:
    r, lo, hi = _rr(10.0, 20.0, 10.0, 1000.0)
    assert r == np.inf
    assert np.isfinite(lo) and lo > 1.0
    assert hi == np.inf


def test_residue_of_weight_sums_counts_as_zero() -> None:
    """Outliers outside the group that are only floating-point residue (1e-12 of a weighted
    sum) follow the zero-cell rule: infinite, never a 13-digit ratio (the HTTP report)."""
    o = 1234.5678
    r, lo, hi = _rr(o, 50.0, o + 1e-12 * o, 10_000.0)
    assert r == np.inf and np.isfinite(lo) and hi == np.inf


def test_no_outliers_in_group() -> None:
    r, lo, hi = _rr(0.0, 100.0, 10.0, 1000.0)
    assert r == 0.0 and lo == 0.0 and 0 < hi < np.inf


def test_plain_case_and_interval_contains_estimate() -> None:
    r, lo, hi = _rr(30.0, 100.0, 60.0, 1000.0)
    assert r == pytest.approx((30 / 100) / (30 / 900))
    assert lo < r < hi


def test_interval_coverage_is_at_least_nominal() -> None:
    rng = np.random.default_rng(0)
    true_rr, n_g, n_rest, base = 2.0, 400, 4000, 0.02
    covered = 0
    sims = 400
    for _ in range(sims):
        o_g = rng.binomial(n_g, base * true_rr)
        o_r = rng.binomial(n_rest, base)
        _, lo, hi = _rr(float(o_g), float(n_g), float(o_g + o_r), float(n_g + n_rest))
        covered += lo <= true_rr <= hi
    assert covered / sims >= 0.93


def test_other_ratios_boundaries() -> None:
    g, _, _ = global_ratio(np.array([0.0]), np.array([0.0]), 5.0, 100.0, ALPHA)
    assert np.isnan(g[0])
    s, lo, hi = share_ratio(np.array([20.0]), np.array([0.0]), 100.0, 100.0, ALPHA)
    assert s[0] == np.inf and lo[0] > 1 and hi[0] == np.inf  # a brand-new segment
    m, _, _ = mean_shift(np.array([0.0]), np.array([0.0]), np.array([0.0]), 10.0, 5.0, 5.0,
                         ALPHA)
    assert np.isnan(m[0])


def test_boundary_cases_through_explain_serialize() -> None:
    frame = pd.DataFrame({"a": ["x"] * 20 + ["y"] * 980, "o": [True] * 10 + [False] * 990})
    result = explain(frame, ["a"], outlier="o")
    assert result[0]["a"] == "x" and result[0]["support"] == 1.0
    payload = result.to_dict()
    # an infinite upper bound is None (a number column), named in the row's `infinite`
    assert payload["rows"][0]["ci_high"] is None and "ci_high" in payload["rows"][0]["infinite"]
    json.dumps(payload, allow_nan=False)
    # every row exposed: nothing to report
    all_in = pd.DataFrame({"a": ["x"] * 100, "o": [True] * 5 + [False] * 95})
    assert len(explain(all_in, ["a"], outlier="o")) == 0
