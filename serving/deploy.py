"""serving.deploy: an optimized pipeline (or its artifact) as a Ray Serve application."""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from willump import OptimizedPipeline

from .planner import LAYOUTS, Plan, Resources, plan_stages
from .proxy import PROXIES, release_proxy_files, running_proxy, use_proxy
from .runtime import Bundle, bundle_version, load_bundle, read_bundle
from .schema import MAX_BODY_BYTES, MAX_ROWS, RowSchema
from .stages import StageSpec, profile_stages, stage_specs

#: rows per request the plan assumes when none is given
DEFAULT_ROWS_PER_REQUEST = 32
#: closed panes of live traffic frozen as the monitor's reference (monitor reference="traffic")
DEFAULT_REFERENCE_PANES = 5
#: seconds without traffic before a scaled-to-zero stage gives its replica back
DEFAULT_DOWNSCALE_TO_ZERO_S = 30.0
#: how the ingress calls the stages: "grpc" (Serve's inter-deployment gRPC, measured
#: faster here) or "ray" (Ray actor calls through the object store)
TRANSPORTS = ("grpc", "ray")


@dataclass
class ServingApp:
    """A deployed application: where it answers, how it was planned, how to stop it."""

    name: str
    url: str
    plan: Plan
    model_version: str
    stages: list[str]
    started_ray: bool
    notes: list[str] = field(default_factory=list)
    #: the HTTP front answering at ``url``: "haproxy" or "serve" (see serving.proxy)
    proxy: str = "serve"

    def shutdown(self, *, stop_ray: bool | None = None) -> None:
        """Delete the app; stop Serve and Ray too when deploy started them."""
        from ray import serve

        serve.delete(self.name)
        if stop_ray if stop_ray is not None else self.started_ray:
            import ray

            serve.shutdown()
            ray.shutdown()
            release_proxy_files()


def _bundle_of(target: Any) -> tuple[Bundle, OptimizedPipeline]:
    if isinstance(target, OptimizedPipeline):
        with tempfile.TemporaryDirectory(prefix="willump-deploy-") as tmp:
            target.save(Path(tmp) / "artifact")
            bundle = read_bundle(Path(tmp) / "artifact")
        return bundle, load_bundle(bundle)
    if isinstance(target, (str, os.PathLike)):
        bundle = read_bundle(target)
        return bundle, load_bundle(bundle)
    raise TypeError(
        f"deploy expects an OptimizedPipeline or an artifact path, got {type(target).__name__}"
    )


def _ensure_ray(address: str | None, cpus: float | None, gpus: float | None,
                proxy: str | None = None) -> bool:
    """Start (or join) Ray; a Ray started here runs ``proxy`` (default HAProxy) as its HTTP front."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is not None:
        ray.init(address=address, **kwargs)
        return False
    use_proxy(proxy)
    if cpus is not None:
        kwargs["num_cpus"] = int(cpus) if float(cpus).is_integer() else cpus
    if gpus is not None:
        kwargs["num_gpus"] = int(gpus) if float(gpus).is_integer() else gpus
    ray.init(**kwargs)
    return True


def _check_fits(plan: Plan, specs: list[StageSpec], min_replicas: int | None, free: dict) -> None:
    """Refuse a plan the cluster cannot place: Serve would otherwise wait forever."""
    cpus = plan.ingress_replicas * plan.ingress_cpus + plan.monitor_cpus
    gpus = 0.0
    for spec in specs:
        sp = plan.stage(spec.name)
        count = max(min_replicas, 1) if min_replicas is not None else sp.replicas
        cpus += count * sp.num_cpus
        gpus += count * (sp.num_gpus if sp.device == "gpu" else 0.0)
    if cpus > free.get("CPU", 0.0) + 1e-6 or gpus > free.get("GPU", 0.0) + 1e-6:
        raise ValueError(
            f"the plan needs {cpus:.2f} CPUs and {gpus:.2f} GPUs but the Ray cluster has "
            f"{free.get('CPU', 0.0):.2f} CPUs and {free.get('GPU', 0.0):.2f} GPUs free; "
            "pass cpus=/a smaller plan, or free resources"
        )


def monitor_settings(monitor: dict[str, Any] | None, opt: OptimizedPipeline) -> tuple[dict, dict]:
    """Split the user's monitor options into the drift.Monitor config and the record config."""
    if monitor is None:
        return {}, {}
    options = dict(monitor)
    options.pop("reference", None)
    inputs = set(opt.pipeline.graph.input_columns)
    sample_columns = set(getattr(opt.sample_rows_, "columns", []))
    missing = [c for c in [*options.get("features", []), *options.get("buckets", {})] if c not in sample_columns]
    if missing:
        raise ValueError(f"monitor features/buckets {missing} are not input columns of the pipeline")
    wanted = list(options.pop("attributes", []))
    request_attributes = list(options.pop("request_attributes", []))
    buckets = dict(options.pop("buckets", {}))
    features = list(options.pop("features", []))
    input_attributes = [a for a in wanted if a in inputs]
    unknown = [a for a in wanted if a not in inputs and a not in request_attributes]
    request_attributes += unknown  # attributes the client sends with each request
    attributes = ["model_version", "replica", *input_attributes, *request_attributes,
                  *[f"{c}_bucket" for c in buckets]]
    config = {
        "attributes": attributes,
        "metrics": ["latency_ms", "score"],
        "features": features,
        "level_column": "level",
        "cheap_level": "0",
        "confidence_column": "confidence",
        "error_column": "error",
        **options,
    }
    records = {"input_attributes": input_attributes, "request_attributes": request_attributes,
               "buckets": buckets, "features": features}
    return config, records


def deploy(
    target: OptimizedPipeline | str | os.PathLike,
    name: str = "willump",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    cpus: float | None = None,
    gpus: float | None = None,
    plan: Plan | None = None,
    rps: float | None = None,
    p99_ms: float | None = None,
    rows_per_request: int = DEFAULT_ROWS_PER_REQUEST,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    downscale_to_zero_s: float = DEFAULT_DOWNSCALE_TO_ZERO_S,
    monitor: dict[str, Any] | bool | None = None,
    batching: bool = True,
    max_batch_size: int | None = None,
    batch_wait_timeout_s: float | None = None,
    runtime: str = "native",
    device: str = "auto",
    baseline: bool = False,
    layout: str = "auto",
    access_log: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_rows: int = MAX_ROWS,
    proxy: str | None = None,
    transport: str = "grpc",
) -> ServingApp:
    """Deploy on Ray Serve at ``http://host:port/<name>``.

    Ray starts embedded unless it is already running or ``address`` joins a cluster.
    Stages are sized by :func:`serving.planner.plan_stages` from costs measured here
    (or ``plan``); ``max_batch_size`` (rows) and ``batch_wait_timeout_s`` override the
    plan's batching at every model stage. ``min_replicas=0`` lets model stages scale to zero. ``monitor``
    (e.g. ``dict(attributes=["dest"], buckets={"distance": [500, 1000]}, directory=...)``)
    deploys a drift.Monitor fed with one record per served row; its reference is the first
    ``auto_reference_panes`` panes of traffic (``reference="traffic"``, default) or the
    artifact's sample rows scored offline (``reference="sample"``, no latency). ``device='auto'``
    puts the expensive stage on a GPU when the cluster has one; ``runtime='onnx'``
    runs models through ONNX Runtime. ``baseline=True`` serves the unoptimized
    pipeline as one deployment (for side-by-side benchmarks). ``layout="staged"``
    gives the ingress, the cheap stage and the expensive stage a deployment each;
    ``layout="fused"`` runs the cheap stage inside the ingress replicas (the planner
    sizes them for the ingress's and the cheap stage's CPU together), saving a hop for
    every request (hops cost several ms of CPU each here) while unsure rows still go to
    the expensive stage's own deployment. ``layout="auto"`` (default) is fused unless
    the cheap stage must scale on its own (``min_replicas`` given) or a ``plan``
    names its layout.

    ``proxy`` is the HTTP front of a Ray that deploy starts: ``"haproxy"`` (default when
    deploy starts Ray: HAProxy forwards straight to the ingress replicas) or ``"serve"``
    (Serve's Python proxy actor); a running Ray keeps the front it started with, and a
    different explicit ``proxy`` gets a warning (see :mod:`serving.proxy`). ``transport``
    is how the ingress calls the stages: ``"grpc"`` (default) or ``"ray"`` actor calls.
    """
    import ray
    from ray import serve

    if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
        raise ValueError(f"name must be letters, digits, '-' or '_', got {name!r}")
    if min_replicas is not None and min_replicas < 0:
        raise ValueError(f"min_replicas must be >= 0, got {min_replicas}")
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if layout not in ("auto", *LAYOUTS):
        raise ValueError(f"layout must be 'auto' or one of {LAYOUTS}, got {layout!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if proxy is not None and proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    if isinstance(monitor, bool):  # monitor=True: the monitor with default options
        monitor = {} if monitor else None
    if monitor is not None and not isinstance(monitor, dict):
        raise TypeError(f"monitor must be a dict of options, True or None, got {type(monitor).__name__}")
    bundle, opt = _bundle_of(target)
    if opt.sample_rows_ is None:
        raise ValueError("the artifact has no sample rows; re-optimize with keep_sample=True to serve it")
    started = _ensure_ray(address, cpus, gpus, proxy)
    cluster = ray.cluster_resources()
    use_gpu = device == "gpu" or (device == "auto" and cluster.get("GPU", 0) > 0)
    if device == "gpu" and ray.available_resources().get("GPU", 0) <= 0:
        raise ValueError("device='gpu' but the Ray cluster has no free GPU")
    use_gpu = use_gpu and ray.available_resources().get("GPU", 0) > 0
    specs = [StageSpec("baseline", 0, len(opt.levels) - 1)] if baseline else stage_specs(opt)
    if layout == "auto":
        layout = plan.layout if plan is not None else "staged" if min_replicas is not None else "fused"
    if len(specs) == 1:
        layout = "staged"  # one stage: nothing to fuse
    if plan is None:
        if baseline:
            from .stages import profile_baseline

            profiles = [profile_baseline(opt)]
        else:
            profiles = profile_stages(opt, device="gpu" if use_gpu else "cpu")
        free = ray.available_resources()  # other apps may hold part of the cluster
        budget = Resources(cpus=min(cpus or free.get("CPU", 0.0), free.get("CPU", 0.0)) or 0.5,
                           gpus=free.get("GPU", 0.0))
        plan = plan_stages(profiles, budget, rps=rps, p99_ms=p99_ms, rows_per_request=rows_per_request,
                           monitor=monitor is not None, layout=layout)
    if max_batch_size is not None or batch_wait_timeout_s is not None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_timeout_s is not None and batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {batch_wait_timeout_s}")
        for stage in plan.stages:
            if max_batch_size is not None:
                stage.max_batch_size = int(max_batch_size)
                stage.max_ongoing_requests = max(stage.max_ongoing_requests, 2 * int(max_batch_size))
            if batch_wait_timeout_s is not None:
                stage.batch_wait_timeout_s = float(batch_wait_timeout_s)
    notes = list(plan.notes)
    if not plan.feasible:
        warnings.warn("the stage plan is not feasible: " + "; ".join(plan.notes), stacklevel=2)

    _check_fits(plan, specs, min_replicas, ray.available_resources())
    serve.start(http_options={"host": host, "port": port})
    front = running_proxy()
    if proxy is not None and front != proxy:
        warnings.warn(f"proxy={proxy!r} asked for, but the running Ray Serve uses {front!r}: the front "
                      "is chosen when Ray starts (see serving.proxy.proxy_environment)", stacklevel=2)
    from .app import Ingress, ModelStage, MonitorStage

    fused = layout == "fused"
    handles: list[Any] = [None] if fused else []
    for spec in specs[1:] if fused else specs:
        sp = plan.stage(spec.name)
        on_gpu = sp.device == "gpu"
        options: dict[str, Any] = {
            "name": f"{name}-{spec.name}",
            "max_ongoing_requests": sp.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": sp.num_cpus, "num_gpus": sp.num_gpus if on_gpu else 0},
        }
        if min_replicas is not None:
            options["autoscaling_config"] = {
                "min_replicas": min_replicas,
                "initial_replicas": max(min_replicas, 1),
                "max_replicas": max(max_replicas or sp.replicas, sp.replicas, 1),
                "target_ongoing_requests": max(1, sp.max_ongoing_requests // 2),
                "upscale_delay_s": 0.0,
                "downscale_delay_s": downscale_to_zero_s,
                "downscale_to_zero_delay_s": downscale_to_zero_s,
                "metrics_interval_s": 0.5,
                "look_back_period_s": 2.0,
            }
        else:
            options["num_replicas"] = sp.replicas
        handles.append(ModelStage.options(**options).bind(
            bundle, spec, baseline=baseline, device="cuda" if on_gpu else "cpu", runtime=runtime,
            batching=batching, max_batch_size=sp.max_batch_size,
            batch_wait_timeout_s=sp.batch_wait_timeout_s,
        ))
    monitor_handle = None
    monitor_config, record_config = monitor_settings(monitor, opt)
    if monitor is not None:
        try:
            import drift  # noqa: F401 - the monitor stage needs it on the replicas
        except ImportError as exc:
            raise ValueError(f"monitor= needs the drift package: {exc}") from exc
        from .records import build_records

        reference = None
        if monitor.get("reference", "traffic") == "sample":
            import numpy as np

            sample = opt.sample_rows_
            proba, level = opt.predict_with_levels(sample)
            reference = build_records(
                sample, proba, level, np.full(len(sample), "offline", dtype=object), np.nan, 0.0,
                "reference", None, record_config,
            ).to_dict("records")
        else:
            monitor_config.setdefault("auto_reference_panes", DEFAULT_REFERENCE_PANES)
        monitor_handle = MonitorStage.options(
            name=f"{name}-monitor", ray_actor_options={"num_cpus": plan.monitor_cpus or 0.1},
            max_ongoing_requests=64,
        ).bind(monitor_config, reference)
    graph = opt.pipeline.graph
    required = sorted({c for cols in graph.columns.values() for c in cols})
    monitored = [*record_config.get("input_attributes", []), *record_config.get("features", []),
                 *record_config.get("buckets", {})]
    optional = [c for c in dict.fromkeys(monitored) if c not in required]
    schema = RowSchema.from_sample(opt.sample_rows_, required, optional)
    version = bundle_version(bundle)
    info = {
        "name": name,
        "model_version": version,
        "classes": [c.item() if hasattr(c, "item") else c for c in opt.classes_],
        "levels": [list(lv.groups) for lv in opt.levels],
        "stages": [s.name for s in specs],
        "schema": schema.to_dict(),
        "report": opt.report().to_dict(),
        "plan": plan.to_dict(),
        "monitor_config": record_config,
        "max_body_bytes": max_body_bytes,
        "batching": batching,
        "max_rows": max_rows,
        "transport": transport,
    }
    second = handles[1] if len(handles) > 1 else None
    ingress_options: dict[str, Any] = {
        "name": f"{name}-ingress", "max_ongoing_requests": 1024,
        "ray_actor_options": {"num_cpus": plan.ingress_cpus}, "num_replicas": plan.ingress_processes,
    }
    local_first = None
    if fused:
        cheap = plan.stage(specs[0].name)
        local_first = {"bundle": bundle, "spec": specs[0], "device": "cpu", "runtime": runtime}
        # the fused replicas share what the plan gave the cheap stage and the ingress
        share = (cheap.replicas * cheap.num_cpus + plan.ingress_replicas * plan.ingress_cpus) / plan.ingress_processes
        ingress_options["ray_actor_options"] = {"num_cpus": round(share, 4)}
        info["layout"] = "fused"
    ingress = Ingress.options(**ingress_options).bind(handles[0], second, monitor_handle, info, local_first)
    # Per-request access logs cost the ingress and stages a large share of their CPU here;
    # /metrics carries request counts and latencies instead.
    serve.run(ingress, name=name, route_prefix=f"/{name}",
              logging_config={"enable_access_log": access_log, "log_level": "INFO" if access_log else "WARNING"})
    return ServingApp(name, f"http://{host}:{port}/{name}", plan, version, [s.name for s in specs],
                      started, notes, proxy=front)
