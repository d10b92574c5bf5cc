"""Benchmark of model partitioning: ``python -m benchmarks.partition [--part ...] [--out FILE]``.

Parts (all by default), each printed and written to the JSON file:

- ``plan``: planner quality at cluster scale, simulated. Every PipeDream GPU profile (14
  networks), M in {2, 4, 8, 16} devices with a per-device memory below the model's
  footprint: predicted rows/s (p99 too, by discrete-event simulation, Poisson and bursty,
  for vgg16, resnet50 and gnmt) of DP + replication, DP without replication, even split by layers and by
  parameters (M stages, PiPPy / DeepSpeed defaults), whole-model replicas (do not fit).
  Two transports: the Serve hop measured in this run, and an assumed GPU interconnect
  (labelled as such: no GPU here). Then whether the DP is at least as good as every even
  split with replication (any stage count) on every profile, and its gain per profile.
- ``emulated``: the same planner's plans served by :func:`serving.deploy_model` on
  emulated accelerators (blocks sleep for their profiled GPU time, real bytes cross
  real Serve hops); measured rows/s at saturation and p99 under Poisson load printed
  next to the cost model's and the simulation's predictions.
- ``cpu``: all-MiniLM-L6-v2 really computed on CPU, planned into 2 stages, served.
- ``deep``: the full toxic_deep pipeline (word TF-IDF + MiniLM -> logistic regression,
  one torch module) served alone on 2 CPUs: rows/s, p50/p99; test accuracy of it, of
  the cheap level and of the embeddings alone. The certified cascade served against it:
  ``python -m benchmarks.deep``.

Run it under the shared lock (``flock /tmp/willump-heavy.lock ...``); figures depend on
the machine's load, which is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serving import partition as sp
from serving.model_app.load import closed_loop, open_loop

#: the profiles whose plans are also simulated for p99 (the docs' tables); the rest of the
#: PipeDream profiles are planned and compared on the cost model's rows/s alone
MODELS = ("vgg16", "resnet50", "gnmt")
DEVICES = (2, 4, 8, 16)
#: per-device memory: this far from the largest single block's need (0) to the whole
#: model's (1), so the model never fits one device and every block does
MEMORY_SHARE = 0.5
#: assumed GPU-to-GPU hop (not measured here: there is no GPU): NVLink-class
ASSUMED_GPU_HOP = sp.Transport(0.02, 20e9, "assumed-gpu-interconnect")
#: the common offered load for p99 comparisons: this share of the slowest plan's throughput
P99_LOAD = 0.7
#: Poisson load of the served runs, as a share of the predicted throughput
SERVED_LOAD = 0.6
PARTS = ("plan", "emulated", "cpu", "deep")


def _profiles_dir(data_dir: str | None) -> Path:
    base = Path(data_dir) if data_dir else Path(os.environ.get(
        "WILLUMP_DATASETS", Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))
    return base / "pipedream_profiles"


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def memory_cap(prof: sp.Profile, share: float = MEMORY_SHARE) -> tuple[float, float]:
    """``(cap, whole)``: the per-device memory of the runs and the whole model's need."""
    b = prof.batch_sizes[-1]
    params, work = prof.params(), prof.workspace(b)
    whole = float(params.sum() + work.max())
    largest = float((params + work).max())
    return largest + share * (whole - largest), whole


def _fmt(x: float) -> str:
    return "-" if not math.isfinite(x) or x == 0 else f"{x:,.0f}"


# --- plan: cluster scale, simulated ---------------------------------------------------------
def _candidates(prof: sp.Profile, m: int, cap: float) -> dict[str, sp.Plan]:
    n = len(prof)
    return {
        "dp+replication": sp.plan(prof, m, cap),
        "dp, no replication": sp.plan(prof, m, cap, replication=False),
        "even by layers": sp.evaluate(prof, sp.with_replicas(sp.even_by_layers(n, m), m), devices=m,
                                      memory_per_device=cap),
        "even by params": sp.evaluate(prof, sp.with_replicas(sp.even_by_params(prof, m), m), devices=m,
                                      memory_per_device=cap),
        "whole-model replicas": sp.evaluate(prof, [(0, n, m)], devices=m, memory_per_device=cap),
    }


def best_even(prof: sp.Profile, m: int, cap: float) -> sp.Plan | None:
    """A stronger baseline than the defaults: the best even split (by layers or by
    parameters) over every stage count k <= m, with the m devices spread over the stages."""
    best = None
    for k in range(1, m + 1):
        for ranges in (sp.even_by_layers(len(prof), k), sp.even_by_params(prof, k)):
            p = sp.evaluate(prof, sp.with_replicas(ranges, m), devices=m, memory_per_device=cap)
            if p.feasible and (best is None or p.throughput > best.throughput):
                best = p
    return best


def profile_names(data_dir: str | None) -> list[str]:
    """Every PipeDream profile in the shared folder (14 networks)."""
    return sorted(p.stem for p in _profiles_dir(data_dir).glob("*.txt") if p.stem != "LICENSE")


def part_plan(data_dir: str | None, serve_hop: sp.Transport, requests: int,
              models: tuple[str, ...] | None = None, simulated: tuple[str, ...] = MODELS) -> dict[str, Any]:
    """Every plan of every profile (``models``: default all) on the cost model; p99 simulated
    for ``simulated``; and whether the DP with replication is at least as good as every even
    split with replication (any stage count) on every profile, with its gain per profile."""
    models = tuple(profile_names(data_dir)) if models is None else models
    out: dict[str, Any] = {"transports": {"serve-measured": serve_hop.to_dict(),
                                          "assumed-gpu": ASSUMED_GPU_HOP.to_dict()}, "rows": []}
    print("\n== plan: PipeDream GPU profiles (batch 64), simulated ==")
    for label, hop in (("assumed-gpu", ASSUMED_GPU_HOP), ("serve-measured", serve_hop)):
        print(f"-- transport {label}: {hop.fixed_ms:.3f} ms + bytes / {hop.bytes_per_s / 1e6:,.0f} MB/s")
        for model in models:
            path = _profiles_dir(data_dir) / f"{model}.txt"
            prof = sp.read_pipedream(path, transport=hop)
            cap, footprint = memory_cap(prof)
            for m in DEVICES:
                cands = _candidates(prof, m, cap)
                feasible = [p.throughput for p in cands.values() if p.feasible and p.throughput > 0]
                rate_rows = P99_LOAD * min(feasible)
                row: dict[str, Any] = {"transport": label, "model": model, "devices": m,
                                       "memory_per_device": cap, "footprint": footprint,
                                       "offered_rows_per_s": rate_rows, "plans": {}}
                for name, p in cands.items():
                    entry = {"feasible": p.feasible, "throughput": p.throughput, "latency_ms": p.latency_ms,
                             "stages": [(s.start, s.end, s.replicas) for s in p.stages]}
                    if p.feasible and model in simulated:
                        for arrivals in ("poisson", "bursty"):
                            sim = sp.simulate(p, prof, rate=rate_rows / 64, rows_per_request=64,
                                              requests=requests, arrivals=arrivals, seed=m)
                            entry[f"p99_ms_{arrivals}"] = sim.p99_ms
                    row["plans"][name] = entry
                even = max(row["plans"]["even by layers"]["throughput"],
                           row["plans"]["even by params"]["throughput"])
                dp = row["plans"]["dp+replication"]["throughput"]
                row["dp_over_best_even"] = dp / even if even > 0 else math.inf
                any_k = best_even(prof, m, cap)
                row["best_even_any_k"] = None if any_k is None else {
                    "throughput": any_k.throughput, "stages": [(s.start, s.end, s.replicas) for s in any_k.stages]}
                # None where no even split fits at all (no comparison, not a pass)
                row["dp_over_best_even_any_k"] = dp / any_k.throughput if any_k else None
                out["rows"].append(row)
                cells = "  ".join(f"{k}: {_fmt(v['throughput'])}/s"
                                  + (f" p99 {v['p99_ms_poisson']:.0f}ms" if "p99_ms_poisson" in v else "")
                                  if v["feasible"] else f"{k}: does not fit" for k, v in row["plans"].items())
                print(f"{model:13s} M={m:2d} cap {cap / 2**20:7,.0f} MiB (model {footprint / 2**20:,.0f})  "
                      f"DP/best-even {row['dp_over_best_even']:.2f}x (any k: {_ratio(row['dp_over_best_even_any_k'])}) "
                      f"| {cells}")
    out["versus_even"] = versus_even(out["rows"])
    return out


def versus_even(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per transport and profile, the DP's gain over the best even split with replication (any
    stage count) across the device counts, and every case where the DP fell short of it."""
    gains: dict[str, dict[str, list[float]]] = {}
    short, unmatched = [], []
    for r in rows:
        g = r["dp_over_best_even_any_k"]
        if g is None:  # no even split fits: nothing to compare with
            unmatched.append({k: r[k] for k in ("transport", "model", "devices")})
            continue
        gains.setdefault(r["transport"], {}).setdefault(r["model"], []).append(g)
        if g < 1 - 1e-9:
            short.append({k: r[k] for k in ("transport", "model", "devices", "dp_over_best_even_any_k")})
    summary = {t: {m: {"min": min(v), "max": max(v)} for m, v in per.items()} for t, per in gains.items()}
    ok = not short
    print(f"\nDP + replication >= every even split with replication (any stage count), on every profile and "
          f"device count: {'yes' if ok else 'NO: ' + str(short)}")
    for t, per in summary.items():
        print(f"  {t}: gain per profile (min-max over M) "
              + ", ".join(f"{m} {v['min']:.2f}-{v['max']:.2f}x" for m, v in per.items()))
    if unmatched:
        print(f"  no even split fits (not compared): {unmatched}")
    return {"dp_at_least_every_even_split": ok, "short": short, "no_even_split_fits": unmatched,
            "gain_per_profile": summary}


def _ratio(x: float | None) -> str:
    return "no even split fits" if x is None else f"{x:.2f}x"


# --- served runs ------------------------------------------------------------------------------
def _bodies(arrays_per_request: list[list[Any]]) -> list[bytes]:
    return [json.dumps({"inputs": a if len(a) > 1 else a[0]}).encode() for a in arrays_per_request]


def _front_ms(url: str, calls: int = 20) -> float:
    """Median round trip of GET /healthz: the HTTP front and ingress, outside the pipeline."""
    import requests

    times = []
    with requests.Session() as session:
        for _ in range(calls):
            t0 = time.perf_counter()
            session.get(url + "/healthz", timeout=30).raise_for_status()
            times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times))


def _measure(app: Any, prof: sp.Profile, probe: Any, bodies: list[bytes], rows: int, *, duration_s: float,
             inflight: int, batch_wait_ms: float) -> dict[str, Any]:
    """Saturation rows/s, then Poisson p50/p99 at SERVED_LOAD of the prediction, each next
    to what the cost model and the simulation predict, with the Serve hop and the HTTP
    front measured right before (both move with the machine's load)."""
    hop = probe.measure(repeats=9)
    prof = prof.with_transport(hop)
    p = sp.evaluate(prof, app.plan.stages, batch_size=app.plan.batch_size)
    front = _front_ms(app.url)
    url = app.url + "/predict"
    sat = asyncio.run(closed_loop(url, bodies, rows, concurrency=inflight + 2, duration_s=duration_s))
    rate_rps = SERVED_LOAD * p.throughput / rows
    ol = asyncio.run(open_loop(url, bodies, rows, rate_rps=rate_rps, duration_s=duration_s * 1.5, seed=1))
    sim = sp.simulate(p, prof, rate=rate_rps, rows_per_request=rows, requests=3000,
                      batch_wait_ms=batch_wait_ms, max_inflight=inflight, front_ms=front)
    res = {
        "stages": [(s.start, s.end, s.replicas) for s in p.stages], "batch_size": p.batch_size,
        "hop": hop.to_dict(), "front_ms": front, "load": _load(),
        "predicted_rows_per_s": p.throughput, "measured_rows_per_s": sat.rows_per_s,
        "throughput_ratio": sat.rows_per_s / p.throughput if p.throughput else math.nan,
        "saturation": sat.to_dict(), "poisson": ol.to_dict(), "offered_rps": rate_rps,
        "predicted_latency_ms": p.latency_ms + front, "simulated_p50_ms": sim.p50_ms,
        "simulated_p99_ms": sim.p99_ms, "p99_ratio": ol.p99_ms / sim.p99_ms if sim.p99_ms else math.nan,
    }
    print(f"    stages {res['stages']} batch {p.batch_size}; hop {hop.fixed_ms:.1f} ms + B/{hop.bytes_per_s / 1e6:,.0f} "
          f"MB/s, front {front:.1f} ms, load {res['load']}\n"
          f"      rows/s predicted {p.throughput:,.1f} measured {sat.rows_per_s:,.1f} "
          f"({res['throughput_ratio']:.2f}x; {sat.errors} errors) | Poisson {rate_rps:.1f} req/s: p50 {ol.p50_ms:.0f} ms "
          f"(sim {sim.p50_ms:.0f}), p99 {ol.p99_ms:.0f} ms (sim {sim.p99_ms:.0f}, {res['p99_ratio']:.2f}x)")
    return res


def part_emulated(data_dir: str | None, probe: Any, duration_s: float,
                  models: tuple[str, ...] = ("vgg16", "resnet50"), devices: tuple[int, ...] = (4, 8),
                  plans_wanted: tuple[str, ...] = ("dp+replication", "even by layers")) -> dict[str, Any]:
    from serving.model_app.deploy import deploy_model

    print("\n== emulated accelerators: plans served, blocks sleep their profiled GPU time ==")
    out: dict[str, Any] = {"runs": []}
    rows = 64
    for model in models:
        base = sp.read_pipedream(_profiles_dir(data_dir) / f"{model}.txt")
        module, example, prof = sp.emulated(base, transport=probe.measure(repeats=9))
        graph = sp.capture(module, example)
        cap, _ = memory_cap(prof)
        rng = np.random.default_rng(0)
        bodies = _bodies([[rng.standard_normal((rows, 8)).round(4).tolist()] for _ in range(8)])
        for m in devices:
            # the even split is judged without the memory cap here (an emulated device has
            # no memory to overflow): this part checks the cost model, not feasibility
            plans = {"dp+replication": sp.plan(prof, m, cap),
                     "even by layers": sp.evaluate(prof, sp.with_replicas(sp.even_by_layers(len(prof), m), m),
                                                   devices=m)}
            for name, p in plans.items():
                if name not in plans_wanted:
                    continue
                inflight = 2 * p.devices_used + len(p.stages)
                print(f"  {model} M={m} {name}:")
                app = deploy_model(module, example, name=f"emu-{model}-{m}", plan=p, graph=graph,
                                   cpus_per_replica=0.05, threads=1, batch_wait_ms=0.0, max_inflight=inflight)
                try:
                    res = _measure(app, prof, probe, bodies, rows, duration_s=duration_s, inflight=inflight,
                                   batch_wait_ms=0.0)
                finally:
                    app.shutdown()
                out["runs"].append({"model": model, "devices": m, "plan": name, **res})
    return out


def _fixed_width(tok: Any, texts: list[str], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = tok(texts)
    pad = width - ids.shape[1]
    if pad > 0:
        ids = torch.nn.functional.pad(ids, (0, pad))
        mask = torch.nn.functional.pad(mask, (0, pad))
    return ids, mask


def part_cpu(probe: Any, duration_s: float, device: str = "cpu") -> dict[str, Any]:
    from pipelines._minilm import Tokenizer, load_minilm
    from serving.model_app.deploy import deploy_model

    print(f"\n== real {device}: all-MiniLM-L6-v2 in 2 stages (1 thread each) ==")
    tok = Tokenizer(max_length=64)
    model = load_minilm()
    texts = [f"example tweet number {i} with a few words, some of them rude" for i in range(64)]
    example = _fixed_width(tok, texts[:2], 64)
    graph = sp.capture(model, example)
    prof = sp.profile(graph, batch_sizes=(8, 16), device=device, threads=1, repeats=5,
                      transport=probe.measure(repeats=9), name="minilm")
    cap, _ = memory_cap(prof)
    p = sp.plan(prof, 2, cap)
    print(f"  {len(graph)} blocks; plan: {p}")
    rows = p.batch_size
    bodies = []
    for k in range(4):
        ids, mask = _fixed_width(tok, texts[k * rows:(k + 1) * rows] or texts[:rows], 64)
        bodies.append(json.dumps({"inputs": [ids.tolist(), mask.tolist()]}).encode())
    inflight = 2 * p.devices_used + len(p.stages)
    app = deploy_model(model, example, name="cpu-minilm", plan=p, graph=graph, cpus_per_replica=1.0,
                       threads=1, batch_wait_ms=0.0, max_inflight=inflight, device=device)
    try:
        res = _measure(app, prof, probe, bodies, rows, duration_s=duration_s, inflight=inflight,
                       batch_wait_ms=0.0)
    finally:
        app.shutdown()
    return {"blocks": len(graph), "profile_compute_ms": {str(b): float(np.sum(prof.compute(b)))
                                                         for b in prof.batch_sizes}, **res}


def part_deep(data_dir: str | None, probe: Any, duration_s: float, device: str = "cpu") -> dict[str, Any]:
    from scipy import sparse

    from pipelines import toxic_deep as td
    from serving.model_app.deploy import deploy_model

    print("\n== toxic_deep: the full pipeline served alone (2 CPUs) ==")
    X_train, y_train, X_test, y_test = td.load_split(data_dir)
    enc = td.SentenceEncoder(threads=2)
    t0 = time.perf_counter()
    e_train = td.cached_embeddings(X_train["tweet"], enc)
    e_test = td.cached_embeddings(X_test["tweet"], enc)
    print(f"  embeddings of {len(X_train) + len(X_test)} tweets: {time.perf_counter() - t0:.1f} s (cached after)")
    word = td.fit_word_tfidf(X_train["tweet"])
    w_train, w_test = word.transform(X_train["tweet"]), word.transform(X_test["tweet"])
    cheap = td.model().fit(w_train, y_train)
    full = td.model().fit(sparse.hstack([w_train, e_train]).tocsr(), y_train)
    _, lr = td.fit_embedding_classifier(enc, e_train, y_train)
    acc = {
        "cheap_word_tfidf": float((cheap.predict(w_test) == y_test).mean()),
        "embeddings_only": float((lr.predict(e_test) == y_test).mean()),
        "full_pipeline": float((full.predict(sparse.hstack([w_test, e_test]).tocsr()) == y_test).mean()),
    }
    print(f"  test accuracy: cheap level (word TF-IDF) {acc['cheap_word_tfidf']:.4f}, MiniLM embeddings alone "
          f"{acc['embeddings_only']:.4f}, full pipeline {acc['full_pipeline']:.4f} ({len(y_test)} rows)")
    # the full pipeline (word TF-IDF + MiniLM -> logistic regression) as one torch module,
    # served alone: what a cascade would be measured against
    module = td.FullPipelineModule(enc.model, word, full.coef_, full.intercept_).eval()
    width = enc.tokenizer.max_length
    texts = X_test["tweet"].tolist()

    def inputs(batch: list[str]) -> list[torch.Tensor]:
        ids, mask = _fixed_width(enc.tokenizer, batch, width)
        return [ids, mask, td.word_ids(word, batch)[0]]

    example = tuple(inputs(texts[:2]))
    rows = 16
    bodies = [json.dumps({"inputs": [t.tolist() for t in inputs(texts[k * rows:(k + 1) * rows])]}).encode()
              for k in range(16)]
    app = deploy_model(module, example, name="toxic-deep-full", plan="auto", devices=2, cpus_per_replica=1.0,
                       threads=1, batch_sizes=(8, 16, 32), transport=probe.measure(repeats=9), device=device)
    try:
        import requests

        sample = inputs(texts[:64])
        served = np.asarray(requests.post(app.url + "/predict", json={"inputs": [t.tolist() for t in sample]},
                                          timeout=120).json()["outputs"])
        want = full.predict_proba(sparse.hstack([w_test[:64], e_test[:64]]).tocsr())
        same = bool(np.allclose(served, want, atol=1e-4))
        inflight = 2 * app.plan.devices_used + len(app.plan.stages)
        print(f"  plan: {app.plan}\n  served == in-process full pipeline on 64 test rows: {same}")
        res = _measure(app, app.profile, probe, bodies, rows, duration_s=duration_s, inflight=inflight,
                       batch_wait_ms=2.0)
    finally:
        app.shutdown()
    return {"accuracy": acc, "served_matches_in_process": same, "tokens": width, **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.partition", description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    ap.add_argument("--out", default="bench_partition.json", help="JSON file written at the end")
    ap.add_argument("--data-dir", help="the shared datasets folder (default ../shared/datasets)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load per served measurement")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="device of the cpu and deep parts' real runs (cuda: one GPU per replica; the "
                         "hop measured is still the Serve object-store hop, CUDA copies fall in the stages)")
    ap.add_argument("--emulated-models", default="vgg16,resnet50", help="PipeDream profiles to emulate")
    ap.add_argument("--emulated-devices", default="4,8", help="device counts of the emulated runs")
    ap.add_argument("--emulated-plans", default="dp+replication,even by layers", help="plans to serve")
    ap.add_argument("--sim-requests", type=int, default=4000, help="requests per simulation")
    ap.add_argument("--models", default="all", help="PipeDream profiles the plan part compares (default: all 14)")
    ap.add_argument("--sim-models", default=",".join(MODELS), help="profiles whose plans are simulated for p99")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; choose from {PARTS}")
    import ray
    from ray import serve

    from serving.model_app.deploy import free_port
    from serving.model_app.transport import HopProbe

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": _load(),
                              "cpus": os.cpu_count(), "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                              "command": " ".join(["python -m benchmarks.partition", *(argv or sys.argv[1:])])}
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU here")
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    probe = None
    try:
        probe = HopProbe()
        hop = probe.measure()
        result["serve_hop"] = hop.to_dict()
        print(f"Serve hop measured here: {hop.fixed_ms:.2f} ms + bytes / {hop.bytes_per_s / 1e6:,.0f} MB/s "
              f"(points {[(int(b), round(ms, 2)) for b, ms in hop.points]})")
        if "plan" in parts:
            result["plan"] = part_plan(args.data_dir, hop, args.sim_requests,
                                       None if args.models == "all" else tuple(args.models.split(",")),
                                       tuple(args.sim_models.split(",")))
        if "emulated" in parts:
            result["emulated"] = part_emulated(
                args.data_dir, probe, args.duration, tuple(args.emulated_models.split(",")),
                tuple(int(m) for m in args.emulated_devices.split(",")), tuple(args.emulated_plans.split(",")))
        if "cpu" in parts:
            result["cpu"] = part_cpu(probe, args.duration, args.device)
        if "deep" in parts:
            result["deep"] = part_deep(args.data_dir, probe, args.duration, args.device)
    finally:
        if probe is not None:
            probe.close()
        serve.shutdown()
        ray.shutdown()
    result["load_after"] = _load()
    Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    print(f"\nload average before {result['load_before']}, after {result['load_after']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
