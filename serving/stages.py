"""How an optimized pipeline splits into serving stages, and what each stage costs here.

Stages are coarse on purpose (each hop costs a few ms): the *cheap* stage runs
the first cascade level; the *expensive* stage runs every later level and only
sees the rows the cheap stage was unsure of, together with the feature blocks
the cheap stage already computed. A pipeline without a cascade has one *model*
stage. The *baseline* stage (the unoptimized pipeline in one deployment) exists
for side-by-side benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from willump import OptimizedPipeline
from willump._rows import take

from .planner import StageProfile

#: batch sizes (rows) at which stage costs are measured
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
#: timed repeats per batch size (median)
PROFILE_REPEATS = 5


@dataclass(frozen=True)
class StageSpec:
    """A stage runs cascade levels first..last (inclusive)."""

    name: str
    first: int
    last: int


def stage_specs(opt: OptimizedPipeline) -> list[StageSpec]:
    """Cheap + expensive stages for a cascade; one model stage otherwise."""
    n = len(opt.levels)
    if n == 1:
        return [StageSpec("model", 0, 0)]
    return [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, n - 1)]


def unsure_share(opt: OptimizedPipeline) -> float:
    """Fraction of rows the cheap level sends on, as measured at certification."""
    levels = opt.report().levels
    if len(levels) < 2:
        return 1.0
    return float(min(1.0, max(0.0, 1.0 - levels[0].fraction_answered)))


def profile_rows(opt: OptimizedPipeline, rows: Any = None) -> Any:
    if rows is not None:
        return rows
    if getattr(opt, "sample_rows_", None) is None:
        raise ValueError(
            "the optimized pipeline carries no sample rows (optimize(..., keep_sample=False)); "
            "pass rows= to profile the stages"
        )
    return opt.sample_rows_


def _batch(rows: Any, size: int) -> Any:
    n = len(rows)
    return take(rows, np.arange(size) % n)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def profile_stages(
    opt: OptimizedPipeline,
    rows: Any = None,
    *,
    batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    repeats: int = PROFILE_REPEATS,
    device: str = "cpu",
) -> list[StageProfile]:
    """Measure seconds per batch for each stage at each batch size, on this machine."""
    rows = profile_rows(opt, rows)
    specs = stage_specs(opt)
    out = []
    for spec in specs:
        seconds = {}
        for b in batch_sizes:
            batch = _batch(rows, b)
            if spec.first == 0:
                seconds[b] = _median_seconds(lambda batch=batch, s=spec: opt.run_levels(batch, s.first, s.last), repeats)
            else:
                blocks, _ = opt.pipeline.compute(batch, opt.levels[0].groups)
                seconds[b] = _median_seconds(
                    lambda batch=batch, s=spec, blocks=blocks: opt.run_levels(batch, s.first, s.last, blocks),
                    repeats,
                )
        scale = 1.0 if spec.first == 0 else unsure_share(opt)
        out.append(StageProfile(spec.name, seconds, scale, "gpu" if device == "gpu" and spec.first > 0 else "cpu"))
    return out


def profile_baseline(
    opt: OptimizedPipeline, rows: Any = None, *, batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    repeats: int = PROFILE_REPEATS,
) -> StageProfile:
    """The unoptimized pipeline as one stage (for the baseline deployment)."""
    rows = profile_rows(opt, rows)
    seconds = {}
    for b in batch_sizes:
        batch = _batch(rows, b)
        seconds[b] = _median_seconds(lambda batch=batch: opt.baseline.predict_proba(batch), repeats)
    return StageProfile("baseline", seconds, 1.0)
