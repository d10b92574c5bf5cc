"""A module group whose torch module runs as a chain of partition stages in other replicas.

When a cascade's deep level is too big for one device, ``serving.deploy(module_memory=...)``
cuts the group's module PipeDream-style (:mod:`serving.partition`) and deploys one
``PartitionStage`` deployment per stage. The expensive stage's replicas then swap the
group's module for a :class:`RemoteModule`: willump's ``ModuleFeature`` calls it exactly as
it called the module (prepare, module, finish), and each call travels the stages in
order, one stage's result handed to the next by Serve without returning here in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from serving.runtime.wire import from_wire, to_wire

#: seconds one forward pass through the chain may take before the stage call fails
CHAIN_TIMEOUT_S = 60.0


class RemoteModule(torch.nn.Module):
    """``forward(*inputs)`` through the stage deployments ``handles`` (in order); the output
    comes back as CPU tensors, like the module's own output moved to the CPU."""

    def __init__(self, handles: Sequence[Any], timeout_s: float = CHAIN_TIMEOUT_S):
        super().__init__()
        if not handles:
            raise ValueError("a remote module needs at least one stage handle")
        self.handles = [_callable_from_threads(h) for h in handles]
        self.timeout_s = timeout_s

    def forward(self, *inputs: Any) -> Any:
        response = self.handles[0].remote(to_wire(tuple(inputs)))
        for handle in self.handles[1:]:  # chained: Serve passes each result on
            response = handle.remote(response)
        return from_wire(response.result(timeout_s=self.timeout_s), torch.device("cpu"))


def _callable_from_threads(handle: Any) -> Any:
    """The module runs in the replica's worker threads, outside its event loop; with
    ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` a handle's router shares that loop and refuses calls
    from elsewhere, so the chain's handles get a router on a loop of their own (the option
    Serve's own error message names). A handle already used keeps its router."""
    init = getattr(handle, "_init", None)
    if init is not None and not getattr(handle, "is_initialized", True):
        init(_run_router_in_separate_loop=True)
    return handle


def attach_chains(opt: Any, chains: Mapping[str, Sequence[Any]] | None) -> list[str]:
    """Swap each named module group's module for a :class:`RemoteModule` over its stage
    handles (the group then computes on the CPU side of the chain); returns notes."""
    if not chains:
        return []
    from willump import ModuleFeature

    features = opt.pipeline.graph_features()
    notes = []
    for group, handles in chains.items():
        feature = features.get(group)
        if not isinstance(feature, ModuleFeature):
            raise ValueError(f"module chain for {group!r}, which is not a willump.module_feature group")
        feature.module = RemoteModule(handles)
        feature.device = "cpu"
        notes.append(f"module group {group}: a chain of {len(handles)} partition stages")
    return notes
