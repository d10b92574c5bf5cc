"""Two-sample tests of one column: current window vs reference.

Why these: KS (numeric) and chi-squared (categorical) give significance; normalized Wasserstein
and Jensen-Shannon distance give an effect size that does not grow with the sample, because at
serving volumes plain KS fires on meaningless differences (Evidently #50, Alibi Detect #646).
PSI is reported for familiarity only. On sketches, the KS statistic is bracketed by exact bounds
and the Wasserstein distance carries an error bound; significance uses the lower KS bound and
the effect gate uses the effect's lower bound, so sketch error can never cause a flag.

The numeric effect is robust: W1 of both samples winsorised to the reference's far-out fences,
over the reference's IQR / 1.349 (`robust_spread`), so one extreme value neither silences a
column (a standard deviation inflated by one 1e12) nor raises a false alarm (W1 moved by one
1e12 in the window). Columns whose spread outliers dominate are named, with a reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from scipy.spatial import distance

from drift._rules import (
    DEFAULT_ALPHA,
    DEFAULT_CATEGORICAL_EFFECT,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_NUMERIC_EFFECT,
    benjamini_hochberg,
)
from drift._sketch import QuantileSketch, ks_bounds, wasserstein

__all__ = ["DEFAULT_ALPHA", "DEFAULT_CATEGORICAL_EFFECT", "DEFAULT_MIN_SAMPLES",
           "DEFAULT_NUMERIC_EFFECT", "benjamini_hochberg"]

#: Floor on bin proportions inside PSI's logarithm.
PSI_EPSILON = 1e-4
#: PSI bins: deciles of the reference.
PSI_BINS = 10


#: Above this effective size the limiting Kolmogorov distribution is used (scipy's exact
#: finite-n distribution costs milliseconds per call there and differs by < 1e-3).
KS_ASYMPTOTIC_N = 1000


def ks_pvalue(d: float, n: float, m: float) -> float:
    """Two-sided two-sample KS p-value from the statistic and the (effective) sample sizes.

    Uses scipy's finite-n distribution of the KS statistic at n*m/(n+m) (as ks_2samp's 'asymp'
    method does) for small sizes, and the limiting distribution beyond `KS_ASYMPTOTIC_N`.
    """
    if not (math.isfinite(d) and n > 0 and m > 0):
        return math.nan
    big, small = max(n, m), min(n, m)
    en = big * small / (big + small)
    if en > KS_ASYMPTOTIC_N:
        return float(stats.kstwobign.sf(d * math.sqrt(en)))
    return float(stats.kstwo.sf(d, max(round(en), 1)))


def rank_sum_pvalue(auc: float, n: float, m: float) -> float:
    """Two-sided p-value of the Mann-Whitney statistic, given as P(current > reference)
    (`auc`, ties half), at (effective) sizes n and m: the normal approximation without a tie
    correction (ties shrink the null variance, so leaving it out is conservative)."""
    if not (math.isfinite(auc) and n > 0 and m > 0):
        return math.nan
    sd = math.sqrt((n + m + 1.0) / (12.0 * n * m))
    return float(2.0 * stats.norm.sf(abs(auc - 0.5) / sd))


def segment_shift_pvalue(d: float, auc: float, n: float, m: float) -> float:
    """p-value of a segment's numeric shift: KS (any change of shape) and the rank-sum test
    (a change of location, several times more powerful on the few rows a segment holds: the
    demo's +5 h departures, 85 window rows against 30, read p 0.012 by KS and 0.0003 by rank
    sum), Bonferroni-combined (twice the smaller), so the level holds for either."""
    p_ks, p_rank = ks_pvalue(d, n, m), rank_sum_pvalue(auc, n, m)
    if math.isnan(p_ks) or math.isnan(p_rank):
        return p_ks
    return min(1.0, 2.0 * min(p_ks, p_rank))


def psi(current: np.ndarray, reference: np.ndarray) -> float:
    """Population stability index of two proportion vectors over the same bins."""
    p = np.maximum(np.asarray(current, dtype=np.float64), PSI_EPSILON)
    q = np.maximum(np.asarray(reference, dtype=np.float64), PSI_EPSILON)
    return float(np.sum((p - q) * np.log(p / q)))


#: Robust spread of the reference: the first of these central ranges (low q, high q) that is
#: positive, over its width for normal data, so the spread is the standard deviation there
#: (IQR / 1.349; the central 80% / 2.563; the central 98% / 4.653).
SPREAD_QUANTILES = ((0.25, 0.75, 1.3489795003921634), (0.10, 0.90, 2.5631031310892007),
                    (0.01, 0.99, 4.6526957480816815))
#: Winsorising limits: that range's quantiles widened by this many times its width (Tukey's
#: far-out fences Q1 - 3 IQR, Q3 + 3 IQR); the effect is at most (1 + 2 x 3) x 1.349 = 9.4.
WINSOR_FENCE = 3.0
#: MAD x this = standard deviation for normal data.
MAD_TO_SIGMA = 1.482602218505602
#: Outlier check: the effect a shift of this many (MAD) sigmas of the middle half of the
#: reference would at least read (`core_effect`); below the gate, the column is undetectable.
CORE_SHIFT = 3.0


def robust_spread(reference: QuantileSketch) -> dict[str, Any]:
    """Robust scale and winsorising limits of a reference sketch.

    Returns scale (the normal-consistent central range, 0 when the central 98% is one value),
    low / high (the winsorising limits), core_scale (MAD x 1.4826) and reason (None, or why the
    column is dominated by outliers: its central ranges fall beyond the sketch's bounded range,
    or at least 98% of it is one value while the rest is not).
    """
    out: dict[str, Any] = {"scale": 0.0, "low": None, "high": None, "core_scale": None,
                           "reason": None}
    qs = sorted({q for pair in SPREAD_QUANTILES for q in pair[:2]})
    values = dict(zip(qs, np.atleast_1d(reference.quantile(qs)).tolist(), strict=True))
    for q_lo, q_hi, width in SPREAD_QUANTILES:
        a, b = values[q_lo], values[q_hi]
        if not (reference.in_range(a) and reference.in_range(b)):
            out["reason"] = (f"dominated by outliers: its {q_lo:g}-{q_hi:g} quantiles lie beyond "
                             f"the sketch's range (|x - centre| > {reference.max_magnitude:.3g}, "
                             f"or infinite)")
            return out
        if b > a:
            span = b - a
            lim = reference.max_magnitude
            out.update(scale=span / width,
                       low=max(a - WINSOR_FENCE * span, reference.offset - lim),
                       high=min(b + WINSOR_FENCE * span, reference.offset + lim))
            break
    else:
        if reference.max > reference.min:
            out["reason"] = ("dominated by outliers: at least 98% of the reference is one value, "
                             "so it has no robust spread")
        return out
    mad = reference.mad()
    out["core_scale"] = mad * MAD_TO_SIGMA if math.isfinite(mad) else None
    return out


def numeric_sketch_test(current: QuantileSketch, reference: QuantileSketch,
                        deff: tuple[float, float] = (1.0, 1.0)) -> dict[str, Any]:
    """KS (bounds, p from the lower bound) + robust Wasserstein effect (+ error) + PSI.

    Effect: the Wasserstein-1 distance of both samples winsorised to the reference's far-out
    fences (`robust_spread`), over the reference's robust spread (IQR / 1.349). One extreme
    value (1e12, 1e300, inf) on either side moves it by at most (high - low) / (n x spread),
    so it neither hides a shift nor raises one. `effect_error` is the sketch's error bound
    of that W1 over the same spread (the spread and limits are read from the reference sketch
    and define the effect). A reference without a robust spread, or whose central range lies
    beyond the sketch's range, gets `effect` None and an `undetectable_reason`; a constant
    reference reads inf for any difference beyond the error bound. `core_effect` is what a
    3-sigma (MAD) shift of the reference's middle half would at least read: when outliers
    inflate the spread (more than a quarter of the values far away) it falls below the gate.
    `deff`: the design effects of the two sides (rows in requests, drift._clusters); the KS
    p-value uses the effective sizes n / deff.
    """
    n, m = current.count, reference.count
    out: dict[str, Any] = {"test": "ks", "n_current": n, "n_reference": m}
    if n == 0 or m == 0:
        out.update(statistic=None, statistic_upper=None, p_value=None, effect=None,
                   effect_error=None, psi=None)
        return out
    d_low, d_high = ks_bounds(current, reference)
    spread = robust_spread(reference)
    scale = spread["scale"]
    effect: float | None
    effect_err: float | None
    core_effect = None
    if spread["reason"] is not None:
        effect = effect_err = None
        out["undetectable_reason"] = spread["reason"]
    elif not scale > 0:  # constant reference
        w, w_err = wasserstein(current, reference)
        effect = math.inf if w > w_err else 0.0
        effect_err = 0.0
    else:
        w, w_err = wasserstein(current, reference, spread["low"], spread["high"])
        effect, effect_err = w / scale, w_err / scale
        if spread["core_scale"]:
            core_effect = 0.5 * CORE_SHIFT * spread["core_scale"] / scale
    cuts = np.unique(reference.quantile(np.arange(1, PSI_BINS) / PSI_BINS))
    cdf_cur = np.concatenate(([0.0], np.atleast_1d(current.cdf(cuts)), [1.0]))
    cdf_ref = np.concatenate(([0.0], np.atleast_1d(reference.cdf(cuts)), [1.0]))
    out.update(
        statistic=d_low,
        statistic_upper=d_high,
        p_value=ks_pvalue(d_low, n / max(deff[0], 1.0), m / max(deff[1], 1.0)),
        effect=effect,
        effect_error=effect_err,
        psi=psi(np.diff(cdf_cur), np.diff(cdf_ref)),
        scale=scale,
        winsor=(spread["low"], spread["high"]),
        core_effect=core_effect,
    )
    return out


#: Cells whose pooled expected count is below this on either side are merged into one
#: 'other' cell (chi-squared's validity rule; also what keeps the plug-in JS bias small).
DEFAULT_MIN_EXPECTED = 5.0
#: With heavy-hitter summaries, a value keeps its own cell only where its kept count is at
#: least this many times the summary's per-value error (the rest join 'other').
RELIABLE_FACTOR = 10.0


def js_bias_bits(cells: int, n: float, m: float) -> float:
    """Expected plug-in Jensen-Shannon divergence (bits) of two samples of one distribution:
    (K - 1) (1/n + 1/m) / (8 ln 2), from the second-order expansion of JS."""
    if cells < 2 or n <= 0 or m <= 0:
        return 0.0
    return (cells - 1) * (1.0 / n + 1.0 / m) / (8.0 * math.log(2.0))


def closest_table(
    cells_c: np.ndarray, cells_r: np.ndarray, err_c: float, err_r: float, other: int
) -> tuple[np.ndarray, np.ndarray]:
    """The table nearest to "no difference" that both heavy-hitter summaries allow.

    A kept count is a lower bound: the true count lies in [kept, kept + error], the missing
    mass sitting in the 'other' cell (index `other`). Each separate cell's smaller proportion
    is raised toward the other side's by at most that side's error, taking the mass from its
    'other' cell. Tests on this table are bounds in the safe direction (a statistic no larger,
    a p-value no smaller than the truth's, up to the greedy choice), so summary error never
    causes a flag, as with the numeric sketches' KS lower bound.
    """
    c, r = cells_c.astype(np.float64).copy(), cells_r.astype(np.float64).copy()
    if other < 0 or (err_c <= 0 and err_r <= 0):
        return c, r
    n, m = float(c.sum()), float(r.sum())
    sep = np.ones(c.size, dtype=bool)
    sep[other] = False
    p, q = c[sep] / n, r[sep] / m
    for arr, room, total, gap in ((c, err_c, n, q - p), (r, err_r, m, p - q)):
        if room <= 0:
            continue
        inc = np.where(gap > 0, np.minimum(room, gap * total), 0.0)
        spare = float(arr[other])
        if inc.sum() > spare:
            inc *= spare / inc.sum() if inc.sum() > 0 else 0.0
        arr[sep] += inc
        arr[other] -= float(inc.sum())
    return c, r


def categorical_test(
    cur_codes: np.ndarray,
    cur_counts: np.ndarray,
    cur_other: float,
    ref_codes: np.ndarray,
    ref_counts: np.ndarray,
    ref_other: float,
    cur_error: float = 0.0,
    ref_error: float = 0.0,
    min_expected: float = DEFAULT_MIN_EXPECTED,
    deff: tuple[float, float] = (1.0, 1.0),
) -> dict[str, Any]:
    """Chi-squared on the coarsened 2 x K table + bias-corrected Jensen-Shannon distance + PSI.

    Coarsening: `*_other` (mass a heavy-hitter summary could not attribute) opens an 'other'
    cell; values a summary counts unreliably (kept count < RELIABLE_FACTOR x its error on both
    sides) and sparse values (pooled expected count < `min_expected` on either side) join it.
    So many-level columns are judged on the levels that carry information, chi-squared stays
    calibrated, and the plug-in JS distance loses the bias of sparse cells; the remaining bias
    of K cells, `js_bias_bits`, is subtracted from the divergence before the square root.
    With heavy-hitter summaries the chi-squared test runs on `closest_table` (so undercounts
    cannot make a difference significant) and `effect_error` is how far the JS distance of that
    table lies below the raw one (0 for exact counts): effect - effect_error is a lower bound.

    Rows in requests (`deff`, each side's Rao-Scott design effect, drift._clusters): sparse
    cells and the JS bias use the effective sizes n / deff, and the chi-squared statistic is
    divided by the two-sample design effect (Rao-Scott's first-order correction), so a
    stationary client mix does not read as drift because clients send rows by the dozen.
    """
    codes = np.union1d(cur_codes, ref_codes)
    cur = np.zeros(codes.size, dtype=np.float64)
    ref = np.zeros(codes.size, dtype=np.float64)
    cur[np.searchsorted(codes, cur_codes)] = cur_counts
    ref[np.searchsorted(codes, ref_codes)] = ref_counts
    n = float(cur.sum() + cur_other)
    m = float(ref.sum() + ref_other)
    new = (cur > 0) & (ref == 0)
    out: dict[str, Any] = {
        "test": "chi2",
        "n_current": n,
        "n_reference": m,
        "new_categories": int(new.sum()),
        "new_category_share": float(cur[new].sum() / n) if n else None,
        "levels": int(codes.size),
    }
    if n == 0 or m == 0:
        out.update(statistic=None, p_value=None, effect=None, effect_error=None, psi=None,
                   cells=0)
        return out
    separate = np.ones(codes.size, dtype=bool)
    if cur_error or ref_error:
        reliable = np.zeros(codes.size, dtype=bool)
        if cur_error:
            reliable |= cur >= RELIABLE_FACTOR * cur_error
        else:
            reliable |= cur > 0
        if ref_error:
            reliable |= ref >= RELIABLE_FACTOR * ref_error
        else:
            reliable |= ref > 0
        separate &= reliable
    d_c, d_r = max(float(deff[0]), 1.0), max(float(deff[1]), 1.0)
    n_eff, m_eff = n / d_c, m / d_r
    pooled = (cur + ref) / (n + m)
    separate &= (pooled * n_eff >= min_expected) & (pooled * m_eff >= min_expected)
    other_c = cur_other + float(cur[~separate].sum())
    other_r = ref_other + float(ref[~separate].sum())
    cells_c = np.append(cur[separate], other_c)
    cells_r = np.append(ref[separate], other_r)
    if other_c + other_r <= 0:
        cells_c, cells_r = cells_c[:-1], cells_r[:-1]
        other_idx = -1
    else:
        other_idx = cells_c.size - 1
    k = int(cells_c.size)
    near_c, near_r = closest_table(cells_c, cells_r, cur_error, ref_error, other_idx)
    if k < 2:
        stat, p = 0.0, 1.0
    else:
        res = stats.chi2_contingency(np.vstack((near_c, near_r)), correction=False)
        stat, p = float(res.statistic), float(res.pvalue)
        two_sample = (d_c / n + d_r / m) / (1.0 / n + 1.0 / m)
        if two_sample > 1.0:
            stat /= two_sample
            p = float(stats.chi2.sf(stat, res.dof))
    bias = js_bias_bits(k, n_eff, m_eff)

    def js(a: np.ndarray, b: np.ndarray) -> float:
        if k < 2:
            return 0.0
        d2 = float(distance.jensenshannon(a / n, b / m, base=2.0)) ** 2
        return math.sqrt(max(d2 - bias, 0.0))

    effect = js(cells_c, cells_r)
    lower = js(near_c, near_r)
    out.update(statistic=stat, p_value=p, effect=effect, effect_error=max(effect - lower, 0.0),
               cells=k, psi=psi(cells_c / n, cells_r / m))
    return out


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """1-D dot product without BLAS: BLAS may start threads that fight over pinned cores."""
    return float(np.einsum("i,i->", a, b))


def kish(weights: np.ndarray) -> float:
    """Kish effective sample size of weighted rows."""
    s = float(weights.sum())
    s2 = float((weights * weights).sum())
    return s * s / s2 if s2 > 0 else 0.0


def sample_spread(x: np.ndarray, cum: np.ndarray) -> dict[str, Any]:
    """`robust_spread` of a weighted sample: sorted values `x`, cumulative weights `cum`.

    Returns scale (normal-consistent central range, 0 when none is positive), low / high (the
    far-out fences, None without a scale) and reason (None, or why outliers dominate: at least
    98% of the sample is one value while the rest is not)."""
    out: dict[str, Any] = {"scale": 0.0, "low": None, "high": None, "reason": None}
    total = float(cum[-1]) if cum.size else 0.0
    if total <= 0:
        return out

    def quantile(q: float) -> float:
        return float(x[min(int(np.searchsorted(cum, q * total, side="left")), x.size - 1)])

    for q_lo, q_hi, width in SPREAD_QUANTILES:
        a, b = quantile(q_lo), quantile(q_hi)
        if b > a:
            span = b - a
            out.update(scale=span / width, low=a - WINSOR_FENCE * span,
                       high=b + WINSOR_FENCE * span)
            return out
    if quantile(1.0) > quantile(0.0):
        out["reason"] = ("dominated by outliers: at least 98% of the reference is one value, "
                         "so it has no robust spread")
    return out


class SortedSample:
    """Current and reference sample values of one numeric column, sorted once.

    Comparing a segment (current rows in it vs reference rows in it) and its complement then
    costs two cumulative sums: segment sums are cumulated, complement sums are totals minus
    segment sums. Non-finite values carry no weight.

    Effect: the robust W1 of `numeric_sketch_test`, in the units of the WHOLE reference sample
    of the column (`sample_spread`: winsorised to its far-out fences, over its IQR / 1.349),
    for the segment and its complement alike. Why not the segment's own spread: a segment holds
    few reference rows (a 2% segment of a 300-row reference: 6), and a segment often nearly
    fixes a column (dest=DEN fixes distance to three values 21 miles apart, std 8.5): its own
    std made a wobble of the origin mix read as an effect of 0.4-1.8 (infinite for a constant
    segment), outranking a +5 h shift of the departure time. One 1e12 in the reference no
    longer silences the test either (it inflated the std).
    """

    def __init__(
        self, current: np.ndarray, reference: np.ndarray, w_cur: np.ndarray, w_ref: np.ndarray
    ) -> None:
        self.n_cur = current.size
        values = np.concatenate((current, reference))
        finite = np.isfinite(values)
        self.order = np.argsort(np.where(finite, values, np.inf), kind="stable")
        x = np.where(finite, values, 0.0)[self.order]
        self.x = x
        fin_sorted = finite[self.order]
        last = np.r_[x[1:] != x[:-1], True] if x.size else np.zeros(0, dtype=bool)
        last &= fin_sorted
        # without ties or missing values every position ends a run: no masking needed
        self.last = None if last.all() else last
        self.run_starts = (np.flatnonzero(np.r_[True, x[1:] != x[:-1]]) if x.size
                           else np.zeros(1, dtype=np.int64))
        self.finite = fin_sorted
        wc = np.concatenate((w_cur, np.zeros(reference.size)))[self.order] * fin_sorted
        wr = np.concatenate((np.zeros(current.size), w_ref))[self.order] * fin_sorted
        self.wc, self.wr = wc, wr
        self.cum_c, self.cum_r = np.cumsum(wc), np.cumsum(wr)
        ref_rows = wr > 0
        self.spread = sample_spread(x[ref_rows], self.cum_r[ref_rows])
        low, high = self.spread["low"], self.spread["high"]
        clipped = x if low is None else np.clip(x, low, high)
        self.gaps = np.where(fin_sorted[1:], np.diff(clipped), 0.0)

    def _summary(self, c: np.ndarray, r: np.ndarray, cum_c: np.ndarray, cum_r: np.ndarray
                 ) -> dict[str, Any]:
        sc, sr = float(cum_c[-1]) if cum_c.size else 0.0, float(cum_r[-1]) if cum_r.size else 0.0
        n_eff = sc * sc / _dot(c, c) if sc > 0 else 0.0
        m_eff = sr * sr / _dot(r, r) if sr > 0 else 0.0
        out: dict[str, Any] = {"test": "ks+rank_sum", "n_current": n_eff, "n_reference": m_eff}
        if sc <= 0 or sr <= 0:
            out.update(statistic=None, p_value=None, effect=None, effect_error=0.0,
                       mean_current=None, mean_reference=None, median_current=None,
                       median_reference=None)
            return out
        gap = cum_c * (1.0 / sc) - cum_r * (1.0 / sr)
        np.abs(gap, out=gap)
        if self.last is None:
            d = float(gap.max())
        else:
            d = float(gap[self.last].max()) if self.last.any() else 0.0
        w1 = _dot(gap[:-1], self.gaps)
        mean_c = _dot(c, self.x) / sc
        mean_r = _dot(r, self.x) / sr
        scale = self.spread["scale"]
        effect: float | None
        if self.spread["reason"] is not None:
            effect = None
        elif scale > 0:
            effect = w1 / scale
        else:  # a constant reference: any difference is infinite
            effect = math.inf if w1 > 0 else 0.0
        med_c = float(self.x[min(np.searchsorted(cum_c, 0.5 * sc), self.x.size - 1)])
        med_r = float(self.x[min(np.searchsorted(cum_r, 0.5 * sr), self.x.size - 1)])
        auc = self._auc(c, r, sc, sr)
        out.update(statistic=d, auc=auc, p_value=segment_shift_pvalue(d, auc, n_eff, m_eff),
                   effect=effect,
                   effect_error=0.0, mean_current=mean_c, mean_reference=mean_r,
                   median_current=med_c, median_reference=med_r)
        return out

    def _auc(self, c: np.ndarray, r: np.ndarray, sc: float, sr: float) -> float:
        """P(current value > reference value), ties counted half, from the weights per run
        of equal sorted values."""
        starts = self.run_starts
        run_c, run_r = np.add.reduceat(c, starts), np.add.reduceat(r, starts)
        below = np.cumsum(run_r) - run_r
        return float(_dot(run_c, below + 0.5 * run_r) / (sc * sr))

    def compare(self, in_cur: np.ndarray, in_ref: np.ndarray, outside: bool = True
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Weighted KS + robust W1 inside a segment (row masks) and outside it."""
        inside = np.concatenate((in_cur, in_ref))[self.order]
        c, r = self.wc * inside, self.wr * inside
        cum_c, cum_r = np.cumsum(c), np.cumsum(r)
        res_in = self._summary(c, r, cum_c, cum_r)
        if not outside:
            return res_in, None
        res_out = self._summary(self.wc - c, self.wr - r, self.cum_c - cum_c, self.cum_r - cum_r)
        return res_in, res_out

    def compare_reweighted(self, in_cur: np.ndarray, ref_weight: np.ndarray
                           ) -> dict[str, Any]:
        """`compare`'s inside test of current rows `in_cur` against the reference rows
        weighted by `ref_weight` (one weight per reference row, 0 for rows left out):
        drift._composition's reweighted reference, on the same values and spread."""
        c = self.wc * np.concatenate((in_cur, np.zeros(ref_weight.size, dtype=bool)))[self.order]
        r = np.concatenate((np.zeros(self.n_cur), ref_weight))[self.order] * self.finite
        return self._summary(c, r, np.cumsum(c), np.cumsum(r))


def weighted_categorical_test(
    cur_codes: np.ndarray, w_cur: np.ndarray, ref_codes: np.ndarray, w_ref: np.ndarray,
    deff: tuple[float, float] = (1.0, 1.0),
) -> dict[str, Any]:
    """Chi-squared + JS on weighted samples, with counts scaled to Kish effective sizes;
    `deff`: the two sides' design effects (rows in requests), as in `categorical_test`."""
    n_eff, m_eff = kish(w_cur), kish(w_ref)
    size = int(max(cur_codes.max(initial=-1), ref_codes.max(initial=-1))) + 1
    cur = np.bincount(cur_codes, weights=w_cur, minlength=size)
    ref = np.bincount(ref_codes, weights=w_ref, minlength=size)
    sc, sr = cur.sum(), ref.sum()
    cur_scaled = cur / sc * n_eff if sc > 0 else cur
    ref_scaled = ref / sr * m_eff if sr > 0 else ref
    codes = np.arange(size)
    out = categorical_test(codes, cur_scaled, 0.0, codes, ref_scaled, 0.0, deff=deff)
    out["n_current"], out["n_reference"] = n_eff, m_eff
    return out
