"""Discrete-event simulation of a planned app, to predict what it will measure (InferLine-style,
with the machine in it).

Every process of the app is simulated: the load generator (when it shares the head's
machine), the HTTP front, each ingress replica, each stage replica, Ray's own processes.
Each piece of work is CPU time on a process; the processes of a machine share its cores
(processor sharing: a process with j pieces of work in progress uses at most min(j, cap)
cores, ``cap`` = 1 for a Python process held by its GIL, and when the machine's demand
exceeds its cores every process slows in proportion). A GPU is one server whose total
throughput with k pieces of work in progress is the stage's measured ``speedup(k)``.

A request: the client sends it (half its ``client_ms``), the front forwards it (half its
cost) to the ingress replica with the fewest requests (HAProxy's ``leastconn``), which
handles HTTP and parses it; then, stage by stage, the ingress merges waiting requests'
rows (up to ``INGRESS_BATCH_ROWS``) into calls, with at most ``CONCURRENT_BATCHES`` calls in
flight per replica of the stage (what :class:`serving.runtime.coalesce.Coalescer` allows); a call
costs the caller half its hop cost before and half after, goes to the less busy of two
random replicas (Serve's power-of-two-choices router), costs the callee half its hop cost
on arrival and half on return, and is split into chunks of ``max_batch_size`` rows that
join the replica's ``@serve.batch`` queue (a batch starts when a slot of
``CONCURRENT_BATCHES`` is free and the queue holds ``max_batch_size`` rows or its oldest
waited ``batch_wait_timeout_s``). With ``layout="fused"`` the first stage runs in the
ingress process (no hop). Each row reaches the next stage with probability
``scale_next / scale_this``. The answer is built on the ingress, passes the front and
reaches the client. Closed loop (``clients``) or Poisson arrivals (``rate_rps``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from serving.core.constants import CONCURRENT_BATCHES, INGRESS_BATCH_ROWS
from serving.core.costs import HostCosts
from serving.core.profiles import IngressProfile, NodeSpec
from serving.planning import costmodel

#: threads HAProxy runs (Ray Serve's default RAY_SERVE_HAPROXY_NBTHREAD)
FRONT_THREADS = 4
#: share of the first completions left out of the statistics (warm-up)
WARMUP_SHARE = 0.1


@dataclass
class SimulationResult:
    rate_rps: float
    completed: int
    throughput_rows_s: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    utilization: dict[str, float]
    #: CPU (GPU) milliseconds each group of processes spent per completed request
    cpu_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("utilization")
        data.pop("cpu_ms")
        data.update({f"utilization_{k}": v for k, v in self.utilization.items()})
        return data


class _Pool:
    """A machine's cores, or one GPU (``speedup``: throughput with k pieces of work)."""

    def __init__(self, capacity: float, speedup=None):
        self.capacity = max(capacity, 1e-3)
        self.speedup = speedup
        self.procs: list[_Proc] = []


class _Proc:
    def __init__(self, name: str, group: str, pool: _Pool, cap: float, inflation=None):
        self.name, self.group, self.pool, self.cap = name, group, pool, cap
        #: CPU factor with j pieces of work at once (threads contending for the GIL)
        self.inflation = inflation or (lambda j: 1.0)
        #: measured over modelled CPU of this process's group (simulate(cpu_scale=...))
        self.scale = 1.0
        self.jobs: list[list] = []
        self.busy = 0.0  # CPU-seconds used
        pool.procs.append(self)
        # ingress: requests held; stage replica: calls held
        self.ongoing = 0
        self.coalescers: dict[int, dict[str, Any]] = {}
        self.batch_queue: deque = deque()
        self.queued_rows = 0
        self.running = 0
        self.wake_at: float | None = None


class _Engine:
    """Processor-sharing clock: pieces of work progress at the rates their pools allow."""

    def __init__(self):
        self.t = 0.0
        self.jobs: list[list] = []  # [remaining seconds, rate, proc, callback]
        self.events: list = []
        self.seq = 0
        self.dirty = True
        self.pools: list[_Pool] = []

    def work(self, proc: _Proc, seconds: float, then) -> None:
        if seconds <= 0:
            then()
            return
        seconds *= proc.scale
        job = [seconds, 0.0, proc, then, 1.0]  # [CPU work left, cores, process, then, CPU factor]
        proc.jobs.append(job)
        self.jobs.append(job)
        self.dirty = True

    def at(self, when: float, then) -> None:
        heapq.heappush(self.events, (when, self.seq, then))
        self.seq += 1

    def _rates(self) -> None:
        for pool in self.pools:
            active = [p for p in pool.procs if p.jobs]
            if not active:
                continue
            if pool.speedup is not None:
                n = sum(len(p.jobs) for p in active)
                each = pool.speedup(n) / n
                for p in active:
                    for job in p.jobs:
                        job[1], job[4] = each, 1.0
                continue
            demand = sum(min(p.cap, len(p.jobs)) for p in active)
            share = min(1.0, pool.capacity / demand)
            for p in active:
                each = min(p.cap, len(p.jobs)) * share / len(p.jobs)
                slow = p.inflation(len(p.jobs))
                for job in p.jobs:
                    job[1] = each
                    job[4] = slow
        self.dirty = False

    def step(self) -> bool:
        if self.dirty:
            self._rates()
        t_job = min((self.t + j[0] * j[4] / j[1] for j in self.jobs), default=math.inf)
        t_evt = self.events[0][0] if self.events else math.inf
        t_new = min(t_job, t_evt)
        if t_new == math.inf:
            return False
        dt = t_new - self.t
        if dt > 0:
            for j in self.jobs:
                used = j[1] * dt
                j[0] -= used / j[4]
                j[2].busy += used
        self.t = t_new
        if t_job <= t_evt:
            done = [j for j in self.jobs if j[0] <= 1e-12 or self.t + j[0] * j[4] / j[1] <= t_new + 1e-12]
            for j in done:
                self.jobs.remove(j)
                j[2].jobs.remove(j)
            self.dirty = True
            for j in done:
                j[3]()
        else:
            _, _, then = heapq.heappop(self.events)
            then()
        return True


def simulate(
    plan: Any,
    *,
    rate_rps: float | None = None,
    clients: int | None = None,
    n_requests: int = 2000,
    seed: int = 0,
    client_ms: float = 0.0,
    cpu_scale: dict[str, float] | None = None,
) -> SimulationResult:
    """Simulate ``n_requests`` requests through the plan: Poisson arrivals at ``rate_rps``,
    or a closed loop of ``clients`` each sending its next request when answered.

    ``cpu_scale`` multiplies the CPU work of a group of processes (keys as in
    ``SimulationResult.cpu_ms``: "ingress", a stage's name, "front", "other", "client"): the
    measured-over-modelled factors :func:`serving.measure.insitu.cpu_factors` reads off a running app.
    None takes the plan's own (``plan.in_situ["factors"]``, set when deploy probed the app);
    ``{}`` simulates the plan's model alone."""
    if (rate_rps is None) == (clients is None):
        raise ValueError("give exactly one of rate_rps and clients")
    if rate_rps is not None and rate_rps <= 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    if clients is not None and clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if n_requests < 10:
        raise ValueError(f"n_requests must be >= 10, got {n_requests}")
    if cpu_scale is None:
        cpu_scale = (getattr(plan, "in_situ", None) or {}).get("factors") or {}
    bad = {k: v for k, v in cpu_scale.items() if not (isinstance(v, (int, float)) and v > 0)}
    if bad:
        raise ValueError(f"cpu_scale factors must be positive numbers, got {bad}")
    sim = _Simulation(plan, seed, client_ms)
    for pool in sim.eng.pools:
        if pool.speedup is None:  # CPU work only: a GPU's time is the stage's measured profile
            for proc in pool.procs:
                proc.scale = float(cpu_scale.get(proc.group, 1.0))
    return sim.run(rate_rps, clients, n_requests)


class _Simulation:
    def __init__(self, plan: Any, seed: int, client_ms: float):
        self.plan = plan
        self.rng = np.random.default_rng(seed)
        self.R = plan.rows_per_request
        self.profiles = list(plan.profiles)
        if not self.profiles:
            raise ValueError("the plan carries no stage profiles to simulate")
        self.ingress: IngressProfile = plan.ingress_profile or IngressProfile.unmeasured(self.R)
        nodes: list[NodeSpec] = plan.nodes or [NodeSpec("local", "localhost", 1.0, head=True)]
        self.costs: HostCosts = plan.costs or HostCosts.unmeasured({nodes[0].host: float(nodes[0].cpus)})
        self.fused = plan.layout == "fused"
        self.eng = _Engine()
        hosts = {n.node_id: n.host for n in nodes}
        pools: dict[str, _Pool] = {}
        for host in dict.fromkeys(hosts.values()):
            cores = self.costs.cores_of(host) - self.costs.busy_cores(host)
            pools[host] = _Pool(cores)
        self.eng.pools.extend(pools.values())
        head = costmodel.head_host(nodes)
        self.client = _Proc("client", "client", pools[head], 1.0)
        self.client_half = client_ms / 2000.0
        d = costmodel.demand(self.profiles, {s.name: s.max_batch_size for s in plan.stages}, self.ingress,
                             self.costs, plan.layout)
        self.front = _Proc("front", "front", pools[head], FRONT_THREADS if self.costs.front == "haproxy" else 1.0)
        self.front_half = d.front_ms / 2000.0
        self.ray = _Proc("ray", "other", pools[head], 64.0)
        self.other_s = d.other_ms / 1000.0
        kb_in, kb_out = self.ingress.body_kb, self.ingress.response_kb
        self.ingress_in = (self.costs.http_ms + self.costs.http_ms_per_kb * kb_in + self.ingress.parse_ms) / 1000.0
        self.ingress_out = (self.costs.http_ms_per_kb * kb_out + self.ingress.respond_ms
                            + self.ingress.records_ms) / 1000.0
        placement = plan.placement or {}

        def procs_for(name: str, count: int, group: str, inflation=None) -> list[_Proc]:
            where = placement.get(name) or {nodes[0].node_id: count}
            out = []
            for node, c in where.items():
                for _ in range(c):
                    out.append(_Proc(f"{name}-{len(out)}", group, pools[hosts.get(node, nodes[0].host)], 1.0,
                                     inflation))
            return out[:count] if len(out) >= count else out + [
                _Proc(f"{name}-{i}", group, pools[nodes[0].host], 1.0, inflation) for i in range(len(out), count)]

        # a fused ingress runs the first stage's batches in threads beside its event loop
        self.ingresses = procs_for("ingress", plan.ingress_processes, "ingress",
                                   self.profiles[0].inflation if self.fused else None)
        self.replicas: dict[int, list[_Proc]] = {}
        self.gpu: dict[int, dict[str, _Pool]] = {}
        for i, (stage, p) in enumerate(zip(plan.stages, self.profiles, strict=True)):
            if self.fused and i == 0:
                continue
            self.replicas[i] = procs_for(stage.name, stage.replicas, stage.name, p.inflation)
            if p.device == "gpu":
                self.gpu[i] = {}
                for proc in self.replicas[i]:
                    key = proc.pool and id(proc.pool)
                    if key not in self.gpu[i]:
                        pool = _Pool(1.0, speedup=p.gpu_speedup)
                        self.eng.pools.append(pool)
                        self.gpu[i][key] = pool
                    proc.gpu = _Proc(f"{proc.name}-gpu", f"{stage.name} (GPU)", self.gpu[i][key], 1e9)
        self.latencies: list[float] = []
        self.finish_times: list[float] = []

    # --- a request ---------------------------------------------------------------------
    def start(self, request: dict) -> None:
        request["t0"] = self.eng.t
        reach = [self.R]
        for k in range(1, len(self.profiles)):
            ratio = self.profiles[k].scale / max(self.profiles[k - 1].scale, 1e-12)
            reach.append(int(self.rng.binomial(reach[-1], min(1.0, ratio))) if reach[-1] else 0)
        request["reach"] = reach
        self.eng.work(self.client, self.client_half, lambda: self.eng.work(
            self.front, self.front_half, lambda: self._enter(request)))

    def _enter(self, request: dict) -> None:
        least = min(p.ongoing for p in self.ingresses)
        choices = [p for p in self.ingresses if p.ongoing == least]
        ing = choices[int(self.rng.integers(len(choices)))]
        ing.ongoing += 1
        request["ingress"] = ing
        self.eng.work(ing, self.ingress_in, lambda: self._stage(request, 0))

    def _stage(self, request: dict, k: int) -> None:
        if k >= len(self.profiles) or request["reach"][k] == 0:
            self._respond(request)
            return
        ing = request["ingress"]
        co = ing.coalescers.setdefault(k, {"queue": deque(), "in_flight": 0})
        co["queue"].append(request)
        self._dispatch(ing, k)

    def _limit(self, k: int) -> int:
        if self.fused and k == 0:
            return CONCURRENT_BATCHES
        return len(self.replicas[k]) * CONCURRENT_BATCHES

    def _dispatch(self, ing: _Proc, k: int) -> None:
        co = ing.coalescers[k]
        while co["in_flight"] < self._limit(k) and co["queue"]:
            items, rows = [], 0
            while co["queue"] and (not items or rows + co["queue"][0]["reach"][k] <= INGRESS_BATCH_ROWS):
                item = co["queue"].popleft()
                items.append(item)
                rows += item["reach"][k]
            co["in_flight"] += 1
            self._call(ing, k, items, rows)

    def _call(self, ing: _Proc, k: int, items: list[dict], rows: int) -> None:
        profile = self.profiles[k]

        def back() -> None:
            ing.coalescers[k]["in_flight"] -= 1
            for item in items:
                self._stage(item, k + 1)
            self._dispatch(ing, k)

        if self.fused and k == 0:
            wall, cpu = profile.service_time(rows), profile.cpu_time(rows)
            cpu += self.costs.local_request_ms / 1000.0 * len(items)
            self.eng.work(ing, cpu, lambda: self._wait(wall - cpu, back))
            return
        caller, callee = self.costs.hop_ms(costmodel.call_kb(self.profiles, k, rows, self.ingress))
        caller += self.costs.hop_caller_request_ms * len(items)
        callee += self.costs.hop_callee_request_ms * len(items)
        replicas = self.replicas[k]
        if len(replicas) > 2:
            a, b = self.rng.choice(len(replicas), 2, replace=False)
            rep = replicas[a] if replicas[a].ongoing <= replicas[b].ongoing else replicas[b]
        else:
            rep = min(replicas, key=lambda p: p.ongoing)
        stage = self.plan.stages[k]

        def returned() -> None:
            rep.ongoing -= 1
            self.eng.work(rep, callee / 2000.0, lambda: self.eng.work(ing, caller / 2000.0, back))

        def arrive() -> None:
            rep.ongoing += 1
            chunks = [min(stage.max_batch_size, rows - s) for s in range(0, rows, stage.max_batch_size)]
            call = {"left": len(chunks), "done": returned}
            for c in chunks:
                rep.batch_queue.append((self.eng.t, c, call))
                rep.queued_rows += c
            self._batch(rep, k)

        self.eng.work(ing, caller / 2000.0, lambda: self.eng.work(rep, callee / 2000.0, arrive))

    def _batch(self, rep: _Proc, k: int) -> None:
        stage, profile = self.plan.stages[k], self.profiles[k]
        while rep.running < CONCURRENT_BATCHES and rep.batch_queue:
            oldest = rep.batch_queue[0][0]
            due = oldest + stage.batch_wait_timeout_s
            if rep.queued_rows < stage.max_batch_size and self.eng.t < due - 1e-12:
                if rep.wake_at is None or rep.wake_at > due:
                    rep.wake_at = due
                    self.eng.at(due, lambda: self._wake(rep, k))
                return
            taken, calls = 0, []
            while rep.batch_queue and (not calls or taken + rep.batch_queue[0][1] <= stage.max_batch_size):
                _, c, call = rep.batch_queue.popleft()
                taken += c
                calls.append(call)
            rep.queued_rows -= taken
            rep.running += 1

            def finished(calls=calls) -> None:
                rep.running -= 1
                for call in calls:
                    call["left"] -= 1
                    if call["left"] == 0:
                        call["done"]()
                self._batch(rep, k)

            worker = getattr(rep, "gpu", rep)
            if worker is not rep:  # a GPU: the device's time
                self.eng.work(worker, profile.service_time(taken), finished)
            else:  # CPU on the replica's process, then what the batch waits for (lookups)
                wall, cpu = profile.service_time(taken), profile.cpu_time(taken)
                self.eng.work(rep, cpu, lambda f=finished, w=wall - cpu: self._wait(w, f))

    def _wait(self, seconds: float, then) -> None:
        if seconds <= 1e-9:
            then()
        else:
            self.eng.at(self.eng.t + seconds, then)

    def _wake(self, rep: _Proc, k: int) -> None:
        rep.wake_at = None
        self._batch(rep, k)

    def _respond(self, request: dict) -> None:
        ing = request["ingress"]

        def out() -> None:
            ing.ongoing -= 1
            self.eng.work(self.ray, self.other_s, lambda: None)
            self.eng.work(self.front, self.front_half, lambda: self.eng.work(
                self.client, self.client_half, lambda: self._done(request)))

        self.eng.work(ing, self.ingress_out, out)

    def _done(self, request: dict) -> None:
        self.latencies.append(self.eng.t - request["t0"])
        self.finish_times.append(self.eng.t)
        then = request.get("then")
        if then is not None:
            then()

    # --- the run -----------------------------------------------------------------------
    def run(self, rate_rps: float | None, clients: int | None, n_requests: int) -> SimulationResult:
        sent = 0

        def closed_loop_next() -> None:
            nonlocal sent
            if sent >= n_requests:
                return
            sent += 1
            self.start({"then": closed_loop_next})

        def arrival() -> None:
            nonlocal sent
            if sent >= n_requests:
                return
            sent += 1
            self.start({})
            self.eng.at(self.eng.t + self.rng.exponential(1.0 / rate_rps), arrival)

        if clients is not None:
            for c in range(clients):
                self.eng.at(1e-5 * c, closed_loop_next)
        else:
            self.eng.at(self.rng.exponential(1.0 / rate_rps), arrival)
        while len(self.latencies) < n_requests and self.eng.step():
            pass
        return self._result(rate_rps, clients)

    def _result(self, rate_rps: float | None, clients: int | None) -> SimulationResult:
        n = len(self.latencies)
        skip = int(n * WARMUP_SHARE)
        lat = np.asarray(self.latencies[skip:]) * 1000.0
        t_start = self.finish_times[skip - 1] if skip > 0 else 0.0
        span = max(self.finish_times[-1] - t_start, 1e-9)
        rps = (n - skip) / span
        groups: dict[str, list[_Proc]] = {}
        for pool in self.eng.pools:
            for p in pool.procs:
                groups.setdefault(p.group, []).append(p)
        total = max(self.eng.t, 1e-9)
        util = {g: sum(p.busy for p in ps) / (total * len(ps)) for g, ps in groups.items()}
        cpu = {g: 1000.0 * sum(p.busy for p in ps) / max(n, 1) for g, ps in groups.items()}
        return SimulationResult(
            rate_rps=float(rate_rps if rate_rps is not None else rps), completed=n,
            throughput_rows_s=float(rps * self.R), throughput_rps=float(rps),
            p50_ms=float(np.percentile(lat, 50)), p99_ms=float(np.percentile(lat, 99)),
            mean_ms=float(lat.mean()), utilization=util, cpu_ms=cpu,
        )
