"""PipeDream's dynamic program, for inference, with replication and per-device memory.

``A(j, m)``: the smallest slowest-stage period of blocks ``0..j-1`` on at most ``m``
devices, ``A(j, m) = min over i < j, 1 <= r <= m of max(A(i, m - r), busy(i, j) / r)``,
``A(0, m) = 0``; a stage that does not fit a device has infinite busy time. Among the
plans reaching that period the one with the lowest latency is kept (a second DP, the
latency one below, with the period as its constraint): so a model that fits one device
and pays anything for a hop comes out as one stage replicated on every device.

The latency objective (PipeDream's inference variant): ``L(j, m) = min over i, r of
L(i, m - r) + latency(i, j)`` with every stage's period at most the time between
batches, ``batch_size / rate``.

Every figure comes from :mod:`serving.partition.cost`, which :func:`evaluate` applies
to any assignment, so baselines and brute force are judged the same way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cost import CostModel, Stage, StageCosts, assess, model_of
from .profile import Profile, Transport

OBJECTIVES = ("throughput", "latency")
#: relative slack when matching the optimal period in the latency tie-break
PERIOD_SLACK = 1e-9


@dataclass
class Plan:
    """Stages with replicas and batch size, and what the cost model predicts for them."""

    stages: list[Stage]
    throughput: float
    latency_ms: float
    batch_size: int
    devices: int
    memory_per_device: float | None
    objective: str
    feasible: bool
    profile_name: str = ""
    transport: Transport = field(default_factory=Transport)
    overlap: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def bottleneck_ms(self) -> float:
        return max((s.period_ms for s in self.stages), default=math.inf)

    @property
    def cuts(self) -> list[int]:
        return [s.start for s in self.stages[1:]]

    @property
    def devices_used(self) -> int:
        return sum(s.replicas for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [s.to_dict() for s in self.stages], "throughput": self.throughput,
            "latency_ms": self.latency_ms, "batch_size": self.batch_size, "devices": self.devices,
            "memory_per_device": self.memory_per_device, "objective": self.objective,
            "feasible": self.feasible, "profile_name": self.profile_name,
            "transport": self.transport.to_dict(), "overlap": self.overlap, "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        d["stages"] = [Stage(**s) for s in d["stages"]]
        d["transport"] = Transport.from_dict(d.get("transport") or {})
        return cls(**d)

    def __str__(self) -> str:
        lines = [f"plan for {self.profile_name or 'model'}: {len(self.stages)} stage(s) on "
                 f"{self.devices_used}/{self.devices} device(s), batch {self.batch_size}, "
                 f"{self.throughput:,.1f} rows/s, latency {self.latency_ms:,.2f} ms"
                 + ("" if self.feasible else " (INFEASIBLE)")]
        for k, s in enumerate(self.stages):
            lines.append(f"  stage {k}: blocks {s.start}..{s.end - 1} x{s.replicas} on {s.device}, "
                         f"compute {s.compute_ms:.2f} ms, busy {s.busy_ms:.2f} ms/batch, "
                         f"{s.memory_bytes / 2**20:.1f} MiB")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _check_devices(devices: int, memory_per_device: float | None) -> None:
    if not isinstance(devices, (int, np.integer)) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices must be a positive int, got {devices!r}")
    if memory_per_device is not None and not memory_per_device > 0:
        raise ValueError(f"memory_per_device must be positive bytes or None, got {memory_per_device!r}")


def evaluate(profile: Profile, stages: Sequence[Any], *, devices: int | None = None,
             memory_per_device: float | None = None, batch_size: int | None = None,
             transport: Transport | None = None, overlap: bool = False,
             ingress_hops: bool = True) -> Plan:
    """What the cost model predicts for ``stages`` (``(start, end, replicas)`` or Stage
    objects): throughput (rows/s) and latency (ms); an assignment that does not fit
    (a stage over ``memory_per_device``, more replicas than ``devices``) is infeasible,
    with throughput 0 and latency inf."""
    model = model_of(profile, transport, overlap=overlap, ingress_hops=ingress_hops)
    b = batch_size if batch_size is not None else profile.batch_sizes[-1]
    out, thr, lat, notes = assess(profile, stages, devices=devices, memory_per_device=memory_per_device,
                                  batch_size=b, model=model)
    used = sum(s.replicas for s in out)
    return Plan(out, thr, lat, b, devices if devices is not None else used, memory_per_device, "given",
                not notes, profile.name, model.transport, overlap, notes)


# --- the dynamic programs ------------------------------------------------------------------
def _bottleneck_dp(busy: np.ndarray, n: int, devices: int, max_replicas: int) -> float:
    """Smallest achievable slowest-stage period (ms per batch) on at most ``devices``."""
    A = np.full((n + 1, devices + 1), np.inf)
    A[0, :] = 0.0
    for j in range(1, n + 1):
        col = busy[:j, j]  # busy(i, j) for i < j
        for m in range(1, devices + 1):
            best = np.inf
            for r in range(1, min(m, max_replicas) + 1):
                cand = np.maximum(A[:j, m - r], col / r)
                v = cand.min()
                if v < best:
                    best = v
            A[j, m] = best
    return float(A[n, devices])


def _latency_dp(busy: np.ndarray, lat: np.ndarray, n: int, devices: int, period: float,
                max_replicas: int) -> list[tuple[int, int, int]] | None:
    """Lowest-latency stages whose every period is <= ``period`` on at most ``devices``;
    each stage gets the fewest replicas meeting the period. None if none exists."""
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(np.isfinite(busy), np.ceil(busy / period * (1 - PERIOD_SLACK)), np.inf)
    need = np.maximum(need, 1)
    need[need > max_replicas] = np.inf
    L = np.full((n + 1, devices + 1), np.inf)
    L[0, :] = 0.0
    choice: dict[tuple[int, int], tuple[int, int]] = {}
    for j in range(1, n + 1):
        for m in range(1, devices + 1):
            best, arg = np.inf, None
            for i in range(j):
                r = need[i, j]
                if not np.isfinite(r) or r > m:
                    continue
                v = L[i, m - int(r)] + lat[i, j]
                # ties: fewer stages first (i smaller means a longer last stage)
                if v < best - 1e-12:
                    best, arg = v, (i, int(r))
            L[j, m] = best
            if arg is not None:
                choice[(j, m)] = arg
    if not np.isfinite(L[n, devices]):
        return None
    out = []
    j, m = n, devices
    while j > 0:
        i, r = choice[(j, m)]
        out.append((i, j, r))
        j, m = i, m - r
    return out[::-1]


def _spread_spare(stages: list[tuple[int, int, int]], costs: StageCosts, devices: int) -> list[tuple[int, int, int]]:
    """Give devices the plan left unused to its slowest stage, one at a time."""
    stages = [list(s) for s in stages]
    spare = devices - sum(s[2] for s in stages)
    for _ in range(max(spare, 0)):
        k = max(range(len(stages)), key=lambda t: costs.busy(stages[t][0], stages[t][1]) / stages[t][2])
        stages[k][2] += 1
    return [tuple(s) for s in stages]  # type: ignore[misc]


def _one_batch(profile: Profile, b: int, model: CostModel, devices: int, memory_per_device: float | None,
               objective: str, rate: float | None, slo_ms: float | None,
               max_replicas: int) -> list[tuple[int, int, int]] | None:
    costs = StageCosts(profile, b, model)
    busy, lat = costs.matrices(memory_per_device)
    n = len(profile)
    if objective == "latency":
        return _latency_dp(busy, lat, n, devices, b * 1000.0 / rate, max_replicas)
    best = _bottleneck_dp(busy, n, devices, max_replicas)
    if not np.isfinite(best):
        return None
    stages = _latency_dp(busy, lat, n, devices, best * (1 + PERIOD_SLACK), max_replicas)
    if stages is None:
        return None
    if slo_ms is not None and sum(lat[i, j] for i, j, _ in stages) > slo_ms:
        # the fastest plan misses the SLO: the smallest period whose lowest latency fits it
        periods = np.unique(np.concatenate([(busy[np.isfinite(busy)] / r) for r in range(1, max_replicas + 1)]))
        periods = periods[periods >= best]
        lo, hi, found = 0, len(periods) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = _latency_dp(busy, lat, n, devices, float(periods[mid]), max_replicas)
            if cand is not None and sum(lat[i, j] for i, j, _ in cand) <= slo_ms:
                found, hi = cand, mid - 1
            else:
                lo = mid + 1
        if found is None:
            return None
        stages = found
    if max_replicas >= devices:
        stages = _spread_spare(stages, costs, devices)
    return stages


def plan(
    profile: Profile,
    devices: int,
    memory_per_device: float | None = None,
    objective: str = "throughput",
    *,
    rate: float | None = None,
    slo_ms: float | None = None,
    batch_sizes: Sequence[int] | None = None,
    transport: Transport | None = None,
    overlap: bool = False,
    ingress_hops: bool = True,
    replication: bool = True,
) -> Plan:
    """The best stages for ``profile`` on ``devices`` identical devices.

    ``objective="throughput"``: the highest rows/s (with ``slo_ms``: among plans whose
    latency is at most ``slo_ms``); ``"latency"``: the lowest latency that sustains
    ``rate`` rows/s (per batch, the batch's fill time ``(b - 1) / rate`` is added when
    batch sizes are compared). Every profiled batch size is tried (``batch_sizes``
    restricts them). ``replication=False`` gives each stage one device (PipeDream
    without replication, for comparison). An infeasible answer (nothing fits, the rate
    or SLO cannot be met) is a Plan with ``feasible=False`` and notes saying why.
    """
    _check_devices(devices, memory_per_device)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "latency" and not (rate and rate > 0):
        raise ValueError("objective='latency' needs rate= (rows/s the plan must sustain)")
    if slo_ms is not None and not slo_ms > 0:
        raise ValueError(f"slo_ms must be positive, got {slo_ms!r}")
    sizes = list(profile.batch_sizes if batch_sizes is None else batch_sizes)
    for b in sizes:
        profile.batch_index(b)  # raises on an unprofiled size
    model = model_of(profile, transport, overlap=overlap, ingress_hops=ingress_hops)
    max_replicas = devices if replication else 1
    best: Plan | None = None
    best_key: tuple = ()
    for b in sizes:
        stages = _one_batch(profile, b, model, devices, memory_per_device, objective, rate, slo_ms, max_replicas)
        if stages is None:
            continue
        p = evaluate(profile, stages, devices=devices, memory_per_device=memory_per_device, batch_size=b,
                     transport=model.transport, overlap=overlap, ingress_hops=ingress_hops)
        if objective == "throughput":
            key = (-round(p.throughput, 9), p.latency_ms)
        else:
            key = (p.latency_ms + (b - 1) * 1000.0 / rate, -p.throughput)
        if best is None or key < best_key:
            best, best_key = p, key
    if best is None:
        total = profile.model_bytes
        why = (f"no assignment of {len(profile)} blocks to {devices} device(s) fits "
               f"memory_per_device={memory_per_device} with the objective's constraints "
               f"(model parameters {total / 2**20:.1f} MiB"
               + (f", rate {rate} rows/s" if rate else "") + (f", SLO {slo_ms} ms" if slo_ms else "") + ")")
        return Plan([], 0.0, math.inf, sizes[-1], devices, memory_per_device, objective, False,
                    profile.name, model.transport, overlap, [why])
    best.objective = objective
    return best


# --- baselines and brute force, under the same cost model ---------------------------------
def even_by_layers(n: int, stages: int) -> list[tuple[int, int]]:
    """``stages`` contiguous ranges with (nearly) equal block counts (PiPPy/DeepSpeed 'uniform')."""
    stages = min(stages, n)
    bounds = [round(k * n / stages) for k in range(stages + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(stages)]


def even_by_params(profile: Profile, stages: int) -> list[tuple[int, int]]:
    """Ranges with (nearly) equal parameter bytes (DeepSpeed 'parameters'): cut where the
    running total first reaches each k/stages share; every range keeps at least one block."""
    n = len(profile)
    stages = min(stages, n)
    prefix = np.cumsum(profile.params())
    total = prefix[-1] if prefix[-1] > 0 else 1.0
    bounds = [0]
    for k in range(1, stages):
        target = total * k / stages
        cut = int(np.searchsorted(prefix, target, side="left")) + 1
        cut = max(cut, bounds[-1] + 1)
        cut = min(cut, n - (stages - k))
        bounds.append(cut)
    bounds.append(n)
    return [(bounds[k], bounds[k + 1]) for k in range(stages)]


def with_replicas(ranges: list[tuple[int, int]], devices: int) -> list[tuple[int, int, int]]:
    """Spread ``devices`` over the ranges as evenly as possible (earlier ranges get the rest)."""
    k = len(ranges)
    base, extra = divmod(devices, k)
    return [(a, b, base + (1 if t < extra else 0)) for t, (a, b) in enumerate(ranges)]


def brute_force(profile: Profile, devices: int, memory_per_device: float | None = None, *,
                batch_size: int | None = None, transport: Transport | None = None,
                overlap: bool = False, ingress_hops: bool = True) -> Plan:
    """Every split into contiguous stages and every replica count (small instances only):
    the highest throughput, ties to the lower latency. For checking the DP."""
    n = len(profile)
    best: Plan | None = None
    for k in range(1, min(n, devices) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = [0, *cuts, n]
            ranges = [(bounds[t], bounds[t + 1]) for t in range(k)]
            for reps in itertools.product(range(1, devices + 1), repeat=k):
                if sum(reps) > devices:
                    continue
                p = evaluate(profile, [(a, b, r) for (a, b), r in zip(ranges, reps, strict=True)],
                             devices=devices, memory_per_device=memory_per_device, batch_size=batch_size,
                             transport=transport, overlap=overlap, ingress_hops=ingress_hops)
                if not p.feasible:
                    continue
                if best is None or (p.throughput, -p.latency_ms) > (best.throughput, -best.latency_ms):
                    best = p
    if best is None:
        return Plan([], 0.0, math.inf, batch_size or profile.batch_sizes[-1], devices, memory_per_device,
                    "throughput", False, profile.name, transport or profile.transport, overlap,
                    ["nothing fits"])
    return best
