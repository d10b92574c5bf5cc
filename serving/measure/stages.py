"""How an optimized pipeline splits into serving stages, and what each stage and the
ingress's own work cost here.

Stages are coarse on purpose (each hop costs CPU on both sides): the *cheap* stage runs
the first cascade level; the *expensive* stage runs every later level and only sees the
rows the cheap stage was unsure of, together with the feature blocks the cheap stage
already computed. A pipeline without a cascade has one *model* stage. The *baseline*
stage (the unoptimized pipeline in one deployment) exists for side-by-side benchmarks.

CPU stages are timed in this process. A GPU stage is timed inside a Ray actor that holds
a GPU, with the models moved onto it, and again with 2 and 4 such processes sharing one
GPU (the planner treats a GPU as one server whose throughput with k processes is what
was measured).
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.core.constants import CONCURRENT_BATCHES
from serving.core.jsonsafe import clean
from serving.core.nodes import floor_units
from serving.core.procstat import runqueue_wait_s
from serving.core.profiles import IngressProfile, StageProfile
from serving.core.schema import PredictRequest, RowSchema, parse_request, predict_answer
from serving.core.specs import StageSpec, stage_specs, unsure_share, whole_cascade
from serving.runtime.records import record_columns
from serving.runtime.stage_runner import StageRunner, place_models, slice_blocks
from willump import OptimizedPipeline

#: batch sizes (rows) at which stage costs are measured
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
#: timed repeats per batch size (median)
PROFILE_REPEATS = 5
#: batch size (rows) at which the CPU cost of concurrent batches in one process is measured,
#: and how many times (median)
INFLATION_BATCH = 32
INFLATION_ROUNDS = 3
INFLATION_REPEATS = 12
#: processes sharing one GPU at which its throughput is measured
GPU_CONCURRENCY = (1, 2, 4)
#: timed batches per process when measuring GPU sharing
GPU_SHARING_BATCHES = 20
#: seconds a GPU profiling step may take (starting the processes, timing) before it is refused
GPU_PROFILE_TIMEOUT_S = 300.0


def profile_rows(opt: OptimizedPipeline, rows: Any = None) -> Any:
    if rows is not None:
        return rows
    if getattr(opt, "sample_rows_", None) is None:
        raise ValueError(
            "the optimized pipeline carries no sample rows (optimize(..., keep_sample=False)); "
            "pass rows= to profile the stages"
        )
    return opt.sample_rows_


def _batch(rows: Any, size: int) -> Any:
    return rows.iloc[np.arange(size) % len(rows)].reset_index(drop=True)


def request_bodies(rows: Any, rows_per_request: int, schema: Any, count: int = 1) -> list[bytes]:
    """``count`` JSON bodies of ``POST /predict`` with ``rows_per_request`` of ``rows`` each
    (cycling through them), holding the columns ``schema`` names."""
    bodies = []
    for k in range(count):
        frame = rows.iloc[(np.arange(rows_per_request) + k * rows_per_request) % len(rows)].reset_index(drop=True)
        required = [c.name for c in schema.columns] + [c for c in schema.optional if c in frame.columns]
        bodies.append(json.dumps(clean({"rows": frame[required].to_dict("records")})).encode())
    return bodies


def _timed(fn, repeats: int) -> tuple[float, float]:
    """Wall seconds the call takes with the machine to itself, and its median CPU seconds, over
    ``repeats`` calls (the CPU clock counts every thread the call uses, e.g. a pipeline
    computing feature groups in a thread pool, but not waits, nor other processes' use of
    the machine).

    A busy machine (Ray and replicas starting while deploy profiles) lengthens the wall
    clock without the call waiting for anything of its own: its thread stands in the run
    queue (:func:`serving.core.procstat.runqueue_wait_s`, left out), or waits for the GIL
    while another thread of the process runs (a Ray worker's own threads), which no
    counter separates from a real wait. Such a disturbance only ever lowers a call's share
    of CPU in its wall time, so the call's own share is read from its least disturbed
    repeat, and its wall time is its median CPU time over that share. Before, whether a
    CPU-bound stage ran inline (:attr:`StageProfile.runs_inline`, decided from that share)
    depended on what else the machine did. A stage that waits on every call (a lookup, a
    device) keeps its waits: they are in every repeat."""
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0, q0 = time.perf_counter(), time.process_time(), runqueue_wait_s()
        fn()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0 - (runqueue_wait_s() - q0))
    cpu = float(np.median(cpus))
    share = max(c / max(w, c, 1e-12) for w, c in zip(walls, cpus, strict=True))
    if share < 1e-3:  # (almost) no CPU at all: a stage that waits; its wall clock as measured
        return float(np.median(walls)), cpu
    return cpu / share, cpu


def _median_seconds(fn, repeats: int) -> float:
    return _timed(fn, repeats)[1]


def time_stage(opt: OptimizedPipeline, spec: StageSpec, rows: Any, batch_sizes: Sequence[int],
               repeats: int, rows_per_call: float | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds per batch of the stage at each batch size: the time it takes when the stage
    has the machine to itself (its CPU time plus what it waits for), and its CPU time.

    With ``rows_per_call`` the batch is timed the way a replica runs it: as several calls of
    that many rows (what the ingress sends per request) merged into one pass and split back
    (``StageRunner.run_many``), so the merging costs are in the figures too."""

    runner = StageRunner(opt, spec, baseline=spec.name == "baseline")
    wall, cpu = {}, {}
    for b in batch_sizes:
        batch = _batch(rows, b)
        blocks = None
        if spec.first > 0 and spec.name != "baseline":
            blocks, _ = opt.pipeline.compute(batch, opt.levels[0].groups)
        per = max(1, round(rows_per_call)) if rows_per_call else b
        items = [(batch.iloc[i:i + per].reset_index(drop=True), slice_blocks(blocks, i, i + per))
                 for i in range(0, b, per)]
        w, c = _timed(lambda items=items: runner.run_many(items), repeats)
        cpu[b] = max(c, 1e-7)
        wall[b] = max(cpu[b], w)  # on a busy machine the wall clock also counts others' turns
    return wall, cpu


def thread_inflation(opt: OptimizedPipeline, spec: StageSpec, rows: Any, batch: int, repeats: int,
                     threads: int | None = None) -> float:
    """CPU per batch with ``threads`` (CONCURRENT_BATCHES) batches running at once in this
    process, as a replica runs them, over CPU per batch one at a time (the process's CPU clock:
    GIL hand-offs and shared caches cost CPU; waiting for the GIL does not)."""
    import threading

    threads = CONCURRENT_BATCHES if threads is None else threads
    repeats = max(repeats, INFLATION_REPEATS)
    runner = StageRunner(opt, spec, baseline=spec.name == "baseline")
    data = _batch(rows, batch)
    blocks = None
    if spec.first > 0 and spec.name != "baseline":
        blocks, _ = opt.pipeline.compute(data, opt.levels[0].groups)
    def together() -> float:
        def loop() -> None:
            for _ in range(repeats):
                runner.run(data, blocks)

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        c0 = time.process_time()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return (time.process_time() - c0) / (threads * repeats)

    # alternate the two conditions, so that a neighbour's burst of load hits both alike
    ratios = [together() / max(_timed(lambda: runner.run(data, blocks), repeats)[1], 1e-9)
              for _ in range(INFLATION_ROUNDS)]
    return max(1.0, float(np.median(ratios)))


def profile_stages(
    opt: OptimizedPipeline,
    rows: Any = None,
    *,
    batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    repeats: int = PROFILE_REPEATS,
    device: str = "cpu",
    rows_per_request: int | None = None,
    skip: Sequence[str] = (),
    whole: bool = False,
) -> list[StageProfile]:
    """Seconds per batch for each stage at each batch size, measured in this process.

    ``device="gpu"`` marks the later stages as GPU stages but keeps these CPU timings
    (``measured_on="cpu"``, which the plan notes); :func:`profile_gpu_stage` measures them
    on a GPU. ``rows_per_request``: batches are timed as merged calls of the rows a request
    sends each stage (see :func:`time_stage`). Stages named in ``skip`` (those a GPU
    will time, :func:`profile_gpu_stage`) are left out rather than timed on the CPU for nothing.
    ``whole``: a cascade's every level as one stage is timed too, last
    (:func:`serving.core.specs.whole_cascade`; layouts "whole" and "auto").
    """
    rows = profile_rows(opt, rows)
    out = []
    for spec in stage_specs(opt) + (whole_cascade(opt) if whole and len(opt.levels) > 1 else []):
        if spec.name in skip:
            continue
        scale = 1.0 if spec.first == 0 else unsure_share(opt)
        on_gpu = device == "gpu" and spec.first > 0
        per_call = None if rows_per_request is None else max(1.0, rows_per_request * scale)
        wall, cpu = time_stage(opt, spec, rows, batch_sizes, repeats, per_call)
        inflation = thread_inflation(opt, spec, rows, INFLATION_BATCH, repeats)
        out.append(StageProfile(spec.name, wall, scale, "gpu" if on_gpu else "cpu", measured_on="cpu",
                                cpu_seconds=cpu, thread_inflation=inflation))
    return out


def profile_baseline(
    opt: OptimizedPipeline, rows: Any = None, *, batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    repeats: int = PROFILE_REPEATS, rows_per_request: int | None = None,
) -> StageProfile:
    """The unoptimized pipeline as one stage (for the baseline deployment)."""
    rows = profile_rows(opt, rows)
    spec = StageSpec("baseline", 0, len(opt.levels) - 1)
    wall, cpu = time_stage(opt, spec, rows, batch_sizes, repeats, rows_per_request)
    return StageProfile("baseline", wall, 1.0, cpu_seconds=cpu,
                        thread_inflation=thread_inflation(opt, spec, rows, INFLATION_BATCH, repeats))


def profile_ingress(
    opt: OptimizedPipeline,
    rows_per_request: int,
    *,
    schema: Any = None,
    record_config: dict[str, Any] | None = None,
    rows: Any = None,
    repeats: int = PROFILE_REPEATS * 4,
) -> IngressProfile:
    """The ingress route's own CPU per request of ``rows_per_request`` rows (parse and
    validate the JSON body, build the frame, encode the answer, build monitor records),
    measured in this process on the sample rows, and the sizes hops and the front move."""

    rows = profile_rows(opt, rows)
    frame = _batch(rows, rows_per_request)
    if schema is None:
        graph = opt.pipeline.graph
        schema = RowSchema.from_sample(rows, sorted({c for cols in graph.columns.values() for c in cols}))
    body = request_bodies(frame, rows_per_request, schema)[0]
    parse_s = _median_seconds(lambda: parse_request(body, PredictRequest, schema, len(frame) + 1), repeats)
    specs = stage_specs(opt)
    first = StageRunner(opt, specs[0]).run(frame)
    proba = np.nan_to_num(first["proba"], nan=0.5)
    level = np.maximum(first["level"], 0)
    classes = np.asarray(opt.classes_, dtype=object)
    degraded = np.zeros(len(frame), dtype=bool)
    answer = predict_answer(classes, proba, level, degraded, "v")
    respond_s = _median_seconds(lambda: predict_answer(classes, proba, level, degraded, "v"), repeats)
    records_s = 0.0
    if record_config is not None:
        replica = np.full(len(frame), "r", dtype=object)
        records_s = _median_seconds(lambda: record_columns(frame, proba, level, replica, 1.0, 0.0, "v", None,
                                                           record_config), repeats)
    n = len(frame)
    result = {"proba": proba, "level": level, "unsure": first["unsure"], "seconds": 0.0, "replica": "r"}
    blocks = first.get("blocks")
    if blocks is None and len(specs) > 1:
        blocks, _ = opt.pipeline.compute(frame, opt.levels[0].groups)
    blocks_kb = _kb(blocks) / n if blocks else 0.0
    return IngressProfile(
        rows_per_request=rows_per_request, parse_ms=1000 * parse_s, respond_ms=1000 * respond_s,
        records_ms=1000 * records_s, body_kb=len(body) / 1024, response_kb=len(answer) / 1024,
        rows_kb_per_row=_kb(frame) / n, result_kb_per_row=_kb({**result, "blocks": None}) / n,
        blocks_kb_per_row=blocks_kb, measured=True,
    )


def _kb(obj: Any) -> float:
    return len(pickle.dumps(obj, protocol=5)) / 1024


# --- GPU stages ---------------------------------------------------------------------------
class _GpuTimer:
    """A process holding (a share of) a GPU, with the stage's models on it."""

    def __init__(self, source: Any, spec: StageSpec, runtime: str):
        self.opt = source.load()
        self.notes = place_models(self.opt, "cuda", runtime)
        self.spec = spec
        self.rows = profile_rows(self.opt)

    def device(self) -> str:
        try:
            import torch

            return "gpu" if torch.cuda.is_available() else "cpu (no CUDA device visible to the actor)"
        except ImportError:
            return "cpu (torch not installed in the actor)"

    def batch_seconds(self, batch_sizes: Sequence[int], repeats: int) -> dict[int, float]:
        return time_stage(self.opt, self.spec, self.rows, batch_sizes, repeats)[0]

    def rows_per_second(self, batch: int, batches: int, start_at: float) -> float:
        """Run ``batches`` batches back to back from wall-clock ``start_at`` (so that the
        processes sharing the GPU overlap); rows per second."""
        data = _batch(self.rows, batch)
        baseline = self.spec.name == "baseline"
        blocks = None
        if self.spec.first > 0 and not baseline:
            blocks, _ = self.opt.pipeline.compute(data, self.opt.levels[0].groups)
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        for _ in range(batches):
            if baseline:  # the full pipeline, as the baseline's replicas run it
                self.opt.baseline.predict_proba(data)
            else:
                self.opt.run_levels(data, self.spec.first, self.spec.last, blocks)
        return batch * batches / (time.perf_counter() - t0)


def _get(ray: Any, refs: Any, what: str, timeout_s: float | None = None) -> Any:
    """``ray.get`` with a deadline: a GPU the cluster cannot give (a fraction of one still
    taken) is refused with a clear error instead of a hang."""
    timeout_s = GPU_PROFILE_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"GPU profiling: {what} took over {timeout_s:g} s (is a GPU free on the "
                           "cluster? a fraction of one held elsewhere leaves too little)") from None


def profile_gpu_stage(
    source: Any,
    spec: StageSpec,
    scale: float,
    *,
    runtime: str = "native",
    batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
    repeats: int = PROFILE_REPEATS,
    concurrency: Sequence[int] | None = None,
    gpus: float = 1.0,
) -> StageProfile:
    """Time a GPU stage inside Ray actors holding a GPU (Ray must be running, with a GPU):
    batch seconds with one process, then the GPU's throughput with k processes sharing it,
    relative to one (``speedup``). The processes hold ``gpus`` of one GPU among them (what
    the app may use: another app may hold the rest)."""
    import ray

    if not 0 < gpus <= 1:
        raise ValueError(f"gpus must be in (0, 1], got {gpus!r}")

    concurrency = GPU_CONCURRENCY if concurrency is None else concurrency
    counts = sorted(set(concurrency) | {1})
    timer = ray.remote(_GpuTimer)
    # every process that will share the GPU is started (and loads the stage) once: one of
    # them times the batches alone, then the first k of them run at once for each k
    # each an equal share, rounded down to Ray's unit so that together they never ask for more
    actors = [timer.options(num_gpus=floor_units(gpus / counts[-1]), num_cpus=0).remote(source, spec, runtime)
              for _ in range(counts[-1])]
    batch = max(b for b in batch_sizes if b <= 64) if any(b <= 64 for b in batch_sizes) else min(batch_sizes)
    speedup: dict[int, float] = {}
    try:
        devices = _get(ray, [a.device.remote() for a in actors], f"{counts[-1]} GPU profiling processes to start")
        measured_on = devices[0]
        seconds = _get(ray, actors[0].batch_seconds.remote(list(batch_sizes), repeats), "the GPU batch timings")
        base = None
        for k in counts:
            start = time.time() + 0.5
            total = sum(_get(ray, [a.rows_per_second.remote(batch, GPU_SHARING_BATCHES, start) for a in actors[:k]],
                             f"{k} processes sharing the GPU"))
            base = total if base is None else base
            speedup[k] = total / base
    finally:
        for a in actors:
            ray.kill(a)
    return StageProfile(spec.name, seconds, scale, "gpu", speedup=speedup, measured_on=measured_on)


# --- profiling where the replicas run -----------------------------------------------------
class _Profiler:
    """A Ray worker process like the replicas' (same interpreter settings, one thread for
    numerical libraries), which times the stages and the ingress's work there."""

    def __init__(self, source: Any):
        self.opt = source.load()

    def profile(self, baseline: bool, rows_per_request: int, schema: dict[str, Any],
                record_config: dict[str, Any] | None, batch_sizes: Sequence[int], repeats: int,
                skip: Sequence[str] = (), whole: bool = False) -> dict:

        if baseline and "baseline" in skip:
            stages = []
        elif baseline:
            stages = [profile_baseline(self.opt, batch_sizes=batch_sizes, repeats=repeats,
                                       rows_per_request=rows_per_request)]
        else:
            stages = profile_stages(self.opt, batch_sizes=batch_sizes, repeats=repeats,
                                    rows_per_request=rows_per_request, skip=skip, whole=whole)
        ingress = profile_ingress(self.opt, rows_per_request, schema=RowSchema.from_dict(schema),
                                  record_config=record_config)
        return {"stages": [p.to_dict() for p in stages], "ingress": ingress.to_dict()}


#: profiles measured by :func:`profile_on_cluster` in this process, by artifact version, node
#: and what was asked: the same artifact deployed again on the same raylet is not re-timed
#: (a replica's worker process and its imports cost seconds per deploy)
_MEASURED: dict[tuple, tuple[list[dict], dict]] = {}


def forget_profiles() -> None:
    """Time every artifact afresh on its next deploy (the machine's load changed)."""
    _MEASURED.clear()


def profile_on_cluster(source: Any, *, baseline: bool, rows_per_request: int, schema: Any,
                       record_config: dict[str, Any] | None, batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
                       repeats: int = PROFILE_REPEATS,
                       skip: Sequence[str] = (), whole: bool = False) -> tuple[list[StageProfile], IngressProfile]:
    """Stage and ingress profiles measured in a Ray worker on this node (Ray must be running):
    a replica's process, not the driver's, whose numerical libraries may use several threads.
    Stages named in ``skip`` are not timed (a GPU times them); ``whole``: the whole cascade
    as one stage is timed too (:func:`serving.core.specs.whole_cascade`). Measured once per
    artifact version, raylet and arguments in this process (:func:`forget_profiles`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    args = (baseline, rows_per_request, schema.to_dict(), record_config, list(batch_sizes), repeats, list(skip),
            whole)
    key = (source.version, here, json.dumps(args, sort_keys=True, default=str))
    if key not in _MEASURED:
        actor = ray.remote(_Profiler).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote(source)
        try:
            out = ray.get(actor.profile.remote(*args))
        finally:
            ray.kill(actor)
        _MEASURED[key] = (out["stages"], out["ingress"])
    stages, ingress = _MEASURED[key]
    return [StageProfile.from_dict(p) for p in stages], IngressProfile.from_dict(ingress)
