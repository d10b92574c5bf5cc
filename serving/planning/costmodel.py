"""CPU per request of every process of an app, the throughput bound it implies, and where
Serve will put the replicas.

A request of R rows costs, in CPU milliseconds:

* the HTTP front: ``front_ms + front_ms_per_kb * (body + answer KB)``;
* the ingress: its HTTP handling, the route's own work (parse, answer, records), the
  caller's side of every stage call, and with ``layout="fused"`` the first stage's models;
* a stage replica: the callee's side of its calls plus ``R * scale * T(b) / b`` of model
  time at batch b (on the GPU for a GPU stage, whose hop costs stay on the CPU);
* Ray's own processes: ``other_ms``, and while the app serves, ``serving_cores`` of the
  head's machine whatever the rate (with the idle ``background_cores``, off its cores).

The bound on requests/s is the least of: each deployment's processes (a Python process
does about one core of work: the GIL), each GPU (one server whose throughput with k
processes is the measured ``speedup(k)``), each machine's cores (shared by every process
on it, less what Ray uses at idle) and the logical CPUs the app may reserve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serving.core.constants import CONCURRENT_BATCHES
from serving.core.costs import HostCosts
from serving.core.profiles import IngressProfile, NodeSpec, StageProfile

#: least logical CPUs a replica reserves (Ray needs a positive figure to place it)
MIN_REPLICA_CPUS = 0.05
#: most logical CPUs a replica reserves: one Python process does about one core of work
MAX_REPLICA_CPUS = 1.0
#: logical CPUs of the monitor replica (fed off the critical path)
MONITOR_CPUS = 0.1


@dataclass
class Demand:
    """CPU (and GPU) milliseconds one request costs each deployment, and what it moves."""

    cpu_ms: dict[str, float]  # deployment -> CPU ms per request (all its replicas together)
    wait_ms: dict[str, float]  # deployment -> ms per request its batches spend waiting (lookups)
    gpu_ms: dict[str, float]  # GPU stage -> model ms per request on one GPU process
    front_ms: float
    other_ms: float
    calls: dict[str, float]  # stage -> calls per request
    call_kb: dict[str, float]  # stage -> KB per call (arguments + results)


def reach(profile: StageProfile, rows: int) -> float:
    """Chance that a request of ``rows`` rows sends at least one row to this stage."""
    if profile.scale >= 1.0:
        return 1.0
    return 1.0 - (1.0 - profile.scale) ** rows


def call_kb(profiles: list[StageProfile], index: int, rows: float, ingress: IngressProfile) -> float:
    """KB moved by a stage call carrying ``rows`` rows of the request: the rows (and for a
    later stage their blocks), the results, and blocks handed on for the next stage."""
    p = profiles[index]
    kb = rows * (ingress.rows_kb_per_row + ingress.result_kb_per_row)
    if index > 0:
        kb += rows * ingress.blocks_kb_per_row
    if index + 1 < len(profiles):
        share = profiles[index + 1].scale / max(p.scale, 1e-12)
        kb += rows * share * ingress.blocks_kb_per_row
    return kb


def demand(profiles: list[StageProfile], batches: dict[str, int], ingress: IngressProfile,
           costs: HostCosts, layout: str, *, requests_per_call: float = 1.0) -> Demand:
    """CPU per request of each deployment (``requests_per_call``: how many requests the
    ingress merges into one stage call; 1 is the pessimistic figure the planner uses)."""
    r = ingress.rows_per_request
    kb_http = ingress.body_kb + ingress.response_kb
    ingress_ms = costs.http_ms + costs.http_ms_per_kb * kb_http + ingress.per_request_ms()
    cpu = {"ingress": 0.0}
    wait = {"ingress": 0.0}
    gpu: dict[str, float] = {}
    calls: dict[str, float] = {}
    kbs: dict[str, float] = {}
    for i, p in enumerate(profiles):
        rows = r * p.scale
        b = batches[p.name]
        # at the bound every process is busy, running CONCURRENT_BATCHES batches at once
        model_ms = 1000.0 * rows * p.cpu_time(b) / b * p.inflation(CONCURRENT_BATCHES)
        wait_ms = 1000.0 * rows * (p.service_time(b) - p.cpu_time(b)) / b
        if layout == "fused" and i == 0:
            ingress_ms += model_ms + costs.local_request_ms
            wait["ingress"] += wait_ms
            continue
        wait[p.name] = wait_ms
        n_calls = reach(p, r) / max(requests_per_call, 1.0)
        kb = call_kb(profiles, i, rows / max(reach(p, r), 1e-12), ingress) * max(requests_per_call, 1.0)
        caller, callee = costs.hop_ms(kb)
        caller += costs.hop_caller_request_ms * max(requests_per_call, 1.0)
        callee += costs.hop_callee_request_ms * max(requests_per_call, 1.0)
        ingress_ms += n_calls * caller
        calls[p.name], kbs[p.name] = n_calls, kb
        if p.device == "gpu":
            cpu[p.name] = n_calls * callee
            gpu[p.name] = model_ms
        else:
            cpu[p.name] = n_calls * callee + model_ms
    cpu["ingress"] = ingress_ms
    return Demand(cpu, wait, gpu, costs.front_ms + costs.front_ms_per_kb * kb_http, costs.other_ms, calls, kbs)


def scaled(d: Demand, cpu_scale: dict[str, float] | None) -> Demand:
    """The demand with each group's CPU multiplied by its measured-over-modelled factor
    (:mod:`serving.measure.insitu`: "ingress", a stage's name, "front"); other groups as modelled."""
    if not cpu_scale:
        return d
    cpu = {k: v * float(cpu_scale.get(k, 1.0)) for k, v in d.cpu_ms.items()}
    return Demand(cpu, dict(d.wait_ms), dict(d.gpu_ms), d.front_ms * float(cpu_scale.get("front", 1.0)),
                  d.other_ms, dict(d.calls), dict(d.call_kb))


def replica_cpus(d: Demand, replicas: dict[str, int], rate: float) -> dict[str, float]:
    """Logical CPUs each replica reserves: what it uses at ``rate`` requests/s, within
    [MIN_REPLICA_CPUS, MAX_REPLICA_CPUS], rounded down to Ray's resolution (1e-4) so that
    reservations made for a budget add up to no more than it."""
    out = {}
    for name, ms in d.cpu_ms.items():
        use = rate * ms / 1000.0 / max(replicas[name], 1)
        out[name] = min(MAX_REPLICA_CPUS, max(MIN_REPLICA_CPUS, math.floor(use * 1e4) / 1e4))
    return out


def place(nodes: list[NodeSpec], replicas: dict[str, int], cpus: dict[str, float],
          gpus: dict[str, float], fixed: dict[str, tuple[float, str | None]],
          pinned: dict[str, set[str]] | None = None) -> dict[str, dict[str, int]] | str:
    """Serve's SPREAD placement, replayed: each replica on the node holding the fewest of its
    deployment's replicas that has room (ties: most free CPU). ``fixed`` holds replicas
    pinned by name to a node ("head") or anywhere (None); ``pinned`` restricts a deployment to
    some nodes (a node pool's). Returns deployment -> node -> count, or a message saying what
    does not fit."""
    pinned = pinned or {}
    free_cpu = {n.node_id: n.cpus for n in nodes}
    free_gpu = {n.node_id: n.gpus for n in nodes}
    head = next((n.node_id for n in nodes if n.head), nodes[0].node_id)
    placement: dict[str, dict[str, int]] = {}
    for name, (need, where) in fixed.items():
        node = head if where == "head" else max(free_cpu, key=lambda k: free_cpu[k])
        if free_cpu[node] + 1e-9 < need:
            return f"the {name} replica needs {need:.2f} CPUs but node {node[:8]} has {free_cpu[node]:.2f} free"
        free_cpu[node] -= need
        placement[name] = {node: 1}
    order = sorted(replicas, key=lambda k: (-gpus.get(k, 0.0), -cpus[k]))
    for name in order:
        counts: dict[str, int] = {}
        for _ in range(replicas[name]):
            fits = [n for n in free_cpu if free_cpu[n] + 1e-9 >= cpus[name]
                    and free_gpu[n] + 1e-9 >= gpus.get(name, 0.0) and (name not in pinned or n in pinned[name])]
            if not fits:
                listing = ", ".join(f"{n[:8]}: {free_cpu[n]:.2f} CPUs/{free_gpu[n]:.2f} GPUs free"
                                    for n in free_cpu)
                return (f"replica {(counts and sum(counts.values()) + 1) or 1} of {replicas[name]} of "
                        f"'{name}' needs {cpus[name]:.2f} CPUs and {gpus.get(name, 0.0):.2f} GPUs, "
                        f"which no node has ({listing})")
            node = min(fits, key=lambda n: (counts.get(n, 0), -free_cpu[n]))
            free_cpu[node] -= cpus[name]
            free_gpu[node] -= gpus.get(name, 0.0)
            counts[node] = counts.get(node, 0) + 1
        placement[name] = counts
    return placement


def host_of(nodes: list[NodeSpec]) -> dict[str, str]:
    return {n.node_id: n.host for n in nodes}


def head_host(nodes: list[NodeSpec]) -> str:
    return next((n.host for n in nodes if n.head), nodes[0].host)


def bound(d: Demand, replicas: dict[str, int], placement: dict[str, dict[str, int]],
          nodes: list[NodeSpec], costs: HostCosts, profiles: dict[str, StageProfile],
          budget_cpus: float, fixed_cpus: float, client_ms: float = 0.0) -> tuple[float, str, dict[str, float]]:
    """Most requests/s the app sustains, the constraint that sets it, and the CPU each
    deployment and host would use there (cores)."""
    limits: dict[str, float] = {}
    for name, ms in d.cpu_ms.items():
        if ms > 0:
            limits[f"processes of {name}"] = 1000.0 * replicas[name] / ms
    for name, ms in d.wait_ms.items():  # batches that wait overlap, CONCURRENT_BATCHES per process
        busy = ms + d.cpu_ms.get(name, 0.0)
        if ms > 0 and busy > 0:
            limits[f"batches of {name}"] = 1000.0 * replicas[name] * CONCURRENT_BATCHES / busy
    for name, ms in d.gpu_ms.items():
        if ms > 0:
            per_gpu = _replicas_per_gpu(placement.get(name, {}), replicas[name])
            limits[f"GPU of {name}"] = 1000.0 * sum(profiles[name].gpu_speedup(k) for k in per_gpu) / ms
    hosts = host_of(nodes)
    load: dict[str, float] = {}
    head = head_host(nodes)
    load[head] = d.front_ms + d.other_ms + client_ms
    for name, ms in d.cpu_ms.items():
        for node, count in placement.get(name, {}).items():
            load[hosts[node]] = load.get(hosts[node], 0.0) + ms * count / max(replicas[name], 1)
    for host, ms in load.items():
        cores = costs.cores_of(host) - costs.busy_cores(host)
        if ms > 0:
            limits[f"cores of {host}"] = 1000.0 * max(cores, 0.05) / ms
    logical = sum(d.cpu_ms.values())
    if logical > 0:
        limits["logical CPUs"] = 1000.0 * max(budget_cpus - fixed_cpus, 0.01) / logical
    name = min(limits, key=limits.get)
    rate = limits[name]
    usage = {k: rate * ms / 1000.0 for k, ms in d.cpu_ms.items()}
    usage.update({f"host {h}": rate * ms / 1000.0 for h, ms in load.items()})
    return rate, name, usage


def _replicas_per_gpu(counts: dict[str, int], total: int) -> list[int]:
    """Replicas sharing each GPU, assuming Ray packs a node's fractional GPU replicas onto as
    few GPUs as fit (each asks 1/k of one)."""
    if not counts:
        return [max(total, 1)]
    return [c for c in counts.values() if c > 0]


def summary(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in values.items())
