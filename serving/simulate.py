"""Discrete-event simulation of a staged plan, to check it before deploying (InferLine-style).

Requests arrive as a Poisson process, each with ``rows_per_request`` rows. Every
stage has ``replicas`` servers sharing one FIFO queue; a free server starts a
batch when ``max_batch_size`` rows are queued or the oldest item has waited
``batch_wait_timeout_s``, and takes whole requests up to the batch size. Of the
rows leaving a stage, each reaches the next with probability scale_next /
scale_this (the unsure share). Every request first passes the ingress
(``plan.ingress_replicas`` servers, ``plan.ingress_ms`` per request, no batching).
Entering the ingress or a stage costs one hop, except the first stage when the plan's
layout is "fused" (it runs on the ingress replicas, so it has that many servers; the
ingress's own work and the stage's are queued as two stations, which is optimistic where
one process does both).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class _Ingress:
    """The ingress as a station: one request per batch, a fixed service time."""

    name: str
    replicas: int
    max_batch_size: int
    batch_seconds: float
    batch_wait_timeout_s: float = 0.0
    scale: float = 1.0

    def service_time(self, rows: float) -> float:
        return self.batch_seconds


@dataclass
class SimulationResult:
    rate_rps: float
    completed: int
    throughput_rows_s: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    utilization: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("utilization")
        data.update({f"utilization_{k}": v for k, v in self.utilization.items()})
        return data


def simulate(
    plan: Any,
    profiles: Sequence[Any],
    *,
    rate_rps: float,
    hop_ms: float,
    n_requests: int = 4000,
    seed: int = 0,
) -> SimulationResult:
    """Simulate ``n_requests`` Poisson arrivals at ``rate_rps`` through the plan's stages."""
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    rng = np.random.default_rng(seed)
    rows = plan.rows_per_request
    fused = plan.layout == "fused"
    ingress = _Ingress("ingress", max(1, plan.ingress_processes), rows, plan.ingress_ms / 1000.0)
    stages = [ingress, *plan.stages]
    profiles = [ingress, *profiles]
    n_stages = len(stages)
    hop = hop_ms / 1000.0
    hops = [hop, 0.0 if fused else hop] + [hop] * (n_stages - 2)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, n_requests))
    queues: list[deque] = [deque() for _ in range(n_stages)]
    queued_rows = [0] * n_stages
    idle = [s.replicas for s in stages]
    if fused and n_stages > 1:
        idle[1] = ingress.replicas
    servers = list(idle)
    wake_at: list[float | None] = [None] * n_stages
    busy = [0.0] * n_stages
    finish = np.full(n_requests, np.nan)
    events: list[tuple[float, int, str, int, Any]] = []
    seq = 0

    def push(t: float, kind: str, stage: int, data: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, stage, data))
        seq += 1

    for i, t in enumerate(arrivals):
        push(t + hop, "arrive", 0, (i, rows))

    def dispatch(stage: int, now: float) -> None:
        spec, profile = stages[stage], profiles[stage]
        while idle[stage] > 0 and queues[stage]:
            oldest = queues[stage][0][0]
            deadline = oldest + spec.batch_wait_timeout_s
            if queued_rows[stage] < spec.max_batch_size and now < deadline - 1e-12:
                if wake_at[stage] is None or wake_at[stage] > deadline:
                    wake_at[stage] = deadline
                    push(deadline, "wake", stage, None)
                return
            batch, taken = [], 0
            while queues[stage] and (not batch or taken + queues[stage][0][2] <= spec.max_batch_size):
                item = queues[stage].popleft()
                batch.append(item)
                taken += item[2]
            queued_rows[stage] -= taken
            service = profile.service_time(taken)
            busy[stage] += service
            idle[stage] -= 1
            push(now + service, "done", stage, batch)

    while events:
        now, _, kind, stage, data = heapq.heappop(events)
        if kind == "arrive":
            request, n = data
            queues[stage].append((now, request, n))
            queued_rows[stage] += n
        elif kind == "wake":
            if wake_at[stage] is not None and wake_at[stage] <= now + 1e-12:
                wake_at[stage] = None
        else:  # done
            idle[stage] += 1
            for _, request, n in data:
                nxt = stage + 1
                if nxt < n_stages:
                    ratio = profiles[nxt].scale / max(profiles[stage].scale, 1e-12)
                    reach = int(rng.binomial(n, min(1.0, ratio)))
                    if reach > 0:
                        push(now + hops[nxt], "arrive", nxt, (request, reach))
                        continue
                finish[request] = max(np.nan_to_num(finish[request], nan=0.0), now)
        dispatch(stage, now)

    latency = (finish - arrivals) * 1000.0
    done = ~np.isnan(latency)
    span = float(np.nanmax(finish) - arrivals[0]) if done.any() else 1.0
    return SimulationResult(
        rate_rps=float(rate_rps),
        completed=int(done.sum()),
        throughput_rows_s=float(done.sum() * rows / span),
        p50_ms=float(np.percentile(latency[done], 50)),
        p99_ms=float(np.percentile(latency[done], 99)),
        mean_ms=float(latency[done].mean()),
        utilization={s.name: busy[i] / (servers[i] * span) for i, s in enumerate(stages)},
    )
