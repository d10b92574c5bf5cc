"""Certified top-K: a cheap filter keeps the best rows, and a certificate says whether they hold
enough of the true top k; when it cannot, every row is scored exactly.

A query asks for the k rows of a pool of N with the best full-model score. The filter (cheap
groups + small model) keeps the ``m = ceil(r k)`` rows with the best cheap scores and the full
model ranks them. Let ``kappa`` be the k-th best full score among the kept rows: a row left out
displaces one of the answer exactly when its full score is at least ``kappa`` (``>=``: ties count
against us), so precision@k is ``1 - L / k`` with ``L`` the number of left-out rows scoring at
least ``kappa`` (ties at the cheap cut that were not kept are counted in L outright).

**The certificate.** Given the cheap cut ``c_m`` and ``kappa`` (both set by the pool), the pool's
rows below the cut are independent draws from the rows with cheap score below ``c_m``, so ``L ~
Binomial(N_below, p)`` with ``p = P(full >= kappa | cheap < c_m)``. The calibration rows (held-out
rows nothing was fitted or chosen on) below the same cut give ``X ~ Binomial(H_below, p)``,
independently. The answer is certified at precision ``1 - A / k`` when

    sup_p  P(Binomial(H_below, p) <= X) * P(Binomial(N_below, p) > A)  <=  1 - confidence,

an exact test: whatever p is, the chance of certifying while more than A rows were lost is at most
``1 - confidence``. That chance is joint, over the query's pool and the calibration rows alike:
P(certified and below the target) <= 1 - confidence, not the same bound given one set of
calibration rows (every query reuses them, so a deployment whose calibration rows happened to
show few exceeding rows certifies often and misses more often than that). The pool must be drawn
like the calibration rows (a pool chosen otherwise, or one holding calibration rows, is outside
the guarantee). Uncertified answers are exact. It needs calibration rows of the order of the pool:
a pool much larger than the calibration rows cannot be certified (no data shows that few enough of
its many left-out rows beat the kept ones) and is scored exactly.

**The ratio** is planned per query on the *selection* rows (never the calibration rows, so the test
stays exact): the smallest r from ``TOPK_RATIOS`` whose certificate the selection rows predict to
pass. One ratio, one test: a failed certificate falls back to exact scoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: top-K filter ratios r tried when planning, smallest first (the filter keeps ceil(r * k) rows)
TOPK_RATIOS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0,
               30.0, 40.0, 50.0, 75.0, 100.0)
#: largest k / pool answered through a filter (above it the filter saves little: exact)
MAX_TAIL_SHARE = 0.5
#: points of the log-spaced grid over the unknown exceedance rate p (then refined)
RATE_GRID = 64
#: the plan assumes the calibration rows show this many standard deviations more
#: exceedances than the selection rows predict: a failed certificate costs an exact rescoring, so
#: the plan keeps a few more rows rather than fail often
PLAN_MARGIN = 1.0
#: pool sizes, as multiples of the calibration rows, the report checks for a plan
POOL_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def _worst_joint(x: int, h: int, n: int, allowed: int) -> float:
    """sup over p of P(Bin(h, p) <= x) * P(Bin(n, p) > allowed)."""
    if allowed < 0:
        return 1.0
    if n <= allowed:
        return 0.0
    if h == 0:
        return 1.0
    grid = np.r_[np.geomspace(1e-9, 1.0, RATE_GRID)]
    values = stats.binom.cdf(x, h, grid) * stats.binom.sf(allowed, n, grid)
    best = int(np.argmax(values))
    fine = np.linspace(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)], 32)
    return float(max(values[best], np.max(stats.binom.cdf(x, h, fine) * stats.binom.sf(allowed, n, fine))))


@dataclass
class Certificate:
    """The outcome of one query's test: certified or not, and the precision it certifies."""

    certified: bool
    precision: float  # the precision@k certified: the target to whole rows (0 when not certified)
    target: float
    kappa: float
    calibration_below: int
    calibration_exceeding: int
    pool_below: int
    ties: int

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"certified": self.certified, "precision_bound": self.precision, "target": self.target,
                "calibration_rows_below_cut": self.calibration_below,
                "calibration_rows_above_kappa": self.calibration_exceeding,
                "pool_rows_below_cut": self.pool_below, "ties_at_cut": self.ties}


@dataclass
class Scores:
    """Cheap and full scores of one class on a set of held-out rows, sorted by cheap score."""

    cheap: np.ndarray
    full: np.ndarray

    @classmethod
    def of(cls, cheap: np.ndarray, full: np.ndarray) -> Scores:
        order = np.argsort(cheap, kind="stable")
        return cls(np.asarray(cheap, dtype=np.float64)[order], np.asarray(full, dtype=np.float64)[order])

    def __len__(self) -> int:
        return len(self.cheap)

    def below(self, cutoff: float, kappa: float) -> tuple[int, int]:
        """(rows with cheap score below the cut, those of them with full score >= kappa)."""
        count = int(np.searchsorted(self.cheap, cutoff, side="left"))
        return count, int(np.sum(self.full[:count] >= kappa))


def certify(calibration: Scores, k: int, pool_below: int, ties: int, cutoff: float, kappa: float,
            precision: float, confidence: float) -> Certificate:
    """The test of the module docstring for one query."""
    alpha = 1.0 - confidence
    h, x = calibration.below(cutoff, kappa)
    allowed = math.floor(k * (1.0 - precision) + 1e-9) - ties
    passed = _worst_joint(x, h, pool_below, allowed) <= alpha
    # the precision the one test certifies: the target, to whole rows. Not the smallest A that
    # would pass: an A chosen after seeing X is no longer tested at 1 - confidence (worst case
    # near twice the error rate at confidence 0.95, by exact computation)
    bound = 1.0 - (allowed + ties) / k if passed else 0.0
    return Certificate(passed, bound, precision, float(kappa), h, x, pool_below, ties)


@dataclass
class RatioPlan:
    """Selection rows of one class, for planning the ratio of a query before any full score of
    the pool is seen."""

    selection: Scores
    calibration_rows: int
    ratios: np.ndarray

    def ratio_for(self, k: int, pool: int, precision: float, confidence: float) -> float | None:
        """The smallest ratio whose certificate the selection rows predict to pass (None: exact)."""
        for ratio in self.ratios:
            if math.ceil(ratio * k) >= pool:
                return None
            if self.predicts_pass(k, pool, float(ratio), precision, confidence):
                return float(ratio)
        return None

    def predicts_pass(self, k: int, pool: int, ratio: float, precision: float, confidence: float) -> bool:
        """Would the certificate pass if the pool and the calibration rows looked like the
        selection rows? (The pool's cut and kappa at the selection rows' quantiles; their
        exceedance rate scaled to the calibration rows.)"""
        sel = self.selection
        n = len(sel)
        kept = math.ceil(ratio * k)
        kept_here = max(1, min(n - 1, round(kept / pool * n)))
        top_here = max(1, min(kept_here, round(k / pool * n)))
        kappa = np.sort(sel.full[n - kept_here:])[::-1][top_here - 1]
        below = n - kept_here
        exceeding = int(np.sum(sel.full[:below] >= kappa))
        h = round(self.calibration_rows * below / n)
        expected = exceeding * h / below if below else 0.0
        x = math.ceil(expected + PLAN_MARGIN * math.sqrt(expected))  # plan for an unlucky draw
        allowed = math.floor(k * (1.0 - precision) + 1e-9)
        return _worst_joint(x, h, pool - kept, allowed) <= 1.0 - confidence


@dataclass
class TopKFilter:
    """Cheap groups + small model that pre-select rows for top-K, with per class the selection
    rows that plan a query's ratio and the calibration rows that certify its answer."""

    groups: tuple[str, ...]
    model: object
    plans: dict[int, RatioPlan]
    calibration: dict[int, Scores]
    precision: float
    confidence: float
    holdout_rows: int = 0

    def ratio_for(self, k: int, pool: int, label_index: int) -> float | None:
        """Filter ratio for k rows out of ``pool`` (None: score exactly)."""
        plan = self.plans.get(label_index)
        if plan is None or k < 1 or pool <= k or k / pool > MAX_TAIL_SHARE:
            return None
        return plan.ratio_for(k, pool, self.precision, self.confidence)

    def certify(self, label_index: int, k: int, pool_below: int, ties: int, cutoff: float,
                full_kept: np.ndarray) -> Certificate:
        """The certificate of one query, from the full scores of its kept rows."""
        kappa = float(np.sort(np.asarray(full_kept, dtype=np.float64))[::-1][k - 1])
        return certify(self.calibration[label_index], k, pool_below, ties, cutoff, kappa,
                       self.precision, self.confidence)


def build_filter(groups: tuple[str, ...], model: object, select_cheap: np.ndarray, select_full: np.ndarray,
                 cal_cheap: np.ndarray, cal_full: np.ndarray, precision: float, confidence: float,
                 ratios: Sequence[float] = TOPK_RATIOS) -> TopKFilter:
    """A filter with a plan and calibration rows for every class (binary: both)."""
    plans, calibration = {}, {}
    for c in range(select_full.shape[1]):
        plans[c] = RatioPlan(Scores.of(select_cheap[:, c], select_full[:, c]), len(cal_full),
                             np.asarray(ratios, dtype=np.float64))
        calibration[c] = Scores.of(cal_cheap[:, c], cal_full[:, c])
    return TopKFilter(tuple(groups), model, plans, calibration, precision, confidence,
                      len(select_full) + len(cal_full))


def plan_topk(top_k: int | None, small: dict, probas_small: dict, full_proba: dict, graph, costs,
              precision: float, confidence: float, notes: list[str]):
    """The cheapest filter among the small models at k = top_k over a pool the size of the
    calibration rows (k at most a tenth of it); (filter or None, report row)."""
    from ._report import TopKRow

    if top_k is None:
        return None, None
    pool = len(full_proba["cert"])
    k = min(top_k, max(1, pool // 10))
    if k < top_k:
        notes.append(f"top-K planned at k={k} (the calibration rows are {pool})")
    label = full_proba["cert"].shape[1] - 1
    exact = topk_cost([], None, k, pool, graph, costs)
    best = None
    for subset in small:
        filt = build_filter(subset, small[subset], probas_small["select"][subset], full_proba["select"],
                            probas_small["cert"][subset], full_proba["cert"], precision, confidence)
        ratio = filt.ratio_for(k, pool, label)
        if ratio is None:
            continue
        cost = topk_cost(subset, ratio, k, pool, graph, costs)
        if cost < exact and (best is None or cost < best[1]):
            best = (filt, cost, ratio)
    if best is None:
        notes.append("top-K: no cheap filter is predicted to certify precision@k at the calibration "
                     "rows' pool size; top_k scores exactly")
        return None, TopKRow(k, pool, [], None, precision, confidence, 1.0)
    filt, cost, ratio = best
    pools = [max(k + 1, round(pool * f)) for f in POOL_MULTIPLES]
    reach = [{"pool": p, "ratio": filt.ratio_for(k, p, label)} for p in pools]
    return filt, TopKRow(k, pool, list(filt.groups), ratio, precision, confidence, exact / cost, reach)


def topk_cost(filter_groups, ratio: float | None, k: int, pool: int, graph, costs) -> float:
    """Seconds for a top-K query over ``pool`` rows (batch costs)."""
    from ._planner import chain_cost, full_cost

    if ratio is None:
        return pool * full_cost(graph, costs, "batch")
    kept = min(math.ceil(ratio * k), pool)
    chain = (tuple(filter_groups), tuple(graph.groups))
    return pool * chain_cost(chain, [1.0, kept / pool], graph, costs, "batch")
