"""serving.partition: a torch model cut into pipeline stages, PipeDream style, for inference.

Plain data in, plan out, no Ray (deployment of a plan lives in :func:`serving.deploy_model`)::

    graph = capture(module, example)          # a chain of <= 200 blocks; len(graph)
    prof = profile(graph, batch_sizes=(1, 8, 32), device="cpu")
    p = plan(prof, devices=4, memory_per_device=None, objective="throughput")
    p.stages[0].start, p.stages[0].end, p.stages[0].replicas, p.throughput, p.latency_ms
    evaluate(prof, [(0, 10, 2), (10, len(graph), 2)], devices=4)   # any assignment
    simulate(p, prof, rate=100.0)              # p50 / p99 / throughput by discrete events
    stages = split(graph, p)                   # one nn.Module per stage; Pipeline(stages) == module

``save_model(module, example, "m.pt")`` writes the file ``willump plan m.pt`` and
``willump serve m.pt`` read.
"""

from .capture import MAX_BLOCKS, capture
from .cost import Stage
from .device import on_device, retarget, retarget_module, to_device
from .emulate import EmulatedBlock, emulated
from .graph import Block, CaptureError, Graph
from .pipedream import PIPEDREAM_BATCH, read_pipedream
from .planner import (
    OBJECTIVES,
    Plan,
    brute_force,
    evaluate,
    even_by_layers,
    even_by_params,
    plan,
    with_replicas,
)
from .profile import (
    Profile,
    Transport,
    batch_of,
    load_model,
    load_profile,
    nbytes,
    profile,
    save_model,
    save_profile,
)
from .simulate import ARRIVALS, SimResult, simulate
from .split import Pipeline, allclose, split

__all__ = [
    "ARRIVALS",
    "MAX_BLOCKS",
    "OBJECTIVES",
    "PIPEDREAM_BATCH",
    "Block",
    "CaptureError",
    "EmulatedBlock",
    "Graph",
    "Pipeline",
    "Plan",
    "Profile",
    "SimResult",
    "Stage",
    "Transport",
    "allclose",
    "batch_of",
    "brute_force",
    "capture",
    "emulated",
    "evaluate",
    "even_by_layers",
    "even_by_params",
    "load_model",
    "load_profile",
    "nbytes",
    "on_device",
    "plan",
    "profile",
    "read_pipedream",
    "retarget",
    "retarget_module",
    "save_model",
    "save_profile",
    "simulate",
    "split",
    "to_device",
    "with_replicas",
]
