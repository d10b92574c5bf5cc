"""Plan: which group subsets make cheap levels, at which confidence threshold, and
how the bound is computed for each.

Cost model: a cascade level runs the pipeline body again on the rows that reach
it, computes the nodes its *new* groups need (shared upstream steps included,
since intermediates are not kept between levels), reuses the blocks of earlier
levels by slicing, and runs its model. So for a chain S1 < S2 < ... < full::

    cost = sum_l reach_l * (body + sum(closure(new_l)) + model_l)

where reach_l is the fraction of rows that were not confident at earlier levels.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ._bounds import (
    MIN_DISAGREEMENTS,
    JointBound,
    LossBound,
    Resamples,
    disagreements,
    exact_score_bound,
    guarded_bootstrap_bound,
    has_exact_bound,
    rowwise_bound,
)
from ._capture import BODY
from ._graph import Graph
from ._metrics import Labels, Metric
from ._profile import Costs
from ._routing import answer_levels, route

#: cheap-subset cost budgets, as fractions of the full feature cost (Willump's grid, widened)
COST_BUDGETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
#: up to this many groups, every subset is enumerated (exact, shared costs included)
EXACT_SUBSET_LIMIT = 14
#: fractions of rows answered early that define the threshold grid
EARLY_FRACTIONS = tuple(np.round(np.r_[np.linspace(0.05, 0.9, 18), np.linspace(0.92, 0.995, 9)], 4))


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


def threshold_grid(first_level_confidence: np.ndarray) -> list[float]:
    """Thresholds, most conservative first, at which set fractions of rows exit early."""
    qs = [float(np.quantile(first_level_confidence, 1.0 - f)) for f in EARLY_FRACTIONS]
    return sorted(set(qs), reverse=True)


def certification_grid(evaluator: Evaluator, chain, probas, grid: Sequence[float],
                       max_loss: float) -> list[float]:
    """The thresholds certification tests, in order: ``grid`` from the most conservative
    threshold that keeps the bound within max_loss on the *selection* split.

    More conservative thresholds can fail where a less conservative one passes: too few rows
    differ for a bootstrap (and an exact fallback is loose there), or routing ties. Starting
    the fixed sequence at such a threshold would stop it at its first step. The start is
    chosen on the selection split, before any certification label is seen, so fixed-sequence
    testing stays valid.
    """
    for i, t in enumerate(grid):
        if evaluator.evaluate(chain, probas, t).bound.within(max_loss):
            return list(grid[i:])
    return []


#: most thresholds a fixed sequence tests when each test is costly (see Evaluator.costly)
COSTLY_SEQUENCE_STEPS = 8


def thin(sequence: Sequence[float], keep: float | None, steps: int = COSTLY_SEQUENCE_STEPS) -> list[float]:
    """At most ``steps`` thresholds of ``sequence`` in order, evenly spread, first and last
    kept, and ``keep`` (the threshold selected on the selection split) kept when present.
    Decided before certification, so the thinned sequence is still a fixed sequence."""
    if len(sequence) <= steps:
        return list(sequence)
    picks = set(np.round(np.linspace(0, len(sequence) - 1, steps)).astype(int).tolist())
    if keep is not None and keep in sequence:
        picks.add(list(sequence).index(keep))
    return [sequence[i] for i in sorted(picks)]


@dataclass
class Sweep:
    """One chain at one threshold on one split."""

    chain: tuple[tuple[str, ...], ...]
    threshold: float
    bound: LossBound
    fractions: list[float]  # rows answered at each level
    cost_batch: float
    cost_row: float
    rows: int  # rows of the split
    class_disagreed: int  # rows whose predicted class (argmax) differs from the full pipeline's


def bound_method(metric: Metric, bound: str) -> str:
    """'exact', 'product' or 'bootstrap' (guarded) for a metric under the requested ``bound``:
    'auto' is 'exact' wherever the metric has an exact bound (rowwise, ROC AUC, F1)."""
    if bound == "auto":
        return "exact" if has_exact_bound(metric) else "bootstrap"
    return bound


@dataclass
class Evaluator:
    """Scores chains on one split against the full pipeline.

    ``tolerance`` is how far a served runtime's probabilities may differ from the ones
    certified (ONNX, a GPU): rows whose confidence lies within it of a threshold, or whose
    top two classes lie within it of each other, may be answered differently, and the
    bound covers the least favourable of those answers (exactly for rowwise metrics, by
    taking the largest bound over the extreme routings otherwise).

    ``project_to``: on the selection split, the bounds are those its rows predict for a
    certification split of that many rows (rowwise and F1 counts scaled, ROC AUC pair losses
    resampled), so that a plan is chosen for what certification will be able to show rather
    than for what the smaller selection split can. A prediction only: certification itself
    always bounds its own rows.

    ``segments`` (one key per row of this split) with ``segment_max_loss``: each segment's loss
    is bounded on its own rows too, and a plan passes only when all of them and the overall
    bound do (see ``_bounds.JointBound``).
    """

    metric: Metric
    labels: Labels
    full_proba: np.ndarray
    resamples: Resamples | None
    confidence: float
    bound: str
    graph: Graph
    costs: Costs
    tolerance: float = 0.0
    min_disagreements: int = MIN_DISAGREEMENTS
    project_to: int | None = None
    seed: int = 0
    segments: np.ndarray | None = None
    segment_max_loss: float | None = None

    def __post_init__(self) -> None:
        self.method = bound_method(self.metric, self.bound)
        self._full_utilities: np.ndarray | None = None
        self._sweeps: dict[tuple, Sweep] = {}
        if self.method in ("exact", "product") and self.metric.kind == "rowwise":
            self.full_good = self.metric.row_good(self.labels, self.full_proba)
        self._parts: dict[Any, tuple[np.ndarray, Evaluator]] = {}
        if self.segments is not None:
            n = len(self.labels)
            for key in pd.unique(pd.Series(self.segments)):
                mask = np.asarray(self.segments == key)
                labels = Labels(self.labels.values[mask], self.labels.index[mask], self.labels.classes)
                draws = None if self.resamples is None else Resamples(int(mask.sum()), self.resamples.count,
                                                                    np.random.default_rng(self.seed + 1))
                share = None if self.project_to is None else max(1, round(self.project_to * mask.sum() / n))
                self._parts[key] = (mask, Evaluator(self.metric, labels, self.full_proba[mask], draws,
                                                    self.confidence, self.bound, self.graph, self.costs,
                                                    self.tolerance, self.min_disagreements, share, self.seed))

    @property
    def refused(self) -> int:
        """Bounds evaluated so far that were refused (see _bounds.guarded_bootstrap_bound)."""
        return sum(s.bound.method == "refused" for s in self._sweeps.values())

    @property
    def costly(self) -> bool:
        """True when each bound calls Python code once per resample (a user callable or a
        scikit-learn scorer), so a long fixed sequence is worth thinning."""
        return self.method == "bootstrap" and self.metric.builtin is None

    def evaluate(self, chain, probas: dict[tuple[str, ...], np.ndarray], threshold: float) -> Sweep:
        key = (tuple(chain), float(threshold))
        if key not in self._sweeps:
            self._sweeps[key] = self._evaluate(chain, probas, threshold)
        return self._sweeps[key]

    def _evaluate(self, chain, probas: dict[tuple[str, ...], np.ndarray], threshold: float) -> Sweep:
        level_probas = [probas[s] for s in chain[:-1]] + [self.full_proba]
        levels, approx = route(level_probas, threshold)
        bound = self.loss_bound(level_probas, levels, approx, threshold)
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
            len(levels),
            int(np.count_nonzero(approx.argmax(axis=1) != self.full_proba.argmax(axis=1))),
        )

    def disagreements_at(self, chain, probas, threshold: float) -> int:
        """Rows whose input to the metric differs between the chain and the full pipeline."""
        level_probas = [probas[s] for s in chain[:-1]] + [self.full_proba]
        _, approx = route(level_probas, threshold)
        return disagreements(self.metric, self.full_proba, approx)

    def point_loss(self, chain, probas, threshold: float) -> float:
        level_probas = [probas[s] for s in chain[:-1]] + [self.full_proba]
        _, approx = route(level_probas, threshold)
        return self.metric.utility(self.labels, self.full_proba) - self.metric.utility(self.labels, approx)

    def loss_bound(self, level_probas, levels, approx, threshold: float) -> LossBound:
        overall = self._overall_bound(level_probas, levels, approx, threshold)
        if not self._parts:
            return overall
        assert self.segment_max_loss is not None
        parts = {key: part.loss_bound([p[mask] for p in level_probas], levels[mask], approx[mask], threshold)
                 for key, (mask, part) in self._parts.items()}
        sizes = {key: int(mask.sum()) for key, (mask, _) in self._parts.items()}
        return JointBound(overall, parts, self.segment_max_loss, sizes)

    def _overall_bound(self, level_probas, levels, approx, threshold: float) -> LossBound:
        if self.method in ("exact", "product") and self.metric.kind == "rowwise":
            return self._rowwise(level_probas, levels, approx, threshold)
        routings = [approx]
        if self.tolerance > 0:
            for t in (threshold + self.tolerance, threshold - self.tolerance):
                _, other = route(level_probas, t)
                if not np.array_equal(other, approx):
                    routings.append(other)
        bounds = [self._score_bound(p) for p in routings]
        worst = max(bounds, key=lambda b: b.upper)
        worst.point = bounds[0].point
        return worst

    def _score_bound(self, approx: np.ndarray) -> LossBound:
        if self.method == "exact":
            return exact_score_bound(self.metric, self.labels, self.full_proba, approx, self.confidence,
                                     self.seed, self.project_to)
        assert self.resamples is not None
        if self._full_utilities is None:
            self._full_utilities = self.metric.utilities(self.labels, self.full_proba, self.resamples.chunks())
        return guarded_bootstrap_bound(self.metric, self.labels, self.full_proba, approx, self.resamples,
                                       self.confidence, self.min_disagreements, self._full_utilities)

    def _rowwise(self, level_probas, levels, approx, threshold: float) -> LossBound:
        n = len(self.labels)
        point = float(np.mean(self.full_good) - np.mean(self.metric.row_good(self.labels, approx)))
        good = np.stack([self.metric.row_good(self.labels, p) for p in level_probas])  # levels x rows
        worst, best = good.copy(), good.copy()
        if self.tolerance > 0:
            for index, p in enumerate(level_probas):
                top2 = np.sort(p, axis=1)[:, -2:] if p.shape[1] > 1 else np.hstack([p, p])
                unsure_label = (top2[:, 1] - top2[:, 0]) < 2 * self.tolerance
                worst[index] &= ~unsure_label
                best[index] |= unsure_label
            loose = answer_levels(level_probas, threshold - self.tolerance)
            strict = answer_levels(level_probas, threshold + self.tolerance)
        else:
            loose = strict = levels
        candidate = np.arange(len(level_probas))[:, None]
        possible = (candidate >= loose[None, :]) & (candidate <= strict[None, :])
        worst_good = np.where(possible, worst, True).all(axis=0)
        best_good = np.where(possible, best, False).any(axis=0)
        worse_max = int(np.sum(self.full_good & ~worst_good))
        better_min = int(np.sum(~self.full_good & worst_good))
        ambiguous = int(np.sum(worst_good != best_good))
        rule = "product" if self.method == "product" else "exact"
        if self.project_to is not None and n:
            scale = self.project_to / n
            return rowwise_bound(round(worse_max * scale), round(better_min * scale), round(ambiguous * scale),
                                 self.project_to, point, self.confidence, rule, projected_from=n)
        return rowwise_bound(worse_max, better_min, ambiguous, n, point, self.confidence, rule)


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

    A lower threshold answers more rows early, so it is never more expensive: each chain's
    thresholds are tried from the lowest up and the first within max_loss is its cheapest
    plan. Thresholds whose point loss already exceeds max_loss are skipped without a bound.
    """

    def cost(sweep: Sweep) -> float:
        return sweep_cost(sweep, cost_mode)

    best: Sweep | None = None
    table: list[Sweep] = []
    for chain in chains:
        chain_best = None
        for t in sorted(grids[chain]):
            if evaluator.point_loss(chain, probas, t) > max_loss:
                continue
            sweep = evaluator.evaluate(chain, probas, t)
            if sweep.bound.within(max_loss):
                chain_best = sweep
                break
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
        if not sweep.bound.within(max_loss):
            break
        accepted = sweep
    return accepted, tested


def describe(chain: Sequence[Sequence[str]]) -> str:
    return " -> ".join("[" + ", ".join(level) + "]" for level in chain)
