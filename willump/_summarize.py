"""Turn what optimize measured and decided into a Report and a one-line reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._capture import BODY
from ._planner import Sweep, chain_cost, describe, full_cost, subset_cost, sweep_cost
from ._report import CandidateRow, GroupRow, LevelRow, Report
from ._routing import route

REFIT_STATEMENT = (
    "not refitted after certification: the small and full models that serve are exactly the ones "
    "the bound was certified on (refitting on more rows would change them and void the guarantee)"
)


@dataclass
class Decision:
    """The plan search's outcome, as the reason needs it."""

    chosen: Sweep | None  # best plan on the selection split
    accepted: Sweep | None  # certified plan (None: full pipeline)
    tested: list[Sweep]  # certification sweeps, in fixed-sequence order
    table: list[Sweep]  # each chain's cheapest plan within max_loss on the selection split
    candidates: list[tuple[str, ...]]
    small: dict[tuple[str, ...], Any]
    blocker: str | None = None  # a reason that stopped the search before it ran
    refused: int = 0  # selection-split bounds refused (too few differing rows, no exact bound)


def plan_reason(d: Decision, max_loss: float, cost_mode: str, full: float, min_speedup: float) -> str:
    """Why the plan is what it is, in one sentence."""
    if d.accepted is not None:
        b = d.accepted.bound
        return (
            f"cascade {describe(d.accepted.chain)} at threshold {d.accepted.threshold:.4f}: loss "
            f"bound {b.upper:.4f} <= max_loss {max_loss} on the certification split ({b.method})"
        )
    if d.blocker is not None:
        return d.blocker
    if not d.candidates:
        return "full pipeline: no proper subset of feature groups carries signal (or only one group)"
    if not d.small:
        return "full pipeline: no small model could be trained on the candidate subsets"
    if d.chosen is None and d.table:
        fastest = min(d.table, key=lambda s: sweep_cost(s, cost_mode))
        return (
            f"full pipeline: cascades within max_loss {max_loss} exist (fastest: {describe(fastest.chain)} "
            f"at threshold {fastest.threshold:.4f}) but none is expected faster than the full pipeline by "
            f"min_speedup {min_speedup:g} ({cost_mode} cost; best {full / sweep_cost(fastest, cost_mode):.2f}x): "
            "the cheap levels cost about as much as the full pipeline (a smaller small_model may help)"
        )
    if d.chosen is None and d.refused:
        return (
            f"full pipeline: on the selection split no candidate plan kept the loss bound within "
            f"max_loss {max_loss}; {d.refused} bounds were refused because too few rows differed "
            "between the cascade and the full pipeline for a bootstrap and the metric has no exact "
            "bound (more rows, a metric with an exact bound such as accuracy, f1 or roc_auc, or a "
            "lower min_disagreements at the bootstrap's risk would help)"
        )
    if d.chosen is None:
        return (
            f"full pipeline: on the selection split no candidate plan kept the loss bound within "
            f"max_loss {max_loss} at any threshold (the cheap groups carry too little signal, or the "
            "split is too small for the bound)"
        )
    first = d.tested[0]
    return (
        f"full pipeline: the selected plan {describe(d.chosen.chain)} failed certification; its first "
        f"threshold in the fixed sequence, {first.threshold:.4f}, had loss bound {first.bound.upper:.4f} > "
        f"max_loss {max_loss} ({first.bound.method}: {first.bound.detail})"
    )


def candidate_row(sweep: Sweep, base_batch: float, base_row: float) -> CandidateRow:
    return CandidateRow(describe(sweep.chain), sweep.threshold, sweep.bound.point, sweep.bound.upper,
                        base_batch / sweep.cost_batch, base_row / sweep.cost_row, sweep.bound.method)


def build_report(*, pipeline, graph, costs, importance, levels, decision: Decision, reason: str,
                 metric, max_loss: float, confidence: float, bound_request: str, topk_row,
                 full_proba, probas, labels, splits, timings, notes, full_model_note: str,
                 cost_mode: str, floor: float, rows_needed: int, split_how: str,
                 feature_state: str, costs_source: str) -> Report:
    groups = list(graph.groups)
    base_batch = full_cost(graph, costs, "batch")
    base_row = full_cost(graph, costs, "row")
    first_level: dict[str, int] = {}
    for i, lv in enumerate(levels):
        for g in lv.groups:
            first_level.setdefault(g, i)
    group_rows = [
        GroupRow(
            name=g,
            columns=list(graph.columns.get(g, [])),
            upstream=sorted(graph.closure([g]) - {g}),
            width=graph.widths[g],
            sparse=graph.sparse[g],
            cost_batch_us=1e6 * subset_cost(graph, costs.batch, [g]),
            cost_row_us=1e6 * subset_cost(graph, costs.row, [g]),
            importance=importance.mean[g],
            importance_std=importance.std[g],
            level=first_level[g],
        )
        for g in groups
    ]
    cert_labels = labels["cert"]
    base_score = metric.value(cert_labels, full_proba["cert"])
    accepted = decision.accepted
    if accepted is not None:
        level_probas = [probas["cert"][s] for s in accepted.chain[:-1]] + [full_proba["cert"]]
        _, approx = route(level_probas, accepted.threshold)
        opt_score = metric.value(cert_labels, approx)
        fractions = accepted.fractions
        speed_batch = base_batch / accepted.cost_batch
        speed_row = base_row / accepted.cost_row
        first_cost = chain_cost([accepted.chain[0]], [1.0], graph, costs, "batch")
    else:
        opt_score, fractions, speed_batch, speed_row = base_score, [1.0], 1.0, 1.0
        cheapest = min(decision.small, key=lambda s: subset_cost(graph, costs.batch, s), default=None)
        first_cost = chain_cost([cheapest], [1.0], graph, costs, "batch") if cheapest else base_batch
    level_rows = [
        LevelRow(i, list(lv.groups), type(lv.model).__name__, lv.threshold, float(fractions[i]))
        for i, lv in enumerate(levels)
    ]
    models = {"full": full_model_note}
    for i, lv in enumerate(levels[:-1]):
        models[f"level {i}"] = (f"{type(lv.model).__name__} on {list(lv.groups)}, "
                                f"{splits['train']} training rows")
    bound = None if accepted is None else accepted.bound
    parts = getattr(bound, "segments", None) or {}
    segment_rows = [{"segment": str(key), "rows": bound.sizes[key], "loss": b.point, "bound": b.upper}
                    for key, b in parts.items()]
    return Report(
        pipeline=pipeline.name,
        plan="cascade" if accepted is not None else "full",
        reason=reason,
        metric=metric.name,
        max_loss=max_loss,
        confidence=confidence,
        bound_method=bound.method if bound is not None else f"requested: {bound_request}",
        bound_detail=bound.detail if bound is not None else "",
        loss=None if bound is None else bound.point,
        loss_bound=None if bound is None else bound.upper,
        baseline_score=base_score,
        optimized_score=opt_score,
        expected_speedup=speed_batch,
        expected_speedup_row=speed_row,
        limit_speedup=base_batch / first_cost if first_cost > 0 else 1.0,
        groups=group_rows,
        levels=level_rows,
        candidates=[candidate_row(s, base_batch, base_row) for s in decision.table],
        certification=[candidate_row(s, base_batch, base_row) for s in decision.tested],
        topk=topk_row,
        splits=splits,
        models=models,
        refit=REFIT_STATEMENT,
        shared_nodes=graph.shared_nodes(),
        node_costs_us={k: 1e6 * v for k, v in sorted(costs.batch.items()) if k != BODY}
        | {"<body>": 1e6 * costs.batch.get(BODY, 0.0)},
        timings_s=timings,
        notes=notes,
        cost_mode=cost_mode,
        certifiable_floor=floor,
        rows_needed=rows_needed,
        split=split_how,
        feature_state=feature_state,
        costs_source=costs_source,
        greater_is_better=metric.greater_is_better,
        segments=segment_rows,
        segment_max_loss=getattr(bound, "segment_max_loss", None),
    )

