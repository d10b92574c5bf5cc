"""Discrete-event simulation of a plan under Poisson or bursty arrivals: p50 / p99 / rows/s.

What it models, the way :func:`serving.deploy_model` serves a plan: requests of
``rows_per_request`` rows queue at the ingress, which forms micro-batches of up to the
plan's batch size (waiting at most ``batch_wait_ms`` for a batch to fill) while fewer
than ``max_inflight`` batches are in the pipeline; a batch visits the stages in order,
each stage a FIFO queue in front of ``replicas`` servers, each busy for the stage's
busy time at that batch size (compute interpolated between profiled batch sizes, plus
its halves of the adjacent hops, from :mod:`serving.partition.cost`). A request's
latency runs from its arrival to the end of the last batch carrying its rows.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from .cost import model_of
from .planner import Plan
from .profile import Profile

ARRIVALS = ("poisson", "bursty")
#: bursty arrivals: the rate during a burst is this multiple of the mean rate ...
BURST_FACTOR = 4.0
#: ... bursts take this share of the time, and last this long on average (ms)
BURST_SHARE = 0.15
BURST_MS = 200.0
#: share of the requests at the start left out of the statistics (the pipeline filling)
WARMUP_SHARE = 0.1


@dataclass
class SimResult:
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float  # rows/s completed
    requests: int
    mean_batch: float
    arrivals: str
    rate: float

    @property
    def p50(self) -> float:
        """Median latency (ms); the same as ``p50_ms``."""
        return self.p50_ms

    @property
    def p99(self) -> float:
        """99th percentile latency (ms); the same as ``p99_ms``."""
        return self.p99_ms

    def to_dict(self) -> dict:
        return dict(vars(self))


def _interp(sizes: list[int], values: np.ndarray, k: int) -> float:
    """Time at batch size ``k``: linear between profiled sizes, proportional beyond them."""
    if k <= sizes[0]:
        return float(values[0]) * k / sizes[0]
    if k >= sizes[-1]:
        return float(values[-1]) * k / sizes[-1]
    return float(np.interp(k, sizes, values))


def _arrival_times(rate: float, count: int, arrivals: str, rng: np.random.Generator) -> np.ndarray:
    if arrivals == "poisson":
        return np.cumsum(rng.exponential(1.0 / rate, count))
    # two-state (burst / calm) modulated Poisson with the same mean rate
    hi = rate * BURST_FACTOR
    lo = rate * max(1.0 - BURST_SHARE * BURST_FACTOR, 0.05) / (1.0 - BURST_SHARE)
    calm_ms = BURST_MS * (1.0 - BURST_SHARE) / BURST_SHARE
    out, t, burst = [], 0.0, False
    state_end = rng.exponential(calm_ms / 1000.0)
    while len(out) < count:
        r = hi if burst else lo
        nxt = t + rng.exponential(1.0 / r)
        if nxt > state_end:
            t = state_end
            burst = not burst
            state_end = t + rng.exponential((BURST_MS if burst else calm_ms) / 1000.0)
            continue
        t = nxt
        out.append(t)
    return np.asarray(out)


def simulate(
    plan: Plan,
    profile: Profile,
    rate: float,
    *,
    arrivals: str = "poisson",
    requests: int = 5000,
    rows_per_request: int = 1,
    batch_wait_ms: float = 0.0,
    max_inflight: int | None = None,
    front_ms: float = 0.0,
    seed: int = 0,
) -> SimResult:
    """Simulate ``requests`` requests arriving at ``rate`` requests/s (``arrivals``:
    "poisson" or "bursty", a burst/calm modulated Poisson process with the same mean).

    ``front_ms`` is a fixed time every request spends outside the pipeline (the HTTP
    front and the ingress's request handling, measured on the deployment), added to
    its latency."""
    if not plan.stages:
        raise ValueError("the plan has no stages (an infeasible plan cannot be simulated)")
    if not rate > 0:
        raise ValueError(f"rate must be positive requests/s, got {rate!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if requests < 10 or rows_per_request < 1:
        raise ValueError("requests must be >= 10 and rows_per_request >= 1")
    if front_ms < 0 or batch_wait_ms < 0:
        raise ValueError("front_ms and batch_wait_ms must be >= 0")
    rng = np.random.default_rng(seed)
    model = model_of(profile, plan.transport, overlap=plan.overlap)
    sizes = profile.batch_sizes
    compute = np.asarray(profile.compute_ms, dtype=float)
    cut_bytes = np.asarray(profile.cut_bytes, dtype=float)
    per_row_cut = cut_bytes / np.asarray(sizes, dtype=float)  # bytes per row at each profiled size
    n = len(profile)
    b_max = plan.batch_size
    stages = plan.stages
    inflight_cap = max_inflight or sum(s.replicas for s in stages) + len(stages)

    def hop(cut: int, k: int) -> float:
        if cut in (0, n) and not model.ingress_hops:
            return 0.0
        return model.transport.hop_ms(float(np.interp(k, sizes, per_row_cut[cut])) * k)

    def edge_hop(cut: int, k: int) -> float:
        """The ingress's half of the hop into the first or out of the last stage (a delay)."""
        return hop(cut, k) / 2.0

    def busy(stage_idx: int, k: int) -> float:
        s = stages[stage_idx]
        c = sum(_interp(sizes, compute[blk], k) for blk in range(s.start, s.end))
        comm = (hop(s.start, k) + hop(s.end, k)) / 2.0
        return max(c, comm) if model.overlap else c + comm

    arrive = _arrival_times(rate, requests, arrivals, rng) * 1000.0  # ms
    remaining = np.full(requests, rows_per_request)
    done_at = np.full(requests, math.nan)
    queue: deque = deque()  # (request, rows left to batch)
    free = [s.replicas for s in stages]
    waiting: list[deque] = [deque() for _ in stages]
    events: list = []  # (time, seq, kind, payload)
    seq = 0
    inflight = 0
    batch_sizes: list[int] = []
    timer_at = math.inf

    def push(t: float, kind: str, payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    def start(t: float, stage_idx: int, batch) -> None:
        free[stage_idx] -= 1
        push(t + busy(stage_idx, batch[0]), "done", (stage_idx, batch))

    def dispatch(t: float) -> None:
        nonlocal inflight, timer_at
        while queue and inflight < inflight_cap:
            rows = sum(r for _, r in queue)
            oldest = arrive[queue[0][0]]
            if rows < b_max and t < oldest + batch_wait_ms:
                if oldest + batch_wait_ms < timer_at:
                    timer_at = oldest + batch_wait_ms
                    push(timer_at, "timer", None)
                return
            take, members = 0, []
            while queue and take < b_max:
                req, left = queue[0]
                k = min(left, b_max - take)
                take += k
                members.append((req, k))
                if k == left:
                    queue.popleft()
                else:
                    queue[0] = (req, left - k)
            inflight += 1
            batch_sizes.append(take)
            # the ingress's half of the hop into the first stage delays the batch
            push(t + edge_hop(0, take), "enter", (take, members))

    for i, t in enumerate(arrive):
        push(float(t), "arrive", i)
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            queue.append((payload, rows_per_request))
            dispatch(t)
        elif kind == "enter":
            if free[0] > 0:
                start(t, 0, payload)
            else:
                waiting[0].append(payload)
        elif kind == "leave":
            inflight -= 1
            for req, k in payload[1]:
                remaining[req] -= k
                if remaining[req] == 0:
                    done_at[req] = t
            dispatch(t)
        elif kind == "timer":
            if t >= timer_at:
                timer_at = math.inf
            dispatch(t)
        else:
            stage_idx, batch = payload
            free[stage_idx] += 1
            if waiting[stage_idx]:
                start(t, stage_idx, waiting[stage_idx].popleft())
            if stage_idx + 1 < len(stages):
                if free[stage_idx + 1] > 0:
                    start(t, stage_idx + 1, batch)
                else:
                    waiting[stage_idx + 1].append(batch)
            else:  # the ingress's half of the hop out of the last stage
                push(t + edge_hop(n, batch[0]), "leave", batch)
    skip = int(requests * WARMUP_SHARE)
    lat = (done_at - arrive)[skip:] + front_ms
    finished = np.sort(done_at)
    span_ms = finished[-1] - finished[skip]  # completions after the warm-up, to the last one
    thr = (requests - 1 - skip) * rows_per_request * 1000.0 / span_ms if span_ms > 0 else math.inf
    return SimResult(float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), float(lat.mean()),
                     float(thr), requests, float(np.mean(batch_sizes)), arrivals, float(rate))
