"""Correct a plan's CPU model from a few seconds of the running app (in-situ calibration).

A plan charges each group of processes (the ingress, each stage, the HTTP front, Ray's own
processes, a co-located load generator) the CPU per request that its profiles say: stage
models timed in-process, HTTP and hop costs timed on probe deployments
(:mod:`serving.measure.calibrate`). A running app can spend more than the parts did apart: a fused
ingress runs its first stage in threads that share one GIL with its event loop, and Ray's own
processes do more per request around a real app than around an echo probe. Those are
properties of the deployed app, so they are measured on it: read every process's CPU from
/proc while a fraction of the planned load runs for a few seconds, simulate the plan at that
same load, and take measured over modelled CPU per group as a factor that the simulation then
applies to that group's work (``simulate(cpu_scale=...)``). CPU time, not wall time, is
compared, so other users' load on the machine does not leak into the factors.

InferLine profiles each model in the container that serves it for the same reason.

:func:`probe` runs the measurement against a deployed app (``serving.deploy`` does so before
it returns, ``insitu=``, through :mod:`serving.launch.insitu`; ``benchmarks.serving`` reads the result); :func:`unreadable` says why a
cluster's processes cannot be read from here (they run on other machines).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from serving.core.procstat import cpu_per_request, process_cpu, session_dir, session_processes
from serving.measure.loadgen import settled_heap
from serving.planning.simulate import simulate

#: share of the planned closed-loop clients the probe runs (a light load: batches merge less
#: than at the bound, so the factors err on the side of more CPU per request)
PROBE_CLIENT_SHARE = 0.25
#: seconds of probe traffic
PROBE_S = 4.0
#: groups the model charges less than this (ms per request) keep factor 1: a ratio of two
#: near-zero figures says nothing
MIN_MODELLED_MS = 0.05
#: closed-loop clients of the probe deploy runs (a quarter of 16)
DEPLOY_PROBE_CLIENTS = 4
#: seconds of traffic before the probe's measurement (first calls import, fill caches, and
#: Serve's routers learn the replicas)
WARMUP_S = 2.0
#: most requests the probe sends (a bound on a very fast app's probe)
MAX_PROBE_REQUESTS = 20_000
#: distinct request bodies deploy's probe cycles through
PROBE_BODIES = 64
#: simulated requests behind the modelled CPU figures
SIMULATED_REQUESTS = 2000
#: header marking the probe's requests (with deploy's one-off token as its value): the
#: ingress builds their monitor records, as for any request, then drops them
PROBE_HEADER = "X-Willump-Probe"
#: measured roles (serving.core.procstat.cpu_per_request) that the simulation names differently
ROLE_TO_GROUP = {"load generator": "client"}
#: groups whose CPU does not scale with requests, so that a ratio per request measured at the
#: probe's rate would be wrong at another: Ray's own processes (calibration splits them into
#: cores while serving plus CPU per request, serving.measure.calibrate.split_rest)
NOT_PER_REQUEST = frozenset({"other"})


def probe_clients(clients: int, share: float = PROBE_CLIENT_SHARE) -> int:
    """Closed-loop clients of the probe for a phase of ``clients``."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    return max(1, round(clients * share))


def cpu_factors(measured: dict[str, float], modelled: dict[str, float],
                min_modelled_ms: float = MIN_MODELLED_MS) -> dict[str, float]:
    """Measured over modelled CPU ms per request, per simulated group.

    ``measured``: roles as :func:`serving.core.procstat.cpu_per_request` names them ("ingress", a
    stage, "front", "other", "load generator"; "total" is ignored). ``modelled``: the
    simulation's ``cpu_ms`` at the same load. Groups the model barely charges, groups the probe
    did not see, GPU groups and ``NOT_PER_REQUEST`` keep their modelled cost (no factor)."""
    factors: dict[str, float] = {}
    for role, ms in measured.items():
        group = ROLE_TO_GROUP.get(role, role)
        model = modelled.get(group)
        if role == "total" or model is None or group.endswith("(GPU)") or group in NOT_PER_REQUEST:
            continue
        if model < min_modelled_ms or not math.isfinite(ms) or ms <= 0:
            continue
        factors[group] = ms / model
    return factors


def summary(factors: dict[str, Any]) -> str:
    return ", ".join(f"{k} x{v:.2f}" for k, v in sorted(factors.items())) or "none"


def unreadable(nodes: Sequence[Any], gcs_address: str) -> str | None:
    """Why the processes of the Ray at ``gcs_address`` cannot all be read from /proc here, or
    None when they can (every node on this machine)."""

    if not os.path.isdir("/proc"):
        return "this machine has no /proc to read processes' CPU from"
    import ray

    here = ray.util.get_node_ip_address()
    away = sorted({n.host for n in nodes if n.host != here})
    if away:
        return f"the app runs on other machines too ({', '.join(away)}); /proc is read on this one only"
    if session_dir(gcs_address) is None:
        return "this Ray's processes are not on this machine"
    return None


def probe(url: str, payloads: Sequence[bytes], rows_per_request: int, plan: Any, app: str, *,
          session: str, clients: int = DEPLOY_PROBE_CLIENTS, seconds: float = PROBE_S,
          warmup_s: float = WARMUP_S, headers: dict[str, str] | None = None,
          max_requests: int = MAX_PROBE_REQUESTS, seed: int = 0,
          charge_to: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Load the app at ``url`` (``POST .../predict``) with a closed loop of ``clients`` for
    ``seconds`` after ``warmup_s``, read every process of the Ray ``session`` from /proc, and
    compare each group's CPU per request with what ``plan``'s model charges at that load.

    Returns the probe's load and figures with ``factors`` (:func:`cpu_factors`) for
    ``simulate(cpu_scale=...)`` and ``plan_stages(cpu_scale=...)``. ``charge_to`` maps roles
    the plan has no deployment for to the one whose work they do (a module chain's partition
    stages to the stage that calls them): their CPU counts in that one's factor. Raises RuntimeError when
    the app answered no probe request. Runs its HTTP client on a thread of its own, so it
    may be called from inside a running event loop (a notebook)."""
    from serving.measure.loadgen import closed_loop

    if seconds <= 0 or warmup_s < 0:
        raise ValueError(f"seconds must be positive and warmup_s >= 0, got {seconds}, {warmup_s}")

    def load(duration: float) -> dict[str, Any]:
        return asyncio.run(closed_loop(url, payloads, rows_per_request, clients=clients, duration=duration,
                                       max_requests=max_requests, headers=headers))

    # the heap settled once, before the CPU readings: the load's own collection is not the app's
    with settled_heap(), concurrent.futures.ThreadPoolExecutor(1) as pool:
        if warmup_s > 0:
            pool.submit(load, warmup_s).result()
        before = process_cpu()
        run = pool.submit(load, seconds).result()
        after = process_cpu()
    if run["requests"] == 0:
        raise RuntimeError(f"the in-situ probe got no answer from {url} ({run['errors']} errors)")
    measured = cpu_per_request(before, after, run["requests"], app, session_processes(session))
    client_ms = plan.costs.client_ms if plan.costs is not None else 0.0
    modelled = simulate(plan, clients=clients, n_requests=SIMULATED_REQUESTS, seed=seed, client_ms=client_ms,
                        cpu_scale={}).cpu_ms
    return {"clients": clients, "seconds": seconds, "requests": run["requests"], "errors": run["errors"],
            "rows_per_s": run["rows_per_s"], "p99_ms": run["p99_ms"],
            "measured_cpu_ms_per_request": measured, "modelled_cpu_ms_per_request": modelled,
            "factors": cpu_factors(charged(measured, charge_to or {}), modelled)}


def charged(measured: dict[str, float], charge_to: Mapping[str, str]) -> dict[str, float]:
    """``measured`` with each role of ``charge_to`` added to the role it works for (and
    dropped): a module chain's processes do the calling stage's module work, which the plan
    times inside that stage. Without this the stage looked cheaper than modelled (the module
    ran elsewhere) and the chain's CPU was charged to nothing: on 2 cores the in-situ probe
    raised a chained cascade's bound from 1,341 to 1,722 rows/s where 1,059 were served."""
    out = dict(measured)
    for role, target in charge_to.items():
        if role in out and role != target:
            out[target] = out.get(target, 0.0) + out.pop(role)
    return out


def probe_blocked(mode: str, nodes: list, min_replicas: int | None) -> str | None:
    """Why the in-situ probe cannot run here (None: it can); raises for ``mode="always"``."""
    if mode == "never":
        return "insitu='never'"
    if min_replicas is not None:
        why = "the stages autoscale (min_replicas): their replica counts are Serve's, not the plan's"
    else:
        import ray

        why = unreadable(nodes, ray.get_runtime_context().gcs_address)
    if why and mode == "always":
        raise ValueError(f"insitu='always', but the in-situ probe cannot run: {why}")
    return why
