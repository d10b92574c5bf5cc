"""A redeploy under a running app's name: what the running replicas hold, and how Serve can
replace them without waiting forever.

Why: a hand-over (a re-certified or retrained artifact deployed under the running app's name)
replaces the app's replicas, so the resources they hold come back to the new app. Planning and
placing on the cluster's free resources alone counts them as taken: on a machine the app fills,
``deploy(new, name=..., plan=app.plan)`` was refused as unplaceable, and without a plan the new
app was planned on what the old one left (two ingress replicas became one). Planning counts
them as the new app's; what must fit beside the running app is what Serve starts before it
stops old replicas. In Ray 2.60, with a surge (``max_surge_percent``,
serving.core.constants.HANDOVER_SURGE_PERCENT) Serve starts, per deployment, the replicas the
new plan adds plus one replacement, and stops an old replica only while more than the target
run; with none it stops old replicas first, but a deployment that grows by a rollout batch or
more first starts its added replicas. So :func:`rollout_surge` asks, per deployment, for the
growth plus one replacement (surge), else for the growth alone (stop-first), to fit on the free
nodes at once; where neither does, the rollout would wait forever, and deploy plans on the free
nodes alone (or refuses a given plan), as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from serving.core.constants import HANDOVER_SURGE_PERCENT
from serving.core.profiles import NodeSpec
from serving.core.running_apps import Running, started_first
from serving.core.specs import pool_deployment
from serving.launch.graph import chain_role
from serving.planning import costmodel
from serving.planning.pools import ingress_nodes


def new_deployments(name: str, plan: Any, chains: dict[str, Any] | None) -> dict[str, tuple[int, float, float]]:
    """The app's deployments (less the monitor) as Serve names them: (replicas, CPUs, GPUs) each."""
    out = {f"{name}-ingress": (plan.ingress_replicas, plan.ingress_cpus, 0.0)}
    for s in plan.remote_stages():
        by_pool = plan.pools.get("replicas", {}).get(s.name) if plan.pools else None
        for pool, n in (by_pool or {None: s.replicas}).items():
            deployment = f"{name}-{s.name}" if pool is None else pool_deployment(name, s.name, pool)
            out[deployment] = (n, s.num_cpus, s.num_gpus if s.device == "gpu" else 0.0)
    for group, chain in (chains or {}).items():
        for k, stage in enumerate(chain.stages):
            out[f"{name}-{chain_role(group, k)}"] = (stage.replicas, chain.num_cpus, chain.num_gpus)
    return out


def pool_pins(name: str, plan: Any, nodes: Sequence[str] = ()) -> dict[str, set[str]]:
    """The nodes each of the app's node-pool deployments may run on (``deploy(pools=...)``), and
    of ``nodes`` (node ids) those its ingress may run on where a tier plan keeps it off the
    preemptible pools (serving.launch.graph.off_spot)."""
    if not plan.pools:
        return {}
    pins = {pool_deployment(name, stage, pool): set(plan.pools["nodes"].get(pool, ()))
            for stage, by_pool in plan.pools.get("replicas", {}).items() for pool in by_pool}
    allowed = ingress_nodes(plan.pools, nodes)
    if allowed is not None and nodes:
        pins[f"{name}-ingress"] = allowed
    return pins


def rollout_problem(deployments: dict[str, tuple[int, float, float]], old: dict[str, int], free: list[NodeSpec],
                    *, surge: bool, monitor_cpus: float = 0.0, pinned: dict[str, set[str]] | None = None) -> str | None:
    """Why what Serve starts first does not fit on ``free``, or None: per deployment the replicas
    the new plan adds over ``old`` (running replicas by deployment name), plus one replacement
    where replicas run and ``surge``; and ``monitor_cpus`` on the head for a monitor the running
    app did not have. ``pinned``: deployments that may run only on some nodes (:func:`pool_pins`)."""
    replicas = started_first({dep: d[0] for dep, d in deployments.items()}, old, surge=surge)
    cpus = {dep: deployments[dep][1] for dep in replicas}
    gpus = {dep: deployments[dep][2] for dep in replicas}
    fixed = {"monitor": (monitor_cpus, "head")} if monitor_cpus else {}
    if not replicas and not fixed:
        return None
    placed = costmodel.place(free, replicas, cpus, gpus, fixed, pinned)
    return placed if isinstance(placed, str) else None


def rollout_surge(deployments: dict[str, tuple[int, float, float]], old: Running, free: list[NodeSpec], *,
                  monitor_cpus: float = 0.0, pinned: dict[str, set[str]] | None = None) -> tuple[int | None, str | None]:
    """(surge percent, why not the surge): ``HANDOVER_SURGE_PERCENT`` where the surge's
    replacements fit beside the running app, 0 where only stop-first's do, None where neither
    does (Serve would wait forever)."""
    why = rollout_problem(deployments, old.replicas, free, surge=True, monitor_cpus=monitor_cpus, pinned=pinned)
    if why is None:
        return HANDOVER_SURGE_PERCENT, None
    if rollout_problem(deployments, old.replicas, free, surge=False, monitor_cpus=monitor_cpus,
                       pinned=pinned) is None:
        return 0, why
    return None, why


def planned_surge(name: str, plan: Any) -> int:
    """The surge a Serve config (``willump build``) asks for: ``HANDOVER_SURGE_PERCENT`` where
    one replacement of each deployment fits beside the plan on the nodes it was made for, else 0
    (Serve's surge would wait for room, and ``serve deploy`` of an edited config with it)."""
    if not plan.nodes or not plan.placement:
        return 0
    size = {"ingress": (plan.ingress_cpus, 0.0), "monitor": (plan.monitor_cpus, 0.0)}
    for s in plan.stages:
        size[s.name] = (s.num_cpus, s.num_gpus if s.device == "gpu" else 0.0)
    used: dict[str, list[float]] = {}
    for deployment, where in plan.placement.items():
        c, g = size.get(deployment, (0.0, 0.0))
        for node, count in where.items():
            u = used.setdefault(node, [0.0, 0.0])
            u[0], u[1] = u[0] + c * count, u[1] + g * count
    free = [replace(n, cpus=max(n.cpus - used.get(n.node_id, [0.0, 0.0])[0], 0.0),
                    gpus=max(n.gpus - used.get(n.node_id, [0.0, 0.0])[1], 0.0)) for n in plan.nodes]
    deployments = new_deployments(name, plan, None)
    same = Running(replicas={d: n for d, (n, _, _) in deployments.items()}, apps={name})
    surge, _ = rollout_surge(deployments, same, free, pinned=pool_pins(name, plan, [n.node_id for n in plan.nodes]))
    return surge or 0
