"""Alternating rounds for the serving benchmark: every app deployed at once, each measured in
turn (A B C A B C ...) with the same clients and payloads, the medians kept, and each round's
CPU per request read from /proc; what a request costs beyond the pipeline's own work."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from serving.core.procstat import cpu_per_request, process_cpu, session_processes
from serving.measure.loadgen import closed_loop, settled_heap

#: rounds each app is measured in (the medians are reported)
ROUNDS = 3
#: roles of cpu_per_request that are not the measured app's CPU: the load generator, and the
#: idle replicas of the other apps deployed beside it for the rounds
CLIENT_ROLE = "load generator"
OTHER_APPS = "other apps"


def measure_rounds(urls: dict[str, str], bodies: Sequence[bytes], *, rows_each: int, clients: int,
                   duration: float, max_requests: int, rounds: int, session: str | None,
                   extra: Callable[..., dict[str, Any]] | None = None,
                   local: dict[str, Callable[[], dict[str, Any]]] | None = None) -> dict[str, list[dict]]:
    """``rounds`` closed-loop phases per app, the apps taken in turn (the order rotates every
    round); each phase with its CPU ms per request by role (this Ray's processes only) and what
    ``extra(before, after, seconds, requests, ours)`` adds from the /proc readings. ``local``
    phases (a name -> a call that measures one phase in this process, e.g. the pipeline in
    process) take their turns among the apps', so they see the same machine."""
    local = dict(local or {})
    keys = list(urls) + list(local)
    out: dict[str, list[dict]] = {k: [] for k in keys}
    with settled_heap():  # collected once, before any CPU reading (not inside a phase's)
        for r in range(rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                if key in local:
                    phase = local[key]()
                    said = f"CPU {phase['cpu_ms_per_request']:.2f} ms per request"
                else:
                    phase = _app_phase(urls[key], key, bodies, rows_each=rows_each, clients=clients,
                                       duration=duration, max_requests=max_requests, session=session, extra=extra)
                    said = f"p99 {phase['p99_ms'] or 0:.1f} ms, {phase['errors']} failed"
                phase["round"], phase["at"] = r, time.strftime("%H:%M:%S")
                out[key].append(phase)
                print(f"    round {r + 1} {key}: {phase['rows_per_s']:.0f} rows/s, {said}", flush=True)
    return out


def _app_phase(url: str, key: str, bodies: Sequence[bytes], *, rows_each: int, clients: int, duration: float,
               max_requests: int, session: str | None, extra: Callable[..., dict[str, Any]] | None) -> dict[str, Any]:
    """One closed-loop phase of one app, with its CPU ms per request by role from /proc."""
    ours = session_processes(session) if session else None
    before, t0 = process_cpu(), time.perf_counter()
    phase = asyncio.run(closed_loop(url, bodies, rows_each, clients=clients, duration=duration,
                                    max_requests=max_requests))
    after = process_cpu()
    phase["cpu_ms_per_request"] = cpu_per_request(before, after, phase["requests"], key.replace("_", "-"), ours)
    if extra is not None:
        phase.update(extra(before, after, time.perf_counter() - t0, phase["requests"], ours))
    return phase


def median_local(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of a phase measured in this process (rates, latencies, its CPU
    per request), each round's own figures kept."""
    out = {key: statistics.median(p[key] for p in phases)
           for key in ("rows_per_s", "requests_per_s", "p50_ms", "p99_ms", "cpu_ms_per_request")
           if all(p.get(key) is not None for p in phases)}
    out["requests"] = sum(p["requests"] for p in phases)
    out["rounds"] = phases
    return out


def median_phase(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure per field over the rounds: medians of rates, latencies and CPU per request
    (role by role), sums of requests and failures; each round's own figures kept."""
    out: dict[str, Any] = {}
    for key in ("rows_per_s", "requests_per_s", "p50_ms", "p99_ms", "seconds", "foreign_cores"):
        values = [p[key] for p in phases if p.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["requests"] = sum(p["requests"] for p in phases)
    out["errors"] = sum(p["errors"] for p in phases)
    kinds: collections.Counter[str] = collections.Counter()
    for p in phases:
        kinds.update(p.get("error_kinds") or {})
    out["error_kinds"] = dict(sorted(kinds.items()))  # what failed, over every round
    out["cpu_ms_per_request"] = _medians([p["cpu_ms_per_request"] for p in phases])
    if all("other_cpu_ms_per_request" in p for p in phases):
        out["other_cpu_ms_per_request"] = _medians([p["other_cpu_ms_per_request"] for p in phases])
    out["rounds"] = [{k: p.get(k) for k in ("round", "at", "rows_per_s", "p99_ms", "errors", "error_kinds", "requests")}
                     for p in phases]
    return out


def _medians(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for d in dicts for k in d}
    return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in sorted(keys)}


def overhead(phase: dict[str, Any], pipeline_cpu_ms: float) -> dict[str, float]:
    """CPU per request over every process of the app (load generator excluded) and the part
    of it that is not the pipeline's own work (``pipeline_cpu_ms``: the same rows in process)."""
    cpu = phase["cpu_ms_per_request"]
    app = sum(v for role, v in cpu.items() if role not in ("total", CLIENT_ROLE, OTHER_APPS))
    return {"app_cpu_ms_per_request": app, "pipeline_cpu_ms_per_request": pipeline_cpu_ms,
            "overhead_ms_per_request": app - pipeline_cpu_ms}


def serving_main(parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
                 run: Callable[[argparse.Namespace], dict[str, Any]], markdown: Callable[[dict[str, Any]], str],
                 argv: Sequence[str] | None = None) -> int:
    """A served benchmark's entry point: parse, run, print its table, write ``--json``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=float)
    return 0
