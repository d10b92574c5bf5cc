"""The app as Serve deployments, built from a JSON-able spec.

:func:`serving.deploy` builds the spec (measuring and planning first) and runs what
:func:`build_app` and :func:`build_monitor` return. The same spec is what ``willump build``
writes into a Serve config file, whose applications name :func:`app_builder` and
:func:`monitor_builder` as import paths, so ``serve deploy`` / ``serve run`` / KubeRay's
RayService start exactly the app deploy() would (see :mod:`serving.launch.config`).

The monitor is an application of its own (``<name>-monitor``): an app is deleted
ingress first, and the ingress flushes its buffered records to the monitor on the way out.
"""

from __future__ import annotations

from typing import Any

from serving.core.artifacts import ArtifactSource
from serving.core.constants import (
    CONCURRENT_BATCHES,
    HANDOVER_SURGE_PERCENT,
    INGRESS_SERVE_HEADROOM,
)
from serving.core.schema import RowSchema
from serving.core.specs import (
    WHOLE_STAGE,
    AppSpec,
    IngressConfig,
    ModuleChainSpec,
    StageSpec,
    pool_deployment,
    stage_specs,
    whole_cascade,
)
from serving.launch.proxy import AUTOSCALING_PUSH_S
from serving.planning.autoscale import policy_config
from serving.planning.planner import Plan
from serving.planning.pools import specs_of_entry
from serving.runtime.calls import default_deadline_s
from serving.runtime.gears import ladder
from serving.runtime.records import REQUEST_COLUMN, build_records
from serving.runtime.routing import router_config
from serving.runtime.stage_runner import module_groups
from willump import OptimizedPipeline
from willump.runtime import class_disagreement_bounds_loss

#: Ray's resource of the head node (a monitor replica keeping its state on disk is pinned there)
HEAD_NODE_RESOURCE = "node:__internal_head__"
#: seconds without traffic before a scaled-to-zero stage gives its replica back
DEFAULT_DOWNSCALE_TO_ZERO_S = 30.0
#: ongoing calls per stage replica Serve's autoscaler aims at: half of what the ingress keeps
#: in flight per running replica, so a saturated stage always reads as over its target
AUTOSCALE_TARGET_ONGOING = CONCURRENT_BATCHES / 2
#: seconds of reported load Serve's autoscaler averages over. Ray requires it to exceed the
#: AutoscalingConfig's ``metrics_interval_s``; replicas and handles push every
#: serving.launch.proxy.AUTOSCALING_PUSH_S, so a 3x load step crosses the target within about a
#: third of the window
AUTOSCALE_LOOK_BACK_S = 10.5
#: closed panes of live traffic frozen as the monitor's reference (monitor reference="traffic")
DEFAULT_REFERENCE_PANES = 5
#: seconds a stage replica waits for its calls in flight when stopping
GRACEFUL_SHUTDOWN_S = 10.0
#: how often a stopping stage or monitor replica looks at its calls in flight (seconds; Ray's
#: default, 2 s, made every redeploy, scale-down and shutdown wait that long for an idle replica)
DRAIN_POLL_S = 0.2
#: calls a partition stage of a module chain may hold (its lock still runs one batch at a time)
CHAIN_MAX_ONGOING = 64


def specs_of(opt: OptimizedPipeline, baseline: bool, plan: Plan | None = None) -> list[StageSpec]:
    """The stages an app runs: the baseline's one, the whole cascade as one stage where the
    plan says so (:func:`serving.core.specs.whole_cascade`), or the cheap and expensive stages."""
    if baseline:
        return [StageSpec("baseline", 0, len(opt.levels) - 1)]
    if plan is not None and [s.name for s in plan.stages] == [WHOLE_STAGE]:
        return whole_cascade(opt)
    return stage_specs(opt)


def runs_inline(plan: Plan, stage: str) -> bool:
    """Whether the stage's replicas run its batches on their event loop (its profile says it
    is CPU-bound: :attr:`serving.core.profiles.StageProfile.runs_inline`)."""
    profile = next((p for p in plan.profiles or () if p.name == stage), None)
    return profile is not None and profile.runs_inline


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
        "attributes": attributes, "metrics": ["latency_ms", "score"], "features": features,
        "level_column": "level", "cheap_level": "0", "confidence_column": "confidence",
        "error_column": "error", "request_column": REQUEST_COLUMN, **options,
    }
    records = {"input_attributes": input_attributes, "request_attributes": request_attributes,
               "buckets": buckets, "features": features}
    return config, records


def row_schema(opt: OptimizedPipeline, record_config: dict[str, Any]) -> RowSchema:
    graph = opt.pipeline.graph
    required = sorted({c for cols in graph.columns.values() for c in cols})
    monitored = [*record_config.get("input_attributes", []), *record_config.get("features", []),
                 *record_config.get("buckets", {})]
    optional = [c for c in dict.fromkeys(monitored) if c not in required]
    return RowSchema.from_sample(opt.sample_rows_, required, optional)


def _actor_options(num_cpus: float, num_gpus: float = 0.0) -> dict[str, Any]:
    # no runtime_env here: deployments inherit the job's (deploy ships the code that way) or
    # the Serve config's application-level one
    return {"num_cpus": num_cpus, "num_gpus": num_gpus}


def off_spot(plan: Plan) -> dict[str, Any]:
    """What the request path's replicas (the ingress, the monitor) add to their
    ``ray_actor_options`` to stay off a tier plan's preemptible pools, as the plan decided
    (serving.launch.pools.place_on_pools): a replica there would go with its node, and every
    request in flight through it (``{}`` where the plan keeps none off)."""
    selector = (plan.pools or {}).get("request_path", {}).get("label_selector")
    return {"label_selector": dict(selector)} if selector else {}


def _opt(spec: AppSpec, opt: OptimizedPipeline | None) -> OptimizedPipeline:
    return opt if opt is not None else ArtifactSource(**spec.artifact).load()


def app_spec(spec: AppSpec | dict[str, Any]) -> AppSpec:
    """``spec`` validated (a dict from a Serve config file is checked here, once)."""
    return spec if isinstance(spec, AppSpec) else AppSpec.model_validate(spec)


def chain_role(group: str, k: int) -> str:
    """The deployment name (less the app's) of stage ``k`` of ``group``'s module chain."""
    return f"{group}-part{k}"


def chain_apps(name: str, chains: dict[str, ModuleChainSpec] | None, groups: list[str],
               surge_percent: int = HANDOVER_SURGE_PERCENT) -> dict[str, list] | None:
    """The partition-stage deployments of the module groups a stage computes that are served
    as chains (``deploy(module_memory=...)``); None when there are none."""
    if not chains or not any(g in chains for g in groups):
        return None
    from serving.model_app.stages import PartitionStage

    out: dict[str, list] = {}
    for group in groups:
        chain = chains.get(group)
        if chain is None:
            continue
        out[group] = [
            PartitionStage.options(
                name=f"{name}-{chain_role(group, k)}", num_replicas=st.replicas, max_ongoing_requests=CHAIN_MAX_ONGOING,
                graceful_shutdown_wait_loop_s=DRAIN_POLL_S, max_surge_percent=surge_percent,
                ray_actor_options=_actor_options(chain.num_cpus, chain.num_gpus),
            ).bind(st.path, chain.device, 1, st.sha256)
            for k, st in enumerate(chain.stages)]
    return out


def build_app(spec: AppSpec | dict[str, Any], opt: OptimizedPipeline | None = None) -> Any:
    """The main application (ingress and model stages) for ``spec``."""
    from serving.runtime.ingress import Ingress
    from serving.runtime.replicas import ModelStage

    spec = app_spec(spec)
    opt = _opt(spec, opt)
    plan = Plan.from_dict(spec.plan)
    name = spec.name
    specs = specs_of(opt, spec.baseline, plan)
    fused = plan.layout == "fused" and (len(specs) > 1 or specs[0].name == WHOLE_STAGE)
    monitor = spec.monitor
    _, record_config = monitor_settings(monitor, opt) if monitor is not None else ({}, {})
    degrade = spec.degrade
    handles: list[Any] = [None] if fused else []
    for i, stage_spec in enumerate(specs):
        if fused and i == 0:
            continue
        sp = plan.stage(stage_spec.name)
        on_gpu = sp.device == "gpu"
        fallback = degrade and i == 0
        chains = chain_apps(name, spec.module_chains, module_groups(opt, stage_spec), spec.surge_percent)
        bound = {pool: ModelStage.options(**options).bind(
            ArtifactSource(**spec.artifact), stage_spec, baseline=spec.baseline,
            device="cuda" if on_gpu else "cpu", runtime=spec.runtime,
            batching=spec.batching, max_batch_size=sp.max_batch_size,
            batch_wait_timeout_s=sp.batch_wait_timeout_s, fallback=fallback,
            module_chains=chains,
            # a module chain waits on its partition stages (a blocking call): never on the event loop
            inline=runs_inline(plan, stage_spec.name) and not on_gpu and chains is None,
        ) for pool, options in stage_deployments(spec, plan, stage_spec.name)}
        # a stage on node pools: a deployment per pool, called as one (serving.runtime.pools)
        handles.append(bound[None] if None in bound else bound)
    schema = row_schema(opt, record_config)
    deadline_s = _deadline_s(spec, plan)
    config = IngressConfig(
        name=name,
        model_version=spec.artifact["version"],
        classes=[c.item() if hasattr(c, "item") else c for c in opt.classes_],
        levels=[list(lv.groups) for lv in opt.levels],
        stages=[s.name for s in specs],
        first_stage_last_level=specs[0].last,
        row_schema=schema.to_dict(),
        report=opt.report().to_dict(),
        plan=plan.to_dict(),
        layout=plan.layout,
        monitor=None if monitor is None else {"app": f"{name}-monitor", "records": record_config},
        max_body_bytes=spec.max_body_bytes,
        max_rows=spec.max_rows,
        batching=spec.batching,
        deadline_s=deadline_s,
        degrade=degrade,
        api_key_hmac=spec.api_key_hmac,
        api_key_env=spec.api_key_env,
        allowed_hosts=spec.allowed_hosts,
        probe_sha256=spec.probe_sha256,
        max_in_flight=spec.max_in_flight or plan.ingress_max_in_flight,
        gears=spec.gears,
        hedging=spec.hedging,
        lost_after_s=spec.lost_after_s,
        audit=audit_settings(spec, opt, record_config),
        pools=ingress_pools(plan),
        unbuffered_logs=spec.access_log or spec.log_format == "json",
    )
    local_first = None
    if fused:
        local_first = {"artifact": spec.artifact, "spec": vars(specs[0]).copy(),
                       "runtime": spec.runtime, "fallback": degrade, "inline": runs_inline(plan, specs[0].name)}
    second = handles[1] if len(handles) > 1 else None
    ingress = Ingress.options(**ingress_options(spec, plan, config.max_in_flight, ingress_user_config(spec, opt, plan)))
    return ingress.bind(handles[0], second, config, local_first)


def _deadline_s(spec: AppSpec, plan: Plan) -> float:
    """A request's deadline when it sends none: the app's, else from the plan's p99 target."""
    return spec.deadline_ms / 1000.0 if spec.deadline_ms else default_deadline_s(plan.target_p99_ms)


def ingress_user_config(spec: AppSpec, opt: OptimizedPipeline, plan: Plan) -> dict[str, Any]:
    """The ingress deployment's ``user_config``: the settings an operator may change in place
    (serving.runtime.live_settings), at the values the app is deployed with."""
    deadline_s = _deadline_s(spec, plan)
    audited = bool(spec.audit_rate) and spec.monitor is not None and not spec.baseline and len(opt.levels) > 1
    return {"deadline_ms": 1000.0 * deadline_s, "degrade": bool(spec.degrade),
            "max_in_flight": int(spec.max_in_flight or plan.ingress_max_in_flight), "gear": "auto",
            "hedging": bool(spec.hedging), "lost_after_s": spec.lost_after_s,
            "audit_rate": float(spec.audit_rate) if audited else 0.0, "on_alarm": spec.on_alarm}


def ingress_pools(plan: Plan) -> dict[str, dict[str, Any]] | None:
    """What the ingress needs of the node pools: per pooled stage, one replica's rows/s and the
    replicas on each pool (None: no stage on pools)."""
    replicas = plan.pools.get("replicas") if plan.pools else None
    if not replicas:
        return None
    return {stage: {"rates": {p: plan.pools["rates"][stage][p] for p in by_pool}, "replicas": dict(by_pool)}
            for stage, by_pool in replicas.items()}


def stage_deployments(spec: AppSpec, plan: Plan, stage: str) -> list[tuple[str | None, dict[str, Any]]]:
    """A model stage's deployments and their Serve options: one (pool None), or one per node pool
    the plan gives it replicas on, pinned there."""
    by_pool = plan.pools.get("replicas", {}).get(stage) if plan.pools else None
    if not by_pool:
        return [(None, stage_options(spec, plan, stage))]
    pools = {p.name: p for p in specs_of_entry(plan.pools)}
    out = []
    for pool, n in by_pool.items():
        options = stage_options(spec, plan, stage)
        options["name"], options["num_replicas"] = pool_deployment(spec.name, stage, pool), int(n)
        options["ray_actor_options"] = {**options["ray_actor_options"], **pools[pool].actor_options()}
        out.append((pool, options))
    return out


def stage_options(spec: AppSpec, plan: Plan, stage: str) -> dict[str, Any]:
    """A model stage deployment's Serve options (replicas or autoscaling, limits, resources): what
    :func:`build_app` deploys it with, and what ``willump build`` writes in the Serve config's
    ``deployments:`` section for an operator to tune."""
    sp = plan.stage(stage)
    options: dict[str, Any] = {
        "name": f"{spec.name}-{stage}",
        "max_ongoing_requests": sp.max_ongoing_requests,
        "max_queued_requests": sp.max_queued_requests,
        "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_S,
        "graceful_shutdown_wait_loop_s": DRAIN_POLL_S,
        "max_surge_percent": spec.surge_percent,
        "ray_actor_options": _actor_options(sp.num_cpus, sp.num_gpus if sp.device == "gpu" else 0.0),
    }
    if spec.router == "capacity":
        options["request_router_config"] = router_config(lost_after_s=spec.lost_after_s)
    if spec.min_replicas is not None:
        low = spec.min_replicas
        idle = DEFAULT_DOWNSCALE_TO_ZERO_S if spec.downscale_to_zero_s is None else spec.downscale_to_zero_s
        options["autoscaling_config"] = {
            "min_replicas": low, "initial_replicas": max(low, 1),
            "max_replicas": max(spec.max_replicas or sp.replicas, sp.replicas, 1),
            "target_ongoing_requests": AUTOSCALE_TARGET_ONGOING,
            "upscale_delay_s": 0.0, "downscale_delay_s": idle, "downscale_to_zero_delay_s": idle,
            "look_back_period_s": AUTOSCALE_LOOK_BACK_S,
            # how often replicas and handles push their load: Ray 2.60 reads only this field (the
            # RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S variables its deprecation names are
            # defined but unread), whose default, 10 s, made the policy read a burst 10 s late
            "metrics_interval_s": AUTOSCALING_PUSH_S,
        }
        if spec.autoscaler == "planner":  # the planner's cost model picks the replicas
            options["autoscaling_config"]["policy"] = policy_config(ingress_replicas=plan.ingress_replicas)
    else:
        options["num_replicas"] = sp.replicas
    return options


def ingress_options(spec: AppSpec, plan: Plan, max_in_flight: int,
                    user_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ingress deployment's Serve options (see :func:`stage_options`), with its in-place
    settings as ``user_config`` when given (:func:`ingress_user_config`)."""
    options: dict[str, Any] = {} if user_config is None else {"user_config": user_config}
    return {**options,
        "name": f"{spec.name}-ingress", "num_replicas": plan.ingress_replicas,
        # Serve's own limit sits above the ingress's admission bound, which answers 503 first
        "max_ongoing_requests": max_in_flight + INGRESS_SERVE_HEADROOM,
        "max_surge_percent": spec.surge_percent,
        # no DRAIN_POLL_S here: behind HAProxy a stopping ingress replica first stays reachable for
        # INGRESS_DRAIN_S, and Ray's slower poll once it is closed leaves stale pooled connections
        # time to move on
        "ray_actor_options": {**_actor_options(plan.ingress_cpus), **off_spot(plan)},
    }


def deployment_overrides(spec: AppSpec | dict[str, Any], opt: OptimizedPipeline | None = None) -> list[dict[str, Any]]:
    """The app's deployments as a Serve config's ``deployments:`` section: the plan's replicas,
    autoscaling, limits and resources per deployment, in Serve's own keys, so an operator reads
    and tunes them where Serve looks (a value changed there overrides the plan's; module chains'
    deployments keep the plan's)."""
    spec = app_spec(spec)
    opt = _opt(spec, opt)
    plan = Plan.from_dict(spec.plan)
    specs = specs_of(opt, spec.baseline, plan)
    fused = plan.layout == "fused" and (len(specs) > 1 or specs[0].name == WHOLE_STAGE)
    stages = [options for i, s in enumerate(specs) if not (fused and i == 0)
              for _, options in stage_deployments(spec, plan, s.name)]
    return [ingress_options(spec, plan, spec.max_in_flight or plan.ingress_max_in_flight,
                            ingress_user_config(spec, opt, plan)), *stages]


def audit_settings(spec: AppSpec, opt: OptimizedPipeline, record_config: dict[str, Any]) -> dict[str, Any] | None:
    """The ingress's live-audit settings (None: no audit: rate 0, no monitor, or no cascade)."""
    if not spec.audit_rate or spec.monitor is None or spec.baseline or len(opt.levels) < 2:
        return None
    return {"rate": spec.audit_rate, "final_levels": [len(opt.gear(g).levels) - 1 for g in range(len(opt.gears_))],
            "segments": list(record_config.get("request_attributes", [])), "on_alarm": spec.on_alarm}


def guarantee_terms(spec: AppSpec, opt: OptimizedPipeline, record_config: dict[str, Any]) -> dict[str, Any] | None:
    """What the monitor's ledger judges the audit against (drift.GuaranteeLedger's arguments):
    every certified gear's max_loss and certification counts, the metric, the confidence."""
    if audit_settings(spec, opt, record_config) is None:
        return None
    report = opt.report()
    return {"gears": [{"gear": g["gear"], "max_loss": g["max_loss"], "cert_rows": g.get("cert_rows"),
                       "cert_disagreed": g.get("cert_disagreed")} for g in ladder(opt)],
            "rowwise": class_disagreement_bounds_loss(report.metric), "confidence": float(report.confidence),
            "segments": list(record_config.get("request_attributes", [])), "hold": spec.on_alarm == "step"}


def label_terms(opt: OptimizedPipeline, record_config: dict[str, Any]) -> dict[str, Any]:
    """What the monitor's label join needs (drift.LabelJoin's arguments): the served classes,
    each gear's max_loss with the full pipeline's certified score, the metric, the confidence."""
    report = opt.report()
    return {"classes": [c.item() if hasattr(c, "item") else c for c in opt.classes_],
            "certified": [{"max_loss": g["max_loss"], "baseline_score": float(report.baseline_score)}
                          for g in ladder(opt)],
            # served confidence -> accuracy on the certification rows, per gear (willump's Gear.calibration)
            "calibration": [_calibration(g) for g in opt.gears_],
            "metric": str(report.metric), "confidence": float(report.confidence),
            "segments": list(record_config.get("request_attributes", []))}


def _calibration(gear: Any) -> dict[str, Any] | None:
    """A gear's calibration map with the rows it was fitted on (an artifact from before the map
    kept them: the gear's certification rows, which it was fitted on)."""
    cal = getattr(gear, "calibration", None)
    if cal is None or cal.get("rows") is not None:
        return cal
    return {**cal, "rows": getattr(gear, "cert_rows", None)}


def build_monitor(spec: AppSpec | dict[str, Any], opt: OptimizedPipeline | None = None) -> Any | None:
    """The monitor application for ``spec`` (None without a monitor)."""
    spec = app_spec(spec)
    monitor = spec.monitor
    if monitor is None:
        return None
    from serving.runtime.replicas import MonitorStage

    opt = _opt(spec, opt)
    monitor_config, record_config = monitor_settings(monitor, opt)
    if (spec.gears or {}).get("mode", "off") != "off":  # explain by the gear that answered
        monitor_config["attributes"] = [*monitor_config["attributes"], "gear"]
    reference = None
    if monitor.get("reference", "traffic") == "sample":
        import numpy as np

        sample = opt.sample_rows_
        proba, level = opt.predict_with_levels(sample)
        reference = build_records(sample, proba, level, np.full(len(sample), "offline", dtype=object), np.nan, 0.0,
                                  "reference", None, record_config, gear=0).to_dict("records")
    else:
        monitor_config.setdefault("auto_reference_panes", DEFAULT_REFERENCE_PANES)
    plan = Plan.from_dict(spec.plan)
    return MonitorStage.options(
        name="monitor", max_ongoing_requests=64, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        # on the head node, as planned: a replica that replaces it finds the state folder there
        ray_actor_options={**_actor_options(plan.monitor_cpus or 0.1), **off_spot(plan),
                           **({"resources": {HEAD_NODE_RESOURCE: 0.001}} if default_state(spec) else {})},
    ).bind(monitor_config, reference, guarantee_terms(spec, opt, record_config), label_terms(opt, record_config),
           {"app": spec.name, "token": spec.monitor_state} if default_state(spec) else None)


def default_state(spec: AppSpec) -> bool:
    """Whether the monitor keeps its state in its default folder (serving.runtime.monitor_state):
    a token given and no ``directory`` (a path: the user's; False: in memory)."""
    return spec.monitor is not None and spec.monitor_state is not None and spec.monitor.get("directory") is None


def app_builder(args: dict[str, Any]) -> Any:
    """Serve config entry point (``import_path: serving.launch.graph:app_builder``; the spec as args)."""
    return build_app(app_spec(dict(args)))


def monitor_builder(args: dict[str, Any]) -> Any:
    """Serve config entry point of the monitor application."""
    app = build_monitor(app_spec(dict(args)))
    if app is None:
        raise ValueError("monitor_builder: the spec has no monitor")
    return app
