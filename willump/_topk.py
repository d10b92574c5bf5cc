"""Approximate top-K: how many rows the cheap filter must keep, as a table built once.

A top-K query over a pool of N rows keeps the ``m = ceil(r * k)`` rows with the best cheap
scores and lets the full model rank them. Precision@k is the share of the true top k (by the
full model) among the kept rows. A true top-k row is lost when its cheap score falls below
the m-th best cheap score of the pool, near the cheap score's ``1 - m / N`` quantile.

The rule (an *estimate*, like Willump's, not a certificate): for tail share ``q = k / N`` and
kept share ``f = r q``, a row of the top-``q`` tail of the full score is lost with some chance
``p``, and a query loses about Binomial(k, p) rows. ``p`` is learned from held-out rows (both
scores known): of the ``n`` held-out rows in the tail, ``x`` fall below the ``1 - f`` cheap
quantile, and the lost count of a fresh query is predicted by the beta-binomial with Jeffreys'
prior (``x + 1/2``, ``n - x + 1/2``), which carries the estimate's own uncertainty: a tail seen
on few held-out rows predicts widely. ``r`` is the smallest ratio with ``P(lost <= k (1 -
precision)) >= quantile``. Because the cheap score rises with the full score, a wider tail
``q' > q`` (up to ``f``) loses rows at least as often, so its (better-supported) count may stand
in for the thin tail's. No ratio qualifies (every row is scored exactly) when even that cannot
support the target: k=10 of a 100,000-row pool asks about the top 0.01%, which a few thousand
held-out rows cannot show, so such queries are exact. A ratio is never approved where the
held-out rows of the query's own tail already miss the precision target.

The held-out ranks are stored at optimize time; a query counts and evaluates the beta-binomial
(about a millisecond), so no request pays calibration and nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: top-K filter ratios r tried, smallest first (the filter keeps ceil(r * k) rows)
TOPK_RATIOS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0,
               30.0, 40.0, 50.0, 75.0, 100.0)
#: tails (from the query's own to the kept share, log-spaced) whose counts may stand in
WIDER_TAILS = 8
#: largest tail share on the grid (k above half the pool is answered exactly)
MAX_TAIL_SHARE = 0.5
#: Jeffreys' prior on a tail's loss rate
PRIOR = 0.5
#: a wider tail stands in for the query's thin tail only when its loss rate reaches the thin
#: tail's upper limit at this confidence (a thin tail that lost nothing by chance cannot vouch
#: for wider ones that lose little)
STANDIN_CONFIDENCE = 0.5


def _upper(k: int, n: int, confidence: float) -> float:
    """Exact (Clopper-Pearson) upper limit of a binomial rate k / n."""
    return 1.0 if k >= n else float(stats.beta.ppf(confidence, k + 1, n - k))


@dataclass
class RatioTable:
    """Held-out rows of one label in full-score order (best first), each with its cheap-score
    rank among the ``len(by_full)`` held-out rows (0 = best)."""

    by_full: np.ndarray
    ratios: np.ndarray

    def ratio_for(self, k: int, pool: int, precision: float, quantile: float) -> float | None:
        """Smallest ratio whose lost-row count stays within the precision target in at
        least ``quantile`` of pools (None: score every row exactly)."""
        if k < 1 or pool <= k or k / pool > MAX_TAIL_SHARE:
            return None
        for ratio in self.ratios:
            if math.ceil(ratio * k) >= pool:
                break
            if self.chance(k, pool, precision, ratio)[0] >= quantile:
                return float(ratio)
        return None

    def chance(self, k: int, pool: int, precision: float, ratio: float) -> tuple[float, float]:
        """(predicted share of pools reaching ``precision`` at ``ratio``, the held-out rows'
        own precision: the share of the top-k tail the kept share holds)."""
        held = len(self.by_full)
        q = k / pool
        allowed = math.floor(k * (1.0 - precision) + 1e-9)
        n_tail = max(1, math.floor(q * held + 1e-9))
        kept = math.ceil(ratio * q * held - 1e-9)
        widest = min(max(n_tail, kept), held)
        n = np.unique(np.geomspace(n_tail, widest, WIDER_TAILS).astype(np.int64))
        lost = np.cumsum(self.by_full[:widest] >= kept)[n - 1]
        own_precision = float(1.0 - lost[0] / n[0])
        if own_precision < precision:
            return 0.0, own_precision  # the held-out rows of the tail itself miss the target
        # a wider tail stands in for the thin one only where it loses rows at least as often
        # (the monotone case, checked rather than assumed: a filter that misranks the very top
        # rows makes the thin tail worse than any wider one, and then only its own count speaks)
        usable = lost / n >= _upper(int(lost[0]), int(n[0]), STANDIN_CONFIDENCE)
        usable[0] = True  # the tail itself always speaks
        chances = stats.betabinom.cdf(allowed, k, lost[usable] + PRIOR, n[usable] - lost[usable] + PRIOR)
        return float(np.max(chances)), own_precision


def build_ratio_table(cheap: np.ndarray, full: np.ndarray, *,
                      ratios: Sequence[float] = TOPK_RATIOS) -> RatioTable:
    """The table from held-out cheap and full scores of one label."""
    held = len(full)
    if held < 2:
        raise ValueError("a top-K table needs at least two held-out rows")
    positions = np.arange(held)
    cheap_rank = np.empty(held, dtype=np.int32)
    cheap_rank[np.lexsort((positions, -cheap))] = positions
    return RatioTable(cheap_rank[np.lexsort((positions, -full))], np.asarray(ratios, dtype=np.float64))


@dataclass
class TopKFilter:
    """Cheap groups + small model that pre-select rows for top-K, with one ratio table per
    class (built at optimize time from held-out scores; queries only look it up)."""

    groups: tuple[str, ...]
    model: object
    tables: dict[int, RatioTable]
    precision: float
    quantile: float
    holdout_rows: int

    def ratio_for(self, k: int, pool: int, label_index: int) -> float | None:
        """Filter ratio for k rows out of ``pool`` (None: score exactly)."""
        table = self.tables.get(label_index)
        if table is None:
            return None
        return table.ratio_for(k, pool, self.precision, self.quantile)


def build_filter(groups: tuple[str, ...], model: object, cheap_proba: np.ndarray,
                 full_proba: np.ndarray, precision: float, quantile: float) -> TopKFilter:
    """A filter with a ratio table for every class (binary: both)."""
    tables = {c: build_ratio_table(cheap_proba[:, c], full_proba[:, c])
              for c in range(full_proba.shape[1])}
    return TopKFilter(tuple(groups), model, tables, precision, quantile, len(full_proba))


def plan_topk(top_k: int | None, small: dict, held_small: dict, held_full: np.ndarray, graph,
              costs, precision: float, quantile: float, notes: list[str]):
    """The cheapest filter among the small models, judged at k = top_k (at most a tenth of
    the held-out rows) over a pool of the held-out rows' size; (filter or None, report row)."""
    from ._report import TopKRow

    if top_k is None:
        return None, None
    pool = len(held_full)
    k = min(top_k, max(1, pool // 10))
    if k < top_k:
        notes.append(f"top-K planned at k={k} (the held-out rows are {pool})")
    label = held_full.shape[1] - 1
    exact = topk_cost([], None, k, pool, graph, costs)
    best = None
    for subset in small:
        filt = build_filter(subset, small[subset], held_small[subset], held_full, precision, quantile)
        ratio = filt.ratio_for(k, pool, label)
        if ratio is None:
            continue
        cost = topk_cost(subset, ratio, k, pool, graph, costs)
        if cost < exact and (best is None or cost < best[1]):
            best = (filt, cost, ratio)
    if best is None:
        notes.append("top-K: no cheap filter reached the precision target; top_k scores exactly")
        return None, TopKRow(k, pool, [], None, precision, quantile, 1.0)
    filt, cost, ratio = best
    table = filt.tables[label]
    curve = [{"ratio": float(r), "chance": c, "heldout_precision": h}
             for r in table.ratios if math.ceil(r * k) < pool
             for c, h in [table.chance(k, pool, precision, float(r))]]
    return filt, TopKRow(k, pool, list(filt.groups), ratio, precision, quantile, exact / cost, curve)


def topk_cost(filter_groups, ratio: float | None, k: int, pool: int, graph, costs) -> float:
    """Seconds for a top-K query over ``pool`` rows (batch costs)."""
    from ._planner import chain_cost, full_cost

    if ratio is None:
        return pool * full_cost(graph, costs, "batch")
    kept = min(math.ceil(ratio * k), pool)
    chain = (tuple(filter_groups), tuple(graph.groups))
    return pool * chain_cost(chain, [1.0, kept / pool], graph, costs, "batch")
