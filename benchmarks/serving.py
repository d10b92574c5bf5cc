"""Serving benchmark: what the plan predicts next to what is measured, and the serving ratios.

The same requests go through (a) the baseline served as one deployment, (b) the optimized
pipeline in deploy's default layout (the cheap stage in the ingress replicas, the expensive
stage its own deployment), (b') the same with a deployment per stage, and (c) the
optimized pipeline in-process.

    python -m benchmarks.serving [--workload toxic] [--rows-per-request 32] [--clients 16]
                            [--duration 20] [--json PATH]

Each served phase deploys with costs measured on this machine (``calibrate``: once, at the
first phase, then reused), runs a warm-up and a closed loop of ``--clients`` aiohttp clients,
and prints the plan's prediction for exactly that load (its simulation, closed loop with the
same clients, the load generator's own CPU charged to this machine) beside the measurement.
``deploy`` itself probes each app before it returns (4 closed-loop clients for a few
seconds, every process group's CPU read from /proc) and plans again with the measured CPU;
the prediction is printed again with those in-situ factors (:mod:`serving.measure.insitu`; JSON
``predicted_rows_per_s_in_situ``, ``predicted_p99_ms_in_situ``, ``in_situ.factors``). The measurement itself:
``predicted_rows_per_s`` / ``measured_rows_per_s`` and ``predicted_p99_ms`` /
``measured_p99_ms`` per phase in the JSON, with their ratios, and each process's CPU per
request, predicted and measured (/proc, this Ray's processes only). A final open-loop phase
sends single-row requests at half of the measured single-row peak. All phases run in one
process and one Ray, side by side; the 1-minute load average is recorded.

Time-to-accuracy (:mod:`benchmarks._time_to_accuracy`): every configuration also reports
``accuracy`` (its answers on the labelled held-out rows), ``accuracy_loss`` (vs the full
pipeline), ``certified_loss_bound``, ``rows_per_s_at_accuracy``, ``p99_ms_at_accuracy`` and
``cost_per_million_predictions`` (simulated price per CPU-hour); the run reports
``time_to_first_answer.time_to_first_answer_s`` from starting ``willump serve`` to its first
answer (``--skip-first-answer`` leaves it out).
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

from benchmarks._time_to_accuracy import at_accuracy, labelled, time_to_first_answer
from serving.core.procstat import cpu_per_request, process_cpu, session_dir, session_processes
from serving.launch.proxy import DEFAULT_PROXY, PROXIES, TRANSPORTS
from serving.measure.loadgen import closed_loop, http_floor, in_process, open_loop, payloads

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
#: simulated requests behind each prediction
SIMULATED_REQUESTS = 4000

TARGETS = {"served_vs_baseline": 4.0, "served_vs_in_process": 0.7, "p99_over_p50": 3.0}
#: the plan must predict measured throughput within this share and p99 within this factor
PREDICTION_TARGETS = {"rows_per_s_within": 0.25, "p99_within_factor": 2.0}
PHASES = (("baseline_served", "(a)", True, "staged"), ("optimized_served", "(b)", False, "auto"),
          ("optimized_staged", "(b')", False, "staged"))


def other_processes(before: dict, after: dict, requests: int, ours: set[int] | None, top: int = 8) -> dict[str, float]:
    """CPU ms per request of this Ray's own processes (not replicas, front or load generator),
    by process title: where ``other`` goes."""
    out: dict[str, float] = {}
    for pid, (title, seconds) in after.items():
        if pid not in before or requests <= 0 or pid == os.getpid() or (ours is not None and pid not in ours):
            continue
        if "ServeReplica:" in title or "haproxy" in title or "ProxyActor" in title:
            continue
        used = seconds - before[pid][1]
        if used > 0:
            name = title.split()[0].rsplit("/", 1)[-1][:40]
            out[name] = out.get(name, 0.0) + 1000.0 * used / requests
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])


def foreign_cores(before: dict, after: dict, seconds: float, ours: set[int] | None) -> float | None:
    """Cores that processes outside this benchmark (not this process, not this Ray's) used
    over a phase of ``seconds``: other users' work on the same machine, which the plan,
    measured on an idle Ray, does not know about. None where this Ray's processes are unknown."""
    if ours is None or seconds <= 0:
        return None
    used = 0.0
    for pid, (_, cpu) in after.items():
        if pid == os.getpid() or pid in ours:
            continue
        used += max(0.0, cpu - before[pid][1]) if pid in before else cpu  # started during the phase
    return used / seconds


def under_load(plan: Any, cores: float) -> Any:
    """The plan on a machine whose other users take ``cores`` of every host it runs on."""
    from dataclasses import replace

    costs = plan.costs
    hosts = {n.host for n in (plan.nodes or [])} | set(costs.cores) | set(costs.background_cores)
    busy = {h: costs.background_cores.get(h, 0.0) + cores for h in hosts}
    return replace(plan, costs=replace(costs, background_cores=busy))


def predict(plan: Any, *, clients: int, client_ms: float, seed: int = 0,
            cpu_scale: dict[str, float] | None = None) -> dict[str, Any]:
    """What the plan's simulation says the closed loop will measure (``cpu_scale``: the
    in-situ factors of serving.measure.insitu)."""
    from serving.planning.simulate import simulate

    sim = simulate(plan, clients=clients, n_requests=SIMULATED_REQUESTS, seed=seed, client_ms=client_ms,
                   cpu_scale=cpu_scale)
    names = {"client": "load generator"}
    cpu = {names.get(k, k): v for k, v in sim.cpu_ms.items()}
    cpu["total"] = sum(v for k, v in cpu.items() if not k.endswith("(GPU)"))
    return {"predicted_rows_per_s": sim.throughput_rows_s, "predicted_p99_ms": sim.p99_ms,
            "predicted_p50_ms": sim.p50_ms, "bound_rows_per_s": plan.max_rows_per_s,
            "bottleneck": plan.bottleneck, "predicted_cpu_ms_per_request": cpu,
            "predicted_utilization": sim.utilization}


def compare(phase: dict[str, Any]) -> dict[str, Any]:
    """Measured over predicted, and whether each is within the prediction targets."""
    rows = phase["measured_rows_per_s"] / phase["predicted_rows_per_s"]
    p99 = phase["measured_p99_ms"] / phase["predicted_p99_ms"]
    within_rows = abs(rows - 1.0) <= PREDICTION_TARGETS["rows_per_s_within"]
    factor = PREDICTION_TARGETS["p99_within_factor"]
    return {"rows_per_s_ratio": rows, "p99_ratio": p99, "rows_per_s_within_target": within_rows,
            "p99_within_target": 1.0 / factor <= p99 <= factor}


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import willump

    if args.artifact:
        opt = willump.load(args.artifact)
        return opt, opt.sample_rows_
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    return workload.optimize(verbose=False), workload.X_test


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from serving import deploy
    from serving.launch.proxy import release_proxy_files, use_proxy

    t0 = time.perf_counter()
    opt, X = _load(args)
    print(f"benchmarks.serving: optimized {args.workload} in {time.perf_counter() - t0:.1f}s "
          f"({opt.report().plan})", flush=True)
    data = labelled(args)  # time-to-accuracy: the labelled held-out rows
    bodies, frames = payloads(X, args.rows_per_request)
    singles, _ = payloads(X, 1, limit=2000)
    result: dict[str, Any] = {
        "workload": args.workload, "rows_per_request": args.rows_per_request, "clients": args.clients,
        "duration_s": args.duration, "cpus": args.cpus, "loadavg_1m_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"), "pipeline_workers": getattr(opt, "workers", 1),
    }
    result["in_process"] = in_process(opt, frames, args.rows_per_request, duration=args.duration,
                                      max_requests=args.max_requests)
    result["in_process"].update(at_accuracy(result["in_process"], opt, data, baseline=False, cpus=1.0))
    print(f"  (c) in-process: {result['in_process']['rows_per_s']:.0f} rows/s", flush=True)
    result["proxy"], result["transport"] = use_proxy(args.proxy, args.transport), args.transport
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    calibrate: Any = args.calibrate
    try:
        session = session_dir(ray.get_runtime_context().gcs_address)
        for key, label, baseline, layout in PHASES:
            name = key.replace("_", "-")
            app = deploy(opt, name=name, port=args.port, cpus=args.cpus, baseline=baseline,
                         rows_per_request=args.rows_per_request, device="cpu", layout=layout,
                         transport=args.transport, calibrate=calibrate)
            calibrate = app.plan.costs  # measured once, the same figures for every phase
            url = app.url + "/predict"
            asyncio.run(closed_loop(url, bodies, args.rows_per_request, clients=args.clients, duration=WARMUP_S,
                                    max_requests=args.max_requests))
            before, t_before = process_cpu(), time.perf_counter()
            phase = asyncio.run(closed_loop(url, bodies, args.rows_per_request, clients=args.clients,
                                            duration=args.duration, max_requests=args.max_requests))
            ours = session_processes(session) if session else None
            after, phase_s = process_cpu(), time.perf_counter() - t_before
            phase["foreign_cores"] = foreign_cores(before, after, phase_s, ours)
            phase["cpu_ms_per_request"] = cpu_per_request(before, after, phase["requests"], name, ours)
            phase["other_cpu_ms_per_request"] = other_processes(before, after, phase["requests"], ours)
            phase["measured_rows_per_s"], phase["measured_p99_ms"] = phase["rows_per_s"], phase["p99_ms"]
            phase.update(predict(app.plan, clients=args.clients, client_ms=app.plan.costs.client_ms,
                                 seed=args.seed, cpu_scale={}))
            phase.update(compare(phase))
            if phase["foreign_cores"] is not None and app.plan.costs is not None:
                # the same prediction, told what other users' processes took during the phase
                loaded = predict(under_load(app.plan, phase["foreign_cores"]), clients=args.clients,
                                 client_ms=app.plan.costs.client_ms, seed=args.seed, cpu_scale={})
                phase["predicted_rows_per_s_given_load"] = loaded["predicted_rows_per_s"]
                phase["predicted_p99_ms_given_load"] = loaded["predicted_p99_ms"]
                phase["rows_per_s_ratio_given_load"] = phase["measured_rows_per_s"] / loaded["predicted_rows_per_s"]
                phase["p99_ratio_given_load"] = phase["measured_p99_ms"] / loaded["predicted_p99_ms"]
            if app.plan.in_situ.get("factors") is not None:
                refine_prediction(phase, app.plan, args)
            phase.update(at_accuracy(phase, opt, data, baseline=baseline, cpus=args.cpus, url=url))
            phase["plan"] = app.plan.to_dict()
            result[key] = phase
            print(f"  {label} {key}: measured {phase['measured_rows_per_s']:.0f} rows/s, p99 "
                  f"{phase['measured_p99_ms']:.1f} ms; predicted {phase['predicted_rows_per_s']:.0f} rows/s, p99 "
                  f"{phase['predicted_p99_ms']:.1f} ms (ratios {phase['rows_per_s_ratio']:.2f}, "
                  f"{phase['p99_ratio']:.2f}); CPU ms/request measured: {_cpu_line(phase['cpu_ms_per_request'])}; "
                  f"predicted: {_cpu_line(phase['predicted_cpu_ms_per_request'])}", flush=True)
            if "predicted_rows_per_s_given_load" in phase:
                print(f"      other users' processes took {phase['foreign_cores']:.2f} cores; told so, the plan "
                      f"predicts {phase['predicted_rows_per_s_given_load']:.0f} rows/s, p99 "
                      f"{phase['predicted_p99_ms_given_load']:.1f} ms (ratios {phase['rows_per_s_ratio_given_load']:.2f}, "
                      f"{phase['p99_ratio_given_load']:.2f})", flush=True)
            if key == "optimized_served":
                _single_row_phases(result, app, url, singles, args)
            app.shutdown(stop_ray=False)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        release_proxy_files()
    if not args.skip_first_answer:  # after the phases, with the benchmark's own Ray down
        result["time_to_first_answer"] = time_to_first_answer(opt, X, cpus=args.cpus, port=args.port)
    result["costs"] = calibrate.to_dict() if hasattr(calibrate, "to_dict") else None
    _ratios(result)
    result["loadavg_1m_end"] = os.getloadavg()[0]
    return result


def refine_prediction(phase: dict[str, Any], plan: Any, args: argparse.Namespace) -> None:
    """The plan's prediction with the in-situ CPU factors deploy measured (and, when measured,
    other users' load): JSON ``predicted_rows_per_s_in_situ``, ``predicted_p99_ms_in_situ`` and
    their ratios to the measurement."""
    probe = phase["in_situ"] = plan.in_situ
    target = under_load(plan, phase["foreign_cores"]) if phase.get("foreign_cores") is not None else plan
    refined = predict(target, clients=args.clients, client_ms=plan.costs.client_ms, seed=args.seed)
    phase["predicted_rows_per_s_in_situ"] = refined["predicted_rows_per_s"]
    phase["predicted_p99_ms_in_situ"] = refined["predicted_p99_ms"]
    phase["rows_per_s_ratio_in_situ"] = phase["measured_rows_per_s"] / refined["predicted_rows_per_s"]
    phase["p99_ratio_in_situ"] = phase["measured_p99_ms"] / refined["predicted_p99_ms"]
    factor = PREDICTION_TARGETS["p99_within_factor"]
    phase["in_situ_within_target"] = (abs(phase["rows_per_s_ratio_in_situ"] - 1.0)
                                      <= PREDICTION_TARGETS["rows_per_s_within"]
                                      and 1.0 / factor <= phase["p99_ratio_in_situ"] <= factor)
    from serving.measure.insitu import summary

    print(f"      in situ ({probe['clients']} clients for {probe['seconds']:.0f} s, CPU factors "
          f"{summary(probe['factors'])}): the plan predicts {refined['predicted_rows_per_s']:.0f} rows/s, p99 "
          f"{refined['predicted_p99_ms']:.1f} ms (ratios {phase['rows_per_s_ratio_in_situ']:.2f}, "
          f"{phase['p99_ratio_in_situ']:.2f})", flush=True)


def _single_row_phases(result: dict[str, Any], app: Any, url: str, singles: list[bytes],
                       args: argparse.Namespace) -> None:
    result["http_floor"] = asyncio.run(http_floor(app.url + "/healthz", clients=args.clients,
                                                  duration=args.duration / 2))
    print(f"  HTTP floor (GET /healthz, no stage): {result['http_floor']['requests_per_s']:.0f} req/s", flush=True)
    peak = asyncio.run(closed_loop(url, singles, 1, clients=args.clients, duration=args.duration / 2,
                                   max_requests=args.max_requests))
    result["single_row_peak"] = peak
    half = asyncio.run(open_loop(url, singles, rate=HALF_LOAD * peak["requests_per_s"], duration=args.duration,
                                 seed=args.seed))
    result["single_row_half_load"] = half
    print(f"  single row: peak {peak['requests_per_s']:.0f} req/s; at half load p50 {half['p50_ms']:.1f} ms, "
          f"p99 {half['p99_ms']:.1f} ms; by level {_by_level(half)}", flush=True)


def _ratios(result: dict[str, Any]) -> None:
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
        "predictions": all(result[k]["rows_per_s_within_target"] and result[k]["p99_within_target"]
                           for k, *_ in PHASES),
    }


def _factors(phase: dict[str, Any]) -> str:
    from serving.measure.insitu import summary

    return summary(phase["in_situ"]["factors"])


def _cpu_line(cpu: dict[str, float]) -> str:
    return ", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items())


def _by_level(phase: dict[str, Any]) -> str:
    return ", ".join(f"level {k}: {v['share']:.0%} of rows, p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms"
                     for k, v in phase.get("by_level", {}).items())


def markdown(result: dict[str, Any]) -> str:
    c = result["in_process"]
    half = result["single_row_half_load"]
    r = result["ratios"]
    lines = [
        f"Workload `{result['workload']}`, {result['rows_per_request']} rows per request, {result['clients']} "
        f"clients, {result['duration_s']:g} s per phase, Ray with {result['cpus']:g} CPUs (load average "
        f"{result['loadavg_1m_start']:.1f} -> {result['loadavg_1m_end']:.1f}); HTTP front {result['proxy']}, "
        f"stage calls over {result['transport']}.",
        "",
        "| phase | predicted rows/s | measured rows/s | ratio | predicted p99 ms | measured p99 ms | ratio | "
        "bound set by |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, label, *_ in PHASES:
        p = result[key]
        lines.append(f"| {label} {key} | {p['predicted_rows_per_s']:.0f} | {p['measured_rows_per_s']:.0f} | "
                     f"{p['rows_per_s_ratio']:.2f} | {p['predicted_p99_ms']:.1f} | {p['measured_p99_ms']:.1f} | "
                     f"{p['p99_ratio']:.2f} | {p['bottleneck']} |")
    lines.append(f"| (c) in-process | | {c['rows_per_s']:.0f} | | | {c['p99_ms']:.2f} | | |")
    lines += [
        "",
        f"- predictions within target (throughput +-{PREDICTION_TARGETS['rows_per_s_within']:.0%}, p99 within "
        f"{PREDICTION_TARGETS['p99_within_factor']:g}x) in every phase: {result['targets']['predictions']}",
        f"- (b)/(a) = {r['served_vs_baseline']:.2f}x (target >= {TARGETS['served_vs_baseline']:g}x); "
        f"(b)/(c) = {r['served_vs_in_process']:.0%} (target >= {TARGETS['served_vs_in_process']:.0%}); "
        f"(b')/(a) = {r['staged_vs_baseline']:.2f}x",
    ]
    for key, label, *_ in PHASES:
        p = result[key]
        if "predicted_rows_per_s_given_load" in p:
            lines.append(f"- {label} other users' processes took {p['foreign_cores']:.2f} cores during the phase; "
                         f"told so, the plan predicts {p['predicted_rows_per_s_given_load']:.0f} rows/s (ratio "
                         f"{p['rows_per_s_ratio_given_load']:.2f}), p99 {p['predicted_p99_ms_given_load']:.1f} ms "
                         f"(ratio {p['p99_ratio_given_load']:.2f})")
    for key, label, *_ in PHASES:
        p = result[key]
        if "predicted_rows_per_s_in_situ" in p:
            lines.append(f"- {label} in situ (CPU factors {_factors(p)} from {p['in_situ']['clients']} clients for "
                         f"{p['in_situ']['seconds']:g} s): the plan predicts {p['predicted_rows_per_s_in_situ']:.0f} "
                         f"rows/s (ratio {p['rows_per_s_ratio_in_situ']:.2f}), p99 {p['predicted_p99_ms_in_situ']:.1f} "
                         f"ms (ratio {p['p99_ratio_in_situ']:.2f}); within target: {p['in_situ_within_target']}")
    for key, label, *_ in PHASES:
        p = result[key]
        lines.append(f"- {label} CPU ms per request, measured: {_cpu_line(p['cpu_ms_per_request'])}; predicted: "
                     f"{_cpu_line(p['predicted_cpu_ms_per_request'])}")
    lines += [
        f"- HTTP floor (a route that touches no stage): {result['http_floor']['requests_per_s']:.0f} req/s",
        f"- single row at half of peak ({half['offered_rps']:.0f} req/s offered): p50 {half['p50_ms']:.1f} ms, "
        f"p99 {half['p99_ms']:.1f} ms, p99/p50 = {r['p99_over_p50']:.2f} (target <= {TARGETS['p99_over_p50']:g}); "
        f"by the level that answered: {_by_level(half)}",
    ]
    for key, label in [*((k, lb) for k, lb, *_ in PHASES), ("in_process", "(c)")]:
        p = result[key]
        if p.get("accuracy") is not None:
            lines.append(f"- {label} at accuracy {p['accuracy']:.4f} (loss {p['accuracy_loss']:+.4f} vs the full "
                         f"pipeline, certified bound {p['certified_loss_bound']:.4f}): {p['rows_per_s_at_accuracy']:.0f} "
                         f"rows/s, p99 {p['p99_ms_at_accuracy']:.1f} ms, {p['cost_per_million_predictions']:.3f} per "
                         "million predictions (simulated price)")
    first = result.get("time_to_first_answer")
    if first:
        seconds = first["time_to_first_answer_s"]
        lines.append("- `willump serve` to the first answer: "
                     + (f"{seconds:.1f} s" if seconds is not None else f"none ({first['error']})"))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__,
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
    parser.add_argument("--calibrate", choices=("always", "auto"), default="always",
                        help="measure HTTP and hop costs now (default) or reuse this machine's cached figures")
    parser.add_argument("--skip-first-answer", action="store_true",
                        help="do not time `willump serve` to its first answer")
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
