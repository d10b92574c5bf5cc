"""The single-row tail of one optimized app served alone: single rows at half of its measured
single-row peak, the p99 against the p50, and what Ray's metrics agent and the ingress's garbage
collections cost during that phase.

    python -m benchmarks.single_row_tail [--workload toxic] [--repeats 1] [--seconds 15] [--json PATH]

Each repeat deploys the app on a fresh Ray (as ``deploy`` starts one), warms it for 3 s, measures
its single-row peak with a closed loop for 5 s, then offers half of it as a Poisson open loop for
``--seconds`` (``benchmarks.serving.single_row_load``, the phases of ``benchmarks.serving``). To compare two versions of the code, run this
in each checkout in turn (old, new, old, ...): a fresh Ray per repeat keeps the sides apart, and
the spread between repeats on a small machine is as large as most differences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchmarks.serving import single_row_load
from serving.measure.loadgen import closed_loop, payloads

#: seconds of warm-up and of the peak measurement before the half-load phase
WARM_S, PEAK_S = 3.0, 5.0
#: closed-loop clients for the warm-up and the peak
CLIENTS = 16
#: seconds to wait after the phase for the replicas' next metrics export (deploy's 5 s, and a flush)
EXPORT_WAIT_S = 7.0


def gc_pauses(metrics_text: str, app: str) -> dict[str, dict[str, float]]:
    """``{generation: {"passes", "seconds"}}`` of the app's ``willump_gc_pause_seconds`` in /metrics text."""
    out: dict[str, dict[str, float]] = {}
    for part, generation, value in re.findall(
            rf'willump_gc_pause_seconds_(count|sum)\{{app="{re.escape(app)}",generation="(\d)"\}} (\S+)', metrics_text):
        out.setdefault(generation, {})["passes" if part == "count" else "seconds"] = float(value)
    return out


def one_run(workload: Any, opt: Any, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    from serving import deploy

    app = deploy(opt, name="tail", port=args.port, cpus=args.cpus, rows_per_request=32, device="cpu")
    try:
        singles, _ = payloads(workload.X_test, 1, limit=400)
        url = app.url + "/predict"
        asyncio.run(closed_loop(url, singles, 1, clients=CLIENTS, duration=WARM_S, max_requests=10**9))
        peak, half = single_row_load(url, singles, clients=CLIENTS, peak_s=PEAK_S, half_s=args.seconds,
                                     seed=args.seed + repeat, max_requests=10**9)
        time.sleep(EXPORT_WAIT_S)
        with urllib.request.urlopen(app.url + "/metrics", timeout=30) as r:
            pauses = gc_pauses(r.read().decode(), "tail")
    finally:
        app.shutdown()
    return {"peak_rps": peak["requests_per_s"], "offered_rps": half["offered_rps"], "requests": half["requests"],
            "errors": half["errors"], "p50_ms": half["p50_ms"], "p99_ms": half["p99_ms"],
            "p99_over_p50": half["p99_ms"] / half["p50_ms"], "metrics_agent_cpu_s": half["metrics_agent_cpu_s"],
            "metrics_agent_cpu_ms_per_request": half["metrics_agent_cpu_ms_per_request"],
            "gc_pauses_since_start": pauses}


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.single_row_tail", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the half-load phase")
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--port", type=int, default=8811)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every repeat and the medians here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.seconds <= 0:
        parser.error("--repeats and --seconds must be positive")
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    runs = []
    for repeat in range(args.repeats):
        run = one_run(workload, opt, args, repeat)
        runs.append(run)
        print(f"repeat {repeat + 1}: peak {run['peak_rps']:.0f} req/s; at half ({run['offered_rps']:.0f} offered) "
              f"p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, p99/p50 {run['p99_over_p50']:.2f}; "
              f"Ray's metrics agent {run['metrics_agent_cpu_s']:.2f} CPU s "
              f"({run['metrics_agent_cpu_ms_per_request']:.3f} ms a request); the ingress's GC since it started: "
              f"{run['gc_pauses_since_start'] or 'none timed'}; {run['errors']} failed", flush=True)
    medians = {k: statistics.median(r[k] for r in runs)
               for k in ("p50_ms", "p99_ms", "p99_over_p50", "metrics_agent_cpu_s")}
    print("medians: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "runs": runs, "medians": medians}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
