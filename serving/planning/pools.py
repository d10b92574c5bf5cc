"""Node pools as deployments of their own: where each model stage's replicas go when the
cluster has node types of different speed (``deploy(..., pools=...)``).

A pool is a set of Ray nodes named the way a cluster operator names node groups: by node
labels (Ray's ``label_selector``, e.g. ``{"willump.io/pool": "a10g"}``) or by a custom resource
its nodes carry (each replica asks a sliver of it). Each stage replica's rows per second is
measured on each pool (:mod:`serving.measure.pools`); the heterogeneity LP
(:mod:`serving.planning.hetero`, Gavel's throughput matrix) then chooses replicas per (stage,
pool): the highest rate the slots hold, or with ``rps`` the cheapest replicas (a price per
pool, default 1 per replica) that cover it at the planner's headroom. Each (stage, pool) with
replicas becomes one Serve deployment pinned to its pool, so Serve's own replica management,
routing within the pool and rolling updates stay; the ingress splits a stage's calls over its
pools by expected wait (:mod:`serving.runtime.pools`).

A pool marked ``preemptible`` (spot or preemptible nodes, which vanish together) makes the plan
a tier plan (Proteus, EuroSys'17; Tributary, ATC'18): with any one preemptible pool lost, the
replicas left must still hold the rate (the rate the plan maximizes is the one held through such
a loss) or, with ``rps``, cover it at the plan's own utilization (the headroom that keeps its
latency, not just its rate, through the loss); the others are the reliable tier, and the plan
records the rate left after each loss.

Plain Python, no Ray: the plan keeps what it was made from (``Plan.pools``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.planning.hetero import (
    HeteroPlan,
    ThroughputMatrix,
    plan_max_rate,
    plan_min_cost,
)

#: a pool's name: it becomes part of its deployments' names
POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
#: of a pool's custom resource, what each replica asks (a marker, not a capacity: the pool's
#: size is its nodes' CPUs)
POOL_RESOURCE_SHARE = 0.001
POOL_KEYS = ("labels", "resources", "max_replicas", "price", "preemptible")
#: rows a stage gets per row answered, at least (the LP gives a stage with none no replica)
MIN_VISITS = 1e-3


@dataclass(frozen=True)
class PoolSpec:
    """One node pool: the nodes carrying every one of ``labels`` and every custom resource named
    in ``resources``; at most ``max_replicas`` of this app's stage replicas (None: as many as its
    nodes' free CPUs hold), ``price`` per replica (for ``rps`` plans); ``preemptible``: its nodes
    can vanish together (the plan holds the rate without it: module docstring)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    resources: tuple[str, ...] = ()
    max_replicas: int | None = None
    price: float = 1.0
    preemptible: bool = False

    def actor_options(self) -> dict[str, Any]:
        """What a replica of this pool adds to its ``ray_actor_options``."""
        out: dict[str, Any] = {}
        if self.labels:
            out["label_selector"] = dict(self.labels)
        if self.resources:
            out["resources"] = {r: POOL_RESOURCE_SHARE for r in self.resources}
        return out

    def holds(self, labels: Mapping[str, Any], resources: Mapping[str, float]) -> bool:
        """Whether a node with these labels and resources is in the pool."""
        return (all(str(labels.get(k)) == v for k, v in self.labels.items())
                and all(resources.get(r, 0) >= POOL_RESOURCE_SHARE for r in self.resources))

    def to_dict(self) -> dict[str, Any]:
        return {"labels": dict(self.labels), "resources": list(self.resources), "max_replicas": self.max_replicas,
                "price": self.price, "preemptible": self.preemptible}


def check_pools(pools: Any) -> list[PoolSpec]:
    """``deploy(pools=...)``: a mapping of at least two pool names to ``{"labels": {...}}`` and/or
    ``{"resources": [...]}``, optionally ``max_replicas`` and ``price``. ValueError naming
    ``pools`` and the entry that is wrong."""
    if not isinstance(pools, Mapping) or len(pools) < 2:
        raise ValueError(f"pools must map two or more pool names to their nodes' labels or resources, got {pools!r}")
    out = []
    for name, entry in pools.items():
        where = f"pools[{name!r}]"
        if not isinstance(name, str) or not POOL_NAME.match(name):
            raise ValueError(f"{where}: a pool name is 1-32 lower-case letters, digits or '_', starting with a "
                             "letter or digit")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a dict with 'labels' and/or 'resources', got {entry!r}")
        unknown = sorted(set(entry) - set(POOL_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: {list(POOL_KEYS)})")
        labels = entry.get("labels") or {}
        if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                      for k, v in labels.items()):
            raise ValueError(f"{where}['labels'] must map label names to values (strings), got {labels!r}")
        syntax = [v for v in labels.values() if v.startswith("!") or "(" in v]
        if syntax:
            raise ValueError(f"{where}['labels']: {syntax} read as Ray's selector syntax (not, in()); a pool names "
                             "its nodes by plain label values")
        resources = entry.get("resources") or ()
        if isinstance(resources, str) or not all(isinstance(r, str) and r for r in resources):
            raise ValueError(f"{where}['resources'] must be a list of custom resource names, got {resources!r}")
        if not labels and not resources:
            raise ValueError(f"{where} names no labels and no resources: it would hold every node")
        cap = entry.get("max_replicas")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ValueError(f"{where}['max_replicas'] must be a whole number >= 0, got {cap!r}")
        price = entry.get("price", 1.0)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
            raise ValueError(f"{where}['price'] must be a number >= 0, got {price!r}")
        preemptible = entry.get("preemptible", False)
        if not isinstance(preemptible, bool):
            raise ValueError(f"{where}['preemptible'] must be true or false, got {preemptible!r}")
        out.append(PoolSpec(name, dict(labels), tuple(resources), cap, float(price), preemptible))
    return out


def pool_slots(pools: list[PoolSpec], free_cpus: Mapping[str, float], slot_cpus: float) -> dict[str, int]:
    """Stage replicas each pool can hold: its nodes' free CPUs over a replica's, at most its
    ``max_replicas``."""
    if slot_cpus <= 0:
        raise ValueError(f"slot_cpus must be > 0, got {slot_cpus!r}")
    out = {}
    for p in pools:
        n = math.floor(free_cpus.get(p.name, 0.0) / slot_cpus + 1e-9)
        out[p.name] = n if p.max_replicas is None else min(n, p.max_replicas)
    return out


def plan_pools(rates: Mapping[str, Mapping[str, float]], visits: Mapping[str, float], slots: Mapping[str, int],
               pools: list[PoolSpec], *, target_rows_s: float | None = None,
               utilization: float = 0.75, surge_utilization: float | None = None) -> HeteroPlan:
    """Replicas per (stage, pool) from ``rates[stage][pool]`` (rows per second one replica
    sustains there) and ``visits[stage]`` (rows reaching the stage per row the app answers):
    the highest app rate the ``slots`` hold, or with ``target_rows_s`` the cheapest replicas whose
    capacity at ``utilization`` covers it; either with any one preemptible pool lost too (module
    docstring), the capacity left then used at ``surge_utilization`` (None: ``utilization``, so
    the latency the plan was made for holds while the lost pool is away; a cloud's replacement
    nodes take minutes, and at 0.95 of the capacity left the emulated tiers' p99 stayed over
    their SLO for up to 12 s after a loss, docs/benchmarks.md). Raises ValueError naming what
    does not fit."""
    # a stage no row reaches still gets a replica (a request may still need it)
    visits = {s: max(float(v), MIN_VISITS) for s, v in visits.items()}
    matrix = ThroughputMatrix.from_dict({s: dict(r) for s, r in rates.items()}, visits)
    prices = {p.name: p.price for p in pools}
    preemptible = [p.name for p in pools if p.preemptible]
    try:
        if target_rows_s is None:
            return plan_max_rate(matrix, dict(slots), prices, survive_loss_of=preemptible)
        return plan_min_cost(matrix, dict(slots), prices, target_rows_s, utilization=utilization,
                             survive_loss_of=preemptible,
                             surge_utilization=utilization if surge_utilization is None else surge_utilization)
    except ValueError as exc:
        target = "" if target_rows_s is None else f" at rps x rows_per_request = {target_rows_s:g} rows/s"
        raise ValueError(f"pools: no plan on slots {dict(slots)}{target}: {exc}") from None


def pools_entry(specs: list[PoolSpec], rates: Mapping[str, Mapping[str, float]], hetero: HeteroPlan,
                nodes: Mapping[str, list[str]], slots: Mapping[str, int]) -> dict[str, Any]:
    """What ``Plan.pools`` keeps: the pools, their nodes and slots, the measured rates, the
    replicas and traffic split per stage, the LP's predicted rows per second, and with
    preemptible pools the rows per second left after losing each (``after_loss_rows_s``, the
    LP's :attr:`HeteroPlan.after_loss`)."""
    replicas: dict[str, dict[str, int]] = {}
    for (stage, pool), n in sorted(hetero.replicas.items()):
        replicas.setdefault(stage, {})[pool] = int(n)
    out = {"specs": {p.name: p.to_dict() for p in specs}, "nodes": {k: list(v) for k, v in nodes.items()},
           "slots": dict(slots), "rates": {s: dict(r) for s, r in rates.items()}, "replicas": replicas,
           "weights": hetero.weights, "predicted_rows_s": hetero.predicted_rate, "objective": hetero.objective}
    if hetero.after_loss:
        out["after_loss_rows_s"] = dict(hetero.after_loss)
    return out


def preemptible_pools(entry: Mapping[str, Any] | None) -> list[str]:
    """The preemptible pools of a ``Plan.pools`` entry (none where the plan has no pools)."""
    return [name for name, d in (entry or {}).get("specs", {}).items() if d.get("preemptible")]


def specs_of_entry(entry: Mapping[str, Any]) -> list[PoolSpec]:
    """The pools of a ``Plan.pools`` entry."""
    return [PoolSpec(name, dict(d.get("labels") or {}), tuple(d.get("resources") or ()), d.get("max_replicas"),
                     float(d.get("price", 1.0)), bool(d.get("preemptible", False)))
            for name, d in entry.get("specs", {}).items()]


@dataclass(frozen=True)
class OffPreemptible:
    """How the ingress and the monitor are kept off a tier plan's preemptible pools: a Ray
    ``label_selector`` excluding every preemptible pool named by one label (``"!v"``, or
    ``"!in(a,b)"`` where several share the label key), which excludes exactly that pool's nodes;
    and the preemptible pools it cannot exclude: those named by custom resources (Ray has no
    "not this resource") or by several labels (a selector's terms all hold, so "not all of
    these" cannot be written)."""

    selector: dict[str, str]
    excluded_pools: tuple[str, ...]
    unexcludable: tuple[str, ...]

    def note(self) -> str | None:
        """What a deploy should say about the pools the selector leaves open (None: none)."""
        if not self.unexcludable:
            return None
        return (f"the ingress and the monitor may run on the preemptible pools {list(self.unexcludable)}: Ray "
                "can keep a replica off a pool named by one node label, not off one named by custom resources or "
                "by several labels; name each preemptible pool by one label to keep the request path off it")


def outside_pools(nodes: Iterable[str], pools: Iterable[str], pool_nodes: Mapping[str, Iterable[str]]) -> set[str]:
    """Of ``nodes`` (node ids), those in none of ``pools`` (each pool's node ids in ``pool_nodes``)."""
    banned = {x for p in pools for x in pool_nodes.get(p, ())}
    return {x for x in nodes if x not in banned}


def ingress_nodes(entry: Mapping[str, Any] | None, nodes: Iterable[str]) -> set[str] | None:
    """Of ``nodes`` (node ids), those a plan's ingress may run on where its tier plan keeps the
    request path off preemptible pools (``Plan.pools["request_path"]``); None where it may run
    anywhere."""
    off = (entry or {}).get("request_path", {}).get("off_pools")
    return outside_pools(nodes, off, entry.get("nodes", {})) if off else None


def off_preemptible(pools: list[PoolSpec]) -> OffPreemptible:
    """The placement that keeps the request path's replicas off ``pools``' preemptible ones
    (:class:`OffPreemptible`; an empty selector where none is preemptible)."""
    values: dict[str, list[str]] = {}
    excluded, unexcludable = [], []
    for p in pools:
        if not p.preemptible:
            continue
        if len(p.labels) == 1 and not p.resources:
            (key, value), = p.labels.items()
            values.setdefault(key, []).append(value)
            excluded.append(p.name)
        else:
            unexcludable.append(p.name)
    selector = {key: f"!{vs[0]}" if len(vs) == 1 else f"!in({','.join(sorted(set(vs)))})"
                for key, vs in values.items()}
    return OffPreemptible(selector, tuple(excluded), tuple(unexcludable))


def place_pools(entry: Mapping[str, Any], free_cpus: Mapping[str, float],
                stage_cpus: Mapping[str, float]) -> dict[str, dict[str, int]] | str:
    """Each stage's replicas on its pools' nodes (``free_cpus`` by node id, after the ingress and
    the monitor), most free room first: stage -> node id -> replicas, or why they do not fit."""
    left = dict(free_cpus)
    placed: dict[str, dict[str, int]] = {}
    for stage, by_pool in entry.get("replicas", {}).items():
        counts = placed.setdefault(stage, {})
        for pool, n in by_pool.items():
            nodes = [x for x in entry["nodes"].get(pool, []) if x in left]
            for k in range(n):
                node = max(nodes, key=lambda x: left[x], default=None)
                if node is None or left[node] + 1e-9 < stage_cpus[stage]:
                    return (f"replica {k + 1} of {n} of stage {stage!r} on pool {pool!r} needs "
                            f"{stage_cpus[stage]:.2f} CPUs, which no node of the pool has free")
                left[node] -= stage_cpus[stage]
                counts[node] = counts.get(node, 0) + 1
    return placed
