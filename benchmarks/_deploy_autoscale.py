"""The autoscaling section of :mod:`benchmarks.deploy_cluster`: the planner as Serve's autoscaler
(``deploy(autoscaler="planner")``, serving.planning.autoscale) against Ray Serve's default
policy (``autoscaler="serve"``: ``target_ongoing_requests`` per replica, as deploy sets it), on a
bursty trace.

One node (the head), an **emulated** device of a fixed speed on it (``--autoscale-ms-per-row``,
node label ``willump.io/emulated-ms-per-row``: a stage replica holds each batch at least that
many ms a row, one batch at a time), so a replica's capacity is the device's whatever this
machine's two shared cores carry, and adding replicas adds capacity. (The compute-relative
``emulated-slowdown`` device fed back: under load the cores stretched the compute time and the
device's with it, and the same trace read 3.8% to 62% SLO violations from run to run.) Two apps of the same artifact and plan, every model stage autoscaled from 1 to
``--autoscale-max`` replicas with the same delays; only the policy differs. Per round (the apps'
order alternating), each app alone: open-loop Poisson arrivals at ``--autoscale-rate``, then
four times it, then the base rate again, ``--autoscale-phase-s`` each. Measured per app:
the share of requests slower than ``--slo-ms`` or failed (``slo_violation_share``) and the
model stages' replica-seconds over the trace (replicas starting or running, sampled every
``SAMPLE_S`` from Serve's status).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the apps: the planner's policy and Serve's default one (deploy's own target and delays)
AUTOSCALE_APPS = {"planner": {"autoscaler": "planner"}, "default": {"autoscaler": "serve"}}
#: the emulated device in this section: ms a row (a 32-row request holds a replica 96 ms: about 10
#: requests/s a replica, so the base rate needs one and the burst three; at twice the rates the
#: one ingress on this machine's two cores, not the stage, bounded the burst for either policy)
AUTOSCALE_MS_PER_ROW = 3.0
#: base rate of the trace (requests/s); the burst is BURST times it
AUTOSCALE_RATE = 5.0
BURST = 4.0
#: seconds of each of the trace's three phases (x1, x4, x1)
AUTOSCALE_PHASE_S = 60.0
#: most replicas a model stage may scale to
AUTOSCALE_MAX = 6
#: a request slower than this is an SLO violation (failed ones are too)
SLO_MS = 1000.0
#: logical CPUs a stage replica asks (they mostly sleep on the emulated device)
STAGE_CPUS = 0.1
#: logical CPUs of the one node: the two ingresses (1.1 each) and both apps' stage replicas at
#: their most (0.1 each), with room to spare (the replicas mostly sleep on the emulated device)
HEAD_CPUS = math.ceil(2 * 1.1 + 2 * 2 * AUTOSCALE_MAX * STAGE_CPUS + 1.0)
#: seconds between two samples of the replicas running
SAMPLE_S = 1.0
#: seconds a stage waits idle before it gives a replica back (deploy's downscale delay here)
DOWNSCALE_S = 20.0
#: seconds of base-rate load each app gets before its trace, and rest between traces
WARMUP_S = 10.0
REST_S = 30.0


def _replicas(app: str, states: tuple[str, ...] = ("RUNNING", "STARTING")) -> int:
    """Model-stage replicas of ``app`` in these states (starting or running: what holds resources)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return 0
    return sum(d.replica_states.get(state, 0) for name, d in status.deployments.items()
               if not name.endswith("-ingress") for state in states)


@contextlib.contextmanager
def replicas_sampled(app: str, starting: list[tuple[float, int]] | None = None) -> Iterator[list[tuple[float, int]]]:
    """(time, model-stage replicas of ``app``) every SAMPLE_S while the block runs; (time, those
    still starting) into ``starting`` where given."""
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), _replicas(app)))
            if starting is not None:
                starting.append((time.monotonic(), _replicas(app, ("STARTING",))))
            stop.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join()


def replica_seconds(samples: list[tuple[float, int]]) -> float:
    """Replica-seconds of the samples (each count held until the next sample)."""
    return sum((t1 - t0) * n0 for (t0, n0), (t1, _) in itertools.pairwise(samples))


def mean_start_s(samples: list[tuple[float, int]], starting: list[tuple[float, int]]) -> float | None:
    """Seconds a replica spent starting, from Serve's status sampled once a second (Little's
    law: replica-seconds in STARTING over the replicas added); None without an added replica."""
    added = sum(max(n1 - n0, 0) for (_, n0), (_, n1) in itertools.pairwise(samples))
    return replica_seconds(starting) / added if added else None


def policy_starts(app: str) -> list[float]:
    """The replica starts the planner's policy measured for ``app``'s stages, as it logged them
    in Serve's controller log (serving.planning.autoscale.START_LOG) on this Ray's session."""
    import re

    import ray

    from serving.planning.autoscale import START_LOG

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    pattern = re.compile(re.escape(f"{START_LOG} {app}/") + r"[^:]+: replica start ([0-9., ]+) s;")
    out: list[float] = []
    for log in sorted((session / "logs" / "serve").glob("controller_*.log*")):  # rotated ones too
        for line in log.read_text(errors="replace").splitlines():
            found = pattern.search(line)
            if found:
                out += [float(x) for x in found.group(1).split(",")]
    return out


def policy_asks(app: str) -> list[str]:
    """Each ask of the planner's policy for more replicas than ran, for ``app``'s stages, with
    what it read (serving.planning.autoscale.SCALE_LOG lines of Serve's controller log)."""
    import ray

    from serving.planning.autoscale import SCALE_LOG

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    out: list[str] = []
    for log in sorted((session / "logs" / "serve").glob("controller_*.log*")):
        for line in log.read_text(errors="replace").splitlines():
            if f"{SCALE_LOG} {app}/" in line:
                out.append(line.split(f"{SCALE_LOG} ", 1)[1])
    return out


def _trace(url: str, app: str, payloads: list[bytes], args, seed: int) -> dict[str, Any]:
    """The bursty trace on one app, its replicas sampled meanwhile."""
    from serving.measure.loadgen import open_loop

    phases = []
    with replicas_sampled(app) as samples:
        for i, factor in enumerate((1.0, BURST, 1.0)):
            phases.append(asyncio.run(open_loop(url, payloads, rate=args.autoscale_rate * factor,
                                                duration=args.autoscale_phase_s, seed=seed + i, slo_ms=args.slo_ms)))
    answered = sum(p["requests"] for p in phases)
    failed = sum(p["errors"] for p in phases)
    slow = sum(p["over_slo"] for p in phases)
    return {"slo_violation_share": (slow + failed) / max(answered + failed, 1), "replica_seconds": replica_seconds(samples),
            "requests": answered + failed, "failed": failed, "over_slo": slow,
            "max_replicas_seen": max((n for _, n in samples), default=0),
            "p99_ms": [p["p99_ms"] for p in phases], "replicas": [n for _, n in samples]}


def autoscaling(opt: Any, payloads: list[bytes], args) -> dict[str, Any]:
    """The section (module docstring); a failure is recorded, not raised."""
    from benchmarks.deploy_cluster import with_cluster
    from serving.measure.loadgen import open_loop
    from serving.runtime.emulated_node import MS_PER_ROW_LABEL

    def run(apps: dict[str, Any]) -> dict[str, Any]:
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in apps}
        for r in range(args.autoscale_rounds):
            order = list(apps) if r % 2 == 0 else list(apps)[::-1]
            for name in order:
                url = apps[name].url + "/predict"
                asyncio.run(open_loop(url, payloads, rate=args.autoscale_rate, duration=WARMUP_S, seed=99))
                out = _trace(url, name, payloads, args, seed=1000 * r)
                rounds[name].append(out)
                print(f"  autoscaling round {r + 1} {name}: {out['slo_violation_share']:.2%} over {args.slo_ms:g} ms "
                      f"or failed ({out['failed']} failed of {out['requests']}), {out['replica_seconds']:.0f} "
                      f"replica-seconds, up to {out['max_replicas_seen']} replicas; p99 by phase "
                      f"{[round(p) for p in out['p99_ms'] if p is not None]} ms", flush=True)
                time.sleep(REST_S)
        med = {name: {k: statistics.median(x[k] for x in runs) for k in ("slo_violation_share", "replica_seconds")}
               for name, runs in rounds.items()}
        return {"slo_violation_share": med["planner"]["slo_violation_share"],
                "replica_seconds": med["planner"]["replica_seconds"],
                "default_slo_violation_share": med["default"]["slo_violation_share"],
                "default_replica_seconds": med["default"]["replica_seconds"],
                "replica_seconds_saved": med["default"]["replica_seconds"] / max(med["planner"]["replica_seconds"], 1e-9),
                "slo_ms": args.slo_ms, "rate": args.autoscale_rate, "burst": BURST, "phase_s": args.autoscale_phase_s,
                "ms_per_row": args.autoscale_ms_per_row, "emulated": True, "rounds": rounds}

    # the same plan for both apps, every model stage from one replica, only the policy differs
    apps = {name: {**options, "min_replicas": 1, "max_replicas": args.autoscale_max,
                   "downscale_to_zero_s": DOWNSCALE_S} for name, options in AUTOSCALE_APPS.items()}
    return with_cluster({MS_PER_ROW_LABEL: f"{args.autoscale_ms_per_row:g}"}, [], opt, apps, args, run,
                        head_cpus=HEAD_CPUS, replicas=1, stage_cpus=STAGE_CPUS)


def summary(a: dict[str, Any]) -> str:
    return (f"autoscaling (emulated device {a['ms_per_row']:g} ms a row, x1 -> x{a['burst']:g} -> x1 at {a['rate']:g} req/s, "
            f"{a['phase_s']:g} s each): planner {a['slo_violation_share']:.2%} over {a['slo_ms']:g} ms or failed, "
            f"{a['replica_seconds']:.0f} replica-seconds; Serve's default {a['default_slo_violation_share']:.2%}, "
            f"{a['default_replica_seconds']:.0f}; default / planner replica-seconds {a['replica_seconds_saved']:.2f}x")
