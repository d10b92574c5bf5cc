"""Module groups too big for one device, served inside the cascade as chains of partition stages.

``deploy(opt, module_memory=BYTES)``: every ``willump.module_feature`` group that a later
stage computes and whose module (parameters plus its largest block workspace) does not fit
``module_memory`` is captured on its sample input, profiled on the stage's device, planned
with :func:`serving.partition.plan` on ``module_devices`` devices of that memory, cut, and
written as stage files (0600, sha256 checked by the replica). The spec's
``module_chains`` then tells :mod:`serving.launch.graph` to deploy one ``PartitionStage``
per stage and hand their handles to the expensive stage, whose replicas call the chain in
place of the module (:mod:`serving.runtime.module_chain`). A group that fits is left alone.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.core.profiles import NodeSpec
from serving.core.specs import ChainStageSpec, ModuleChainSpec, StageSpec
from serving.model_app.placement import (
    ReplicaResources,
    check_placeable,
    floor_units,
    replica_resources,
)
from serving.runtime.stage_runner import module_groups
from willump.runtime import require

#: batch sizes a chained module is profiled at (rows per forward)
CHAIN_BATCH_SIZES = (1, 8, 32)
#: devices a chained module is planned on when deploy is not told
DEFAULT_MODULE_DEVICES = 2
#: logical CPUs each partition-stage replica of a chain asks for on a CPU device
DEFAULT_MODULE_CPUS = 0.5
#: GPU shares kept for the plan's own GPU stages when chain replicas split the GPUs: one share,
#: as large as a chain replica's (the stage calling the chain runs the rest of its groups)
CHAIN_GPU_SHARERS = 1


def chain_callers(specs: Sequence[StageSpec]) -> Sequence[StageSpec]:
    """The stages whose module groups may be served as chains: the later stages of a cascade
    (the first runs in or beside the ingress), or the one stage of a single-stage app."""
    return specs[1:] or specs


def plan_module_chains(opt: Any, specs: list[StageSpec], *, module_memory: float | None, devices: int,
                       device: str, cpus_per_replica: float, name: str,
                       workdir: str | os.PathLike | None = None,
                       nodes: Sequence[NodeSpec] = ()) -> tuple[dict[str, ModuleChainSpec], list[str]]:
    """The chains to deploy (by group) and notes; ``{}`` when every module fits or no cap is set.
    On a GPU, the chains' replicas get their shares of ``nodes``' free GPUs (:func:`chain_resources`)."""
    if module_memory is None:
        return {}, []
    if not module_memory > 0:
        raise ValueError(f"module_memory must be a positive number of bytes, got {module_memory!r}")
    if not isinstance(devices, int) or devices < 1:
        raise ValueError(f"module_devices must be a positive int, got {devices!r}")
    features = opt.pipeline.graph_features()
    groups = sorted({g for s in chain_callers(specs) for g in module_groups(opt, s)})
    if not groups:
        return {}, []
    # torch only here: `willump serve` of a scikit-learn artifact runs on the [serve] extra alone
    require("torch", "serving a module group as a chain of partition stages")
    from serving import partition as sp
    from serving.model_app.stage_replica import write_stage_file

    chains: dict[str, ModuleChainSpec] = {}
    notes: list[str] = []
    folder: Path | None = None
    torch_device = "cuda" if device == "gpu" else "cpu"
    for group in groups:
        feature = features[group]
        example = feature.inputs(opt.sample_rows_.iloc[:8])
        graph = sp.capture(feature.module, example)
        prof = sp.profile(graph, batch_sizes=CHAIN_BATCH_SIZES, device=torch_device, name=group)
        if prof.model_bytes + float(max(max(r) for r in prof.workspace_bytes)) <= module_memory:
            notes.append(f"module group {group}: fits module_memory ({prof.model_bytes / 2**20:.1f} MiB of "
                         "parameters): served in the stage's replicas")
            continue
        plan = sp.plan(prof, devices=devices, memory_per_device=module_memory)
        if not plan.feasible or not plan.stages:
            raise ValueError(f"module group {group!r} ({prof.model_bytes / 2**20:.1f} MiB of parameters) does not "
                             f"fit {devices} device(s) of module_memory={module_memory:g} bytes: "
                             + "; ".join(plan.notes))
        if folder is None:
            folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix=f"willump-{name}-chains-"))
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        stages = []
        for k, (module, st) in enumerate(zip(sp.split(graph, plan), plan.stages, strict=True)):
            path = folder / f"{group}-stage{k}.pt"
            stages.append(ChainStageSpec(path=str(path), sha256=write_stage_file(module, path),
                                         replicas=st.replicas, blocks=(st.start, st.end)))
        chains[group] = ModuleChainSpec(device=torch_device, num_cpus=cpus_per_replica, stages=stages,
                                        plan=plan.to_dict())
        notes.append(f"module group {group}: {prof.model_bytes / 2**20:.2f} MiB of parameters over "
                     f"module_memory={module_memory:g} B: served as {len(stages)} partition stages "
                     f"{[s.blocks for s in stages]} x {[s.replicas for s in stages]} replicas, "
                     f"{plan.throughput:.0f} rows/s predicted for the chain")
    if chains:
        replicas = sum(st.replicas for c in chains.values() for st in c.stages)
        need = chain_resources(replicas, torch_device, nodes, cpus_per_replica=cpus_per_replica)
        chains = {g: c.model_copy(update=need.as_options()) for g, c in chains.items()}
    return chains, notes


def chain_resources(replicas: int, device: str, nodes: Sequence[NodeSpec], *, cpus_per_replica: float,
                    sharers: int = CHAIN_GPU_SHARERS) -> ReplicaResources:
    """What each of the chains' ``replicas`` replicas asks for: on a CPU, ``cpus_per_replica``;
    on a GPU, an equal share of the free GPUs split over the chain replicas and ``sharers`` more
    (the plan's own GPU stages get what the chains leave, :func:`free_after_chains`). Raises
    ValueError, naming the shortfall, when the replicas cannot all be placed."""
    if device != "cuda":
        need = replica_resources(replicas, "cpu", nodes, cpus_per_replica=cpus_per_replica)
    else:
        need = replica_resources(replicas + sharers, "cuda", nodes)
    if nodes:
        check_placeable(replicas, need, nodes)
    return need


def free_after_chains(nodes: Sequence[NodeSpec], chains: dict[str, ModuleChainSpec]) -> list[NodeSpec]:
    """``nodes`` less the GPUs the chains' replicas take (placed node by node as Ray would),
    for the plan of the stages that call them."""
    gpus = [n.gpus for n in nodes]
    for chain in chains.values():
        for _ in range(sum(stage.replicas for stage in chain.stages) if chain.num_gpus > 0 else 0):
            k = next((k for k, free in enumerate(gpus) if free + 1e-9 >= chain.num_gpus), None)
            if k is not None:
                gpus[k] = floor_units(gpus[k] - chain.num_gpus)
    return [dataclasses.replace(n, gpus=g) for n, g in zip(nodes, gpus, strict=True)]


def chain_cpus(chains: dict[str, ModuleChainSpec]) -> float:
    """Logical CPUs the chains' replicas take (out of the budget the main plan may use)."""
    return sum(c.num_cpus * s.replicas for c in chains.values() for s in c.stages)
