"""Profile: what each feature node costs per row, and what each group is worth.

Costs are wall-clock seconds per row, exclusive of nested feature calls, measured
both at batch size (throughput serving) and one row at a time (latency serving),
as medians over repeats. Importance is permutation importance of a whole group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._blocks import Block, hstack
from ._capture import BODY, Pipeline
from ._models import predict_proba
from ._rows import n_rows, take

#: rows per timed batch when measuring throughput costs
PROFILE_BATCH_ROWS = 1024
#: timed batches (after one warm-up) whose per-node median is the batch cost
PROFILE_REPEATS = 3
#: single rows timed for latency costs (median)
PROFILE_SINGLE_ROWS = 25
#: shuffles per group for permutation importance
IMPORTANCE_REPEATS = 3


@dataclass
class Costs:
    """Seconds per row for each feature node, the body, and each fitted model."""

    batch: dict[str, float]
    row: dict[str, float]
    model_batch: dict[tuple[str, ...], float] = field(default_factory=dict)
    model_row: dict[tuple[str, ...], float] = field(default_factory=dict)

    def per_row(self, mode: str) -> dict[str, float]:
        return self.batch if mode == "batch" else self.row

    def model(self, groups: Sequence[str], mode: str) -> float:
        table = self.model_batch if mode == "batch" else self.model_row
        return table[tuple(groups)]


def measure_node_costs(
    pipeline: Pipeline,
    rows: Any,
    *,
    batch_rows: int = PROFILE_BATCH_ROWS,
    repeats: int = PROFILE_REPEATS,
    single_rows: int = PROFILE_SINGLE_ROWS,
    rng: np.random.Generator,
    progress: Any = None,
) -> Costs:
    """Time every node of the full pipeline at batch size and at one row."""
    total = n_rows(rows)
    size = min(batch_rows, total)
    pipeline.execute(take(rows, np.arange(min(size, 64))))  # warm caches and lazy imports
    batch_samples: list[dict[str, float]] = []
    for _ in range(repeats):
        pick = np.sort(rng.choice(total, size, replace=False))
        result = pipeline.execute(take(rows, pick))
        batch_samples.append(_per_row(result.node_seconds, result.body_seconds, size))
        if progress is not None:
            progress.update(1)
    row_samples: list[dict[str, float]] = []
    for i in rng.choice(total, min(single_rows, total), replace=False):
        result = pipeline.execute(take(rows, np.array([i])))
        row_samples.append(_per_row(result.node_seconds, result.body_seconds, 1))
    if progress is not None:
        progress.update(1)
    return Costs(batch=_median(batch_samples), row=_median(row_samples))


#: key of ``fixed_costs`` giving every model's seconds per row
MODEL_COST_KEY = "<model>"


def fixed_node_costs(nodes: Sequence[str], fixed: Mapping[str, float], groups: Sequence[str] = ()) -> Costs:
    """Costs given by the caller instead of measured: seconds per row for each feature node
    (a node not named costs 0) and, under ``"<model>"``, for every model. The same at batch
    size and for one row. For tests and studies whose outcome must not depend on how fast
    the machine is."""
    unknown = sorted(set(fixed) - set(nodes) - {MODEL_COST_KEY, BODY})
    if unknown:
        raise ValueError(f"fixed_costs names unknown feature node(s) {unknown}; nodes: {list(nodes)}")
    unpriced = [g for g in groups if g not in fixed]
    if unpriced:
        raise ValueError(f"fixed_costs gives no cost for feature group(s) {unpriced} (helper nodes may "
                         "be left out: they cost 0)")
    bad = {k: v for k, v in fixed.items() if not (isinstance(v, (int, float)) and v >= 0)}
    if bad:
        raise ValueError(f"fixed_costs must be non-negative seconds per row; got {bad}")
    per_node = {n: float(fixed.get(n, 0.0)) for n in nodes} | {BODY: float(fixed.get(BODY, 0.0))}
    return Costs(batch=dict(per_node), row=dict(per_node))


def log_loss(y: np.ndarray, proba: np.ndarray, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true class index (-1, an unseen label: eps)."""
    p_true = np.where(y >= 0, proba[np.arange(len(y)), np.maximum(y, 0)], 0.0)
    return float(-np.mean(np.log(np.clip(p_true, eps, 1.0))))


def _per_row(node_seconds: dict[str, float], body_seconds: float, rows: int) -> dict[str, float]:
    out = {k: v / rows for k, v in node_seconds.items()}
    out[BODY] = body_seconds / rows
    return out


def _median(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for s in samples for k in s}
    return {k: float(np.median([s.get(k, 0.0) for s in samples])) for k in keys}


@dataclass
class Importance:
    """Rise in log loss when a group's rows are shuffled together (mean, std over repeats)."""

    mean: dict[str, float]
    std: dict[str, float]
    baseline_log_loss: float


def permutation_importance(
    model: Any,
    blocks: dict[str, Block],
    groups: Sequence[str],
    y: np.ndarray,
    *,
    repeats: int = IMPORTANCE_REPEATS,
    rng: np.random.Generator,
) -> Importance:
    """Permute all columns of one group with one row permutation; dense and sparse alike."""
    base = log_loss(y, predict_proba(model, hstack([blocks[g] for g in groups])))
    mean, std = {}, {}
    n = len(y)
    for g in groups:
        drops = []
        for _ in range(repeats):
            perm = rng.permutation(n)
            shuffled = [blocks[h][perm] if h == g else blocks[h] for h in groups]
            drops.append(log_loss(y, predict_proba(model, hstack(shuffled))) - base)
        mean[g] = float(np.mean(drops))
        std[g] = float(np.std(drops))
    return Importance(mean, std, base)
