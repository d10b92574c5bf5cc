"""The Ray cluster's alive nodes with the logical CPUs and GPUs free (or in total) on each.

Read by the planner's deploy (replicas placed node by node) and by ``deploy_model``'s
placement check; a Serve replica never spans nodes, so a cluster-wide sum is not enough.
"""

from __future__ import annotations

import math
from dataclasses import replace

from serving.core.profiles import NodeSpec

#: Ray's logical resources are kept in units of 1/10,000
RESOURCE_UNIT = 1e-4


def floor_units(x: float) -> float:
    """``x`` rounded down to Ray's resource unit (never up: shares must add up to at most 1)."""
    return math.floor(x / RESOURCE_UNIT + 1e-9) * RESOURCE_UNIT


def nodes(*, free: bool = True) -> list[NodeSpec]:
    """Alive nodes with their free (or total) logical CPUs and GPUs."""
    import ray

    try:  # per-node free resources: Ray exposes them only through its state module
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node() if free else {}
    except (ImportError, AttributeError):
        available = {}
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        total = n.get("Resources", {})
        have = available.get(n["NodeID"], total) if free else total
        out.append(NodeSpec(node_id=n["NodeID"], host=n["NodeManagerAddress"], cpus=float(have.get("CPU", 0.0)),
                            gpus=float(have.get("GPU", 0.0)), head="node:__internal_head__" in total))
    if not out:
        raise RuntimeError("the Ray cluster has no alive node")
    return out


def within_gpus(nodes: list[NodeSpec], gpus: float | None) -> list[NodeSpec]:
    """``nodes`` with at most ``gpus`` GPUs free among them (None: as they are), taken node by
    node in order: the share of the cluster's GPUs one app may plan for, so that a second app
    finds the rest free (a GPU stage's replicas otherwise share every free GPU)."""
    if gpus is None:
        return nodes
    if not gpus >= 0:
        raise ValueError(f"gpus must be >= 0, got {gpus!r}")
    left, out = float(gpus), []
    for n in nodes:
        take = min(n.gpus, left)
        left -= take
        out.append(replace(n, gpus=take))
    return out
