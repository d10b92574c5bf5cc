"""Stage planner: replicas, batch sizes and request limits per stage, from measured costs.

Pure Python (no Ray). Each stage is described by a :class:`StageProfile`: the
seconds one replica needs for a batch of b rows, at several b, and its *scale
factor* (the fraction of rows that reach it: 1 for the cheap stage, the unsure
share for the expensive one). Sizing follows InferLine / PipeDream:

* per-replica capacity at batch b is ``b / T(b)`` rows/s;
* with a throughput target, ``replicas = ceil(rate * scale / (headroom * capacity))``;
* without one, replicas go one at a time to the bottleneck stage (lowest
  ``replicas * capacity / scale``) until the CPU budget is spent;
* batch sizes are the smallest that reach ``BATCH_EFFICIENCY`` of the best
  capacity, shrunk while a p99 target is missed;
* the ingress is a Python process too (HTTP, JSON, schema checks, routing): it costs
  ``ingress_ms`` of CPU per request, and with ``layout="fused"`` it also runs the first
  stage, so it gets replicas like a stage (one process is held to about one core by
  the GIL);
* every plan is checked by the discrete-event simulation in :mod:`serving.simulate`.

``max_ongoing_requests`` follows the plan so that callers never sit in Serve's
router backoff (see REFERENCES: throughput collapses when replicas are full).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: target utilisation of a replica at the planned rate (InferLine-style headroom)
HEADROOM = 0.75
#: a batch size is "good enough" once it reaches this share of the best per-replica capacity
BATCH_EFFICIENCY = 0.9
#: one deployment hop measured here (REFERENCES: 5-6.5 ms p50 per chained hop)
HOP_MS = 5.5
#: logical CPUs of an ingress replica (parses JSON, fans out; mostly waiting)
INGRESS_CPUS = 0.25
#: CPU ms an ingress replica spends per request outside any model: HTTP, JSON, schema
#: checks, routing, the answer. serving.bench prints each process's CPU per request: the
#: staged ingress (no model; it pays the caller's side of the cheap-stage hop, which a
#: fused ingress does not) used 2.71 ms at 32-row toxic requests on 2 CPUs
INGRESS_REQUEST_MS = 2.0
#: "staged": the ingress calls one deployment per stage; "fused": the first stage runs
#: inside the ingress replicas (no hop for the rows it answers)
LAYOUTS = ("staged", "fused")
#: logical CPUs of the monitor replica (fed off the critical path)
MONITOR_CPUS = 0.1
#: logical CPUs a model-stage replica asks for (one busy Python process)
STAGE_CPUS = 1.0
#: least logical CPUs a CPU-stage replica is given when the budget is tight
MIN_STAGE_CPUS = 0.05
#: logical CPUs of a GPU-stage replica (it feeds the device)
GPU_STAGE_CPUS = 0.5
#: longest a batch waits for more rows (seconds) when no rate is given: none, so a lone
#: request is not delayed; under load, requests queue while a batch runs and batch anyway
DEFAULT_BATCH_WAIT_S = 0.0
#: upper bound on any planned batch wait (seconds)
MAX_BATCH_WAIT_S = 0.01
#: floor on max_ongoing_requests of a stage replica
MIN_ONGOING_REQUESTS = 16
#: max_ongoing_requests of the ingress (async; holds requests while stages work)
INGRESS_ONGOING_REQUESTS = 512
#: simulated requests used to check a plan
SIMULATED_REQUESTS = 4000


@dataclass(frozen=True)
class StageProfile:
    """Measured cost of one stage: seconds per batch at each batch size (rows)."""

    name: str
    batch_seconds: dict[int, float]
    scale: float = 1.0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.batch_seconds:
            raise ValueError(f"stage {self.name!r} has no measured batch sizes")
        if any(b < 1 or t <= 0 for b, t in self.batch_seconds.items()):
            raise ValueError(f"stage {self.name!r}: batch sizes must be >= 1 and times > 0")
        if not 0 <= self.scale <= 1:
            raise ValueError(f"stage {self.name!r}: scale must be in [0, 1], got {self.scale}")

    @property
    def sizes(self) -> list[int]:
        return sorted(self.batch_seconds)

    def service_time(self, rows: float) -> float:
        """Seconds for a batch of ``rows`` rows: piecewise linear between measured sizes."""
        sizes = self.sizes
        rows = max(rows, 1.0)
        if rows <= sizes[0]:
            return self.batch_seconds[sizes[0]]
        for lo, hi in itertools.pairwise(sizes):
            if rows <= hi:
                w = (rows - lo) / (hi - lo)
                return (1 - w) * self.batch_seconds[lo] + w * self.batch_seconds[hi]
        last = sizes[-1]
        per_row = self.batch_seconds[last] / last
        return self.batch_seconds[last] + (rows - last) * per_row

    def capacity(self, rows: int) -> float:
        """Rows per second one replica sustains at batch size ``rows``."""
        return rows / self.service_time(rows)


@dataclass
class Resources:
    """What the plan may use: logical CPUs and GPUs of the cluster."""

    cpus: float
    gpus: float = 0.0

    def __post_init__(self) -> None:
        if self.cpus <= 0:
            raise ValueError(f"cpus must be positive, got {self.cpus}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")


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
    capacity_rows_s: float  # all replicas, at the planned batch size
    utilization: float | None  # at the target rate; None without one


@dataclass
class Plan:
    """Per-stage settings plus what the simulation predicts for them."""

    stages: list[StagePlan]
    rows_per_request: int
    target_rps: float | None
    target_p99_ms: float | None
    ingress_cpus: float
    monitor_cpus: float
    max_rows_per_s: float  # bottleneck capacity at the planned settings
    predicted: dict[str, float] = field(default_factory=dict)
    feasible: bool = True
    notes: list[str] = field(default_factory=list)
    ingress_replicas: int = 1
    layout: str = "staged"
    ingress_ms: float = INGRESS_REQUEST_MS

    @property
    def ingress_processes(self) -> int:
        """Ingress replicas deployed: fused, the first stage's replicas are ingress replicas
        too, so there are as many as the larger of the two (logical CPUs are still what the
        plan gave each: deploy spreads them over these processes)."""
        if self.layout == "fused":
            return max(self.ingress_replicas, self.stages[0].replicas)
        return self.ingress_replicas

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = ["stage        replicas  batch  wait ms  ongoing  cpus  gpus  device  rows/s"]
        fused = f" (runs the {self.stages[0].name} stage)" if self.layout == "fused" else ""
        lines.append(f"{'ingress':<12} {self.ingress_processes:>8}  {self.ingress_ms:g} ms CPU per request{fused}")
        for s in self.stages:
            lines.append(
                f"{s.name:<12} {s.replicas:>8}  {s.max_batch_size:>5}  {1e3 * s.batch_wait_timeout_s:>7.2f}"
                f"  {s.max_ongoing_requests:>7}  {s.num_cpus:>4.2f}  {s.num_gpus:>4.2f}  {s.device:<6}"
                f"  {s.capacity_rows_s:>7.0f}"
            )
        target = "max throughput" if self.target_rps is None else f"{self.target_rps:g} req/s"
        lines.append(
            f"target {target} x {self.rows_per_request} rows"
            + ("" if self.target_p99_ms is None else f", p99 <= {self.target_p99_ms:g} ms")
            + f"; bottleneck capacity {self.max_rows_per_s:.0f} rows/s"
        )
        if self.predicted:
            p = self.predicted
            lines.append(
                f"simulated at {p['rate_rps']:.1f} req/s: {p['throughput_rows_s']:.0f} rows/s, "
                f"p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms"
            )
        lines.append("feasible" if self.feasible else "NOT feasible")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _pick_batch(profile: StageProfile, cap: int | None = None) -> int:
    """Smallest measured batch reaching BATCH_EFFICIENCY of the best capacity."""
    sizes = [b for b in profile.sizes if cap is None or b <= cap] or [profile.sizes[0]]
    best = max(profile.capacity(b) for b in sizes)
    return next(b for b in sizes if profile.capacity(b) >= BATCH_EFFICIENCY * best)


def plan_stages(
    profiles: Sequence[StageProfile],
    resources: Resources,
    *,
    rps: float | None = None,
    p99_ms: float | None = None,
    rows_per_request: int = 1,
    monitor: bool = False,
    headroom: float = HEADROOM,
    hop_ms: float = HOP_MS,
    layout: str = "staged",
    ingress_ms: float = INGRESS_REQUEST_MS,
    seed: int = 0,
) -> Plan:
    """Plan replicas, batches and limits for a chain of stages under a resource budget.

    ``rps`` is a request rate (each request carries ``rows_per_request`` rows).
    Without it the plan maximises throughput within ``resources``. ``layout`` is where
    the first stage runs (see :data:`LAYOUTS`); ``ingress_ms`` the ingress's CPU per request.
    """
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
    if ingress_ms < 0:
        raise ValueError(f"ingress_ms must be >= 0, got {ingress_ms}")
    if layout == "fused" and profiles[0].device == "gpu":
        raise ValueError("layout='fused' runs the first stage in the ingress, on CPU; it is on a GPU here")
    notes: list[str] = []
    batches = {p.name: _pick_batch(p) for p in profiles}
    ingress_replicas = _ingress_replicas(profiles, batches, resources, rps, rows_per_request, layout,
                                         ingress_ms, headroom)
    fixed = ingress_replicas * INGRESS_CPUS + (MONITOR_CPUS if monitor else 0.0)
    cpu_stages = [p for p in profiles if p.device != "gpu"]
    gpu_stages = [p for p in profiles if p.device == "gpu"]
    if gpu_stages and resources.gpus <= 0:
        raise ValueError("a stage wants a GPU but resources.gpus is 0")
    gpu_cpus = GPU_STAGE_CPUS if gpu_stages else 0.0
    available = resources.cpus - fixed - gpu_cpus * len(gpu_stages)
    stage_cpus = STAGE_CPUS
    if cpu_stages and available < STAGE_CPUS * len(cpu_stages):
        stage_cpus = max(available, MIN_STAGE_CPUS * len(cpu_stages)) / len(cpu_stages)
        notes.append(
            f"{resources.cpus:g} CPUs cannot give each of {len(cpu_stages)} CPU stages a whole core; "
            f"each replica asks for {stage_cpus:.2f} (replicas share cores)"
        )

    replicas = {p.name: 1 for p in profiles}
    rate_rows = None if rps is None else rps * rows_per_request

    def cpu_used() -> float:
        return fixed + sum(
            replicas[p.name] * (gpu_cpus if p.device == "gpu" else stage_cpus) for p in profiles
        )

    def stage_rate(p: StageProfile) -> float:
        return replicas[p.name] * p.capacity(batches[p.name]) / max(p.scale, 1e-9)

    def size_for_rate() -> None:
        for p in profiles:
            need = rate_rows * p.scale / (headroom * p.capacity(batches[p.name]))
            replicas[p.name] = max(1, math.ceil(need - 1e-9))

    for _ in range(8):  # shrink batches while the p99 target is missed
        if rate_rows is None:
            for p in profiles:
                replicas[p.name] = 1
            while True:
                bottleneck = min(profiles, key=stage_rate)
                cost = gpu_cpus if bottleneck.device == "gpu" else stage_cpus
                if cpu_used() + cost > resources.cpus + 1e-9:
                    break
                if bottleneck.device == "gpu" and replicas[bottleneck.name] >= max(1, 4 * resources.gpus):
                    break
                replicas[bottleneck.name] += 1
        else:
            size_for_rate()
        plan = _assemble(profiles, replicas, batches, rows_per_request, rps, p99_ms, stage_cpus,
                         gpu_cpus, resources, monitor, rate_rows, notes)
        plan.layout, plan.ingress_ms, plan.ingress_replicas = layout, ingress_ms, ingress_replicas
        rate = rps if rps is not None else 0.7 * plan.max_rows_per_s / rows_per_request
        plan.predicted = _simulate(plan, profiles, rate, hop_ms, seed)
        if p99_ms is None or plan.predicted["p99_ms"] <= p99_ms:
            break
        shrinkable = [p for p in profiles if batches[p.name] > p.sizes[0]]
        if not shrinkable:
            break
        worst = max(shrinkable, key=lambda p: p.service_time(batches[p.name]))
        smaller = [b for b in worst.sizes if b < batches[worst.name]]
        batches[worst.name] = smaller[-1]

    if cpu_used() > resources.cpus + 1e-9:
        plan.feasible = False
        message = f"needs {cpu_used():.2f} CPUs but only {resources.cpus:g} are available"
        if rps is not None:
            best = plan_stages(profiles, resources, rows_per_request=rows_per_request, monitor=monitor,
                               headroom=headroom, hop_ms=hop_ms, layout=layout, ingress_ms=ingress_ms,
                               seed=seed)
            if best.feasible:
                message += f"; within them about {best.max_rows_per_s * headroom / rows_per_request:.1f} req/s fit"
        plan.notes.append(message)
    if p99_ms is not None and plan.predicted["p99_ms"] > p99_ms:
        plan.feasible = False
        plan.notes.append(
            f"simulated p99 {plan.predicted['p99_ms']:.1f} ms exceeds the {p99_ms:g} ms target even "
            "at the smallest batches"
        )
    return plan


def _request_seconds(profile: StageProfile, batch: int, rows_per_request: int) -> float:
    """CPU seconds a stage spends on one request's rows at its planned batch size."""
    return profile.service_time(batch) / batch * rows_per_request * profile.scale


def _ingress_replicas(profiles, batches, resources, rps, rows_per_request, layout, ingress_ms,
                      headroom) -> int:
    """Ingress replicas: enough for ``rps`` at ``headroom``; without a rate, one when staged
    (one ingress batches concurrent requests into fewer hops: on 2 CPUs, two staged
    ingress replicas served 16% fewer rows/s than one) and, when fused, the ingress's
    share of the per-request CPU times the CPUs, rounded up, since one process is held
    to about one core."""
    per_request = ingress_ms / 1000.0
    if layout == "fused":
        per_request += _request_seconds(profiles[0], batches[profiles[0].name], rows_per_request)
    if rps is not None:
        return max(1, math.ceil(rps * per_request / headroom - 1e-9))
    if layout == "staged":
        return 1
    others = sum(_request_seconds(p, batches[p.name], rows_per_request) for p in profiles[1:]
                 if p.device != "gpu")
    share = per_request / (per_request + others) if per_request + others > 0 else 1.0
    return max(1, math.ceil(resources.cpus * share - 1e-9))


def _assemble(profiles, replicas, batches, rows_per_request, rps, p99_ms, stage_cpus, gpu_cpus,
              resources, monitor, rate_rows, notes) -> Plan:
    stages = []
    gpu_replicas = sum(replicas[p.name] for p in profiles if p.device == "gpu")
    for p in profiles:
        b = batches[p.name]
        r = replicas[p.name]
        capacity = r * p.capacity(b)
        rows_per_call = max(1.0, rows_per_request * p.scale)
        requests_per_batch = max(1, math.ceil(b / rows_per_call))
        if rate_rows is None:
            wait = DEFAULT_BATCH_WAIT_S
            utilization = None
            in_flight = requests_per_batch
        else:
            arrival_rows = rate_rows * p.scale / r  # per replica
            # wait at most the time to fill the batch, and never more than half its service time
            fill = b / arrival_rows if arrival_rows > 0 else DEFAULT_BATCH_WAIT_S
            wait = min(MAX_BATCH_WAIT_S, fill, 0.5 * p.service_time(b))
            utilization = rate_rows * p.scale / capacity if capacity > 0 else None
            per_replica_rps = rps * min(1.0, rows_per_request * p.scale) / r
            in_flight = math.ceil(per_replica_rps * (p.service_time(b) + wait))  # Little's law
        ongoing = max(MIN_ONGOING_REQUESTS, 2 * requests_per_batch, 2 * in_flight)
        stages.append(StagePlan(
            name=p.name,
            replicas=r,
            max_batch_size=b,
            batch_wait_timeout_s=round(wait, 6),
            max_ongoing_requests=ongoing,
            num_cpus=round(gpu_cpus if p.device == "gpu" else stage_cpus, 4),
            num_gpus=round(resources.gpus / gpu_replicas, 4) if p.device == "gpu" else 0.0,
            device=p.device,
            capacity_rows_s=capacity,
            utilization=utilization,
        ))
    bottleneck = min(s.capacity_rows_s / max(p.scale, 1e-9) for s, p in zip(stages, profiles, strict=True))
    return Plan(stages, rows_per_request, rps, p99_ms, INGRESS_CPUS, MONITOR_CPUS if monitor else 0.0,
                bottleneck, notes=list(notes))


def _simulate(plan: Plan, profiles, rate: float, hop_ms: float, seed: int) -> dict[str, float]:
    from .simulate import simulate

    result = simulate(plan, profiles, rate_rps=max(rate, 1e-6), hop_ms=hop_ms,
                      n_requests=SIMULATED_REQUESTS, seed=seed)
    return result.to_dict()
