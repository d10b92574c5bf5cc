"""What the live audit costs where users meet it: the same optimized app served with the monitor,
audit off and on, measured in alternating rounds.

    python -m benchmarks.audit_cost [--workload toxic] [--rates 0.01,0.1] [--rows-per-request 32]
                                    [--clients 8] [--duration 10] [--rounds 4] [--json PATH]

Apps (each ``deploy(..., monitor=..., audit_rate=R)`` with the same calibrated costs): audit off
(R = 0) and one per ``--rates``. Each is measured in ``--rounds`` closed-loop rounds taken in turn
(A B C, B C A, ...; :mod:`benchmarks._rounds`); medians reported. Per app: rows/s, p50 and p99,
CPU per request over every process of the app (the load generator and the other apps' idle
replicas excluded), and the rows the audit sampled, audited and shed (``/drift?kind=guarantee``).

Predicted next to measured: the audit's CPU per request is predicted as
``R x cheap rows per request x the full pipeline's CPU per row in process`` (the audit runs the
full pipeline on the rows it samples, and nothing else on the request path); measured twice:
as the app's CPU per request with the audit minus without (every cost the audit causes, the
other threads' contention included, and all the rounds' noise), and in the threads that did the
audit's work (``willump_audit_cpu_seconds``: the request path's sampling, the worker's
bookkeeping, the full pipeline where it runs in the ingress) per /predict request counted. Targets (issue 23): audit CPU at most
``R x`` the full pipeline's cost per row (per served row) and no effect on p99 within noise
(the spread of the audit-off rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import requests

from benchmarks._rounds import ROUNDS, measure_rounds, median_phase, overhead, serving_main
from benchmarks._scrape import counter_by_label, metrics_text
from serving.core.procstat import session_dir
from serving.launch.proxy import metrics_interval_s
from serving.measure.loadgen import closed_loop, in_process, payloads

#: seconds of closed-loop load per phase and round
DURATION_S = 10.0
#: concurrent HTTP clients: below the app's saturation, where an audit competes with requests
CLIENTS = 8
#: seconds of warm-up per app
WARMUP_S = 3.0
#: most requests one phase sends
MAX_REQUESTS = 20_000
#: seconds, beyond one export period of the replicas' metrics (serving.launch.proxy.metrics_interval_s),
#: for the audit's counts to reach /metrics and the monitor
METRICS_SETTLE_S = 1.0
#: the audit shares measured besides 0 (the default, and ten times it: a cost large enough to read)
RATES = (0.01, 0.1)


def _name(rate: float) -> str:
    """The app's name, which is also how its processes are told apart in /proc (no name may be
    a prefix of another)."""
    return "audit-off" if not rate else f"audit-r{round(rate * 10_000):05d}"


def _guarantee(url: str) -> dict[str, Any]:
    r = requests.get(url + "/drift", params={"kind": "guarantee"}, timeout=60)
    r.raise_for_status()
    return r.json()["result"]["gears"][0]


def _audit_counters(url: str) -> dict[str, float]:
    """From the app's /metrics: the live audit's CPU seconds by part (willump_audit_cpu_seconds,
    measured in the threads that did the work) and the /predict requests answered."""
    text = metrics_text(url)
    return {**counter_by_label(text, "willump_audit_cpu_seconds", "part"),
            "requests": counter_by_label(text, "willump_requests", "route").get("predict", 0.0)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import pipelines
    from serving import deploy

    workload = pipelines.build(args.workload, seed=args.seed)
    opt, X = workload.optimize(verbose=False), workload.X_test
    bodies, frames = payloads(X, args.rows_per_request)
    n = args.rows_per_request
    _, level = opt.predict_with_levels(X.iloc[: n * len(frames)])
    cheap_share = float(np.mean(level != len(opt.levels) - 1))
    full = in_process(opt, frames, n, duration=args.duration, max_requests=args.max_requests,
                      predict=opt.baseline.predict_proba)
    full_ms_per_row = full["cpu_ms_per_request"] / n
    result: dict[str, Any] = {"workload": args.workload, "layout": args.layout, "rows_per_request": n,
                              "clients": args.clients,
                              "duration_s": args.duration, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d"),
                              "cheap_share": cheap_share, "full_cpu_ms_per_row": full_ms_per_row,
                              "loadavg_1m_start": os.getloadavg()[0], "apps": {}}
    rates = [0.0, *args.rates]
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=args.cpus * (len(rates) + 1), include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    apps: dict[str, Any] = {}
    try:
        session = session_dir(ray.get_runtime_context().gcs_address)
        calibrate: Any = "always"
        for rate in rates:
            key = _name(rate)
            apps[key] = deploy(opt, name=key, port=args.port, cpus=args.cpus, device="cpu",
                               rows_per_request=n, calibrate=calibrate, insitu="never", audit_rate=rate,
                               layout=args.layout,
                               monitor=dict(attributes=[], pane_seconds=5.0))
            calibrate = apps[key].plan.costs
            print(f"  {key}: deployed ({apps[key].plan.layout}, stages {[s.name for s in apps[key].plan.stages]})",
                  flush=True)
        urls = {key: app.url + "/predict" for key, app in apps.items()}
        for url in urls.values():
            asyncio.run(closed_loop(url, bodies, n, clients=args.clients, duration=WARMUP_S,
                                    max_requests=args.max_requests))
        time.sleep(metrics_interval_s() + METRICS_SETTLE_S)
        before = {key: _guarantee(app.url) for key, app in apps.items() if key != _name(0.0)}
        counters_before = {key: _audit_counters(app.url) for key, app in apps.items() if key != _name(0.0)}
        phases = measure_rounds(urls, bodies, rows_each=n, clients=args.clients, duration=args.duration,
                                max_requests=args.max_requests, rounds=args.rounds, session=session)
        time.sleep(metrics_interval_s() + METRICS_SETTLE_S)  # the audit's last counts reach the monitor, the replicas' metrics /metrics
        off = median_phase(phases[_name(0.0)])
        off_cpu = overhead(off, 0.0)["app_cpu_ms_per_request"]
        off_p99 = [p["p99_ms"] for p in phases[_name(0.0)] if p.get("p99_ms") is not None]
        for rate in rates:
            key = _name(rate)
            phase = median_phase(phases[key])
            entry = {"audit_rate": rate, "rows_per_s": phase["rows_per_s"], "p50_ms": phase["p50_ms"],
                     "p99_ms": phase["p99_ms"], "errors": phase["errors"], "requests": phase["requests"],
                     "app_cpu_ms_per_request": overhead(phase, 0.0)["app_cpu_ms_per_request"],
                     "rounds": phase["rounds"]}
            if rate:
                c0, c1 = counters_before[key], _audit_counters(apps[key].url)
                served = c1["requests"] - c0["requests"]
                own = {part: (c1.get(part, 0.0) - c0.get(part, 0.0)) * 1000.0 / served if served else None
                       for part in ("request_path", "worker", "full_pipeline")}
                if not own["full_pipeline"]:  # the full model runs in a stage replica: not timed here
                    own["full_pipeline"] = None
                g0, g1 = before[key], _guarantee(apps[key].url)
                audited = g1["audited_rows"] - g0["audited_rows"]
                shed = g1["shed_audits"] - g0["shed_audits"]
                cheap_rows = g1["cheap_rows"] - g0["cheap_rows"]
                entry.update({
                    "cheap_rows": cheap_rows, "audited_rows": audited, "shed_audits": shed,
                    "sampled_share": (audited + shed) / cheap_rows if cheap_rows else None,
                    "audit_cpu_ms_per_request_measured": entry["app_cpu_ms_per_request"] - off_cpu,
                    # in the threads that did the audit's work (no other thread's CPU, no noise
                    # of the app's other work; what contention costs the others is in the line above)
                    "audit_cpu_ms_per_request_own": (sum(own.values())
                                                     if served and None not in own.values() else None),
                    "audit_cpu_ms_per_request_own_parts": own, "requests_counted": served,
                    "audit_cpu_ms_per_request_predicted": rate * cheap_share * n * full_ms_per_row,
                    "audit_cpu_ms_per_request_budget": rate * n * full_ms_per_row,
                    "p99_ms_off_rounds": off_p99,
                    "p99_within_noise": bool(off_p99 and phase["p99_ms"] is not None
                                             and phase["p99_ms"] <= max(off_p99)),
                })
            result["apps"][key] = entry
    finally:
        for app in apps.values():
            try:
                app.shutdown(stop_ray=False)
            except Exception:
                pass
        ray.shutdown()
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"workload {result['workload']}, layout {result['layout']}, {result['rows_per_request']}-row requests, "
             f"{result['clients']} clients, "
             f"{result['rounds']} rounds of {result['duration_s']:g} s; cheap share {result['cheap_share']:.1%}, "
             f"full pipeline {result['full_cpu_ms_per_row']:.3f} ms CPU per row in process",
             "", "| audit rate | rows/s | p50 ms | p99 ms | app CPU ms/request | audit CPU ms/request: app with - "
             "without | in the audit's own threads (request path + worker + full pipeline) | "
             "predicted | budget (rate x full per row) | audited / shed | failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in result["apps"].values():
        own = e.get("audit_cpu_ms_per_request_own")
        parts = e.get("audit_cpu_ms_per_request_own_parts") or {}
        own_text = ("-" if not parts else "not measured: the full model runs in a stage replica"
                    if own is None else f"{own:.3f} ({' + '.join(f'{v:.3f}' for v in parts.values())})")
        audit = ("-", "-", "-", "-", "-") if not e["audit_rate"] else (
            f"{e['audit_cpu_ms_per_request_measured']:.2f}", own_text, f"{e['audit_cpu_ms_per_request_predicted']:.2f}",
            f"{e['audit_cpu_ms_per_request_budget']:.2f}", f"{e['audited_rows']:,} / {e['shed_audits']:,}")
        lines.append(f"| {e['audit_rate']:g} | {e['rows_per_s']:.0f} | {e['p50_ms']:.1f} | {e['p99_ms']:.1f} | "
                     f"{e['app_cpu_ms_per_request']:.2f} | {' | '.join(audit)} | {e['errors']} |")
    off = result["apps"][_name(0.0)]["rounds"]
    spread = [r["p99_ms"] for r in off if r.get("p99_ms") is not None]
    if spread:
        lines.append(f"\naudit-off p99 over its rounds: {min(spread):.1f}-{max(spread):.1f} ms "
                     f"(median {statistics.median(spread):.1f}): the noise a p99 with the audit is read against")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",") if x], default=list(RATES),
                        help="audit shares besides 0, comma-separated (default 0.01,0.1)")
    parser.add_argument("--rows-per-request", type=int, default=32)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--duration", type=float, default=DURATION_S)
    parser.add_argument("--rounds", type=int, default=ROUNDS + 1)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS)
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=("auto", "fused", "staged", "whole"), default="auto",
                        help="deploy's layout for every app (default %(default)s: the audit runs where the full "
                             "model is, in the ingress for a whole cascade there, else on the expensive stage)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if any(not 0 < r <= 1 for r in args.rates):
        parser.error("--rates must be in (0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return serving_main(parse_args, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
