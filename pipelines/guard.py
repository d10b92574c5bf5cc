"""Keep a certified cascade only when it pays.

Two things in willump.optimize make this necessary (both reported upstream):

- it returns the cheapest cascade within ``max_loss`` even when its own cost model
  expects that cascade to be *slower* than the full pipeline (when the model, not the
  features, dominates the cost, a cheap level costs about as much as the full pipeline);
- that cost model is profiled on 1024-row batches with 3 repeats, which on a busy
  shared machine can be off by 2x or more (a cascade expected at 1.05x ran at 0.56x).

So :func:`full_unless_faster` re-measures the cascade side by side with the full
pipeline (each level's cost on the same rows, weighted by the share of rows reaching it
on the certification split) and keeps the full pipeline unless the cascade is faster.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp

import willump

from .timing import medians, side_by_side

#: a cascade must be faster than this multiple of the full pipeline to be kept
MIN_CASCADE_SPEEDUP = 1.0
#: timed rounds of the re-measurement (medians)
REMEASURE_REPEATS = 3


def _hstack(blocks: list[Any]) -> Any:
    if len(blocks) == 1:
        return blocks[0]
    if any(sp.issparse(b) for b in blocks):
        return sp.hstack([sp.csr_matrix(b) for b in blocks], format="csr")
    return np.hstack(blocks)


def remeasured_speedup(opt: willump.OptimizedPipeline, rows: Any,
                       repeats: int = REMEASURE_REPEATS) -> float:
    """The cascade's batch speedup with its cost model re-measured on ``rows``.

    Each level's cost (its new feature groups and its model, on every row) and the full
    pipeline's cost are timed side by side; level costs are weighted by the share of rows
    reaching the level on the certification split (from the report, held out from the
    models). Costs are label-independent, so training rows serve as well as any.
    """
    fractions = [lv.fraction_answered for lv in opt.report().levels]
    reach = [1.0 - sum(fractions[:i]) for i in range(len(opt.levels))]
    pipeline = opt.pipeline
    ready, _ = pipeline.compute(rows, pipeline.graph.groups)
    fns = {"full": lambda: opt.baseline.predict_proba(rows)}
    have: set[str] = set()
    for i, level in enumerate(opt.levels):
        new = [g for g in level.groups if g not in have]

        def run(level=level, new=new) -> None:
            blocks, _ = pipeline.compute(rows, new)
            level.model.predict_proba(_hstack([blocks.get(g, ready[g]) for g in level.groups]))

        fns[f"level{i}"] = run
        have |= set(new)
    t = medians(side_by_side(fns, repeats))
    cascade = sum(reach[i] * t[f"level{i}"] for i in range(len(opt.levels)))
    return t["full"] / cascade if cascade > 0 else float("inf")


def full_unless_faster(opt: willump.OptimizedPipeline, rows: Any = None, *,
                       min_speedup: float = MIN_CASCADE_SPEEDUP) -> willump.OptimizedPipeline:
    """``opt`` if its cascade is faster than the full pipeline, else the full pipeline.

    With ``rows`` the speedup is re-measured on them (:func:`remeasured_speedup`),
    otherwise the optimizer's expected speedup decides. The returned pipeline's report
    says what was measured and why; ``opt`` itself is left unchanged. The top-K filter
    is kept either way (it is planned separately, and used only when it is cheaper).
    """
    report = opt.report()
    if report.plan != "cascade":
        return opt
    measured = None if rows is None else remeasured_speedup(opt, rows)
    speedup = report.expected_speedup if measured is None else measured
    how = (f"expected {report.expected_speedup:.2f}x by willump's cost model"
           + ("" if measured is None else f", {measured:.2f}x re-measured side by side on "
              f"{len(rows)} training rows"))
    chain = " -> ".join(str(list(lv.groups)) for lv in opt.levels)
    if speedup > min_speedup:
        kept = copy.copy(opt)
        kept.report_ = replace(report, notes=[*report.notes, f"pipelines.guard: cascade {how}; kept"])
        return kept
    note = (f"the certified cascade {chain} (threshold {opt.levels[0].threshold:.4f}, loss bound "
            f"{report.loss_bound:.4f}) is no faster than the full pipeline ({how})")
    full = copy.copy(opt)
    full.levels = [opt.levels[-1]]
    full.report_ = replace(
        report,
        plan="full",
        reason=f"full pipeline: {note}",
        loss=None,
        loss_bound=None,
        optimized_score=report.baseline_score,
        expected_speedup=1.0,
        expected_speedup_row=1.0,
        groups=[replace(g, level=0) for g in report.groups],
        levels=[replace(report.levels[-1], index=0, groups=list(opt.levels[-1].groups),
                        threshold=None, fraction_answered=1.0)],
        models={k: v for k, v in report.models.items() if not k.startswith("level")},
        notes=[*report.notes, f"pipelines.guard: {note}; kept the full pipeline"],
    )
    return full
