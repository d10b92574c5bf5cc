"""A redeploy under a running app's name: what the running replicas hold, and what is free.

Why: a hand-over (a re-certified or retrained artifact deployed under the running app's name)
replaces the app's replicas, so the resources they hold come back to the new app. Planning and
placing on the cluster's free resources alone counts them as taken: on a machine the app fills,
``deploy(new, name=..., plan=app.plan)`` was refused as unplaceable, and without a plan the new
app was planned on what the old one left (two ingress replicas became one). Planning counts
them as the new app's; only the replacements Serve starts before it stops old replicas (the
surge, serving.core.constants.HANDOVER_SURGE_PERCENT) must fit beside the running app, and where
they do not, deploy hands over without the surge rather than wait forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from serving.core.profiles import NodeSpec

#: replica states that hold their deployment's resources on a node
HOLDING_STATES = ("RUNNING", "UPDATING", "PENDING_MIGRATION")


def held_by_apps(apps: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Logical (CPUs, GPUs) the replicas of the running Serve applications ``apps`` hold, by
    node id (empty when none of them runs, or Serve does not)."""
    from ray.serve.context import _get_global_client

    try:
        details = _get_global_client().get_serve_details()
    except Exception:  # Serve not started: nothing runs
        return {}
    held: dict[str, tuple[float, float]] = {}
    for app in apps:
        for deployment in details.get("applications", {}).get(app, {}).get("deployments", {}).values():
            need = deployment.get("required_resources") or {}
            for replica in deployment.get("replicas", ()):
                state = str(getattr(replica.get("state"), "value", replica.get("state")))
                node = replica.get("node_id")
                if node and state in HOLDING_STATES:
                    cpus, gpus = held.get(node, (0.0, 0.0))
                    held[node] = (cpus + float(need.get("CPU", 0.0)), gpus + float(need.get("GPU", 0.0)))
    return held


def with_returned(nodes: list[NodeSpec], held: dict[str, tuple[float, float]]) -> list[NodeSpec]:
    """``nodes`` (free resources) with what ``held`` holds on each given back."""
    return [replace(n, cpus=n.cpus + held.get(n.node_id, (0.0, 0.0))[0],
                    gpus=n.gpus + held.get(n.node_id, (0.0, 0.0))[1]) for n in nodes]
