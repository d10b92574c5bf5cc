"""Serving benchmark: what the plan predicts next to what is measured, and the serving ratios.

The same requests go through (a) the baseline served as one deployment, (b) the optimized
pipeline in deploy's default layout (``layout="auto"``: the expensive stage its own deployment,
or every level in the ingress, whichever plans faster), (b') a deployment per stage, a peer
(the original pipeline in a stock Ray Serve app as a user would write it: one deployment,
FastAPI, ``@serve.batch``; :mod:`benchmarks._peer_serve`), and in process (c) the optimized
pipeline and (c') the original one.

    python -m benchmarks.serving [--workload toxic] [--rows-per-request 32] [--clients 16]
                            [--duration 10] [--rounds 3] [--json PATH]

Every app is deployed at once (costs calibrated at the first), then measured in ``--rounds``
alternating rounds (A B C D, B C D A, ...; :mod:`benchmarks._rounds`; (c) and (c') take their
turns in the rounds too, so they run beside the same Ray), each app's phase a closed loop of
``--clients`` aiohttp clients after the same warm-up; the medians are reported, with every
round's figures and the failed requests (a refused, reset or timed-out request counts as
failed). Per configuration: CPU per request by process group (/proc, this Ray's processes
only), and ``overhead_ms_per_request``: CPU per request over every process of the app (the
load generator excluded) minus the pipeline's own CPU for the same rows in process. The plan's
prediction for exactly that load (its simulation, closed loop with the same clients, the load
generator's own CPU charged to this machine) is printed beside the measurement.
``deploy`` itself probes each app before it returns (4 closed-loop clients for a few
seconds, every process group's CPU read from /proc) and plans again with the measured CPU;
the prediction is printed again with those in-situ factors (:mod:`serving.measure.insitu`; JSON
``predicted_rows_per_s_in_situ``, ``predicted_p99_ms_in_situ``, ``in_situ.factors``). The measurement itself:
``predicted_rows_per_s`` / ``measured_rows_per_s`` and ``predicted_p99_ms`` /
``measured_p99_ms`` per phase in the JSON, with their ratios. A final open-loop phase
sends single-row requests to (b) at half of its measured single-row peak. JSON ``ratios``:
``served_vs_baseline`` (b)/(a), ``in_process`` (c)/(c'), ``served_share_of_in_process_ratio``,
``served_vs_peer``, ``p99_over_p50``; ``targets`` says which of issue 21's are met.

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
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._peer_serve import deploy_peer
from benchmarks._rounds import (
    ROUNDS,
    measure_rounds,
    median_local,
    median_phase,
    overhead,
    serving_main,
)
from benchmarks._time_to_accuracy import at_accuracy, labelled, time_to_first_answer
from serving.core.procstat import group_cpu, process_cpu, session_dir
from serving.launch.proxy import DEFAULT_PROXY, PROXIES, TRANSPORTS
from serving.measure.loadgen import closed_loop, http_floor, in_process, open_loop, payloads

#: seconds of closed-loop load per phase and round
DURATION_S = 10.0
#: concurrent HTTP clients in closed-loop phases
CLIENTS = 16
#: most requests sent in one phase
MAX_REQUESTS = 20_000
#: seconds of warm-up load before each measured phase
WARMUP_S = 3.0
#: process title of Ray's per-node metrics agent (its CPU is read during the single-row phase)
METRICS_AGENT = "ray::DashboardAgent"
#: share of the single-row peak offered in the latency phase
HALF_LOAD = 0.5
#: simulated requests behind each prediction
SIMULATED_REQUESTS = 4000

#: issue 21's targets: served (b)/(a); served keeping this share of the in-process ratio; the
#: optimized app's CPU per request beyond the pipeline's own work (ms); single rows' p99/p50
TARGETS = {"served_vs_baseline": 5.0, "served_share_of_in_process_ratio": 0.5, "overhead_ms_per_request": 1.5,
           "p99_over_p50": 3.0}
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


def load_pipeline(args: argparse.Namespace) -> tuple[Any, Any]:
    """The optimized pipeline and the rows to send: ``--artifact``'s and its sample rows, or
    ``--workload`` optimized here and its held-out rows."""
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
    opt, X = load_pipeline(args)
    print(f"benchmarks.serving: optimized {args.workload} in {time.perf_counter() - t0:.1f}s "
          f"({opt.report().plan})", flush=True)
    data = labelled(args)  # time-to-accuracy: the labelled held-out rows
    bodies, frames = payloads(X, args.rows_per_request)
    singles, _ = payloads(X, 1, limit=2000)
    result: dict[str, Any] = {
        "workload": args.workload, "rows_per_request": args.rows_per_request, "clients": args.clients,
        "duration_s": args.duration, "rounds": args.rounds, "cpus": args.cpus, "loadavg_1m_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"), "pipeline_workers": getattr(opt, "workers", 1),
    }
    n = args.rows_per_request
    # (c) and (c'), the pipelines in this process: measured in the rounds beside the apps (the
    # same machine, Ray's background included), so the overhead subtracts like from like
    local = {"in_process": lambda: in_process(opt, frames, n, duration=args.duration, max_requests=args.max_requests),
             "in_process_baseline": lambda: in_process(opt, frames, n, duration=args.duration,
                                                       max_requests=args.max_requests,
                                                       predict=opt.baseline.predict_proba)}
    result["proxy"], result["transport"] = use_proxy(args.proxy, args.transport), args.transport
    # every app is deployed at once, each planned for --cpus (Ray's logical CPUs are a budget per
    # app here, not a limit on the machine): the rounds then alternate between them
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=args.cpus * (len(PHASES) + 1), include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    calibrate: Any = args.calibrate
    apps: dict[str, Any] = {}
    artifact = tempfile.mkdtemp(prefix="willump-bench-") + "/pipeline.willump"
    try:
        session = session_dir(ray.get_runtime_context().gcs_address)
        for key, label, baseline, layout in PHASES:
            apps[key] = deploy(opt, name=key.replace("_", "-"), port=args.port, cpus=args.cpus, baseline=baseline,
                               rows_per_request=n, device="cpu", layout=layout, transport=args.transport,
                               calibrate=calibrate)
            calibrate = apps[key].plan.costs  # measured once, the same figures for every phase
            print(f"  {label} {key}: deployed ({apps[key].plan.layout}, stages "
                  f"{[s.name for s in apps[key].plan.stages]})", flush=True)
        opt.save(artifact)
        base = apps["optimized_served"].url.rsplit("/", 1)[0]
        urls = {key: app.url + "/predict" for key, app in apps.items()}
        urls["peer_serve"] = base + deploy_peer(artifact, name="peer-serve", replicas=max(1, round(args.cpus)),
                                                cpus_each=1.0) + "/predict"
        for url in urls.values():  # the same warm-up for every side
            asyncio.run(closed_loop(url, bodies, n, clients=args.clients, duration=WARMUP_S,
                                    max_requests=args.max_requests))

        def extra(before: dict, after: dict, seconds: float, requests: int, ours: set[int] | None) -> dict:
            return {"foreign_cores": foreign_cores(before, after, seconds, ours),
                    "other_cpu_ms_per_request": other_processes(before, after, requests, ours)}

        rounds = measure_rounds(urls, bodies, rows_each=n, clients=args.clients, duration=args.duration,
                                max_requests=args.max_requests, rounds=args.rounds, session=session, extra=extra,
                                local=local)
        result["in_process"] = median_local(rounds["in_process"])
        result["in_process"].update(at_accuracy(result["in_process"], opt, data, baseline=False, cpus=1.0))
        result["in_process_baseline"] = median_local(rounds["in_process_baseline"])
        print(f"  (c) in-process: {result['in_process']['rows_per_s']:.0f} rows/s; the baseline in process "
              f"{result['in_process_baseline']['rows_per_s']:.0f} rows/s (medians of the rounds)", flush=True)
        pipeline_ms = {True: result["in_process_baseline"]["cpu_ms_per_request"],
                       False: result["in_process"]["cpu_ms_per_request"]}
        for key, label, baseline, _ in PHASES:
            result[key] = _phase(median_phase(rounds[key]), apps[key], args, label, key, baseline, opt, data,
                                 pipeline_ms[baseline])
        peer = result["peer_serve"] = median_phase(rounds["peer_serve"])
        peer.update(overhead(peer, pipeline_ms[True]))
        peer.update(at_accuracy(peer, opt, data, baseline=True, cpus=args.cpus, url=urls["peer_serve"]))
        print(f"  peer (stock Ray Serve, the original pipeline): {peer['rows_per_s']:.0f} rows/s, p99 "
              f"{peer['p99_ms']:.1f} ms, {peer['errors']} failed; CPU ms/request {_cpu_line(peer['cpu_ms_per_request'])}",
              flush=True)
        _single_row_phases(result, apps["optimized_served"], urls["optimized_served"], singles, args)
    finally:
        from ray import serve

        for app in apps.values():
            app.shutdown(stop_ray=False)
        serve.shutdown()
        ray.shutdown()
        release_proxy_files()
        shutil.rmtree(os.path.dirname(artifact), ignore_errors=True)
    if not args.skip_first_answer:  # after the phases, with the benchmark's own Ray down
        result["time_to_first_answer"] = time_to_first_answer(opt, X, cpus=args.cpus, port=args.port)
    result["costs"] = calibrate.to_dict() if hasattr(calibrate, "to_dict") else None
    _ratios(result)
    result["loadavg_1m_end"] = os.getloadavg()[0]
    return result


def _phase(phase: dict[str, Any], app: Any, args: argparse.Namespace, label: str, key: str, baseline: bool,
           opt: Any, data: Any, pipeline_ms: float) -> dict[str, Any]:
    """A served configuration's medians with the plan's predictions beside them."""
    if not phase["rows_per_s"] or phase["p99_ms"] is None:
        raise RuntimeError(f"{label} {key}: no request succeeded in any round ({phase['errors']} failed); "
                           "nothing to compare with the plan")
    phase["measured_rows_per_s"], phase["measured_p99_ms"] = phase["rows_per_s"], phase["p99_ms"]
    phase.update(overhead(phase, pipeline_ms))
    phase.update(predict(app.plan, clients=args.clients, client_ms=app.plan.costs.client_ms, seed=args.seed,
                         cpu_scale={}))
    phase.update(compare(phase))
    if phase.get("foreign_cores") is not None and app.plan.costs is not None:
        # the same prediction, told what other users' processes took during the phase
        loaded = predict(under_load(app.plan, phase["foreign_cores"]), clients=args.clients,
                         client_ms=app.plan.costs.client_ms, seed=args.seed, cpu_scale={})
        phase["predicted_rows_per_s_given_load"] = loaded["predicted_rows_per_s"]
        phase["predicted_p99_ms_given_load"] = loaded["predicted_p99_ms"]
        phase["rows_per_s_ratio_given_load"] = phase["measured_rows_per_s"] / loaded["predicted_rows_per_s"]
        phase["p99_ratio_given_load"] = phase["measured_p99_ms"] / loaded["predicted_p99_ms"]
    if app.plan.in_situ.get("factors") is not None:
        refine_prediction(phase, app.plan, args)
    phase.update(at_accuracy(phase, opt, data, baseline=baseline, cpus=args.cpus, url=app.url + "/predict"))
    phase["plan"] = app.plan.to_dict()
    print(f"  {label} {key}: measured {phase['measured_rows_per_s']:.0f} rows/s, p99 "
          f"{phase['measured_p99_ms']:.1f} ms ({phase['errors']} failed, medians of {len(phase['rounds'])} rounds); "
          f"predicted {phase['predicted_rows_per_s']:.0f} rows/s, p99 {phase['predicted_p99_ms']:.1f} ms (ratios "
          f"{phase['rows_per_s_ratio']:.2f}, {phase['p99_ratio']:.2f}); CPU ms/request measured: "
          f"{_cpu_line(phase['cpu_ms_per_request'])}; predicted: {_cpu_line(phase['predicted_cpu_ms_per_request'])}; "
          f"beyond the pipeline's own {pipeline_ms:.2f}: {phase['overhead_ms_per_request']:.2f}", flush=True)
    return phase


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
    peak, half = single_row_load(url, singles, clients=args.clients, peak_s=args.duration / 2,
                                 half_s=args.duration, seed=args.seed, max_requests=args.max_requests)
    result["single_row_peak"] = peak
    result["single_row"] = half
    print(f"  single row: peak {peak['requests_per_s']:.0f} req/s; at half load p50 {half['p50_ms']:.1f} ms, "
          f"p99 {half['p99_ms']:.1f} ms; by level {_by_level(half)}; {_tail(half)}; Ray's metrics agent "
          f"{half['metrics_agent_cpu_ms_per_request']:.3f} ms of CPU per request", flush=True)


def single_row_load(url: str, singles: list[bytes], *, clients: int, peak_s: float, half_s: float, seed: int,
                    max_requests: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Single rows: the peak from a closed loop of ``clients`` for ``peak_s``, then half of it
    offered as a Poisson open loop for ``half_s``, with the CPU Ray's metrics agent took in that
    phase (``metrics_agent_cpu_s``, and per request): it ingests every process's metrics at each
    export, and its bursts set the tail."""
    peak = asyncio.run(closed_loop(url, singles, 1, clients=clients, duration=peak_s, max_requests=max_requests))
    before = process_cpu()
    half = asyncio.run(open_loop(url, singles, rate=HALF_LOAD * peak["requests_per_s"], duration=half_s, seed=seed))
    agent_s = group_cpu(before, process_cpu(), {"agent": lambda _, title: title.startswith(METRICS_AGENT)})["agent"]
    half["metrics_agent_cpu_s"] = agent_s
    half["metrics_agent_cpu_ms_per_request"] = 1000.0 * agent_s / max(half["requests"], 1)
    return peak, half


def _tail(phase: dict[str, Any]) -> str:
    """Where the slowest requests waited: inside the ingress's route (its Server-Timing) or
    outside it (client, HTTP front, the replica's HTTP server, the kernel)."""
    t = phase.get("tail")
    if not t:
        return "no Server-Timing in the answers"
    s = t["slowest"]
    return (f"the route's own time p50 {t['server_p50_ms']:.1f} ms, p99 {t['server_p99_ms']:.1f} ms; the slowest "
            f"{s['requests']} requests (median {s['client_ms']:.1f} ms) spent {s['server_ms']:.1f} ms in the route")


def _ratios(result: dict[str, Any]) -> None:
    a, b, c = result["baseline_served"], result["optimized_served"], result["in_process"]
    half, peer = result["single_row"], result["peer_serve"]
    in_process_ratio = c["rows_per_s"] / result["in_process_baseline"]["rows_per_s"]
    served = b["rows_per_s"] / a["rows_per_s"]
    result["ratios"] = {
        "served_vs_baseline": served,
        "in_process": in_process_ratio,
        "served_share_of_in_process_ratio": served / in_process_ratio,
        "served_vs_peer": b["rows_per_s"] / peer["rows_per_s"],
        "staged_vs_baseline": result["optimized_staged"]["rows_per_s"] / a["rows_per_s"],
        "staged_vs_in_process": result["optimized_staged"]["rows_per_s"] / c["rows_per_s"],
        "served_vs_in_process": b["rows_per_s"] / c["rows_per_s"],
        "p99_over_p50": half["p99_ms"] / half["p50_ms"],
    }
    r = result["ratios"]
    result["targets"] = {
        "served_vs_baseline": r["served_vs_baseline"] >= TARGETS["served_vs_baseline"],
        "served_share_of_in_process_ratio": r["served_share_of_in_process_ratio"]
        >= TARGETS["served_share_of_in_process_ratio"],
        "served_vs_peer": r["served_vs_peer"] >= in_process_ratio / 2,
        "overhead_ms_per_request": b["overhead_ms_per_request"] <= TARGETS["overhead_ms_per_request"],
        "p99_over_p50": r["p99_over_p50"] <= TARGETS["p99_over_p50"],
        "no_failures": all(result[k]["errors"] == 0 for k in (*(k for k, *_ in PHASES), "peer_serve")),
        # issue 21's: the in-situ plan (what deploy runs on) within the targets in every phase
        "predictions": all(result[k].get("in_situ_within_target", False) for k, *_ in PHASES),
        "predictions_model_alone": all(result[k]["rows_per_s_within_target"] and result[k]["p99_within_target"]
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
    half = result["single_row"]
    r = result["ratios"]
    lines = [
        f"Workload `{result['workload']}`, {result['rows_per_request']} rows per request, {result['clients']} "
        f"clients, {result['duration_s']:g} s per phase and round, medians of {result['rounds']} alternating "
        f"rounds, {result['cpus']:g} CPUs per app (load average "
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
    peer = result["peer_serve"]
    lines.append(f"| peer: stock Ray Serve, the original pipeline | | {peer['rows_per_s']:.0f} | | | "
                 f"{peer['p99_ms']:.1f} | | |")
    lines.append(f"| (c) in-process | | {c['rows_per_s']:.0f} | | | {c['p99_ms']:.2f} | | |")
    lines.append(f"| (c') the baseline in process | | {result['in_process_baseline']['rows_per_s']:.0f} | | | "
                 f"{result['in_process_baseline']['p99_ms']:.2f} | | |")
    lines += [
        "",
        f"- predictions within target (throughput +-{PREDICTION_TARGETS['rows_per_s_within']:.0%}, p99 within "
        f"{PREDICTION_TARGETS['p99_within_factor']:g}x) in every phase: {result['targets']['predictions']}",
        f"- (b)/(a) = {r['served_vs_baseline']:.2f}x (target >= {TARGETS['served_vs_baseline']:g}x); in process "
        f"(c)/(c') = {r['in_process']:.2f}x, of which served keeps {r['served_share_of_in_process_ratio']:.0%} "
        f"(target >= {TARGETS['served_share_of_in_process_ratio']:.0%}); (b)/peer = {r['served_vs_peer']:.2f}x "
        f"(target >= {r['in_process'] / 2:.2f}x); (b)/(c) = {r['served_vs_in_process']:.0%}; "
        f"(b')/(a) = {r['staged_vs_baseline']:.2f}x",
        "- failed requests: " + ", ".join(f"{k} {result[k]['errors']}" for k in (*(k for k, *_ in PHASES), "peer_serve")),
    ]
    for key, label in [*((k, lb) for k, lb, *_ in PHASES), ("peer_serve", "peer")]:
        p = result[key]
        lines.append(f"- {label} CPU per request over the app's processes {p['app_cpu_ms_per_request']:.2f} ms, the "
                     f"pipeline's own work (same rows in process) {p['pipeline_cpu_ms_per_request']:.2f} ms, beyond it "
                     f"**{p['overhead_ms_per_request']:.2f} ms**" + (f" (target <= {TARGETS['overhead_ms_per_request']:g})"
                                                                     if key == "optimized_served" else ""))
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
        f"by the level that answered: {_by_level(half)}; {_tail(half)}",
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
    parser.add_argument("--duration", type=float, default=DURATION_S, help="seconds per phase and round")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating rounds per configuration (medians reported; default %(default)s)")
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
    if args.rows_per_request < 1 or args.clients < 1 or args.duration <= 0 or args.rounds < 1:
        parser.error("--rows-per-request, --clients, --duration and --rounds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return serving_main(parse_args, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
