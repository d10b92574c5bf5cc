"""Single rows at half of peak, the replicas' heaps settled (serving.runtime.heap) or not: the
same optimized app deployed in a fresh Ray per side, sides alternating round by round.

    python -m benchmarks.single_row_tail [--workload toxic] [--rounds 3] [--duration 10]
                                         [--clients 8] [--cpus 2] [--json PATH]

Each round runs two child processes, one per side (``WILLUMP_GC_FREEZE=1`` and ``=0`` in the
environment Ray's processes inherit), in alternating order: a Ray started by ``deploy`` (the
HAProxy front users get), the app planned without calibration (the same plan on both sides),
3 s of warm-up, the closed-loop single-row peak (``--clients``), then Poisson arrivals at half
that peak for ``--duration`` seconds (``benchmarks.serving``'s ``single_row`` phase). Medians
over the rounds; issue 21's target is ``p99_ms / p50_ms <= 3``. Also printed: what one full
garbage collection takes in a process holding what an ingress replica holds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from serving.runtime.heap import GC_FREEZE_ENV

#: seconds of single-row warm-up before the peak is measured
WARMUP_S = 3.0
#: share of the closed-loop peak offered as Poisson arrivals (as benchmarks.serving)
HALF_LOAD = 0.5
#: the sides: the environment value of GC_FREEZE_ENV, and its name in the output
SIDES = {"settled": "1", "unsettled": "0"}
#: issue 21's target for single rows at half of peak
TARGET_P99_OVER_P50 = 3.0


def full_collection_ms() -> float:
    """One full collection in this process, which holds the pipeline, Ray and the request path's
    modules (what an ingress replica holds), best of three."""
    import ray  # noqa: F401 - loaded for its objects

    import serving.runtime.ingress  # noqa: F401

    times = []
    for _ in range(3):
        start = time.perf_counter()
        gc.collect()
        times.append(1000.0 * (time.perf_counter() - start))
    return min(times)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One side, one round: deploy, peak, half of peak, shut down."""
    import pandas as pd

    import willump
    from serving import deploy
    from serving.measure.loadgen import closed_loop, open_loop, payloads

    opt = willump.load(args.artifact)
    singles, _ = payloads(pd.read_pickle(args.rows), 1, limit=2000)
    app = deploy(opt, name="single-row", port=args.port, cpus=args.cpus, device="cpu", calibrate="never",
                 insitu="never")
    try:
        url = app.url + "/predict"
        asyncio.run(closed_loop(url, singles, 1, clients=args.clients, duration=WARMUP_S, max_requests=10**6))
        peak = asyncio.run(closed_loop(url, singles, 1, clients=args.clients, duration=args.duration / 2,
                                       max_requests=10**6))
        half = asyncio.run(open_loop(url, singles, rate=HALF_LOAD * peak["requests_per_s"], duration=args.duration,
                                     seed=args.seed))
    finally:
        app.shutdown()
    return {"gc_freeze": os.environ.get(GC_FREEZE_ENV, "1"), "peak": peak, "half": half,
            "plan": {"layout": app.plan.layout, "ingress_replicas": app.plan.ingress_replicas}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    folder = tempfile.mkdtemp(prefix="willump-tail-")
    artifact = os.path.join(folder, "pipeline.willump")
    opt.save(artifact)
    rows = os.path.join(folder, "rows.pkl")
    workload.X_test.iloc[:2000].to_pickle(rows)
    result: dict[str, Any] = {"workload": args.workload, "date": time.strftime("%Y-%m-%d %H:%M"),
                              "rounds": args.rounds, "duration_s": args.duration, "clients": args.clients,
                              "full_collection_ms": full_collection_ms(), "runs": {side: [] for side in SIDES}}
    print(f"one full collection in a process holding the pipeline, Ray and the request path: "
          f"{result['full_collection_ms']:.0f} ms", flush=True)
    for r in range(args.rounds):
        order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
        for i, side in enumerate(order):
            port = args.port + 2 * r + i  # a port of its own: the last child's front may still hold its own
            out = os.path.join(folder, f"{side}-{r}.json")
            env = {**os.environ, GC_FREEZE_ENV: SIDES[side]}
            cmd = [sys.executable, "-m", "benchmarks.single_row_tail", "--child", "--artifact", artifact, "--rows", rows,
                   "--json", out, "--duration", str(args.duration), "--clients", str(args.clients),
                   "--cpus", str(args.cpus), "--port", str(port), "--seed", str(args.seed)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                result["runs"][side].append({"error": done.stderr[-2000:]})
                print(f"  round {r + 1} {side}: failed\n{done.stderr[-2000:]}", flush=True)
                continue
            with open(out) as fh:
                run_out = json.load(fh)
            result["runs"][side].append(run_out)
            half = run_out["half"]
            print(f"  round {r + 1} {side}: peak {run_out['peak']['requests_per_s']:.0f} req/s; at half p50 "
                  f"{half['p50_ms']:.1f} ms, p99 {half['p99_ms']:.1f} ms (x{half['p99_ms'] / half['p50_ms']:.1f}), "
                  f"{half['errors']} failed", flush=True)
    result["sides"] = {side: _median(runs) for side, runs in result["runs"].items()}
    return result


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "half" in r]
    if not ok:
        return {"rounds_ok": 0}
    ratios = [r["half"]["p99_ms"] / r["half"]["p50_ms"] for r in ok]
    return {"rounds_ok": len(ok), "peak_requests_per_s": statistics.median(r["peak"]["requests_per_s"] for r in ok),
            "p50_ms": statistics.median(r["half"]["p50_ms"] for r in ok),
            "p99_ms": statistics.median(r["half"]["p99_ms"] for r in ok),
            "p99_over_p50": statistics.median(ratios), "p99_over_p50_rounds": ratios,
            "failed": sum(r["half"]["errors"] + r["peak"]["errors"] for r in ok),
            "meets_target": statistics.median(ratios) <= TARGET_P99_OVER_P50}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| side | rounds | peak req/s | p50 ms | p99 ms | p99/p50 (rounds) | failed |",
             "|---|---|---|---|---|---|---|"]
    for side, m in result["sides"].items():
        if not m.get("rounds_ok"):
            lines.append(f"| {side} | 0 | - | - | - | - | - |")
            continue
        rounds = ", ".join(f"{x:.1f}" for x in m["p99_over_p50_rounds"])
        lines.append(f"| {side} | {m['rounds_ok']} | {m['peak_requests_per_s']:.0f} | {m['p50_ms']:.1f} | "
                     f"{m['p99_ms']:.1f} | **{m['p99_over_p50']:.1f}** ({rounds}) | {m['failed']} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds at half of peak (the peak: half this)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parse_args(argv)
    if args.child:
        out = child(args)
        with open(args.json, "w") as fh:
            json.dump(out, fh, default=float)
        return 0
    result = run(args)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
