"""How an optimized pipeline splits into serving stages: the vocabulary every wing uses.

Stages are coarse on purpose (each hop costs CPU on both sides): the *cheap* stage runs
the first cascade level; the *expensive* stage runs every later level and only sees the
rows the cheap stage was unsure of. A pipeline without a cascade has one *model* stage;
the *baseline* stage (the unoptimized pipeline in one deployment) exists for side-by-side
benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

from willump import OptimizedPipeline


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


def gpu_capable(opt: OptimizedPipeline, spec: StageSpec, runtime: str) -> bool:
    """Whether the stage's models can run on a GPU: ONNX Runtime sessions (CUDA provider) or
    torch models; scikit-learn and LightGBM models run on the CPU only."""
    if runtime == "onnx":
        return True
    if spec.name == "baseline":
        models = [opt.baseline.model]
    else:
        models = [opt.levels[i].model for i in range(spec.first, spec.last + 1)]
    return all(hasattr(m, "module_") and hasattr(m, "to") for m in models)
