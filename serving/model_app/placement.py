"""Where a partitioned model's replicas go, and a clear refusal when the cluster cannot hold them.

Each replica of a plan takes one *device*: on CPUs ``cpus_per_replica`` logical CPUs, on
GPUs a share of a GPU. The share is 1 when the cluster has a GPU for every replica, else
the free GPUs divided among the replicas (several stages on one GPU, which is how a plan
made for ``devices=4`` runs on one card), floored to Ray's resource granularity so that
the shares never add up to more than the GPUs (a rounded-up 0.3334 leaves the last
replica waiting forever). Replicas never span nodes, so the check packs them node by node
before Serve is asked: a plan that does not fit is refused with what it needs and what is
free, instead of waiting for resources that will not come.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from serving.core.nodes import RESOURCE_UNIT, floor_units
from serving.core.profiles import NodeSpec


@dataclass(frozen=True)
class ReplicaResources:
    """What each replica of the model app asks Ray for."""

    num_cpus: float
    num_gpus: float

    def as_options(self) -> dict[str, float]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}


def replica_resources(replicas: int, device: str, nodes: Sequence[NodeSpec], *, cpus_per_replica: float = 1.0,
                      gpus_per_replica: float | None = None) -> ReplicaResources:
    """Per-replica resources for ``replicas`` replicas on ``device`` ("cpu" or "cuda")."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if device != "cuda":
        return ReplicaResources(num_cpus=cpus_per_replica, num_gpus=0.0)
    if gpus_per_replica is not None:
        if not 0 < gpus_per_replica <= 1 and not (gpus_per_replica >= 1 and float(gpus_per_replica).is_integer()):
            raise ValueError(f"gpus_per_replica must be in (0, 1] or a whole number, got {gpus_per_replica!r}")
        return ReplicaResources(num_cpus=0.0, num_gpus=float(gpus_per_replica))
    free = sum(n.gpus for n in nodes)
    if free < RESOURCE_UNIT:
        raise ValueError("device='cuda' but the Ray cluster has no free GPU (ray.available_resources() "
                         "shows none); start Ray with GPUs, or deploy with device='cpu'")
    return ReplicaResources(num_cpus=0.0, num_gpus=min(1.0, floor_units(free / replicas)))


def fits(replicas: int, need: ReplicaResources, nodes: Sequence[NodeSpec]) -> int:
    """How many of ``replicas`` replicas needing ``need`` the nodes' free resources hold."""
    placed = 0
    for n in nodes:
        by_cpu = math.inf if need.num_cpus <= 0 else math.floor(n.cpus / need.num_cpus + 1e-9)
        by_gpu = math.inf if need.num_gpus <= 0 else math.floor(n.gpus / need.num_gpus + 1e-9)
        placed += int(min(by_cpu, by_gpu, replicas - placed))
        if placed >= replicas:
            break
    return placed


def check_placeable(replicas: int, need: ReplicaResources, nodes: Sequence[NodeSpec]) -> None:
    """Raise ValueError naming the shortfall when the replicas do not fit the free resources."""
    placed = fits(replicas, need, nodes)
    if placed >= replicas:
        return
    free = ", ".join(f"{n.host}: {n.cpus:g} CPU, {n.gpus:g} GPU" for n in nodes)
    raise ValueError(
        f"the plan needs {replicas} replicas of {need.num_cpus:g} CPU and {need.num_gpus:g} GPU each, but the "
        f"cluster's free resources hold {placed} ({free}); plan for fewer devices (devices=), give each "
        "replica less (cpus_per_replica= / gpus_per_replica=), or add nodes")
