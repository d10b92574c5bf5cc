"""Serving benchmark: the same requests through (a) the baseline served as one deployment,
(b) the optimized pipeline served as stages (deploy's default layout: the cheap stage in
the ingress replicas, the expensive stage its own deployment), (b') the same with a
deployment per stage, and (c) the optimized pipeline in-process.

    python -m serving.bench [--workload toxic] [--rows-per-request 32] [--clients 16]
                            [--duration 20] [--json PATH]

HTTP load comes from concurrent aiohttp clients on loopback (closed loop, bounded in
requests and seconds). A final open-loop phase sends single-row requests at half of
the measured single-row peak and reports p50 / p99. All phases run in one process,
side by side, so ratios are comparable; the 1-minute load average is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.proxy import DEFAULT_PROXY, PROXIES, TRANSPORTS

#: seconds of closed-loop load per phase
DURATION_S = 20.0
#: concurrent HTTP clients in closed-loop phases
CLIENTS = 16
#: most requests sent in one phase
MAX_REQUESTS = 20_000
#: seconds of warm-up load before each measured phase
WARMUP_S = 3.0
#: share of the single-row peak offered in the latency phase
HALF_LOAD = 0.5

TARGETS = {"served_vs_baseline": 4.0, "served_vs_in_process": 0.7, "p99_over_p50": 3.0}


def _summary(latencies: Sequence[float], rows: int, seconds: float, errors: int) -> dict[str, Any]:
    lat = np.asarray(latencies) * 1000.0
    return {
        "requests": len(latencies),
        "errors": errors,
        "rows_per_s": rows / seconds if seconds > 0 else 0.0,
        "requests_per_s": len(latencies) / seconds if seconds > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "seconds": seconds,
    }


async def closed_loop(url: str, payloads: Sequence[bytes], rows_each: int, *, clients: int,
                      duration: float, max_requests: int) -> dict[str, Any]:
    """``clients`` workers each send the next payload as soon as their last one answered."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    sent = 0
    stop_at = time.perf_counter() + duration
    headers = {"Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession, offset: int) -> None:
        nonlocal errors, sent
        i = offset
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            start = time.perf_counter()
            async with session.post(url, data=payloads[i % len(payloads)], headers=headers) as r:
                await r.read()
                if r.status == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
            i += clients

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session, c) for c in range(clients)))
        elapsed = time.perf_counter() - start
    return _summary(latencies, len(latencies) * rows_each, elapsed, errors)


async def open_loop(url: str, payloads: Sequence[bytes], *, rate: float, duration: float,
                    seed: int = 0) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` requests/s, each answered on its own task."""
    import aiohttp

    rng = np.random.default_rng(seed)
    latencies: list[float] = []
    levels: list[int] = []
    errors = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(payload: bytes) -> None:
            nonlocal errors
            start = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as r:
                body = await r.read()
                if r.status == 200:
                    latencies.append(time.perf_counter() - start)
                    levels.append(max(json.loads(body)["level"]))
                else:
                    errors += 1

        tasks = []
        start = time.perf_counter()
        t = start
        i = 0
        while t - start < duration:
            t += rng.exponential(1.0 / rate)
            delay = t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(payloads[i % len(payloads)])))
            i += 1
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    out = _summary(latencies, len(latencies), elapsed, errors)
    out["offered_rps"] = rate
    # the cascade's two paths: rows the cheap level answers vs rows that reach a later level
    lat, lev = np.asarray(latencies) * 1000.0, np.asarray(levels)
    out["by_level"] = {
        int(k): {"share": float(np.mean(lev == k)), "p50_ms": float(np.percentile(lat[lev == k], 50)),
                 "p99_ms": float(np.percentile(lat[lev == k], 99))}
        for k in np.unique(lev)
    }
    return out


async def http_floor(url: str, *, clients: int, duration: float) -> dict[str, Any]:
    """Closed-loop GETs of a route that touches no stage: the proxy + ingress ceiling."""
    import aiohttp

    latencies: list[float] = []
    stop_at = time.perf_counter() + duration
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                async with session.get(url) as r:
                    await r.read()
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return _summary(latencies, len(latencies), elapsed, 0)


def in_process(opt: Any, frames: Sequence[Any], rows_each: int, *, duration: float,
               max_requests: int) -> dict[str, Any]:
    """The optimized pipeline called directly on the same requests, one after another."""
    latencies = []
    stop_at = time.perf_counter() + duration
    start = time.perf_counter()
    i = 0
    while time.perf_counter() < stop_at and i < max_requests:
        t0 = time.perf_counter()
        opt.predict_proba(frames[i % len(frames)])
        latencies.append(time.perf_counter() - t0)
        i += 1
    return _summary(latencies, len(latencies) * rows_each, time.perf_counter() - start, 0)


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) each process on this machine has used so far, with its
    command line, by pid; empty where there is no /proc."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # the process ended meanwhile
            continue
        out[int(entry)] = (title, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_per_request(before: dict, after: dict, requests: int) -> dict[str, float]:
    """CPU ms per request over a phase, by role: each Serve deployment (Ray titles replica
    processes ``ray::ServeReplica:APP:DEPLOYMENT``), this load generator, and everything
    else (HAProxy, Ray's own processes); ``total`` sums them."""
    roles: dict[str, float] = {}
    for pid, (title, seconds) in after.items():
        if pid not in before or requests <= 0:
            continue
        used = seconds - before[pid][1]
        if used <= 0:
            continue
        if "ServeReplica:" in title:
            role = title.split()[0].rsplit(":", 1)[-1]
        else:
            role = "load generator" if pid == os.getpid() else "other"
        roles[role] = roles.get(role, 0.0) + 1000.0 * used / requests
    roles["total"] = sum(roles.values())
    return roles


def _cpu_line(phase: dict[str, Any]) -> str:
    cpu = phase.get("cpu_ms_per_request") or {}
    return ", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items())


def _by_level(phase: dict[str, Any]) -> str:
    return ", ".join(f"level {k}: {v['share']:.0%} of rows, p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms"
                     for k, v in phase.get("by_level", {}).items())


def _payloads(X: Any, rows_each: int, limit: int = 400) -> tuple[list[bytes], list[Any]]:
    payloads, frames = [], []
    for start in range(0, min(len(X), rows_each * limit), rows_each):
        frame = X.iloc[start:start + rows_each]
        if len(frame) < rows_each:
            break
        payloads.append(json.dumps({"rows": frame.to_dict("records")}).encode())
        frames.append(frame.reset_index(drop=True))
    return payloads, frames


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import pipelines
    import willump
    from serving import deploy
    from serving.proxy import release_proxy_files, use_proxy

    t0 = time.perf_counter()
    if args.artifact:
        opt = willump.load(args.artifact)
        X = opt.sample_rows_
    else:
        workload = pipelines.build(args.workload, seed=args.seed)
        opt = workload.optimize(verbose=False)
        X = workload.X_test
    print(f"serving.bench: optimized {args.workload} in {time.perf_counter() - t0:.1f}s "
          f"({opt.report().plan}, expected {opt.report().expected_speedup:.1f}x)", flush=True)
    payloads, frames = _payloads(X, args.rows_per_request)
    singles, _ = _payloads(X, 1, limit=2000)
    result: dict[str, Any] = {
        "workload": args.workload, "rows_per_request": args.rows_per_request, "clients": args.clients,
        "duration_s": args.duration, "cpus": args.cpus, "loadavg_1m_start": os.getloadavg()[0],
    }
    result["in_process"] = in_process(opt, frames, args.rows_per_request, duration=args.duration,
                                      max_requests=args.max_requests)
    print(f"  (c) in-process: {result['in_process']['rows_per_s']:.0f} rows/s", flush=True)
    result["proxy"], result["transport"] = use_proxy(args.proxy), args.transport
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        phases = [("baseline_served", True, "staged"), ("optimized_served", False, "auto"),
                  ("optimized_staged", False, "staged")]
        for key, baseline, layout in phases:
            app = deploy(opt, name=key.replace("_", "-"), port=args.port, cpus=args.cpus,
                         baseline=baseline, rows_per_request=args.rows_per_request, device="cpu",
                         layout=layout, transport=args.transport)
            url = app.url + "/predict"
            asyncio.run(closed_loop(url, payloads, args.rows_per_request, clients=args.clients,
                                    duration=WARMUP_S, max_requests=args.max_requests))
            cpu_before = process_cpu()
            result[key] = asyncio.run(closed_loop(url, payloads, args.rows_per_request,
                                                  clients=args.clients, duration=args.duration,
                                                  max_requests=args.max_requests))
            result[key]["cpu_ms_per_request"] = cpu_per_request(cpu_before, process_cpu(),
                                                                result[key]["requests"])
            result[key]["plan"] = app.plan.to_dict() | {"ingress_processes": app.plan.ingress_processes}
            print(f"  {key}: {result[key]['rows_per_s']:.0f} rows/s, "
                  f"p50 {result[key]['p50_ms']:.1f} ms, p99 {result[key]['p99_ms']:.1f} ms; "
                  f"CPU ms per request: {_cpu_line(result[key])}", flush=True)
            if key == "optimized_served":
                result["http_floor"] = asyncio.run(http_floor(app.url + "/healthz", clients=args.clients,
                                                              duration=args.duration / 2))
                print(f"  HTTP floor (GET /healthz, no stage): {result['http_floor']['requests_per_s']:.0f} req/s",
                      flush=True)
                peak = asyncio.run(closed_loop(url, singles, 1, clients=args.clients,
                                               duration=args.duration / 2, max_requests=args.max_requests))
                result["single_row_peak"] = peak
                half = asyncio.run(open_loop(url, singles, rate=HALF_LOAD * peak["requests_per_s"],
                                             duration=args.duration, seed=args.seed))
                result["single_row_half_load"] = half
                print(f"  single row: peak {peak['requests_per_s']:.0f} req/s; at half load p50 "
                      f"{half['p50_ms']:.1f} ms, p99 {half['p99_ms']:.1f} ms; by level "
                      f"{_by_level(half)}", flush=True)
            app.shutdown(stop_ray=False)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        release_proxy_files()
    a, b, c = result["baseline_served"], result["optimized_served"], result["in_process"]
    half = result["single_row_half_load"]
    result["ratios"] = {
        "served_vs_baseline": b["rows_per_s"] / a["rows_per_s"],
        "staged_vs_baseline": result["optimized_staged"]["rows_per_s"] / a["rows_per_s"],
        "staged_vs_in_process": result["optimized_staged"]["rows_per_s"] / c["rows_per_s"],
        "served_vs_in_process": b["rows_per_s"] / c["rows_per_s"],
        "p99_over_p50": half["p99_ms"] / half["p50_ms"],
    }
    result["targets"] = {
        "served_vs_baseline": result["ratios"]["served_vs_baseline"] >= TARGETS["served_vs_baseline"],
        "served_vs_in_process": result["ratios"]["served_vs_in_process"] >= TARGETS["served_vs_in_process"],
        "p99_over_p50": result["ratios"]["p99_over_p50"] <= TARGETS["p99_over_p50"],
    }
    result["loadavg_1m_end"] = os.getloadavg()[0]
    return result


def markdown(result: dict[str, Any]) -> str:
    a, b, c = result["baseline_served"], result["optimized_served"], result["in_process"]
    half = result["single_row_half_load"]
    r = result["ratios"]
    lines = [
        f"Workload `{result['workload']}`, {result['rows_per_request']} rows per request, "
        f"{result['clients']} clients, {result['duration_s']:g} s per phase, Ray with {result['cpus']:g} CPUs "
        f"(load average {result['loadavg_1m_start']:.1f} -> {result['loadavg_1m_end']:.1f}); "
        f"HTTP front {result['proxy']}, stage calls over {result['transport']}.",
        "",
        "| mode | rows/s | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|",
        f"| (a) baseline, one deployment | {a['rows_per_s']:.0f} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} | {a['errors']} |",
        f"| (b) optimized, default layout ({b['plan']['layout']}: {b['plan']['ingress_processes']} ingress "
        f"replicas) | {b['rows_per_s']:.0f} | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | {b['errors']} |",
        f"| (b') optimized, staged (a deployment per stage) | {result['optimized_staged']['rows_per_s']:.0f} | "
        f"{result['optimized_staged']['p50_ms']:.1f} | {result['optimized_staged']['p99_ms']:.1f} | "
        f"{result['optimized_staged']['errors']} |",
        f"| (c) optimized, in-process | {c['rows_per_s']:.0f} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | 0 |",
        "",
        f"- (b)/(a) = {r['served_vs_baseline']:.2f}x (target >= {TARGETS['served_vs_baseline']:g}x)",
        f"- (b)/(c) = {r['served_vs_in_process']:.0%} (target >= {TARGETS['served_vs_in_process']:.0%})",
        f"- staged: (b')/(a) = {r['staged_vs_baseline']:.2f}x, (b')/(c) = {r['staged_vs_in_process']:.0%}",
        f"- CPU ms per request, all processes (/proc accounting over each phase): (a) {_cpu_line(a)}; "
        f"(b) {_cpu_line(b)}; (b') {_cpu_line(result['optimized_staged'])}",
        f"- HTTP floor: a route that touches no stage answers {result['http_floor']['requests_per_s']:.0f} req/s "
        f"here (proxy + ingress only), so no pipeline served at {result['rows_per_request']} rows per request "
        f"can exceed {result['http_floor']['requests_per_s'] * result['rows_per_request']:.0f} rows/s on this machine",
        f"- single row at half of peak ({half['offered_rps']:.0f} req/s offered): p50 {half['p50_ms']:.1f} ms, "
        f"p99 {half['p99_ms']:.1f} ms, p99/p50 = {r['p99_over_p50']:.2f} (target <= {TARGETS['p99_over_p50']:g}); "
        f"by the level that answered: {_by_level(half)}",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--artifact", help="benchmark a saved artifact on its sample rows instead")
    parser.add_argument("--rows-per-request", type=int, default=32)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--duration", type=float, default=DURATION_S)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS)
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proxy", choices=PROXIES,
                        help=f"HTTP front of the Ray started here (default {DEFAULT_PROXY} when installed)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="grpc",
                        help="how the ingress calls the stages (default %(default)s)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.rows_per_request < 1 or args.clients < 1 or args.duration <= 0:
        parser.error("--rows-per-request, --clients and --duration must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
