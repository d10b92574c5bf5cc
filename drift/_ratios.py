"""Ratio metrics of a group against the rest, with exact-conditional confidence intervals.

Why here, vectorized: the explainer scores thousands of candidate combinations at once. All
functions take per-group sums (arrays) and population totals and return ratio, lower and upper
bounds at a two-sided miscoverage `alpha`. Counts may be fractional (pre-aggregated or sampled).

Conventions (MacroBase DIFF terms: o_g outliers in group, n_g rows in group, O, N totals):
- risk ratio  = (o_g / n_g) / ((O - o_g) / (N - n_g)).
- global ratio = (o_g / n_g) / (O / N).
- share ratio  = (o_g / O) / (r_g / R): a group's share of test rows over its share of control
  rows (mix shift: current window vs reference), the risk ratio of the transposed table.
- mean shift   = mean(x | g) / mean(x | not g), CI by the delta method.

Intervals. Risk and share ratios are ratios of two rates, (a / e1) / (c / e2); conditional on
a + c, a is binomial with p = a / (a + c), so Clopper-Pearson bounds on p give exact bounds on
the ratio (the classic conditional interval for a rate ratio; conservative when the outcome is
common). Unlike Katz's log interval it stays honest for the handful-of-outliers combinations an
APriori search produces by the thousand. Sampled rows (Horvitz-Thompson weights) enter with
Kish effective counts, and the sampling variance of the exposures widens the interval on the
log scale. Edge cases: no rows in the group (no exposure) or every row in it (nothing to compare
against) give an undefined ratio (NaN, reported as None). A zero cell (no outliers in the group,
or all of them) gets Haldane's +0.5 on every cell for the point estimate only, so ratios stay
finite; the bounds use the raw counts (an upper bound may be infinite).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

#: Continuity correction added to each cell of a 2x2 table with a zero cell (point estimate).
ZERO_CELL_CORRECTION = 0.5
#: Relative tolerance for "the group holds every row".
_ALL_ROWS_RTOL = 1e-12


def z_value(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(stats.norm.ppf(0.5 + confidence / 2.0))


def _effective(count: np.ndarray, var: np.ndarray | float) -> np.ndarray:
    """Kish effective count of a weighted sum with sampling variance `var`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = np.where(count > 0, count * count / (count + var), 0.0)
    return np.nan_to_num(eff, nan=0.0)


def _binomial_bounds(a: np.ndarray, c: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Clopper-Pearson bounds on p = a / (a + c) (fractional counts allowed)."""
    a = np.maximum(a, 0.0)
    c = np.maximum(c, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(a > 0, stats.beta.ppf(alpha / 2.0, np.maximum(a, 1e-300), c + 1.0), 0.0)
        hi = np.where(c > 0, stats.beta.ppf(1.0 - alpha / 2.0, a + 1.0,
                                            np.maximum(c, 1e-300)), 1.0)
    return np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=1.0)


def _odds(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p >= 1.0, np.inf, p / (1.0 - p))


def rate_ratio(
    a: np.ndarray,
    c: np.ndarray,
    e1: np.ndarray,
    e2: np.ndarray,
    alpha: float,
    var_a: np.ndarray | float = 0.0,
    var_c: np.ndarray | float = 0.0,
    var_log_e: np.ndarray | float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a / e1) / (c / e2) with exact conditional bounds (see module docstring)."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    e1 = np.asarray(e1, dtype=np.float64)
    e2 = np.asarray(e2, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fix = (a <= 0) | (c <= 0)
        k = np.where(fix, ZERO_CELL_CORRECTION, 0.0)
        ratio = ((a + k) / (e1 + 2 * k)) / ((c + k) / (e2 + 2 * k))
        lo_p, hi_p = _binomial_bounds(_effective(a, var_a), _effective(c, var_c), alpha)
        scale = e2 / e1
        lo, hi = _odds(lo_p) * scale, _odds(hi_p) * scale
        widen = np.sqrt(np.maximum(var_log_e, 0.0)) * stats.norm.ppf(1.0 - alpha / 2.0)
        lo, hi = lo * np.exp(-widen), hi * np.exp(widen)
    return ratio, lo, hi


def risk_ratio(
    o: np.ndarray,
    n: np.ndarray,
    total_o: float,
    total_n: float,
    alpha: float,
    var_o: np.ndarray | float = 0.0,
    var_n: np.ndarray | float = 0.0,
    total_var_o: float = 0.0,
    total_var_n: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's outlier rate against the rest's."""
    o = np.asarray(o, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    rest_n = total_n - n
    defined = (n > 0) & (n < total_n * (1.0 - _ALL_ROWS_RTOL))
    with np.errstate(divide="ignore", invalid="ignore"):
        var_log_e = var_n / n**2 + np.maximum(total_var_n - var_n, 0.0) / rest_n**2
    ratio, lo, hi = rate_ratio(
        o, total_o - o, n, rest_n, alpha, var_o, np.maximum(total_var_o - var_o, 0.0),
        np.where(defined, var_log_e, 0.0),
    )
    nan = np.full(ratio.shape, np.nan)
    return np.where(defined, ratio, nan), np.where(defined, lo, nan), np.where(defined, hi, nan)


def global_ratio(
    o: np.ndarray,
    n: np.ndarray,
    total_o: float,
    total_n: float,
    alpha: float,
    var_o: np.ndarray | float = 0.0,
    var_n: np.ndarray | float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's outlier rate against the overall rate."""
    o = np.asarray(o, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    defined = (n > 0) & (total_o > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fix = (o <= 0) | (o >= n)
        k = np.where(fix, ZERO_CELL_CORRECTION, 0.0)
        ratio = ((o + k) / (n + 2 * k)) / (total_o / total_n)
        # share of all outliers that fall in the group, binomial given the total
        lo_p, hi_p = _binomial_bounds(_effective(o, var_o),
                                      _effective(np.maximum(total_o - o, 0.0), 0.0), alpha)
        scale = total_n / n
        lo, hi = lo_p * scale, hi_p * scale
        widen = np.sqrt(np.maximum(var_n, 0.0)) / n * stats.norm.ppf(1.0 - alpha / 2.0)
        lo, hi = lo * np.exp(-widen), hi * np.exp(widen)
    nan = np.full(ratio.shape, np.nan)
    return np.where(defined, ratio, nan), np.where(defined, lo, nan), np.where(defined, hi, nan)


def share_ratio(
    o: np.ndarray,
    r: np.ndarray,
    total_o: float,
    total_r: float,
    alpha: float,
    var_o: np.ndarray | float = 0.0,
    var_r: np.ndarray | float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's share of test rows over its share of control."""
    o = np.asarray(o, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    defined = ((o > 0) | (r > 0)) & (total_o > 0) & (total_r > 0)
    ratio, lo, hi = rate_ratio(o, r, np.full(o.shape, float(total_o)),
                               np.full(o.shape, float(total_r)), alpha, var_o, var_r)
    nan = np.full(ratio.shape, np.nan)
    return np.where(defined, ratio, nan), np.where(defined, lo, nan), np.where(defined, hi, nan)


def mean_shift(
    n: np.ndarray,
    x_sum: np.ndarray,
    x2_sum: np.ndarray,
    total_n: float,
    total_x: float,
    total_x2: float,
    alpha: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's metric mean over the rest's mean (> 0 only)."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        m_in = x_sum / n
        n_out = total_n - n
        m_out = (total_x - x_sum) / n_out
        v_in = np.maximum(x2_sum / n - m_in**2, 0.0) * n / np.maximum(n - 1.0, 1.0)
        v_out = np.maximum((total_x2 - x2_sum) / n_out - m_out**2, 0.0) * n_out / np.maximum(
            n_out - 1.0, 1.0
        )
        defined = (n > 1) & (n_out > 1) & (m_in > 0) & (m_out > 0)
        ratio = m_in / m_out
        se = np.sqrt(v_in / (n * m_in**2) + v_out / (n_out * m_out**2))
        z = stats.norm.ppf(1.0 - alpha / 2.0)
        lo, hi = ratio * np.exp(-z * se), ratio * np.exp(z * se)
    nan = np.full(ratio.shape, np.nan)
    return np.where(defined, ratio, nan), np.where(defined, lo, nan), np.where(defined, hi, nan)
