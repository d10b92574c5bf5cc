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
the ratio (the classic conditional interval for a rate ratio). Unlike Katz's log interval it
stays honest for the handful-of-outliers combinations an APriori search produces by the
thousand.

Sampled rows (Horvitz-Thompson weights with per-row sampling variance) enter through ONE
effective binomial size: the estimate p = a / (a + c) stays centred on the weighted counts, and
n_eff = p (1 - p) / Var(p), where Var(p) adds the binomial variance, the sampling variance of a
and c by the delta method ((c^2 var_a + a^2 var_c) / (a + c)^4) and the sampling variance of
the exposures (var(log e1) + var(log e2), mapped to p's scale). Clopper-Pearson then runs on
(p n_eff, (1 - p) n_eff). On exact data this is the exact interval. (Shrinking each cell to its
own Kish count, as before, moved the centre whenever the two sides' weights differed.)

Clustered rows. Rows that arrive in requests share their request's latency, client and time,
so they are not independent draws. Every interval takes a design effect `deff` (Kish 1965):
the cluster-robust (sandwich) variance of the statistic over the row-wise one, computed per
combination in drift._clusters. The effective binomial size is divided by it (never multiplied:
deff < 1 counts as 1), so the interval stays the conditional exact one on fewer, honest rows.

Zero sampled cells. A Horvitz-Thompson variance is a sum over the rows sampled in the cell, so
a cell whose few expected sample rows all happened to be missed gets variance 0 and looks
exact: a combination with 7 sampled window rows and none in the sampled reference read as a
1,000-fold share change. Every sampled side therefore carries a variance floor (`floor_*`):
half a row of its heaviest stratum, 0.5 w (w - 1), the variance of a cell that is one coin
flip away from holding one more sampled row. Exact data have floors of 0.

Zero cells (documented rule): no rows in the group (no exposure) or every row in it (nothing to
compare against) give an undefined ratio (NaN, reported as None). No outliers outside the group
(all of them inside) gives an infinite ratio with a finite lower bound; no outliers inside gives
0. Counts within `ZERO_TOLERANCE` of zero (relative to a + c, the residue of subtracting sums
of weights) count as zero, so a ratio never reads as a 13-digit number.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

#: Relative size below which a cell counts as empty (floating-point residue of weight sums).
ZERO_TOLERANCE = 1e-9
#: Relative tolerance for "the group holds every row".
_ALL_ROWS_RTOL = 1e-9


def z_value(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(stats.norm.ppf(0.5 + confidence / 2.0))


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


def effective_binomial(
    a: np.ndarray,
    c: np.ndarray,
    var_a: np.ndarray | float = 0.0,
    var_c: np.ndarray | float = 0.0,
    var_log_e: np.ndarray | float = 0.0,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(successes, failures) of one effective binomial with p = a / (a + c) and the variance
    of the estimated p (binomial + delta-method sampling variance + exposure variance),
    shrunk by the design effect `deff` of clustered rows (drift._clusters; 1: independent)."""
    a = np.maximum(np.asarray(a, dtype=np.float64), 0.0)
    c = np.maximum(np.asarray(c, dtype=np.float64), 0.0)
    t = a + c
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(t > 0, a / t, 0.0)
        q = 1.0 - p
        var_p = (p * q / t + (c * c * var_a + a * a * var_c) / t**4
                 + np.maximum(var_log_e, 0.0) * (p * q) ** 2)
        n_eff = np.where((p > 0) & (q > 0) & (var_p > 0), p * q / var_p, 0.0)
        # p at 0 or 1: Kish's effective size of the total stands in (p q is 0 there)
        kish = np.where(t > 0, t * t / (t + np.maximum(var_a + var_c, 0.0)), 0.0)
        n_eff = np.where((p > 0) & (q > 0), n_eff, kish)
        n_eff = np.minimum(np.nan_to_num(n_eff, nan=0.0), np.where(t > 0, t, 0.0))
        n_eff = n_eff / np.maximum(np.nan_to_num(deff, nan=1.0), 1.0)
    return p * n_eff, q * n_eff


def rate_ratio(
    a: np.ndarray,
    c: np.ndarray,
    e1: np.ndarray,
    e2: np.ndarray,
    alpha: float,
    var_a: np.ndarray | float = 0.0,
    var_c: np.ndarray | float = 0.0,
    var_log_e: np.ndarray | float = 0.0,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a / e1) / (c / e2) with conditional exact bounds (see module docstring)."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    e1 = np.asarray(e1, dtype=np.float64)
    e2 = np.asarray(e2, dtype=np.float64)
    tol = ZERO_TOLERANCE * np.maximum(a + c, 0.0)
    a = np.where(a <= tol, 0.0, a)
    c = np.where(c <= tol, 0.0, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(c > 0, (a / e1) / (c / e2), np.where(a > 0, np.inf, np.nan))
        x, y = effective_binomial(a, c, var_a, var_c, var_log_e, deff)
        lo_p, hi_p = _binomial_bounds(x, y, alpha)
        scale = e2 / e1
        lo, hi = _odds(lo_p) * scale, _odds(hi_p) * scale
        # exposure variance could not enter p's scale at p = 0 or 1: widen on the log scale
        edge = (a <= 0) | (c <= 0)
        widen = np.where(edge, np.sqrt(np.maximum(var_log_e, 0.0)), 0.0) * stats.norm.ppf(
            1.0 - alpha / 2.0)
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
    floor_o: float = 0.0,
    floor_n: float = 0.0,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's outlier rate against the rest's."""
    o = np.asarray(o, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    rest_n = total_n - n
    defined = (n > 0) & (n < total_n * (1.0 - _ALL_ROWS_RTOL))
    with np.errstate(divide="ignore", invalid="ignore"):
        var_log_e = ((var_n + floor_n) / n**2
                     + (np.maximum(total_var_n - var_n, 0.0) + floor_n) / rest_n**2)
    ratio, lo, hi = rate_ratio(
        o, total_o - o, n, rest_n, alpha, var_o + floor_o,
        np.maximum(total_var_o - var_o, 0.0) + floor_o, np.where(defined, var_log_e, 0.0),
        deff,
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
    total_var_o: float = 0.0,
    floor_o: float = 0.0,
    floor_n: float = 0.0,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's outlier rate against the overall rate."""
    o = np.asarray(o, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    defined = (n > 0) & (total_o > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (o / n) / (total_o / total_n)
        # share of all outliers that fall in the group, binomial given the total
        rest = np.maximum(total_o - o, 0.0)
        x, y = effective_binomial(o, rest, var_o + floor_o,
                                  np.maximum(total_var_o - var_o, 0.0) + floor_o,
                                  (np.maximum(var_n, 0.0) + floor_n) / n**2, deff)
        lo_p, hi_p = _binomial_bounds(x, y, alpha)
        scale = total_n / n
        lo, hi = lo_p * scale, hi_p * scale
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
    floor_o: float = 0.0,
    floor_r: float = 0.0,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's share of test rows over its share of control."""
    o = np.asarray(o, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    defined = ((o > 0) | (r > 0)) & (total_o > 0) & (total_r > 0)
    ratio, lo, hi = rate_ratio(o, r, np.full(o.shape, float(total_o)),
                               np.full(o.shape, float(total_r)), alpha,
                               np.maximum(var_o, 0.0) + floor_o, np.maximum(var_r, 0.0) + floor_r,
                               deff=deff)
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
    w2_sum: np.ndarray | None = None,
    total_w2: float | None = None,
    deff: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lower, upper) of each group's metric mean over the rest's mean (> 0 only).

    `n`, `x_sum`, `x2_sum` are weighted sums; with sampled rows `w2_sum` (sum of squared
    weights) gives each side's Kish effective size, which is what the standard error of a
    weighted mean is based on (not the estimated population count).
    """
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        m_in = x_sum / n
        n_out = total_n - n
        m_out = (total_x - x_sum) / n_out
        if w2_sum is None or total_w2 is None:
            k_in, k_out = n, n_out
        else:
            w2_sum = np.asarray(w2_sum, dtype=np.float64)
            k_in = n * n / w2_sum
            k_out = n_out * n_out / np.maximum(total_w2 - w2_sum, 1e-300)
        v_in = np.maximum(x2_sum / n - m_in**2, 0.0) * k_in / np.maximum(k_in - 1.0, 1.0)
        v_out = np.maximum((total_x2 - x2_sum) / n_out - m_out**2, 0.0) * k_out / np.maximum(
            k_out - 1.0, 1.0
        )
        defined = (k_in > 1) & (k_out > 1) & (m_in > 0) & (m_out > 0)
        ratio = m_in / m_out
        se = np.sqrt((v_in / (k_in * m_in**2) + v_out / (k_out * m_out**2))
                     * np.maximum(np.nan_to_num(deff, nan=1.0), 1.0))
        z = stats.norm.ppf(1.0 - alpha / 2.0)
        lo, hi = ratio * np.exp(-z * se), ratio * np.exp(z * se)
    nan = np.full(ratio.shape, np.nan)
    return np.where(defined, ratio, nan), np.where(defined, lo, nan), np.where(defined, hi, nan)
