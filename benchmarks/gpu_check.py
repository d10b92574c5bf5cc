"""The GPU check, in one process: ``python -m benchmarks.gpu_check [--device cuda] [--out FILE]``.

Written to run as is on one GPU machine whose Python has torch, scikit-learn, pandas and
numpy but no Ray and no package registry (see "GPU check" in docs/benchmarks.md for the
files to carry along: the Davidson tweets and the MiniLM weights). It measures, on the
device it names:

1. **environment**: torch, the device (name, memory, multiprocessors), the CPU count.
2. **partition**: all-MiniLM-L6-v2 captured on the CPU from real tweets (as a user
   captures), profiled on the device (``serving.partition.profile``, which works on a copy
   there: the caller's module must stay on the CPU, checked), planned for one device and
   for two devices with a memory cap that forces a split; the split run on the device
   against the module on the device (equal within float32 tolerance); the same split as
   ``deploy_model``'s replicas load it (stage files written on the CPU, loaded on the
   device, canary rows, chained); and each stage's predicted time (the profile's block
   times summed) next to the stage timed whole.
3. **cascade**: ``pipelines.toxic_deep`` (word TF-IDF cheap level; MiniLM on the device as
   the expensive feature group) optimized with a certified bound (accuracy, max_loss
   0.005, confidence 0.95); the certified cascade against the full pipeline, **both with
   MiniLM on the same device**, on the held-out rows: rows/s side by side (medians), the
   accuracy of each, the realized loss, the bound, the share answered per level.
4. **stages**: what a serving replica does, without Ray (``serving.runtime.stage_runner``,
   which needs pydantic): the artifact saved with MiniLM on the device and loaded back
   (device-neutral), the stages placed on the device, their canaries (the replicas' health
   check), the stages chained against the pipeline in process; ONNX Runtime asked for the
   device, its provider reported.
5. **served**: not here: the same cascade served through Ray Serve is
   ``benchmarks.deep --device gpu``, whose wheels ``benchmarks.gpu_carry --served`` packs.

It writes one JSON (``--out``) naming the device and prints the issue's targets next to
what was measured. ``--device cpu`` runs the same code on the CPU (how it is tested).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: the issue's targets on a GPU machine
TARGET_CASCADE_SPEEDUP = 4.0
TARGET_MAX_LOSS = 0.005
TARGET_STAGE_PREDICTION = 0.25  # predicted stage time within 25% of the measured one
#: batch sizes the partition profile takes (tweets per forward)
PROFILE_BATCHES = (8, 32, 128)
#: the two-device plan's memory cap, as a share of the model's parameter bytes (plus the
#: largest block workspace at the smallest batch): MiniLM's word embeddings are ~54% of
#: it, so 0.7 forces a split
SPLIT_MEMORY_SHARE = 0.7
#: tweets in the example a user captures with, and in the equality check
EXAMPLE_ROWS = 32
CHECK_ROWS = 128


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
        "machine": platform.machine(), "cuda_available": torch.cuda.is_available(),
        "ray": importlib.util.find_spec("ray") is not None, "device": device,
        "taken": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but torch sees no GPU (torch.cuda.is_available() is False)")
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    return env


def _timer(device: str):
    """``time_ms(fn, repeats, warmup)``: median milliseconds (CUDA events on a GPU; on the
    CPU with one intra-op thread, as ``serving.partition.profile`` times blocks)."""
    import torch

    def time_ms(fn, repeats: int = 10, warmup: int = 3) -> float:
        threads = torch.get_num_threads()
        if not device.startswith("cuda"):
            torch.set_num_threads(1)
        try:
            return _median_ms(fn, repeats, warmup)
        finally:
            torch.set_num_threads(threads)

    def _median_ms(fn, repeats: int, warmup: int) -> float:
        with torch.inference_mode():
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(repeats):
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    torch.cuda.synchronize()
                    samples.append(float(start.elapsed_time(end)))
                else:
                    t0 = time.perf_counter()
                    fn()
                    samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    return time_ms


def partition_check(device: str, tweets: list[str], repeats: int,
                    batch_sizes: tuple[int, ...] = PROFILE_BATCHES) -> dict[str, Any]:
    """Capture on the CPU, profile and plan on ``device``, split == model there, predicted
    stage times next to measured ones."""
    import torch

    from pipelines._minilm import Tokenizer, load_minilm
    from serving import partition as sp

    model, tok = load_minilm(), Tokenizer()
    example = tok(tweets[:EXAMPLE_ROWS])
    t0 = time.perf_counter()
    graph = sp.capture(model, example)
    out: dict[str, Any] = {"module": "all-MiniLM-L6-v2", "capture": graph.kind, "blocks": len(graph),
                           "capture_s": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    prof = sp.profile(graph, batch_sizes=batch_sizes, device=device, repeats=repeats, name="minilm")
    out["profile_s"] = round(time.perf_counter() - t0, 2)
    out["callers_model_stayed_on_cpu"] = all(p.device.type == "cpu" for p in model.parameters())
    out["model_mib"] = round(prof.model_bytes / 2**20, 1)
    out["profile_ms_per_batch"] = {str(b): round(float(prof.compute(b).sum()), 3) for b in prof.batch_sizes}

    whole = sp.plan(prof, devices=1, memory_per_device=None)
    # the whole model plus its workspace exceeds the cap at every batch size; a stage holding
    # the word embeddings fits at the smallest
    cap = SPLIT_MEMORY_SHARE * prof.model_bytes + float(prof.workspace(prof.batch_sizes[0]).max())
    two = sp.plan(prof, devices=2, memory_per_device=cap)
    out["plan_one_device"] = {"stages": [(s.start, s.end, s.replicas) for s in whole.stages],
                              "throughput": whole.throughput, "batch_size": whole.batch_size}
    out["plan_two_devices_capped"] = {
        "memory_cap_mib": round(cap / 2**20, 1), "feasible": two.feasible,
        "stages": [(s.start, s.end, s.replicas) for s in two.stages], "throughput": two.throughput,
        "batch_size": two.batch_size, "notes": two.notes}
    if not two.feasible or len(two.stages) < 2:
        out["split_equals_model"] = None
        out["why_no_split"] = "the capped plan did not split"
        return out

    moved = sp.to_device(graph, device)  # composition checked on the device at every block
    stages = sp.split(moved, two)
    ids, mask = tok(tweets[:CHECK_ROWS])
    args = (ids.to(device), mask.to(device))
    with torch.inference_mode():
        want = moved.module(*args)
        got = sp.Pipeline(stages)(*args)
    out["split_equals_model"] = bool(sp.allclose(want, got))
    out["split_max_abs_diff"] = float((want - got).abs().max())

    out.update(stage_replicas(graph, two, device, args, want))

    time_ms = _timer(device)
    b = two.batch_size
    batch = sp.batch_of(tuple(a.to(device) for a in moved.example), b)
    rows = []
    value: Any = batch
    for s, stage in zip(two.stages, stages, strict=True):
        inputs = value if isinstance(value, tuple) else (value,)
        measured = time_ms(lambda st=stage, a=inputs: st(*a), repeats=max(repeats, 10))
        predicted = float(prof.compute(b)[s.start:s.end].sum())
        with torch.inference_mode():
            value = stage(*inputs)
        rows.append({"blocks": [s.start, s.end], "predicted_ms": round(predicted, 3),
                     "measured_ms": round(measured, 3), "predicted_over_measured": round(predicted / measured, 3)})
    out["stage_times_at_batch"] = b
    out["stage_times"] = rows
    whole_ms = time_ms(lambda: moved.module(*batch), repeats=max(repeats, 10))
    out["whole_model_ms"] = {"predicted": round(float(prof.compute(b).sum()), 3), "measured": round(whole_ms, 3)}
    return out


def stage_replicas(graph: Any, plan: Any, device: str, args: tuple, want: Any) -> dict[str, Any]:
    """What ``deploy_model``'s replicas do with the same split, without Ray: stage files
    written from the graph captured on the CPU (``torch.export`` baked ``device=cpu`` into
    them), each loaded by ``PartitionStageImpl`` on ``device`` (digest checked, device
    constants rewritten), its canary row run, then the stages chained on real tweets."""
    import tempfile

    import torch

    from serving import partition as sp
    from serving.model_app.stage_replica import PartitionStageImpl, canary_inputs, write_stage_file
    from serving.runtime.wire import to_wire

    cpu_stages = sp.split(graph, plan)
    canaries = canary_inputs(cpu_stages, graph.example)
    with tempfile.TemporaryDirectory(prefix="gpu-check-stages-") as tmp:
        replicas = []
        for k, module in enumerate(cpu_stages):
            path = Path(tmp) / f"stage{k}.pt"
            digest = write_stage_file(module, path)
            replicas.append(PartitionStageImpl(str(path), device, threads=None, sha256=digest, canary=canaries[k]))
        canary = [r.canary() for r in replicas]
        value: Any = to_wire(tuple(a.cpu() for a in args))
        for r in replicas:
            value = r.run(value)
    got = torch.from_numpy(np.asarray(value))
    return {"replica_canaries": [c["canary"] for c in canary], "replica_devices": [c.get("device") for c in canary],
            "replicas_equal_model": bool(sp.allclose(want.cpu(), got)),
            "replicas_max_abs_diff": float((want.cpu() - got).abs().max())}


def cascade_check(device: str, args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    """The certified cascade against the full pipeline, MiniLM on ``device`` in both."""
    from benchmarks._timing import side_by_side
    from pipelines import toxic_deep as td
    from pipelines.workload import score
    from willump._capture import clear_row_caches

    t0 = time.perf_counter()
    w = td.build(args.data_dir, seed=args.seed, n_rows=args.rows, device=device)
    opt = w.optimize(verbose=False, top_k=None, workers=1)
    optimize_s = time.perf_counter() - t0
    report = opt.report()
    X, y = w.X_test, w.y_test
    classes = np.asarray(opt.classes_)
    base_proba = opt.baseline.predict_proba(X)
    opt_proba, answered = opt.predict_with_levels(X)
    base_score = score(w.metric, y, base_proba, classes)
    opt_score = score(w.metric, y, opt_proba, classes)

    def cascade() -> Any:
        clear_row_caches()  # each repeat is a cold stream, as in benchmarks.workloads
        return opt.predict_proba(X)

    times = side_by_side({"full": lambda: opt.baseline.predict_proba(X), "cascade": cascade}, args.repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    group = opt.pipeline.graph_features()["minilm"]
    return opt, X, {
        "rows": {"train": len(w.X_train), "test": len(X)}, "optimize_s": round(optimize_s, 1),
        "plan": report.plan, "minilm_device": str(group.device),
        "full_rows_per_s": len(X) / med["full"], "cascade_rows_per_s": len(X) / med["cascade"],
        "speedup": med["full"] / med["cascade"], "repeats": args.repeats,
        "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "full_accuracy": base_score, "cascade_accuracy": opt_score, "loss": base_score - opt_score,
        "loss_bound": report.loss_bound if report.plan == "cascade" else 0.0,
        "max_loss": w.max_loss, "confidence": w.confidence,
        "answered_per_level": (np.bincount(answered, minlength=len(opt.levels)) / len(X)).tolist(),
        "predicted_speedup": report.expected_speedup, "optimizer_measured_speedup": report.measured_speedup,
        "reason": getattr(report, "reason", None),
    }


def stage_check(device: str, opt: Any, X: Any, workdir: str) -> dict[str, Any]:
    """What a serving replica does, without Ray: the artifact saved where the model sat on
    ``device`` and loaded back (device-neutral: it loads on the CPU), the stages placed on
    ``device`` by ``serving.runtime.stage_runner.place_models``, each stage's canary (the
    health check), the two stages chained as the ingress chains them against the pipeline
    in process; then ONNX Runtime asked for the device (its provider checked, not assumed)."""
    import willump
    from serving.core.specs import stage_specs
    from serving.runtime.stage_runner import StageRunner, place_models

    path = Path(workdir) / "artifact"
    opt.save(path)
    out: dict[str, Any] = {}
    loaded = willump.load(path)
    group = loaded.pipeline.graph_features()["minilm"]
    out["loaded_module_device"] = str(next(group.module.parameters()).device)
    out["place_models_native"] = place_models(loaded, device, "native")
    specs = stage_specs(loaded)
    runners = [StageRunner(loaded, spec) for spec in specs]
    out["canaries"] = {spec.name: r.canary() for spec, r in zip(specs, runners, strict=True)}
    t0 = time.perf_counter()
    first = runners[0].run(X)
    proba = np.array(first["proba"], copy=True)
    if len(runners) > 1 and first["unsure"].size:
        later = runners[1].run(X.iloc[first["unsure"]], first["blocks"])
        proba[first["unsure"]] = later["proba"]
    out["chained_rows_per_s"] = len(X) / (time.perf_counter() - t0)
    want = opt.predict_proba(X)
    out["stages_equal_in_process"] = bool(np.allclose(proba, want, atol=1e-5))
    out["stages_max_abs_diff"] = float(np.max(np.abs(proba - want)))
    try:
        onnx_copy = willump.load(path)
        out["place_models_onnx"] = place_models(onnx_copy, device, "onnx")
    except Exception as exc:  # recorded: the check goes on
        out["place_models_onnx"] = f"failed: {type(exc).__name__}: {exc}"[:500]
    return out


def served_check(env: dict[str, Any]) -> dict[str, Any]:
    how = "python -m benchmarks.deep --device gpu (its wheels packed by python -m benchmarks.gpu_carry --served)"
    if not env["ray"]:
        return {"skipped": f"Ray is not installed here; the served figures: {how}"}
    return {"skipped": f"served figures in a process of their own: {how}"}


def targets(result: dict[str, Any]) -> dict[str, Any]:
    part, casc = result.get("partition") or {}, result.get("cascade") or {}
    ratios = [r["predicted_over_measured"] for r in part.get("stage_times", [])]
    return {
        "cascade_speedup>=4 at bound<=0.005": None if not casc else bool(
            casc["speedup"] >= TARGET_CASCADE_SPEEDUP and casc["loss_bound"] <= TARGET_MAX_LOSS),
        "split_equals_model": part.get("split_equals_model"),
        "stage_replicas_equal_model": part.get("replicas_equal_model"),
        "stages_equal_in_process": (result.get("stages") or {}).get("stages_equal_in_process"),
        "stage_prediction_within_25%": None if not ratios else all(
            abs(r - 1.0) <= TARGET_STAGE_PREDICTION for r in ratios),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--rows", type=int, default=None, help="subsample Davidson to this many rows (default all)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats, medians reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, nargs="+", default=list(PROFILE_BATCHES),
                    help="batch sizes the partition profile takes (tweets per forward)")
    ap.add_argument("--data-dir", default=None, help="the shared data sets (default $WILLUMP_DATASETS or ../shared)")
    ap.add_argument("--skip", action="append", default=[], choices=["partition", "cascade", "stages"],
                    help="leave a section out (repeatable)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if args.rows is not None and args.rows < 200:
        ap.error("--rows must be at least 200")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if any(b < 1 for b in args.batches):
        ap.error("--batches must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = {"gpu": "cuda"}.get(args.device, args.device)
    env = environment(device)
    print(json.dumps(env), flush=True)
    result: dict[str, Any] = {"environment": env}

    def save() -> None:  # after every section, so a run cut short keeps what it measured
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    if "partition" not in args.skip:
        from pipelines.datasets import load_davidson

        tweets = load_davidson(args.data_dir)["tweet"].astype(str).tolist()
        result["partition"] = partition_check(device, tweets, args.repeats, tuple(args.batches))
        print("partition:", json.dumps(result["partition"]), flush=True)
        save()
    if "cascade" not in args.skip:
        opt, X, result["cascade"] = cascade_check(device, args)
        print("cascade:", json.dumps({k: v for k, v in result["cascade"].items() if k != "seconds"}), flush=True)
        save()
        if "stages" not in args.skip:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
                try:
                    result["stages"] = stage_check(device, opt, X, tmp)
                except Exception as exc:  # recorded, with what came before it
                    result["stages"] = {"failed": f"{type(exc).__name__}: {exc}"[:1000]}
            print("stages:", json.dumps(result["stages"], default=str), flush=True)
    result["served"] = served_check(env)
    result["targets"] = targets(result)
    print("targets:", json.dumps(result["targets"]), flush=True)
    save()
    if args.out:
        print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
