"""Plan: which group subsets make cheap levels, at which confidence threshold, and
which filter ratio makes top-K safe.

Cost model: a cascade level runs the pipeline body again on the rows that reach
it, computes the nodes its *new* groups need (shared upstream steps included,
since intermediates are not kept between levels), reuses the blocks of earlier
levels by slicing, and runs its model. So for a chain S1 < S2 < ... < full::

    cost = sum_l reach_l * (body + sum(closure(new_l)) + model_l)

where reach_l is the fraction of rows that were not confident at earlier levels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._capture import BODY
from ._graph import Graph
from ._metrics import LossBound, Metric, bootstrap_loss_bound, exact_accuracy_loss_bound
from ._profile import Costs

#: cheap-subset cost budgets, as fractions of the full feature cost (Willump's grid, widened)
COST_BUDGETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
#: up to this many groups, every subset is enumerated (exact, shared costs included)
EXACT_SUBSET_LIMIT = 14
#: fractions of rows answered early that define the threshold grid
EARLY_FRACTIONS = tuple(np.round(np.r_[np.linspace(0.05, 0.9, 18), np.linspace(0.92, 0.995, 9)], 4))
#: top-K filter ratios r tried, smallest first (the filter keeps ceil(r * k) rows)
TOPK_RATIOS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0,
               30.0, 40.0, 50.0, 75.0, 100.0)
#: bootstrap resamples for top-K ratio calibration
TOPK_RESAMPLES = 200


def subset_cost(graph: Graph, costs: dict[str, float], groups: Sequence[str]) -> float:
    """Per-row cost of the feature nodes the groups need (each node once)."""
    return float(sum(costs.get(n, 0.0) for n in graph.closure(groups)))


def candidate_subsets(
    graph: Graph,
    costs: dict[str, float],
    importance: dict[str, float],
    *,
    budgets: Sequence[float] = COST_BUDGETS,
    max_candidates: int,
) -> list[tuple[str, ...]]:
    """Most important proper subsets under each cost budget, cheapest first.

    Exact over all subsets (with shared upstream costs counted once) up to
    EXACT_SUBSET_LIMIT groups; greedy by importance per cost beyond that.
    """
    groups = list(graph.groups)
    if len(groups) < 2:
        return []
    total = subset_cost(graph, costs, groups)
    value = {g: max(importance.get(g, 0.0), 0.0) for g in groups}
    if len(groups) <= EXACT_SUBSET_LIMIT:
        pool = [
            combo
            for r in range(1, len(groups))
            for combo in itertools.combinations(groups, r)
        ]
    else:
        pool = _greedy_pool(graph, costs, value, groups, budgets, total)
    scored = [(c, subset_cost(graph, costs, c), sum(value[g] for g in c)) for c in pool]
    chosen: list[tuple[str, ...]] = []
    for budget in budgets:
        fitting = [s for s in scored if s[1] <= budget * total and s[2] > 0]
        if not fitting:
            continue
        best = max(fitting, key=lambda s: (s[2], -s[1]))
        if best[0] not in chosen:
            chosen.append(best[0])
    chosen.sort(key=lambda c: subset_cost(graph, costs, c))
    return [tuple(g for g in groups if g in c) for c in chosen[:max_candidates]]


def _greedy_pool(graph, costs, value, groups, budgets, total) -> list[tuple[str, ...]]:
    ranked = sorted(groups, key=lambda g: -value[g] / max(subset_cost(graph, costs, [g]), 1e-12))
    pool = []
    for budget in budgets:
        picked: list[str] = []
        for g in ranked:
            if subset_cost(graph, costs, [*picked, g]) <= budget * total:
                picked.append(g)
        if picked and len(picked) < len(groups):
            pool.append(tuple(picked))
    return pool


def chains_from(candidates: Sequence[tuple[str, ...]], all_groups: Sequence[str], max_levels: int):
    """Cascade chains: each candidate alone before the full model, and nested pairs."""
    full = tuple(all_groups)
    chains = [(c, full) for c in candidates]
    if max_levels >= 3:
        for a, b in itertools.permutations(candidates, 2):
            if set(a) < set(b):
                chains.append((a, b, full))
    return chains


def chain_cost(
    chain: Sequence[Sequence[str]], reach: Sequence[float], graph: Graph, costs: Costs, mode: str
) -> float:
    """Expected seconds per row of a chain given the fraction of rows reaching each level."""
    per_row = costs.per_row(mode)
    have: set[str] = set()
    total = 0.0
    for level, groups in enumerate(chain):
        new = [g for g in groups if g not in have]
        level_cost = per_row.get(BODY, 0.0) + subset_cost(graph, per_row, new)
        level_cost += costs.model(groups, mode)
        total += reach[level] * level_cost
        have |= set(groups)
    return total


def full_cost(graph: Graph, costs: Costs, mode: str) -> float:
    return chain_cost([tuple(graph.groups)], [1.0], graph, costs, mode)


def answer_levels(confidences: np.ndarray, threshold: float) -> np.ndarray:
    """Index of the level that answers each row: the first confident one, else the last.

    ``confidences`` has one row per non-final level (levels x rows).
    """
    n_cheap, n = confidences.shape
    confident = confidences >= threshold
    first = np.where(confident.any(axis=0), confident.argmax(axis=0), n_cheap)
    return first.astype(np.int64) if n else np.zeros(0, dtype=np.int64)


def combine(probas: Sequence[np.ndarray], levels: np.ndarray) -> np.ndarray:
    """Each row's probabilities from the level that answered it."""
    stacked = np.stack(probas)  # levels x rows x classes
    return stacked[levels, np.arange(stacked.shape[1])]


def threshold_grid(first_level_confidence: np.ndarray) -> list[float]:
    """Thresholds, most conservative first, at which set fractions of rows exit early."""
    qs = [float(np.quantile(first_level_confidence, 1.0 - f)) for f in EARLY_FRACTIONS]
    return sorted(set(qs), reverse=True)


@dataclass
class Sweep:
    """One chain at one threshold on one split."""

    chain: tuple[tuple[str, ...], ...]
    threshold: float
    bound: LossBound
    fractions: list[float]  # rows answered at each level
    cost_batch: float
    cost_row: float


@dataclass
class Evaluator:
    """Scores chains on one split against the full pipeline, with paired resamples."""

    metric: Metric
    y: np.ndarray
    classes: np.ndarray
    full_proba: np.ndarray
    weights: np.ndarray
    confidence: float
    bound: str
    graph: Graph
    costs: Costs

    def __post_init__(self) -> None:
        self.full_scores = self.metric.weighted(self.y, self.full_proba, self.weights, self.classes)

    def evaluate(self, chain, probas: dict[tuple[str, ...], np.ndarray], threshold: float) -> Sweep:
        level_probas = [probas[s] for s in chain[:-1]] + [self.full_proba]
        conf = np.stack([p.max(axis=1) for p in level_probas[:-1]])
        levels = answer_levels(conf, threshold)
        approx = combine(level_probas, levels)
        if self.bound == "exact":
            bound = exact_accuracy_loss_bound(self.y, self.full_proba, approx, self.confidence)
        else:
            bound = bootstrap_loss_bound(
                self.metric, self.y, self.full_proba, approx, self.weights, self.confidence,
                self.classes, full_scores=self.full_scores,
            )
        counts = np.bincount(levels, minlength=len(chain)) / max(len(levels), 1)
        fractions = [float(c) for c in counts]
        reach = [1.0 - sum(fractions[:i]) for i in range(len(chain))]
        return Sweep(
            tuple(tuple(s) for s in chain),
            float(threshold),
            bound,
            fractions,
            chain_cost(chain, reach, self.graph, self.costs, "batch"),
            chain_cost(chain, reach, self.graph, self.costs, "row"),
        )


def sweep_cost(sweep: Sweep, cost_mode: str) -> float:
    """The expected cost that decides: per row at batch size, or per one-row call."""
    return sweep.cost_batch if cost_mode == "batch" else sweep.cost_row


def select_plan(
    evaluator: Evaluator, chains, probas, grids, max_loss: float, cost_mode: str = "batch",
    max_cost: float = float("inf"),
) -> tuple[Sweep | None, list[Sweep]]:
    """Cheapest (chain, threshold) whose bound on this split is within max_loss and whose
    expected cost is below ``max_cost`` (a cascade that does not pay is no plan). The table
    lists each chain's cheapest plan within max_loss, paying or not, so that the report can
    say which constraint stopped a cascade.

    ``cost_mode`` picks the cost that decides: per row at batch size ("batch", for
    throughput serving) or for one-row calls ("row", for latency serving).
    """

    def cost(sweep: Sweep) -> float:
        return sweep_cost(sweep, cost_mode)

    best: Sweep | None = None
    table: list[Sweep] = []
    for chain in chains:
        chain_best = None
        for t in grids[chain[0]]:
            sweep = evaluator.evaluate(chain, probas, t)
            if sweep.bound.upper <= max_loss and (chain_best is None or cost(sweep) < cost(chain_best)):
                chain_best = sweep
        if chain_best is not None:
            table.append(chain_best)
            if cost(chain_best) < max_cost and (best is None or cost(chain_best) < cost(best)):
                best = chain_best
    return best, table


def certify(evaluator: Evaluator, chain, probas, grid: Sequence[float], max_loss: float):
    """Fixed-sequence testing down the threshold grid, most conservative first.

    Each threshold is tested at the full confidence level; testing stops at the
    first failure. Because the order is fixed before looking at this split, the
    chance that any accepted threshold has a true loss above max_loss is at most
    1 - confidence, with no correction for the number of thresholds tried.
    Returns the last accepted sweep (or None) and every sweep tested.
    """
    accepted: Sweep | None = None
    tested: list[Sweep] = []
    for t in grid:
        sweep = evaluator.evaluate(chain, probas, t)
        tested.append(sweep)
        if sweep.bound.upper > max_loss:
            break
        accepted = sweep
    return accepted, tested


# --- top-K ----------------------------------------------------------------------------
def topk_ratio(
    cheap: np.ndarray,
    full: np.ndarray,
    k: int,
    pool: int,
    *,
    precision: float,
    quantile: float,
    rng: np.random.Generator,
    resamples: int = TOPK_RESAMPLES,
    ratios: Sequence[float] = TOPK_RATIOS,
) -> float | None:
    """Smallest r with precision@k >= ``precision`` in at least ``quantile`` of resamples.

    Each resample draws ``pool`` rows (with replacement) from the held-out scores.
    The filter keeps the ceil(r*k) rows with the best cheap scores; the full model
    ranks them, so the approximate top-k holds exactly those true top-k rows that
    survived the filter. None when only exact scoring qualifies.
    """
    if k < 1 or pool <= k:
        return None
    held = len(cheap)
    keep = np.array([math.ceil(r * k) for r in ratios])
    useful = keep < pool
    if not useful.any():
        return None
    hits = np.zeros((resamples, len(ratios)))
    positions = np.arange(pool)
    for b in range(resamples):
        idx = rng.integers(0, held, pool)
        full_order = np.lexsort((positions, -full[idx]))
        cheap_rank = np.empty(pool, dtype=np.int64)
        cheap_rank[np.lexsort((positions, -cheap[idx]))] = positions
        top_ranks = np.sort(cheap_rank[full_order[:k]])
        hits[b] = np.searchsorted(top_ranks, keep, side="left") / k
    passing = (hits >= precision).mean(axis=0) >= quantile
    for r, ok, use in zip(ratios, passing, useful, strict=True):
        if ok and use:
            return float(r)
    return None


def topk_cost(
    filter_groups: Sequence[str], ratio: float | None, k: int, pool: int, graph: Graph, costs: Costs
) -> float:
    """Seconds for a top-K query over ``pool`` rows (batch costs)."""
    if ratio is None:
        return pool * full_cost(graph, costs, "batch")
    kept = min(math.ceil(ratio * k), pool)
    chain = (tuple(filter_groups), tuple(graph.groups))
    return pool * chain_cost(chain, [1.0, kept / pool], graph, costs, "batch")


def describe(chain: Sequence[Sequence[str]]) -> str:
    return " -> ".join("[" + ", ".join(level) + "]" for level in chain)

