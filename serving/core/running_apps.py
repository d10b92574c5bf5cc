"""What running Serve applications hold, read from Serve's controller.

Why in core: a redeploy under a running app's name (the pipeline app's ``deploy`` and the
torch-model app's ``deploy_model``) replaces that app's replicas, so what they hold comes back
to the new app (serving.launch.handover says how Serve can replace them without waiting
forever). Both apps read it the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from serving.core.profiles import NodeSpec

#: replica states that hold their deployment's resources on a node
HOLDING_STATES = ("RUNNING", "UPDATING", "PENDING_MIGRATION")


@dataclass
class Running:
    """What running Serve applications hold: logical (CPUs, GPUs) by node id, and their running
    replicas by deployment name."""

    held: dict[str, tuple[float, float]] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    apps: set[str] = field(default_factory=set)

    def merged(self, other: Running) -> Running:
        """Both together (what two sets of applications hold)."""
        held = dict(self.held)
        for node, (c, g) in other.held.items():
            c0, g0 = held.get(node, (0.0, 0.0))
            held[node] = (c0 + c, g0 + g)
        return Running(held, {**self.replicas, **other.replicas}, self.apps | other.apps)


def started_first(targets: dict[str, int], running: dict[str, int], *, surge: bool) -> dict[str, int]:
    """Per deployment, the replicas Serve starts before it stops an old one when it rolls the
    ``running`` replicas over to ``targets`` (both by deployment name; Ray 2.60): those the new
    target adds, plus one replacement where replicas run and ``surge``. Deployments that start
    none are left out."""
    out = {}
    for dep, target in targets.items():
        now = running.get(dep, 0)
        need = max(target - now, 0) + (1 if surge and now > 0 else 0)
        if need:
            out[dep] = need
    return out


def running_by_app(apps: Iterable[str]) -> dict[str, Running]:
    """What each running application of ``apps`` holds, from one read of Serve's controller
    (an application that does not run is left out)."""
    from ray.serve.context import _get_global_client

    try:
        details = _get_global_client().get_serve_details()
    except Exception:  # Serve not started: nothing runs
        return {}
    out: dict[str, Running] = {}
    for app in apps:
        deployments = details.get("applications", {}).get(app, {}).get("deployments")
        if not deployments:
            continue
        one = out[app] = Running(apps={app})
        for name, deployment in deployments.items():
            need = deployment.get("required_resources") or {}
            count = 0
            for replica in deployment.get("replicas", ()):
                state = str(getattr(replica.get("state"), "value", replica.get("state")))
                node = replica.get("node_id")
                if node and state in HOLDING_STATES:
                    count += 1
                    cpus, gpus = one.held.get(node, (0.0, 0.0))
                    one.held[node] = (cpus + float(need.get("CPU", 0.0)), gpus + float(need.get("GPU", 0.0)))
            one.replicas[name] = count
    return out


def with_returned(nodes: list[NodeSpec], held: dict[str, tuple[float, float]]) -> list[NodeSpec]:
    """``nodes`` (free resources) with what ``held`` holds on each given back."""
    back = {n.node_id: held.get(n.node_id, (0.0, 0.0)) for n in nodes}
    return [replace(n, cpus=n.cpus + back[n.node_id][0], gpus=n.gpus + back[n.node_id][1]) for n in nodes]
