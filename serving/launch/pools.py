"""``deploy(pools=...)``: a plan's model stages placed on node pools by the heterogeneity LP.

The stage planner sizes the ingress and the batching as without pools; then each remote stage's
replica is timed on each pool (:mod:`serving.measure.pools`), the slots each pool offers are
counted from its nodes' free CPUs (after the ingress and the monitor, which Serve places where it
likes), and the LP (:func:`serving.planning.pools.plan_pools`) chooses replicas per (stage,
pool). The plan keeps the result in ``Plan.pools``; :mod:`serving.launch.graph` makes a
deployment per (stage, pool) pinned there, and the ingress splits each stage's calls over its
pools (:mod:`serving.runtime.pools`).
"""

from __future__ import annotations

import math
from typing import Any

from serving.core.profiles import NodeSpec
from serving.core.specs import StageSpec
from serving.planning import costmodel
from serving.planning.planner import HEADROOM, Plan
from serving.planning.pools import (
    PoolSpec,
    off_preemptible,
    outside_pools,
    place_pools,
    plan_pools,
    pool_slots,
    pools_entry,
)


def _left_after_fixed(plan: Plan, nodes: list[NodeSpec],
                      ingress_nodes: set[str] | None = None) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    """Free CPUs per node once the ingress replicas (on ``ingress_nodes`` where given) and the
    monitor are placed as Serve would, and where they are placed."""
    fixed = {"monitor": (plan.monitor_cpus, "head")} if plan.monitor_cpus else {}
    pinned = None if ingress_nodes is None else {"ingress": ingress_nodes}
    placed = costmodel.place(nodes, {"ingress": plan.ingress_replicas}, {"ingress": plan.ingress_cpus}, {}, fixed,
                             pinned)
    if isinstance(placed, str):
        raise ValueError(f"the plan cannot be placed on this Ray cluster: {placed}")
    left = {n.node_id: n.cpus for n in nodes}
    for name, where in placed.items():
        need = plan.monitor_cpus if name == "monitor" else plan.ingress_cpus
        for node, count in where.items():
            left[node] -= need * count
    return left, placed


def place_on_pools(plan: Plan, source: Any, specs: list[StageSpec], pools: list[PoolSpec], nodes: list[NodeSpec], *,
                   target_rows_s: float | None, node_pools: dict[str, list[str]] | None = None,
                   rates: dict[str, dict[str, float]] | None = None) -> str:
    """Give ``plan``'s remote stages (their levels in ``specs``) replicas per pool (in place; ``Plan.pools``). Returns the
    note for the plan. ``node_pools`` (pool -> node ids) and ``rates`` (rows/s per replica, by
    stage and pool) are measured on the cluster when not given. ValueError naming ``pools`` where
    a pool has no node, a node is in two pools, or the replicas do not fit."""
    from serving.measure.pools import measure_pool_rates, pool_nodes

    stages = plan.remote_stages()
    if not stages:
        raise ValueError(f"pools place the model stages' replicas, but layout {plan.layout!r} runs every stage in "
                         "the ingress: deploy with layout='fused' or 'staged'")
    node_pools = pool_nodes(pools) if node_pools is None else node_pools
    alive = {n.node_id for n in nodes}
    seen: dict[str, str] = {}
    for p in pools:
        mine = [x for x in node_pools.get(p.name, []) if x in alive]
        if not mine:
            raise ValueError(f"pools[{p.name!r}]: no live node of the cluster carries {p.to_dict()}")
        for x in mine:
            if x in seen:
                raise ValueError(f"pools[{seen[x]!r}] and pools[{p.name!r}] both hold node {x[:8]}: a node is in "
                                 "one pool")
            seen[x] = p.name
    # a tier plan keeps the ingress and the monitor off its preemptible pools where it can: not
    # where the head is in one (the monitor keeps its state there), nor where no other node holds
    # the ingress
    off, off_note, fixed = off_preemptible(pools), None, None
    head = next((n.node_id for n in nodes if n.head), None)
    if off.excluded_pools:
        allowed = outside_pools(alive, off.excluded_pools, node_pools)
        if head is not None and head not in allowed:
            off_note = (f"the ingress and the monitor may run on the preemptible pools {list(off.excluded_pools)}: "
                        "the head node is in one of them, and the monitor keeps its state on the head")
        else:
            try:
                fixed = _left_after_fixed(plan, nodes, allowed)
            except ValueError as exc:
                off_note = (f"the ingress may run on the preemptible pools {list(off.excluded_pools)}: no other "
                            f"node holds it ({exc})")
    left, fixed_placed = fixed or _left_after_fixed(plan, nodes)
    slot_cpus = max(s.num_cpus for s in stages)
    if not slot_cpus > 0:
        raise ValueError("pools: the stages' replicas ask no CPU, so a pool's slots cannot be counted from its CPUs")
    per_pool = {p.name: sum(math.floor(left[x] / slot_cpus + 1e-9) * slot_cpus
                            for x in node_pools[p.name] if x in left) for p in pools}
    slots = pool_slots(pools, per_pool, slot_cpus)
    if rates is None:
        remote = [s for s in specs if s.name in {st.name for st in stages}]
        rates = measure_pool_rates(source, remote, pools, [plan.stage(s.name).max_batch_size for s in remote])
    scale = {p.name: p.scale for p in plan.profiles}
    visits = {s.name: scale.get(s.name, 1.0) for s in stages}
    hetero = plan_pools(rates, visits, slots, pools, target_rows_s=target_rows_s, utilization=HEADROOM)
    plan.pools = pools_entry(pools, rates, hetero, {p.name: node_pools[p.name] for p in pools}, slots)
    if off.excluded_pools and off_note is None:
        plan.pools["request_path"] = {"label_selector": off.selector, "off_pools": list(off.excluded_pools)}
    for s in stages:
        by_pool = plan.pools["replicas"].get(s.name, {})
        s.replicas = sum(by_pool.values())
        s.capacity_rows_s = sum(n * rates[s.name][p] for p, n in by_pool.items())
    placed = place_pools(plan.pools, left, {s.name: s.num_cpus for s in stages})
    if isinstance(placed, str):
        raise ValueError(f"pools: {placed}")
    if plan.placement:
        plan.placement.update({**fixed_placed, **placed})
    split = "; ".join(f"{s}: " + ", ".join(f"{n} on {p}" for p, n in by_pool.items())
                      for s, by_pool in plan.pools["replicas"].items())
    after = plan.pools.get("after_loss_rows_s") or {}
    tiers = ("; a tier plan, " + ", ".join(f"{after[p]:.0f} rows/s with {p} lost" for p in after)) if after else ""
    note = (f"node pools ({hetero.objective}): {split}; the LP predicts {hetero.predicted_rate:.0f} rows/s from "
            f"each replica's rows/s measured on each pool{tiers} (the simulated figures are the plan's before the "
            "pools)")
    plan.notes.append(note)
    plan.notes.extend(n for n in (off_note, off.note()) if n)
    return note

