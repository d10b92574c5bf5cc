"""Serving on shared, mixed resources, measured on an emulated cluster of several raylets.

    python -m benchmarks.cluster [--workload toxic] [--json PATH] [--repeats 3]

Heterogeneity (Gavel): a 3-node Ray cluster on this machine (``ray.cluster_utils.Cluster``):
the head carries ``FAST_DEVICES`` devices of type ``dev_fast``, two workers ``SLOW_DEVICES``
each of type ``dev_slow``, whose emulated devices are slower per stage by ``SLOWDOWN``
(:mod:`serving.emulation.hetero_app`). The bench measures the throughput matrix (each stage on each
device type), solves the LP for the heterogeneity-aware plan, and measures side by side,
alternating, ``--repeats`` times (median): the aware plan (capacity-weighted routing), the
heterogeneity-agnostic plan (the same number of devices sized on mean rates, placed
type-blind, uniform routing), and the aware plan's replicas with uniform routing. Each is
printed next to the LP's prediction. The 1-minute load average is recorded (``uptime``).

Stragglers (FlexRR, hedged requests): two replicas per stage on one device type, driven
open loop (Poisson, ``--hedge-rate``) with and without an injected straggler (one replica
10x slower on 10% of its calls), with and without hedging; p50/p99 and the extra device
work hedging costs (``extra_work``: device seconds per stage call with hedging over those
without, same jitter, same repeat; ``copies_over_answers``: device seconds of all copies,
including the straggler's time before it was cancelled, over those of the answers kept).

Load-adaptive gears (CascadeServe): a 3x burst above the planned rate with gears and with one
gear (:mod:`benchmarks._gears`). Transient tiers (Proteus / Tributary): the tier planner's
cost and its plan preempted under load, with and without notice (:mod:`benchmarks._tiers`).
Time-to-accuracy is reported by ``python -m benchmarks.serving``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from benchmarks._gears import GEAR_SLO_MS, geared_workload, run_section, summary
from benchmarks._tiers import PREEMPT_RATE, preemption, tiers_plan
from serving.core.specs import stage_specs
from serving.emulation.hetero_app import DeviceEmulation, deploy_hetero
from serving.emulation.measure import cluster_devices, measure_app, measure_matrix
from serving.measure.loadgen import poisson_calls
from serving.planning.hetero import plan_agnostic, plan_max_rate, sustained_rate, uniform_weights
from serving.runtime.hedge import HEDGE_QUANTILE

#: device types and how many devices each node carries (the head has the fast ones)
FAST_DEVICES = 2
SLOW_DEVICES = 2
DEVICE_TYPES = ("dev_fast", "dev_slow")
#: emulated device time per call on the fast type, per stage: fixed + per row (ms)
FIXED_MS = {"cheap": 20.0, "expensive": 40.0, "model": 30.0}
PER_ROW_MS = {"cheap": 1.0, "expensive": 10.0, "model": 2.0}
#: how much slower the slow type's emulated devices are, per stage (accelerators differ by
#: model: the expensive stage gains more from the fast device than the cheap one)
SLOWDOWN = {"cheap": 2.0, "expensive": 4.0, "model": 3.0}
#: rows per request, closed-loop callers and seconds per measured phase
ROWS_PER_REQUEST = 32
CLIENTS = 24
WARMUP_S = 2.0
SECONDS = 8.0
TARGETS = {"aware_vs_agnostic": 1.3, "prediction_within": 0.25, "p99_jitter_over_no_jitter": 1.5,
           "extra_work": 0.10}
#: hedging phases: replicas per stage (all of one device type, no slowdown), the emulated device
#: time (ms, fixed + per row), the jittered replica (10x slower on 10% of its calls), the
#: open-loop Poisson rate (requests/s) and seconds per phase
HEDGE_REPLICAS = 2
HEDGE_DEVICE = "dev_slow"
HEDGE_FIXED_MS = {"cheap": 8.0, "expensive": 12.0, "model": 10.0}
HEDGE_PER_ROW_MS = {"cheap": 0.25, "expensive": 3.0, "model": 0.5}
JITTER = (0.10, 10.0)
HEDGE_RATE = 20.0
HEDGE_SECONDS = 20.0


def load_average() -> float:
    return os.getloadavg()[0]


def _requests(X, rows_per_request: int, limit: int = 200) -> list:
    n = len(X) // rows_per_request
    return [X.iloc[i * rows_per_request:(i + 1) * rows_per_request].reset_index(drop=True)
            for i in range(min(n, limit))]


def _optimized(args) -> tuple[Any, Any]:
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed, n_rows=args.n_rows)
    return workload.optimize(verbose=False), workload.X_test


def start_cluster(fast: int = FAST_DEVICES, slow: int = SLOW_DEVICES, slow_nodes: int = 2):
    """Head (dev_fast x fast) + ``slow_nodes`` workers (dev_slow x slow); Ray and Serve up."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from serving.core.local_ray import ray_system_config

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"dev_fast": fast, "head": 1}, "include_dashboard": False,
        "_system_config": ray_system_config()})
    for i in range(slow_nodes):  # each slow node is also a transient pool of its own (spot_0, spot_1, ...)
        cluster.add_node(num_cpus=1, resources={"dev_slow": slow, f"spot_{i}": slow})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    return cluster


def stop_cluster(cluster) -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()


def emulation_for(specs) -> DeviceEmulation:
    names = [s.name for s in specs]
    return DeviceEmulation(fixed_ms={n: FIXED_MS[n] for n in names}, per_row_ms={n: PER_ROW_MS[n] for n in names},
                           slowdown={"dev_slow": {n: SLOWDOWN[n] for n in names}})


def heterogeneity(opt, source, requests, args) -> dict[str, Any]:
    specs = stage_specs(opt)
    emulation = emulation_for(specs)
    t0 = time.perf_counter()
    matrix = measure_matrix(source, opt, specs, DEVICE_TYPES, emulation, requests,
                            seconds=args.profile_seconds)
    devices = cluster_devices(DEVICE_TYPES)
    aware = plan_max_rate(matrix, devices)
    agnostic = plan_agnostic(matrix, devices)
    same_uniform = uniform_weights(matrix, aware.replicas)
    print(f"  matrix (calls/s per replica, measured in {time.perf_counter() - t0:.0f}s): {matrix.to_dict()}")
    print(f"  devices {devices}; aware plan {aware.to_dict()['replicas']}, agnostic {agnostic.to_dict()['replicas']}")
    rpr = args.rows_per_request
    measured: dict[str, list[float]] = {"aware": [], "agnostic": [], "same_replicas_uniform": []}
    # both plans hold the same devices at once (half a device each); only one is driven at a time
    apps = {"aware": deploy_hetero(source, specs, aware.replicas, aware.weights, emulation, name="aware",
                                   device_share=0.5),
            "agnostic": deploy_hetero(source, specs, agnostic.replicas, agnostic.weights, emulation,
                                      name="agnostic", device_share=0.5)}
    try:
        for _ in range(args.repeats):
            apps["aware"].set_weights(aware.weights)
            measured["aware"].append(rpr * measure_app(apps["aware"], requests, concurrency=args.clients,
                                                       warmup_s=WARMUP_S, seconds=args.seconds))
            measured["agnostic"].append(rpr * measure_app(apps["agnostic"], requests, concurrency=args.clients,
                                                          warmup_s=WARMUP_S, seconds=args.seconds))
            apps["aware"].set_weights(same_uniform)
            measured["same_replicas_uniform"].append(rpr * measure_app(
                apps["aware"], requests, concurrency=args.clients, warmup_s=WARMUP_S, seconds=args.seconds))
            print("  repeat: " + ", ".join(f"{k} {v[-1]:.0f} rows/s" for k, v in measured.items()))
        placed = {k: _placement(app) for k, app in apps.items()}
    finally:
        for app in apps.values():
            app.shutdown()
    med = {k: float(np.median(v)) for k, v in measured.items()}
    predicted = aware.predicted_rate * rpr
    out = {
        "aware_rows_per_s": med["aware"],
        "agnostic_rows_per_s": med["agnostic"],
        "same_replicas_uniform_rows_per_s": med["same_replicas_uniform"],
        "predicted_rows_per_s": predicted,
        "predicted_agnostic_rows_per_s": agnostic.predicted_rate * rpr,
        "predicted_same_replicas_uniform_rows_per_s": sustained_rate(matrix, aware.replicas, same_uniform) * rpr,
        "aware_vs_agnostic": med["aware"] / med["agnostic"],
        "aware_vs_same_replicas_uniform": med["aware"] / med["same_replicas_uniform"],
        "prediction_error": abs(med["aware"] - predicted) / predicted,
        "repeats": measured,
        "matrix_calls_per_s": matrix.to_dict(),
        "measured_slowdown": {s: float(matrix.rates[i, 0] / matrix.rates[i, 1])
                              for i, s in enumerate(matrix.stages) if matrix.rates[i, 1] > 0},
        "injected_slowdown": {s.name: SLOWDOWN[s.name] for s in specs},
        "devices": devices,
        "aware_plan": aware.to_dict(),
        "agnostic_plan": agnostic.to_dict(),
        "placement": placed,
    }
    out["targets"] = {"aware_vs_agnostic >= 1.3": out["aware_vs_agnostic"] >= TARGETS["aware_vs_agnostic"],
                      "prediction within 25%": out["prediction_error"] <= TARGETS["prediction_within"]}
    return out


def _placement(app) -> dict[str, list[str]]:
    """Which node each replica landed on (device type -> node ids), from the replicas themselves."""
    out: dict[str, list[str]] = {}
    for info in app.replica_info():
        out.setdefault(f"{info['stage']}@{info['device']}", []).append(info["node_id"][:8])
    return out


async def _open_loop(app, requests, rate: float, seconds: float, warmup_s: float, seed: int) -> list[float]:
    """Poisson arrivals at ``rate``/s; latencies (ms) of requests sent after the warm-up."""
    latencies: list[float] = []

    async def one(i: int, t: float):
        t0 = time.perf_counter()
        await app.ingress.predict.remote(requests[i % len(requests)])
        if t >= warmup_s:
            latencies.append((time.perf_counter() - t0) * 1000.0)

    await poisson_calls(rate, warmup_s + seconds, one, seed)
    return latencies


def _device_seconds(app) -> float:
    return sum(info["device_seconds"] for info in app.replica_info())


def hedge_emulation(names: list[str]) -> DeviceEmulation:
    """The hedging (and preemption) sections' devices: fast, one type, no slowdown."""
    return DeviceEmulation(fixed_ms={n: HEDGE_FIXED_MS[n] for n in names},
                           per_row_ms={n: HEDGE_PER_ROW_MS[n] for n in names})


def hedging(opt, source, requests, args) -> dict[str, Any]:
    import asyncio

    specs = stage_specs(opt)
    names = [s.name for s in specs]
    emulation = hedge_emulation(names)
    replicas = {(n, HEDGE_DEVICE): HEDGE_REPLICAS for n in names}
    weights = {n: {HEDGE_DEVICE: 1.0} for n in names}
    jittered = f"{names[0]}@{HEDGE_DEVICE}/0"
    hedge = {"hedge_quantile": args.hedge_quantile, "hedge_idle_only": not args.hedge_any_replica}
    apps = {"no_jitter": deploy_hetero(source, specs, replicas, weights, emulation, name="steady", device_share=0.5,
                                       **hedge),
            "jitter": deploy_hetero(source, specs, replicas, weights, emulation, name="jittery", device_share=0.5,
                                    jitter={jittered: JITTER}, **hedge)}
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for r in range(args.repeats):
            for label, app in apps.items():
                for hedged in (False, True):
                    app.set_hedging(hedged)
                    before = _device_seconds(app)
                    lat = asyncio.run(_open_loop(app, requests, args.hedge_rate, args.hedge_seconds, WARMUP_S,
                                                 seed=args.seed + r))
                    stats = app.stats()
                    spent = _device_seconds(app) - before
                    key = f"{label}_{'hedged' if hedged else 'unhedged'}"
                    row = {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                           "requests": len(lat), "device_s_per_call": spent / max(1, stats["calls"]),
                           "copies_over_answers": spent / stats["winner_device_s"] - 1.0
                           if stats["winner_device_s"] > 0 else 0.0,
                           "hedged_calls": stats["hedges"] / max(1, stats["calls"]),
                           "hedges_skipped_busy": stats["hedges_skipped_busy"] / max(1, stats["calls"]),
                           "hedge_wins": stats["hedge_wins"], "reassigned": stats["reassigned"]}
                    runs.setdefault(key, []).append(row)
                    print(f"  {key}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, device ms per call "
                          f"{1000 * row['device_s_per_call']:.1f}, hedged calls {row['hedged_calls']:.1%}")
    finally:
        for app in apps.values():
            app.shutdown()
    med = {k: {f: float(np.median([row[f] for row in v])) for f in v[0]} for k, v in runs.items()}
    # extra work: device time per stage call with hedging over the same without, same repeat
    extra = {label: float(np.median([h["device_s_per_call"] / u["device_s_per_call"] - 1.0
                                     for h, u in zip(runs[f"{label}_hedged"], runs[f"{label}_unhedged"],
                                                     strict=True)]))
             for label in apps}
    out = {
        "p50_ms_no_jitter": med["no_jitter_unhedged"]["p50_ms"],
        "p99_ms_no_jitter": med["no_jitter_unhedged"]["p99_ms"],
        "p50_ms_no_jitter_hedged": med["no_jitter_hedged"]["p50_ms"],
        "p99_ms_no_jitter_hedged": med["no_jitter_hedged"]["p99_ms"],
        "p50_ms_jitter_unhedged": med["jitter_unhedged"]["p50_ms"],
        "p99_ms_jitter_unhedged": med["jitter_unhedged"]["p99_ms"],
        "p50_ms_jitter_hedged": med["jitter_hedged"]["p50_ms"],
        "p99_ms_jitter_hedged": med["jitter_hedged"]["p99_ms"],
        "extra_work": extra["jitter"],
        "extra_work_no_jitter": extra["no_jitter"],
        "copies_over_answers": med["jitter_hedged"]["copies_over_answers"],
        "hedged_calls": med["jitter_hedged"]["hedged_calls"],
        "rate_per_s": args.hedge_rate, "seconds": args.hedge_seconds, "jitter": {jittered: JITTER},
        "hedge_quantile": args.hedge_quantile, "hedge_idle_only": not args.hedge_any_replica,
        "hedged_calls_no_jitter": med["no_jitter_hedged"]["hedged_calls"],
        "hedges_skipped_busy": med["jitter_hedged"]["hedges_skipped_busy"],
        "runs": runs,
    }
    out["p99_jitter_hedged_over_no_jitter"] = out["p99_ms_jitter_hedged"] / out["p99_ms_no_jitter"]
    out["targets"] = {
        "p99 under jitter <= 1.5x p99 without": out["p99_jitter_hedged_over_no_jitter"]
        <= TARGETS["p99_jitter_over_no_jitter"],
        "extra work <= 10%": out["extra_work"] <= TARGETS["extra_work"],
        "p99 without jitter not worse with hedging": out["p99_ms_no_jitter_hedged"] <= out["p99_ms_no_jitter"] * 1.05,
    }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--n-rows", type=int, default=8000, help="rows of the workload to optimize on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows-per-request", type=int, default=ROWS_PER_REQUEST)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--profile-seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hedge-rate", type=float, default=HEDGE_RATE, help="open-loop requests/s")
    parser.add_argument("--hedge-seconds", type=float, default=HEDGE_SECONDS)
    parser.add_argument("--hedge-quantile", type=float, default=HEDGE_QUANTILE,
                        help="hedge a stage call still unanswered at this quantile of the stage's latencies")
    parser.add_argument("--hedge-any-replica", action="store_true",
                        help="hedge to a busy replica too (serving.runtime.hedge.HEDGE_IDLE_ONLY off), for comparison")
    parser.add_argument("--preempt-rate", type=float, default=PREEMPT_RATE, help="open-loop requests/s")
    parser.add_argument("--preempt-hedging", action=argparse.BooleanOptionalAction, default=False,
                        help="the tier app hedges its stage calls (a call stuck on a lost replica is copied)")
    parser.add_argument("--gear-slo-ms", type=float, default=GEAR_SLO_MS, help="the p99 target the gears hold")
    parser.add_argument("--only", choices=("heterogeneity", "hedging", "gears", "preemption"), help="run one section")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    if min(args.repeats, args.seconds, args.clients, args.rows_per_request, args.hedge_rate,
           args.hedge_seconds, args.preempt_rate) <= 0 or not 0 < args.hedge_quantile < 1:
        parser.error("--repeats, --seconds, --clients, --rows-per-request, --hedge-rate, --hedge-seconds and "
                     "--preempt-rate must be positive, --hedge-quantile in (0, 1)")

    from serving.core.artifacts import resolve

    t0 = time.perf_counter()
    opt, X = _optimized(args) if args.only != "gears" else (None, None)
    geared = geared_workload(args) if args.only in (None, "gears") else None
    requests = _requests(X if X is not None else geared[1], args.rows_per_request)
    print(f"benchmarks.cluster: optimized {args.workload} in {time.perf_counter() - t0:.1f}s; "
          f"{len(requests)} requests of {args.rows_per_request} rows; load {load_average():.2f}")
    result: dict[str, Any] = {"workload": args.workload, "rows_per_request": args.rows_per_request,
                              "clients": args.clients, "seconds": args.seconds, "repeats": args.repeats,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": load_average()}
    cluster = start_cluster()
    try:
        source = resolve(opt, "bench-cluster", "auto")[0] if opt is not None else None
        if args.only in (None, "heterogeneity"):
            print("heterogeneity:")
            result["heterogeneity"] = heterogeneity(opt, source, requests, args)
            try:
                result["tiers"] = tiers_plan(result["heterogeneity"], SLOW_DEVICES)
                print(f"tiers (planner only): cost vs all-reliable {result['tiers']['cost_vs_reliable']:.2f} "
                      f"{result['tiers']['plan']}")
            except ValueError as exc:
                result["tiers"] = {"error": str(exc)}
        if args.only in (None, "hedging"):
            print("hedging:")
            result["hedging"] = hedging(opt, source, requests, args)
        if geared is not None:
            print("gears:")
            result["gears"] = run_section(geared, requests, args)
        if args.only in (None, "preemption"):  # last: it removes the slow nodes
            print("preemption:")
            emulation = hedge_emulation([s.name for s in stage_specs(opt)])
            result.setdefault("tiers", {}).update(preemption(opt, source, requests, cluster, args, emulation,
                                                             SLOW_DEVICES))
            # without the heterogeneity section, the cost is the deployed plan's
            result["tiers"].setdefault("cost_vs_reliable", result["tiers"]["deployed_cost_vs_reliable"])
    finally:
        stop_cluster(cluster)
    result["load_after"] = load_average()
    result["not_built"] = []  # time-to-accuracy: python -m benchmarks.serving
    if "heterogeneity" in result:
        h = result["heterogeneity"]
        print(f"heterogeneity: aware {h['aware_rows_per_s']:.0f} rows/s (predicted {h['predicted_rows_per_s']:.0f},"
              f" error {h['prediction_error']:.0%}), agnostic {h['agnostic_rows_per_s']:.0f} rows/s (predicted "
              f"{h['predicted_agnostic_rows_per_s']:.0f}): {h['aware_vs_agnostic']:.2f}x; same replicas uniformly "
              f"routed {h['same_replicas_uniform_rows_per_s']:.0f} rows/s; targets {h['targets']}")
    if "hedging" in result:
        g = result["hedging"]
        print(f"hedging: p99 no jitter {g['p99_ms_no_jitter']:.1f} ms (hedged {g['p99_ms_no_jitter_hedged']:.1f}), "
              f"jitter unhedged {g['p99_ms_jitter_unhedged']:.1f} ms, jitter hedged {g['p99_ms_jitter_hedged']:.1f} ms"
              f" ({g['p99_jitter_hedged_over_no_jitter']:.2f}x), extra work {g['extra_work']:.1%}; "
              f"targets {g['targets']}")
    if "failed_with_notice" in result.get("tiers", {}):
        t = result["tiers"]
        print(f"tiers: wrong {t['wrong']}, failed with notice {t['failed_with_notice']}, without notice "
              f"{t['failed_without_notice']}, p99 back under {t['slo_ms']:g} ms after {t['recovery_s']:g} s; "
              f"the first pool back in {t.get('restored_s') or float('nan'):.1f} s; cost vs all-reliable "
              f"{t['cost_vs_reliable']:.2f}")
    if "slo_ms" in result.get("gears", {}):
        print(summary(result["gears"]))
    print(f"load average {result['load_before']:.2f} before, {result['load_after']:.2f} after; not built: "
          f"{result['not_built']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=float)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
