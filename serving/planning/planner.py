"""Stage planner: replicas, logical CPUs, batch sizes and request limits per deployment,
from measured costs, placed on the cluster's nodes.

Pure Python (no Ray). Inputs are measurements (:mod:`serving.core.profiles`,
:mod:`serving.core.costs`): each stage's seconds per batch, the ingress route's work per request,
what HTTP, hops and Ray's own processes cost here, and the nodes with their free logical
resources. :mod:`serving.planning.costmodel` turns a choice of replicas into CPU per request per
process and a throughput bound; the planner

* without a target rate, adds replicas one at a time to the deployment whose processes
  bind, while the bound rises by at least ``MIN_GAIN`` a replica (once the machine's cores
  bind, more processes only share them); a replica that only hands the binding to another
  deployment is kept when one more of that one makes the pair worth it;
* with ``rps``, sizes each deployment for ``rps`` at ``headroom`` utilisation
  (InferLine-style) and calls the plan infeasible when a deployment, a machine or the
  logical budget would run above ``headroom``;
* gives every replica the logical CPUs it uses at the planned rate, places the replicas
  the way Serve spreads them, and refuses (``placeable=False``) a plan some replica fits
  on no node;
* picks the smallest batch reaching ``BATCH_EFFICIENCY`` of the best per-replica
  capacity, shrunk while a p99 target is missed;
* checks every plan with the discrete-event simulation of :mod:`serving.planning.simulate`
  (processes sharing each machine's cores, Serve's routing and batching, the ingress's
  limits on calls in flight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from serving.core.constants import CASCADE_LAYOUTS, CONCURRENT_BATCHES, LAYOUTS
from serving.core.costs import HostCosts
from serving.core.nodes import floor_units
from serving.core.profiles import IngressProfile, NodeSpec, StageProfile
from serving.planning import costmodel
from serving.planning.costmodel import MONITOR_CPUS, Demand
from serving.planning.pools import ingress_nodes
from serving.planning.simulate import simulate

__all__ = ["CASCADE_LAYOUTS", "LAYOUTS", "Plan", "Resources", "StagePlan", "StageProfile", "plan_again", "plan_layouts", "plan_stages"]

#: target utilisation of a deployment, machine or budget at a target rate (InferLine headroom)
HEADROOM = 0.75
#: a batch size is "good enough" once it reaches this share of the best per-replica capacity
BATCH_EFFICIENCY = 0.9
#: a replica is added only while it raises the bound by at least this share
MIN_GAIN = 0.02
#: most replicas the planner gives one deployment
MAX_REPLICAS = 64
#: longest a batch waits for more rows (seconds) when no rate is given: none, so a lone
#: request is not delayed; under load, calls queue while a batch runs and batch anyway
DEFAULT_BATCH_WAIT_S = 0.0
#: upper bound on any planned batch wait (seconds)
MAX_BATCH_WAIT_S = 0.01
#: floor on max_ongoing_requests of a stage replica
MIN_ONGOING_REQUESTS = 16
#: seconds of work an ingress replica may hold before it answers 503 (Retry-After) instead
#: of queueing more: a request that would wait longer is better retried elsewhere or later
QUEUE_SECONDS = 2.0
#: floor on the requests an ingress replica admits at once
MIN_IN_FLIGHT = 32
#: simulated requests used to check a plan
SIMULATED_REQUESTS = 1500
#: share of the bound a max-throughput plan is simulated at
SIMULATED_LOAD = 0.7


@dataclass
class Resources:
    """What the plan may use: logical CPUs and GPUs, and optionally the nodes they are on
    (without nodes: one node holding them all, on this machine)."""

    cpus: float
    gpus: float = 0.0
    nodes: list[NodeSpec] | None = None

    def __post_init__(self) -> None:
        if self.cpus <= 0:
            raise ValueError(f"cpus must be positive, got {self.cpus}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")

    def node_list(self) -> list[NodeSpec]:
        return self.nodes or [NodeSpec("local", "localhost", self.cpus, self.gpus, head=True)]


@dataclass
class StagePlan:
    name: str
    replicas: int
    max_batch_size: int
    batch_wait_timeout_s: float
    max_ongoing_requests: int
    num_cpus: float
    num_gpus: float
    device: str
    capacity_rows_s: float  # all replicas, at the planned batch size, as processes alone
    utilization: float | None  # at the target rate; None without one
    max_queued_requests: int = 64


@dataclass
class Plan:
    """Per-deployment settings, what they were planned from, and what the simulation predicts."""

    stages: list[StagePlan]
    rows_per_request: int
    target_rps: float | None
    target_p99_ms: float | None
    ingress_cpus: float
    monitor_cpus: float
    max_rows_per_s: float  # the bound at the planned settings
    predicted: dict[str, float] = field(default_factory=dict)
    feasible: bool = True
    notes: list[str] = field(default_factory=list)
    ingress_replicas: int = 1
    layout: str = "staged"
    #: what the plan was made from (stored so that it can be simulated again and checked)
    profiles: list[StageProfile] = field(default_factory=list)
    ingress_profile: IngressProfile | None = None
    costs: HostCosts | None = None
    nodes: list[NodeSpec] = field(default_factory=list)
    #: deployment -> node id -> replicas; empty when the plan cannot be placed
    placement: dict[str, dict[str, int]] = field(default_factory=dict)
    placeable: bool = True
    bottleneck: str = ""
    #: CPU ms per request of each deployment, the front and Ray's own processes
    cpu_ms: dict[str, float] = field(default_factory=dict)
    #: cores each deployment and machine uses at the planned rate
    usage: dict[str, float] = field(default_factory=dict)
    ingress_max_in_flight: int = MIN_IN_FLIGHT
    #: the running app measured (serving.measure.insitu): ``factors`` (measured over modelled CPU per
    #: group, which the planner and the simulation apply), the probe's load and figures, and
    #: what the plan predicted before; empty when no probe ran
    in_situ: dict[str, Any] = field(default_factory=dict)
    #: stages with a deployment per node pool (serving.planning.pools.pools_entry): the pools, their
    #: nodes, the rows/s measured per (stage, pool), replicas and split per stage; empty: none
    pools: dict[str, Any] = field(default_factory=dict)

    @property
    def ingress_processes(self) -> int:
        """Ingress replicas deployed (fused: they also run the first stage)."""
        return self.ingress_replicas

    @property
    def ingress_ms(self) -> float:
        return self.cpu_ms.get("ingress", 0.0)

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def remote_stages(self) -> list[StagePlan]:
        """Stages with a deployment of their own (fused: all but the first)."""
        return self.stages[1:] if self.layout == "fused" else list(self.stages)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["profiles"] = [p.to_dict() for p in self.profiles]
        data["ingress_profile"] = None if self.ingress_profile is None else self.ingress_profile.to_dict()
        data["costs"] = None if self.costs is None else self.costs.to_dict()
        data["ingress_processes"] = self.ingress_processes
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        data.pop("ingress_processes", None)
        data["stages"] = [StagePlan(**s) for s in data["stages"]]
        data["profiles"] = [StageProfile.from_dict(p) for p in data.get("profiles", [])]
        if data.get("ingress_profile") is not None:
            data["ingress_profile"] = IngressProfile.from_dict(data["ingress_profile"])
        if data.get("costs") is not None:
            data["costs"] = HostCosts.from_dict(data["costs"])
        data["nodes"] = [NodeSpec(**n) for n in data.get("nodes", [])]
        return cls(**data)

    def __str__(self) -> str:
        lines = ["deployment   replicas  batch  wait ms  cpus  gpus  device  CPU ms/request"]
        fused = f" (runs the {self.stages[0].name} stage)" if self.layout == "fused" else ""
        lines.append(f"{'ingress':<12} {self.ingress_processes:>8}  {'':>5}  {'':>7}  {self.ingress_cpus:>4.2f}"
                     f"  {0:>4.2f}  {'cpu':<6}  {self.ingress_ms:>6.2f}{fused}")
        for s in self.remote_stages():
            lines.append(
                f"{s.name:<12} {s.replicas:>8}  {s.max_batch_size:>5}  {1e3 * s.batch_wait_timeout_s:>7.2f}"
                f"  {s.num_cpus:>4.2f}  {s.num_gpus:>4.2f}  {s.device:<6}  {self.cpu_ms.get(s.name, 0.0):>6.2f}"
            )
            for pool, n in self.pools.get("replicas", {}).get(s.name, {}).items():
                rate = self.pools["rates"][s.name][pool]
                spot = " (preemptible)" if self.pools.get("specs", {}).get(pool, {}).get("preemptible") else ""
                lines.append(f"  on pool {pool}{spot}: {n} replica(s), {rate:.0f} rows/s each (measured there)")
        for pool, rows_s in (self.pools.get("after_loss_rows_s") or {}).items():
            lines.append(f"with pool {pool} lost: {rows_s:.0f} rows/s held by the rest (a tier plan)")
        off = (self.pools or {}).get("request_path", {}).get("off_pools")
        if off:
            lines.append(f"ingress and monitor kept off the preemptible pools {', '.join(off)}")
        lines.append(f"front (HTTP) {self.cpu_ms.get('front', 0.0):.2f} ms, Ray's own processes "
                     f"{self.cpu_ms.get('other', 0.0):.2f} ms of CPU per request")
        target = "max throughput" if self.target_rps is None else f"{self.target_rps:g} req/s"
        lines.append(
            f"target {target} x {self.rows_per_request} rows"
            + ("" if self.target_p99_ms is None else f", p99 <= {self.target_p99_ms:g} ms")
            + f"; bound {self.max_rows_per_s:.0f} rows/s, set by the {self.bottleneck}"
        )
        if self.predicted:
            p = self.predicted
            lines.append(f"simulated at {p['rate_rps']:.1f} req/s: {p['throughput_rows_s']:.0f} rows/s, "
                         f"p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms")
        if self.placement:
            lines.append("placement: " + "; ".join(
                f"{d} " + ", ".join(f"{c} on {n[:8]}" for n, c in per.items()) for d, per in self.placement.items()))
        if self.in_situ.get("factors"):
            lines.append("in situ: CPU measured over modelled per group: " + ", ".join(
                f"{k} x{v:.2f}" for k, v in sorted(self.in_situ["factors"].items())))
        lines.append("feasible" if self.feasible else "NOT feasible" if self.placeable else "NOT placeable")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _pick_batch(profile: StageProfile, cap: int | None = None) -> int:
    """Smallest measured batch reaching BATCH_EFFICIENCY of the best capacity."""
    sizes = [b for b in profile.sizes if cap is None or b <= cap] or [profile.sizes[0]]
    best = max(profile.capacity(b) for b in sizes)
    return next(b for b in sizes if profile.capacity(b) >= BATCH_EFFICIENCY * best)


class _Sizing:
    """One candidate: replicas per deployment, their logical CPUs, placement and bound."""

    def __init__(self, ctx: dict[str, Any], replicas: dict[str, int], rate: float | None):
        self.replicas = dict(replicas)
        d: Demand = ctx["demand"]
        nodes: list[NodeSpec] = ctx["nodes"]
        costs: HostCosts = ctx["costs"]
        gpus = {p.name: _gpu_share(p, replicas, nodes) for p in ctx["profiles"] if p.device == "gpu"}
        self.gpus = gpus
        fixed = {"monitor": (MONITOR_CPUS, "head")} if ctx["monitor"] else {}
        # Reserve what each replica uses at the rate it will run at; where that does not
        # place, lower the rate (so the reservations) until it does or they hit the floor.
        probe = rate
        self.placement: dict | str = "not placed"
        for _ in range(40):
            if probe is None:
                total = sum(n.cpus for n in nodes) or 1.0
                spread = {k: {n.node_id: c * n.cpus / total for n in nodes} for k, c in replicas.items()}
                probe, _, _ = costmodel.bound(d, replicas, spread, nodes, costs, ctx["by_name"],
                                              ctx["budget"], ctx["fixed_cpus"], ctx["client_ms"])
            self.cpus = costmodel.replica_cpus(d, replicas, probe)
            self.placement = costmodel.place(nodes, replicas, self.cpus, gpus, fixed)
            if not isinstance(self.placement, str):
                break
            if all(c <= costmodel.MIN_REPLICA_CPUS for c in self.cpus.values()):
                break
            probe *= 0.97
        if isinstance(self.placement, str):
            self.rate, self.binding, self.usage = 0.0, "placement", {}
            return
        self.rate, self.binding, self.usage = costmodel.bound(
            d, replicas, self.placement, nodes, costs, ctx["by_name"], ctx["budget"], ctx["fixed_cpus"],
            ctx["client_ms"])
        if rate is None and probe < self.rate:  # reservations were lowered to place: they bind
            self.rate, self.binding = probe, "logical CPUs per node"


def _gpu_share(profile: StageProfile, replicas: dict[str, int], nodes: list[NodeSpec]) -> float:
    """GPUs a replica of a GPU stage asks for: the replicas share the cluster's GPUs."""
    total = sum(n.gpus for n in nodes)
    per = total / max(replicas[profile.name], 1)
    # rounded down: 6 replicas at round(1/6, 4) = 0.1667 would ask 1.0002 of one GPU, and
    # the sixth never placed (an H200 plan stopped at 5)
    return floor_units(min(1.0, per))


def plan_stages(
    profiles: Sequence[StageProfile],
    resources: Resources,
    *,
    rps: float | None = None,
    p99_ms: float | None = None,
    rows_per_request: int = 1,
    monitor: bool = False,
    headroom: float = HEADROOM,
    layout: str = "staged",
    ingress: IngressProfile | None = None,
    costs: HostCosts | None = None,
    client_ms: float = 0.0,
    seed: int = 0,
    cpu_scale: dict[str, float] | None = None,
) -> Plan:
    """Plan replicas, batches and limits for a chain of stages on ``resources``.

    ``rps`` is a request rate (each request carries ``rows_per_request`` rows); without
    it the plan maximises throughput. ``layout`` is where the first stage runs (see
    :data:`LAYOUTS`); ``ingress`` the route's measured work per request and ``costs`` what
    HTTP and hops cost (both measured by :func:`serving.deploy`; placeholders otherwise,
    noted in the plan). ``client_ms`` charges a load generator on the head node's machine.
    ``cpu_scale``: measured-over-modelled CPU per group of the running app
    (:mod:`serving.measure.insitu`), applied to the cost model and the simulation and kept in
    ``plan.in_situ["factors"]``.
    """
    profiles = list(profiles)
    if not profiles:
        raise ValueError("profiles must name at least one stage")
    if rps is not None and rps <= 0:
        raise ValueError(f"rps must be positive, got {rps}")
    if p99_ms is not None and p99_ms <= 0:
        raise ValueError(f"p99_ms must be positive, got {p99_ms}")
    if rows_per_request < 1:
        raise ValueError(f"rows_per_request must be >= 1, got {rows_per_request}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    bad = {k: v for k, v in (cpu_scale or {}).items() if not (isinstance(v, (int, float)) and 0 < v < math.inf)}
    if bad:
        raise ValueError(f"cpu_scale factors must be positive numbers, got {bad}")
    if layout == "fused" and profiles[0].device == "gpu":
        raise ValueError("layout='fused' runs the first stage in the ingress, on CPU; it is on a GPU here")
    if any(p.device == "gpu" for p in profiles) and resources.gpus <= 0:
        raise ValueError("a stage wants a GPU but resources.gpus is 0")
    nodes = resources.node_list()
    notes: list[str] = []
    if ingress is None:
        ingress = IngressProfile.unmeasured(rows_per_request)
        notes.append("ingress work per request not measured: placeholder figures")
    elif ingress.rows_per_request != rows_per_request:
        raise ValueError(f"the ingress profile is for {ingress.rows_per_request} rows per request, "
                         f"not {rows_per_request}")
    if costs is None:
        costs = HostCosts.unmeasured({n.host: resources.cpus for n in nodes[:1]})
    notes.extend(costs.notes)
    notes.extend(f"stage {p.name}: GPU timings taken on {p.measured_on}" for p in profiles
                 if p.device == "gpu" and p.measured_on != "gpu")
    batches = {p.name: _pick_batch(p) for p in profiles}
    deployments = ["ingress"] + [p.name for p in (profiles[1:] if layout == "fused" else profiles)]
    ctx: dict[str, Any] = {
        "nodes": nodes, "costs": costs, "profiles": profiles, "by_name": {p.name: p for p in profiles},
        "monitor": monitor, "budget": resources.cpus, "fixed_cpus": MONITOR_CPUS if monitor else 0.0,
        "client_ms": client_ms, "ingress_profile": ingress, "cpu_scale": dict(cpu_scale or {}),
    }
    for _ in range(8):  # shrink batches while the p99 target is missed
        ctx["demand"] = costmodel.scaled(costmodel.demand(profiles, batches, ingress, costs, layout), cpu_scale)
        if rps is None:
            sizing = _grow(ctx, deployments)
        else:
            sizing = _for_rate(ctx, deployments, rps, headroom)
        plan = _assemble(ctx, sizing, batches, layout, rows_per_request, rps, p99_ms, notes)
        if not plan.placeable:
            return plan
        rate = rps if rps is not None else SIMULATED_LOAD * sizing.rate
        plan.predicted = simulated_at(plan, rate, seed)
        if p99_ms is None or plan.predicted["p99_ms"] <= p99_ms:
            break
        shrinkable = [p for p in profiles if batches[p.name] > p.sizes[0]]
        if not shrinkable:
            break
        worst = max(shrinkable, key=lambda p: p.service_time(batches[p.name]))
        batches[worst.name] = [b for b in worst.sizes if b < batches[worst.name]][-1]
    if rps is not None:
        _check_rate(plan, sizing, rps, headroom, ctx)
    if p99_ms is not None and plan.predicted["p99_ms"] > p99_ms:
        plan.feasible = False
        plan.notes.append(f"simulated p99 {plan.predicted['p99_ms']:.1f} ms exceeds the {p99_ms:g} ms "
                          "target even at the smallest batches")
    return plan


def plan_layouts(profiles: Sequence[StageProfile], whole: StageProfile | None, resources: Resources, *,
                 layout: str, **options: Any) -> Plan:
    """:func:`plan_stages` for a layout of :data:`CASCADE_LAYOUTS`. ``whole``: the profile of the
    cascade run as one stage (:func:`serving.core.specs.whole_cascade`), None where it cannot
    be (a single stage, a GPU stage). "auto" plans the split cascade fused and the whole one,
    and keeps the feasible plan with the higher bound, saying why in its notes: the whole
    cascade wins where a hop costs the ingress and the expensive stage more CPU than the
    expensive level's own work on the few rows it gets."""
    if layout not in CASCADE_LAYOUTS:
        raise ValueError(f"layout must be one of {CASCADE_LAYOUTS}, got {layout!r}")
    if layout == "whole" and whole is None:
        raise ValueError("layout='whole' needs a cascade whose every stage runs on CPU")
    if layout == "whole":
        return plan_stages([whole], resources, layout="fused", **options)
    split_layout = "fused" if layout == "auto" else layout
    split = plan_stages(profiles, resources, layout="staged" if len(profiles) == 1 else split_layout, **options)
    if layout != "auto" or whole is None:
        return split
    one = plan_stages([whole], resources, layout="fused", **options)
    chosen, other = (one, split) if (one.feasible, one.max_rows_per_s) > (split.feasible, split.max_rows_per_s) \
        else (split, one)
    where = ("every level in the ingress (unsure rows never leave it)" if chosen is one
             else f"the {profiles[-1].name} stage a deployment of its own")
    chosen.notes.append(f"layout: {where}, bound {chosen.max_rows_per_s:.0f} rows/s against "
                        f"{other.max_rows_per_s:.0f} the other way")
    return chosen


def plan_again(plan: Plan, *, budget_cpus: float | None = None, cpu_scale: dict[str, float] | None = None,
               seed: int = 0) -> Plan:
    """``plan`` made again from what it was made of (its profiles, ingress profile, costs,
    nodes, targets and layout) with ``cpu_scale`` (the running app's measured-over-modelled
    CPU, :mod:`serving.measure.insitu`); ``budget_cpus`` defaults to its nodes' CPUs."""
    if not plan.profiles or not plan.nodes:
        raise ValueError("the plan carries no profiles or nodes to plan again from")
    budget = sum(n.cpus for n in plan.nodes) if budget_cpus is None else budget_cpus
    return plan_stages(plan.profiles, Resources(cpus=max(budget, 0.01), gpus=sum(n.gpus for n in plan.nodes),
                                                nodes=plan.nodes),
                       rps=plan.target_rps, p99_ms=plan.target_p99_ms, rows_per_request=plan.rows_per_request,
                       monitor=plan.monitor_cpus > 0, layout=plan.layout, ingress=plan.ingress_profile,
                       costs=plan.costs, seed=seed, cpu_scale=cpu_scale)


def same_replicas(a: Plan, b: Plan) -> bool:
    """Whether two plans run the same replicas, devices, batches and queues where they are
    placed: what only a restart of the app changes. The logical CPUs each replica reserves and
    the ingress's admission bound may differ (a running app that adopts ``b`` keeps its own:
    :func:`kept_running`)."""
    def shape(p: Plan) -> tuple:
        return (p.layout, p.ingress_replicas, tuple(
            (s.name, s.replicas, s.device, s.num_gpus, s.max_batch_size, s.batch_wait_timeout_s,
             s.max_ongoing_requests, s.max_queued_requests) for s in p.stages), p.placement)

    return shape(a) == shape(b)


def kept_running(refined: Plan, running: Plan) -> Plan:
    """``refined`` (:func:`same_replicas` as ``running``) with the reservations and admission
    bound of the app running ``running``: what that app serves once it adopts ``refined``
    without a restart."""
    if not same_replicas(refined, running):
        raise ValueError("kept_running needs the same replicas in both plans (same_replicas)")
    stages = [replace(s, num_cpus=r.num_cpus) for s, r in zip(refined.stages, running.stages, strict=True)]
    return replace(refined, stages=stages, ingress_cpus=running.ingress_cpus,
                   ingress_max_in_flight=running.ingress_max_in_flight)


def same_deployments(a: Plan, b: Plan) -> bool:
    """Whether two plans deploy the same replicas, reservations, batches and placement."""
    def reserved(p: Plan) -> tuple:
        return round(p.ingress_cpus, 4), p.ingress_max_in_flight, tuple(round(s.num_cpus, 4) for s in p.stages)

    return same_replicas(a, b) and reserved(a) == reserved(b)


def _grow(ctx: dict[str, Any], deployments: list[str]) -> _Sizing:
    """Max throughput: one replica each, then one more where the processes bind, while the
    bound rises by MIN_GAIN a replica and the replicas place.

    A replica that only moves the binding to another deployment raises the bound little on its
    own (the other binds at once); such a step is kept when one more replica of the newly
    binding deployment makes the pair worth MIN_GAIN each. Without that look-ahead, an ingress
    and a GPU stage that take turns binding stopped at 3 + 2 replicas on an H200 where 7 + 5
    placed and served 2.5x the rate."""
    replicas = dict.fromkeys(deployments, 1)
    best = _Sizing(ctx, replicas, None)
    while (name := _bound_by_replicas(best)) is not None:
        step = _more(ctx, best, name)
        if step is None:
            break
        if step.rate >= best.rate * (1 + MIN_GAIN):
            best = step
            continue
        other = _bound_by_replicas(step)
        pair = _more(ctx, step, other) if other is not None and other != name else None
        if pair is None or pair.rate < best.rate * (1 + MIN_GAIN) ** 2:
            break
        best = pair
    return best


def _bound_by_replicas(sizing: _Sizing) -> str | None:
    """The deployment more replicas could relieve, when that is what binds the bound."""
    if sizing.binding.startswith(("processes of ", "GPU of ", "batches of ")):
        return sizing.binding.split(" of ", 1)[1]
    return None


def _more(ctx: dict[str, Any], sizing: _Sizing, name: str) -> _Sizing | None:
    """``sizing`` with one more replica of ``name``, or None past MAX_REPLICAS or unplaceable."""
    if sizing.replicas[name] >= MAX_REPLICAS:
        return None
    trial = _Sizing(ctx, {**sizing.replicas, name: sizing.replicas[name] + 1}, None)
    return None if isinstance(trial.placement, str) else trial


def _for_rate(ctx: dict[str, Any], deployments: list[str], rps: float, headroom: float) -> _Sizing:
    """Replicas so that each deployment's processes (and GPUs) run at ``headroom`` at ``rps``."""
    d: Demand = ctx["demand"]
    replicas = {}
    for name in deployments:
        replicas[name] = max(1, math.ceil(rps * d.cpu_ms.get(name, 0.0) / 1000.0 / headroom - 1e-9))
        if name in d.gpu_ms:
            profile = ctx["by_name"][name]
            k = 1
            while k < MAX_REPLICAS and 1000.0 * profile.gpu_speedup(k) / d.gpu_ms[name] * headroom < rps:
                k += 1
            replicas[name] = max(replicas[name], k)
        replicas[name] = min(replicas[name], MAX_REPLICAS)
    return _Sizing(ctx, replicas, rps / headroom)


def _assemble(ctx, sizing: _Sizing, batches, layout, rows_per_request, rps, p99_ms, notes) -> Plan:
    d: Demand = ctx["demand"]
    profiles: list[StageProfile] = ctx["profiles"]
    ingress_replicas = sizing.replicas["ingress"]
    stages = []
    for i, p in enumerate(profiles):
        local = layout == "fused" and i == 0
        r = ingress_replicas if local else sizing.replicas[p.name]
        b = batches[p.name]
        capacity = r * p.capacity(b)
        if rps is None:
            wait, utilization = DEFAULT_BATCH_WAIT_S, None
        else:
            arrival_rows = rps * rows_per_request * p.scale / r  # per replica
            fill = b / arrival_rows if arrival_rows > 0 else DEFAULT_BATCH_WAIT_S
            wait = min(MAX_BATCH_WAIT_S, fill, 0.5 * p.service_time(b))
            utilization = rps * rows_per_request * p.scale / capacity if capacity > 0 else None
        # the ingress keeps CONCURRENT_BATCHES calls in flight per running replica of a stage
        ongoing = max(MIN_ONGOING_REQUESTS, 2 * CONCURRENT_BATCHES * ingress_replicas)
        stages.append(StagePlan(
            name=p.name, replicas=r, max_batch_size=b, batch_wait_timeout_s=round(wait, 6),
            max_ongoing_requests=ongoing, max_queued_requests=ongoing,
            num_cpus=0.0 if local else sizing.cpus.get(p.name, 0.0),
            num_gpus=sizing.gpus.get(p.name, 0.0), device=p.device, capacity_rows_s=capacity,
            utilization=utilization,
        ))
    per_ingress = sizing.rate / max(ingress_replicas, 1)
    in_flight = max(MIN_IN_FLIGHT, math.ceil(per_ingress * QUEUE_SECONDS))
    cpu_ms = {**d.cpu_ms, "front": d.front_ms, "other": d.other_ms}
    cpu_ms.update({f"{k} (GPU)": v for k, v in d.gpu_ms.items()})
    plan = Plan(
        stages, rows_per_request, rps, p99_ms, sizing.cpus.get("ingress", 0.0) if sizing.cpus else 0.0,
        MONITOR_CPUS if ctx["monitor"] else 0.0, sizing.rate * rows_per_request,
        notes=list(notes), ingress_replicas=ingress_replicas, layout=layout, profiles=profiles,
        ingress_profile=None, costs=ctx["costs"], nodes=ctx["nodes"],
        placement={} if isinstance(sizing.placement, str) else sizing.placement,
        placeable=not isinstance(sizing.placement, str), bottleneck=sizing.binding,
        cpu_ms=cpu_ms, usage=sizing.usage, ingress_max_in_flight=in_flight,
    )
    plan.ingress_profile = ctx.get("ingress_profile")
    if ctx.get("cpu_scale"):
        plan.in_situ = {"factors": dict(ctx["cpu_scale"])}
    if isinstance(sizing.placement, str):
        plan.feasible = False
        plan.notes.append("cannot be placed: " + sizing.placement)
    return plan


def _check_rate(plan: Plan, sizing: _Sizing, rps: float, headroom: float, ctx: dict[str, Any]) -> None:
    """A rate plan is feasible only if nothing runs above ``headroom`` at ``rps``."""
    if sizing.rate * headroom + 1e-9 < rps:
        plan.feasible = False
        best = _grow(ctx, list(sizing.replicas))
        plan.notes.append(
            f"{rps:g} req/s needs more than the {sizing.binding} give at {headroom:.0%} utilisation "
            f"(bound {sizing.rate:.1f} req/s); the most this cluster sustains is about "
            f"{best.rate * headroom:.1f} req/s at {headroom:.0%}, {best.rate:.1f} at 100%")


def simulated_at(plan: Plan, rate: float, seed: int = 0) -> dict[str, float]:
    """The plan's simulation at ``rate`` requests/s (Poisson): its ``predicted`` figures."""
    return simulate(plan, rate_rps=max(rate, 1e-6), n_requests=SIMULATED_REQUESTS, seed=seed).to_dict()


def placement_problem(plan: Plan, nodes: list[NodeSpec]) -> str | None:
    """Why ``plan``'s replicas do not fit on ``nodes`` (their free logical CPUs and GPUs), or
    None when they fit: for a plan made elsewhere or earlier, before Serve waits forever. A plan
    on node pools places each (stage, pool)'s replicas on that pool's nodes, and the ingress off
    the pools its tier plan keeps it off (``Plan.pools``)."""
    entry = plan.pools or {}
    pool_nodes = entry.get("nodes", {})
    replicas = {"ingress": plan.ingress_replicas}
    cpus = {"ingress": plan.ingress_cpus}
    gpus: dict[str, float] = {}
    pinned: dict[str, set[str]] = {}
    for s in plan.remote_stages():
        for pool, n in (entry.get("replicas", {}).get(s.name) or {None: s.replicas}).items():
            name = s.name if pool is None else f"{s.name} on pool {pool}"
            replicas[name], cpus[name] = n, s.num_cpus
            if s.device == "gpu":
                gpus[name] = s.num_gpus
            if pool is not None:
                pinned[name] = set(pool_nodes.get(pool, ()))
    allowed = ingress_nodes(entry, [n.node_id for n in nodes])
    if allowed is not None:
        pinned["ingress"] = allowed
    fixed = {"monitor": (plan.monitor_cpus, "head")} if plan.monitor_cpus else {}
    placed = costmodel.place(nodes, replicas, cpus, gpus, fixed, pinned)
    return placed if isinstance(placed, str) else None
