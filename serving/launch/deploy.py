"""serving.deploy: an optimized pipeline (or its artifact) as a Ray Serve application.

deploy() starts or joins Ray, resolves the artifact to a reference every node can load
(:mod:`serving.core.artifacts`), measures what the planner needs on this cluster (stage costs,
the ingress's own work, HTTP and hop costs: :mod:`serving.measure.stages`, :mod:`serving.measure.calibrate`),
plans and places the deployments (:mod:`serving.planning.planner`), refuses a plan no node can hold,
and runs the app that :mod:`serving.launch.graph` builds from a JSON-able spec (the same spec
``willump build`` writes into a Serve config file).
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Any

from serving.core import artifacts, running_apps
from serving.core.artifacts import ArtifactSource
from serving.core.constants import (
    API_KEY_ENV,
    CALIBRATE,
    HANDOVER_SURGE_PERCENT,
    INSITU,
    LOOPBACK_HOSTS,
    LOST_AFTER_S,
    MAX_BODY_BYTES,
    MAX_ROWS,
)
from serving.core.costs import HostCosts, load_cached, store_cached
from serving.core.local_ray import exposure_note, start_local_ray, worker_env
from serving.core.nodes import within_gpus
from serving.core.plan_board import withdraw_plan
from serving.core.serve_apps import delete_app, logging_config, run_app, tracing_config
from serving.core.specs import WHOLE_STAGE, AppSpec, gpu_capable, unsure_share
from serving.launch import cluster, handover
from serving.launch.graph import (
    DEFAULT_DOWNSCALE_TO_ZERO_S,
    build_app,
    build_monitor,
    monitor_settings,
    row_schema,
    specs_of,
)
from serving.launch.insitu import refine_in_situ
from serving.launch.module_chains import (
    DEFAULT_MODULE_CPUS,
    DEFAULT_MODULE_DEVICES,
    chain_cpus,
    free_after_chains,
    plan_module_chains,
)
from serving.launch.pools import place_on_pools
from serving.launch.proxy import (
    PROXIES,
    TRANSPORTS,
    release_proxy_files,
    running_proxy,
    running_transport,
    use_proxy,
)
from serving.measure import calibrate
from serving.measure.insitu import probe_blocked
from serving.measure.stages import profile_gpu_stage, profile_on_cluster
from serving.planning.planner import (
    CASCADE_LAYOUTS,
    Plan,
    Resources,
    placement_problem,
    plan_layouts,
)
from serving.planning.pools import check_pools, preemptible_pools
from serving.runtime.audit import resolve_audit_rate
from serving.runtime.gears import check_gears, gear_info
from serving.runtime.hedge import HEDGE_FLOOR_OVER_MEDIAN, HEDGE_MIN_WIN_SHARE, HEDGE_QUANTILE
from serving.runtime.hold import check_on_alarm
from serving.runtime.keys import SECRET_ENV, key_digest, key_secret, secret_path, weak_key_warning
from serving.runtime.stage_runner import module_groups
from willump import OptimizedPipeline

#: rows per request the plan assumes when none is given
DEFAULT_ROWS_PER_REQUEST = 32



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
    #: the HTTP front answering at ``url``: "haproxy" or "serve" (see serving.launch.proxy)
    proxy: str = "serve"
    artifact: ArtifactSource | None = None
    monitor_app: str | None = None
    spec: AppSpec | None = None

    def shutdown(self, *, stop_ray: bool | None = None) -> None:
        """Delete the app (ingress first, so it flushes its records to the monitor), then the
        monitor, release the artifact; stop Serve and Ray too when deploy started them."""
        from ray import serve

        try:
            try:
                delete_app(self.name)
            finally:
                withdraw_plan(self.name)
            if self.monitor_app is not None:
                _discard_monitor_state(self.monitor_app)
                delete_app(self.monitor_app)
            if self.artifact is not None:
                artifacts.release(self.artifact, self.name)
        finally:
            if stop_ray if stop_ray is not None else self.started_ray:
                import ray

                serve.shutdown()
                ray.shutdown()
                release_proxy_files()


def _ensure_ray(address: str | None, cpus: float | None, gpus: float | None, proxy: str | None = None,
                transport: str = "grpc", *, ship_code: str = "auto", monitor: bool = False) -> bool:
    """Start (or join) Ray; a Ray started here runs ``proxy`` (default HAProxy) as its HTTP
    front and ``transport`` between stages; a cluster joined here gets the project's code
    (``ship_code``). Returns whether Ray was started here."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is not None:
        shipped = cluster.shipped_modules(monitor) if cluster.ships_code(ship_code, address) else {}
        # this job's workers (the app's replicas) at deploy's niceness, unless the cluster's system
        # config or a submitted job's runtime_env sets it
        kwargs["runtime_env"] = {**shipped, "env_vars": worker_env()}
        ray.init(address=address, **kwargs)
        return False
    use_proxy(proxy, transport)
    # Ray counts a node's CPUs and GPUs in whole units; the app's plan keeps to the exact share
    # (``cpus`` budget, :func:`within_gpus`), the rest stays free for the next app
    if cpus is not None:
        kwargs["num_cpus"] = math.ceil(cpus)
    if gpus is not None:
        kwargs["num_gpus"] = math.ceil(gpus)
    # "local": a new Ray here even when another one on this machine was started with `ray start`
    # (ray.init() would join that one, and refuse num_cpus); its control plane on loopback only
    start_local_ray(**kwargs)
    return True


def root_url(host: str, port: int) -> str:
    """The running Serve's HTTP root: the host and port it was started with, which differ from
    the ones asked for when Serve was already running (Serve keeps its first http_options)."""
    try:  # Serve has no public accessor for the running HTTP options
        from ray.serve.context import _get_global_client

        http = _get_global_client().http_config
        host, port = http.host, http.port
    except Exception:
        pass
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def measure_costs(mode: Any, base_url: str, nodes: list, *, front: str, transport: str) -> HostCosts:
    """HTTP, hop and background costs on this cluster: measured, cached per cluster, or
    the placeholders (``mode="never"``); a HostCosts instance is used as given."""

    if isinstance(mode, HostCosts):
        return mode
    cores = cluster.machine_cores(nodes)
    if mode == "never":
        return HostCosts.unmeasured(cores, front, transport)
    key = calibrate.fingerprint(cores, front, transport)
    if mode == "auto":
        cached = load_cached(key)
        if cached is not None:
            return cached
    import ray

    costs = calibrate.calibrate(base_url, calibrate.probe_name(), front=front, transport=transport, cores=cores,
                                host=ray.util.get_node_ip_address())
    store_cached(key, costs)
    return costs


#: deploy(autoscaler=...): who picks an autoscaled stage's replicas (serving.core.specs.AppSpec)
AUTOSCALERS = ("serve", "planner")


def _check_arguments(name, min_replicas, device, layout, transport, proxy, monitor, calibrate,
                     deadline_ms, rows_per_request, insitu_mode="auto") -> None:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
        raise ValueError(f"name must be letters, digits, '-' or '_', got {name!r}")
    if min_replicas is not None and min_replicas < 0:
        raise ValueError(f"min_replicas must be >= 0, got {min_replicas}")
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if layout not in CASCADE_LAYOUTS:
        raise ValueError(f"layout must be one of {CASCADE_LAYOUTS}, got {layout!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if proxy is not None and proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    if monitor is not None and not isinstance(monitor, dict):
        raise TypeError(f"monitor must be a dict of options, True or None, got {type(monitor).__name__}")
    if not isinstance(calibrate, HostCosts) and calibrate not in CALIBRATE:
        raise ValueError(f"calibrate must be one of {CALIBRATE} or a HostCosts, got {calibrate!r}")
    if deadline_ms is not None and not 0 < deadline_ms <= 120_000:
        raise ValueError(f"deadline_ms must be in (0, 120000], got {deadline_ms}")
    if rows_per_request < 1:
        raise ValueError(f"rows_per_request must be >= 1, got {rows_per_request}")
    if insitu_mode not in INSITU:
        raise ValueError(f"insitu must be one of {INSITU}, got {insitu_mode!r}")


def deploy(
    target: OptimizedPipeline | str | os.PathLike,
    name: str = "willump",
    *,
    host: str | None = None,
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
    autoscaler: str = "serve",
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
    calibrate: str | HostCosts = "auto",
    deadline_ms: float | None = None,
    degrade: bool = False,
    api_key: str | None = None,
    max_in_flight: int | None = None,
    ship_code: str = "auto",
    artifact_share: str = "auto",
    gears: str | int = "off",
    gear_policy: dict[str, Any] | None = None,
    insitu: str = "auto",
    hedging: bool | dict[str, float] = False,
    router: str = "capacity",
    lost_after_s: float | None = LOST_AFTER_S,
    module_memory: float | None = None,
    module_devices: int = DEFAULT_MODULE_DEVICES,
    module_cpus: float = DEFAULT_MODULE_CPUS,
    audit_rate: float | None = None,
    on_alarm: str = "alert",
    log_format: str = "text",
    tracing: bool | dict[str, Any] = False,
    pools: dict[str, dict[str, Any]] | None = None,
) -> ServingApp:
    """Deploy on Ray Serve at ``http://host:port/<name>``.

    Ray starts embedded unless it is already running or ``address`` joins a cluster (then
    the project's packages are shipped to the nodes, ``ship_code``, and the artifact goes
    by a path every node reads or through the object store, ``artifact_share``). ``host``
    defaults to loopback on one node and all interfaces on several. Deployments are planned
    from costs measured here (or ``plan``) and placed node by node; a plan no node can hold
    raises ValueError naming what does not fit. ``calibrate`` measures HTTP and hop costs
    ("auto": once per cluster, cached). ``max_batch_size`` / ``batch_wait_timeout_s``
    override the plan's batching; ``min_replicas`` (0 allowed) turns on autoscaling of the
    model stages, by Serve's default policy (``autoscaler="serve"``: requests held per replica)
    or by the planner (``"planner"``: rows answered over the planned capacity of a replica,
    :mod:`serving.planning.autoscale`). ``monitor`` (e.g. ``dict(attributes=["dest"], buckets={"distance": [500,
    1000]})``) deploys a drift.Monitor fed with one record per served row. ``layout``:
    "fused" runs the cheap stage inside the ingress replicas, "staged" gives every stage a
    deployment, "auto" is fused unless ``min_replicas`` is given, and on CPU (without
    ``degrade`` or ``hedging``, which act on a stage of its own) plans a cascade both ways, its
    expensive stage a deployment or every level inside the ingress ("whole": the unsure rows
    never leave it, no hop), and keeps the one with the higher bound (a note in the plan). ``device='auto'`` puts the
    later stages on a GPU when the cluster has one and their models can use it.

    ``cpus`` and ``gpus`` (fractions allowed) are what this app's plan may use of the
    cluster's free logical CPUs and GPUs (default: all of them; a Ray started here is given
    them). Two apps sharing one GPU each pass their share, e.g. ``gpus=0.5``: without it, a
    GPU stage's replicas share every free GPU and the next app finds none.

    Requests: ``deadline_ms`` (default: ``p99_ms``, else 30 s; a client may send
    ``X-Deadline-Ms``) bounds every request; past it the answer is 504, or with
    ``degrade=True`` the cheap level's prediction marked ``degraded``. An ingress replica
    holding ``max_in_flight`` requests (default: 2 s of its planned throughput) answers 503
    with Retry-After. ``api_key`` requires ``Authorization: Bearer KEY`` (or ``X-API-Key``)
    on every route but ``/healthz``; only its SHA-256 is stored in the app.

    Gears (an artifact optimized with ``gears=(...)``: a ladder of cheaper plans certified
    jointly): ``gears="off"`` serves the plan (gear 0); an integer pins that gear;
    ``gears="adaptive"`` switches to a cheaper certified gear when the ingress's queue puts
    the SLO at risk and back when it drains (:class:`serving.runtime.gears.GearPolicy`; the SLO is
    ``p99_ms``, else ``deadline_ms``; ``gear_policy`` overrides the policy's parameters, e.g.
    ``{"slo_ms": 200, "down_after_s": 5}``). Every answer names its gear and that gear's
    certified loss bound; ``/metrics`` counts rows per gear; monitor records carry the gear.

    ``hedging=True`` (or ``{"quantile": 0.95, "floor_over_median": 2.0, "min_win_share": 0.25}``)
    hedges calls to stages of two or more replicas: a call still unanswered after the stage's own
    latency tail is sent once more, the first answer kept and the other cancelled
    (:class:`serving.runtime.calls.StageHedge`); while fewer than ``min_win_share`` of the
    copies answer first, the delay backs off (0: never; :class:`serving.runtime.hedge.HedgeBackoff`).
    ``/metrics`` counts ``willump_stage_hedges`` (by whether the copy won) and
    ``willump_stage_hedge_backoffs``.

    ``router``: "capacity" (default) routes a stage's calls by the rows per second each replica
    measures it sustains, ranks replicas on a node Ray is draining (a preemption notice) and
    replicas silent past a bound last (:class:`serving.runtime.routing.CapacityRouter`); "serve"
    keeps Serve's power of two choices. ``lost_after_s`` (default 2 s; None: off): a stage call
    unanswered this long is copied to another replica, whatever the hedging settings, once the
    capacity router sees a replica of the stage go silent (with ``router="serve"``: once the
    call is also past 5x the stage's median latency): a replica may hang or be cut off without
    Ray reporting it lost for tens of seconds. ``/metrics`` counts ``willump_stage_rescues``.

    ``module_memory`` (bytes per device): a ``willump.module_feature`` group of a later stage
    whose module does not fit is served as a chain of partition stages planned on
    ``module_devices`` such devices, ``module_cpus`` logical CPUs per replica on a CPU
    (:mod:`serving.launch.module_chains`); the expensive stage's replicas call the chain in
    place of the module. Its stage files live on this machine (one-node clusters, or a
    folder every node mounts). The stages' plan still times the module in-process.

    Live audit (``audit_rate``, default 1% on a cascade with the monitor): that share of the
    rows the cheap level answers also runs through the full pipeline, off the request path and
    shed first under load; the monitor keeps an anytime-valid bound on how often served answers
    differ from the full pipeline's, per gear, at ``GET /{name}/drift?kind=guarantee``
    (:mod:`serving.runtime.audit`, :class:`drift.GuaranteeLedger`). ``on_alarm="step"`` also
    acts on its alarm: the alarmed gear is held and the app serves a more conservative one, or
    the full pipeline while gear 0 is held (every answer then says ``full_pipeline``), until the
    rows audited since pass the release test (:mod:`serving.runtime.hold`); the default
    "alert" only raises it (metric, route, dashboard, alert rule).

    Tracing: ``tracing=True`` has Serve trace 1% of requests with OpenTelemetry (spans in the Ray
    session's ``logs/serve/spans``); ``tracing={"exporter_import_path": "module:function",
    "sampling_ratio": 0.1}`` sends them where that function's span processors do. Serve sets
    tracing when it starts: joining a running Serve keeps its setting (a note says so).

    Logs: ``log_format="json"`` writes the replicas' logs as one JSON object a line (Serve's
    encoding, with the request id, application, deployment and replica of every line logged
    inside a request); ``access_log=True`` adds a line per request (off by default: it costs
    the ingress a large share of its CPU, and /metrics counts requests and latencies).

    Node pools (``pools``, e.g. ``{"a10g": {"labels": {"pool": "a10g"}}, "t4": {"labels": {"pool":
    "t4"}, "price": 0.4}}``: nodes named by node labels or by custom resources they carry): each
    model stage's replica is timed on each pool, and the heterogeneity LP chooses replicas per
    (stage, pool): the highest rate the pools hold, or with ``rps`` the cheapest at the planner's
    headroom (``price`` per replica, default 1; ``max_replicas`` caps a pool). Each (stage, pool)
    is a deployment of its own pinned to the pool; the ingress sends each call to the pool where it
    would wait least, and none to a pool whose replicas are all gone
    (:mod:`serving.launch.pools`, :mod:`serving.runtime.pools`). Not with ``min_replicas``. A pool
    with ``"preemptible": True`` makes a tier plan: the rate is held with any one preemptible pool
    lost, with ``rps`` at the planner's headroom (:mod:`serving.planning.pools`), and the ingress
    and the monitor run off the preemptible pools (:func:`serving.launch.graph.off_spot`).

    In situ (``insitu``, :mod:`serving.measure.insitu`): once the app runs, a probe of
    ``DEPLOY_PROBE_CLIENTS`` closed-loop clients sends it the sample rows for a few seconds
    while every process's CPU is read from /proc; a plan made here is made again with each
    group's measured-over-modelled CPU and the app redeployed with it where its replicas
    differ (the running replicas adopt it where they do not: serving.core.plan_board), so ``app.plan`` and
    ``GET /plan`` predict what the running app measures (``plan.in_situ`` holds the factors,
    the probe's figures and the prediction before). The probe's monitor records are dropped.
    "auto" probes where this machine can read every process of the app (not on a cluster
    spanning machines: a note says so), "always" raises where it cannot, "never" skips it.
    """
    import ray

    if router not in ("capacity", "serve"):
        raise ValueError(f"router must be 'capacity' or 'serve', got {router!r}")
    if lost_after_s is not None and not lost_after_s > 0:
        raise ValueError(f"lost_after_s must be > 0 seconds (None: off), got {lost_after_s!r}")
    if isinstance(monitor, bool):  # monitor=True: the monitor with default options
        monitor = {} if monitor else None
    _check_arguments(name, min_replicas, device, layout, transport, proxy, monitor, calibrate,
                     deadline_ms, rows_per_request, insitu)
    if autoscaler not in AUTOSCALERS:
        raise ValueError(f"autoscaler must be one of {AUTOSCALERS}, got {autoscaler!r}")
    pool_specs = check_pools(pools) if pools is not None else None
    if pool_specs and min_replicas is not None:
        raise ValueError("pools: replicas per node pool are the LP's, not an autoscaler's: drop min_replicas "
                         "(autoscaling per pool is not built)")
    if pool_specs and layout == "whole":
        raise ValueError("pools place the model stages' replicas, but layout='whole' runs every level in the "
                         "ingress: use layout='fused', 'staged' or 'auto'")
    if autoscaler == "planner" and min_replicas is None:
        raise ValueError("autoscaler='planner' picks an autoscaled stage's replicas: give min_replicas "
                         "(autoscaling is off without it)")
    if isinstance(gear_policy, dict) and "replicas_for" in gear_policy and autoscaler != "planner":
        raise ValueError("gear_policy['replicas_for'] says what the planner autoscaler sizes the stages for: "
                         "use it with autoscaler='planner' and min_replicas")
    hedge_spec = hedging_options(hedging)
    logging_config(access_log, log_format)  # checks log_format before anything starts
    traced = tracing_config(tracing)
    weak = weak_key_warning(api_key) if api_key else None
    if weak:
        warnings.warn(weak, stacklevel=2)
    cluster.ships_code(ship_code, address)  # validates the option before anything starts
    started = _ensure_ray(address, cpus, gpus, proxy, transport, ship_code=ship_code, monitor=monitor is not None)
    serve_was_running = _serve_running()
    source, opt = artifacts.resolve(target, name, artifact_share)
    try:
        if opt.sample_rows_ is None:
            raise ValueError("the artifact has no sample rows; re-optimize with keep_sample=True to serve it")
        # a redeploy under a running app's name: its replicas' resources come back to the new app
        # (the monitor's only where the new app has one too: else the old monitor app is deleted)
        by_app = running_apps.running_by_app([name, f"{name}-monitor"]) if serve_was_running else {}
        old_app = by_app.get(name, running_apps.Running())
        old_monitor = by_app.get(f"{name}-monitor", running_apps.Running())
        old = old_app.merged(old_monitor) if monitor is not None else old_app
        free_nodes = cluster.nodes(free=True)
        free_now = within_gpus(free_nodes, gpus)
        monitor_state = _monitor_state(name, monitor, bool(old_monitor.apps))
        nodes = within_gpus(running_apps.with_returned(free_nodes, old.held), gpus)
        code_note = cluster.check_code_reaches(ship_code, len(nodes))
        specs = specs_of(opt, baseline, plan)
        check_gears(gears, gear_policy, opt, baseline=baseline)  # and the SLO, before minutes of profiling:
        gears_info = gear_info(gears, gear_policy, opt, (plan.target_p99_ms if plan is not None else p99_ms) or deadline_ms)
        # the GPU decision and its profiling on GPUs free now (a running app's are not, yet)
        use_gpu, notes = _use_gpu(opt, specs, device, runtime, sum(n.gpus for n in free_now))
        audit_rate, audit_note = resolve_audit_rate(audit_rate, monitor=monitor is not None,
                                                    cascade=len(opt.levels) > 1 and not baseline)
        notes += [audit_note] if audit_note else []
        on_alarm = check_on_alarm(on_alarm, audit_rate)
        whole = (specs[0].name == WHOLE_STAGE) if plan is not None else layout == "whole"
        layout = _cascade_layout(layout, plan, whole, min_replicas, use_gpu,
                                 degrade or bool(hedge_spec) or bool(pool_specs))
        host = cluster.listen_host(host, len(nodes))
        allowed_hosts = list(LOOPBACK_HOSTS) if host in LOOPBACK_HOSTS else None
        if allowed_hosts is None and api_key is None:
            warnings.warn(f"serving on {host} (beyond loopback) without an API key: whoever reaches the port can "
                          f"call every route, /plan and the monitor's answers included; pass api_key= (or "
                          f"`willump serve --api-key-env {API_KEY_ENV}`)", stacklevel=2)
        # a tier plan's HTTP fronts stay off the preemptible pools: a front on a node that vanishes
        # takes its clients' connections with it (Serve's proxies run on every node by default)
        spot = [p.name for p in pool_specs or () if p.preemptible] or (   # or a given plan's tier pools
            preemptible_pools(plan.pools) if plan is not None else [])
        serve_start(host, port, traced, proxy_location="HeadOnly" if spot else None)
        if traced is not None:
            notes.append(_tracing_note(traced, serve_was_running))
        if spot and serve_was_running:
            notes.append(f"Serve was already running, with its HTTP proxies where it started them: on the "
                         f"preemptible pools {spot} too where it runs one on every node, and a client connected to "
                         "one of those loses its connection with the node (start Serve with "
                         "proxy_location='HeadOnly' before deploying to keep them on the head)")
        base = root_url(host, port)
        front = running_proxy()
        if proxy is not None and front != proxy:
            warnings.warn(f"proxy={proxy!r} asked for, but the running Ray Serve uses {front!r}: the front "
                          "is chosen when Ray starts (see serving.launch.proxy.proxy_environment)", stacklevel=2)
        made_here = plan is None
        # module groups too big for module_memory: chains of partition stages, whose CPUs come
        # out of the budget the stages' plan may use
        chains, chain_notes = plan_module_chains(opt, specs, module_memory=module_memory, devices=module_devices,
                                                 device="gpu" if use_gpu else "cpu", cpus_per_replica=module_cpus,
                                                 name=name, nodes=nodes)
        notes += chain_notes
        if chains and whole:
            raise ValueError("layout='whole' runs every level in the ingress replicas; module_memory splits a "
                             "module group into a chain of its own deployments: use layout='fused' or 'auto'")
        if chains:
            cpus = (cpus if cpus is not None else sum(n.cpus for n in nodes)) - chain_cpus(chains)
            if cpus <= 0:
                raise ValueError(f"the module chains take {chain_cpus(chains):g} CPUs, all the budget: "
                                 "lower module_cpus or give deploy more cpus")
            nodes = free_after_chains(nodes, chains)  # the stages' plan shares what the chains leave
        def plan_on(where: list) -> Plan:
            costs = measure_costs(calibrate, base, where, front=front,
                                  transport=running_transport() if started else transport)
            made = make_plan(opt, source, specs, where, costs, cpus=cpus, use_gpu=use_gpu, baseline=baseline,
                             runtime=runtime, rps=rps, p99_ms=p99_ms, rows_per_request=rows_per_request,
                             monitor=monitor,
                             layout="fused" if chains and layout == "auto" else layout,
                             gpu_nodes=free_now)
            if pool_specs:  # timed at the batch size the replicas will run
                _override_batching(made, max_batch_size, batch_wait_timeout_s)
                place_on_pools(made, source, specs_of(opt, baseline, made), pool_specs, where,
                               target_rows_s=rps * rows_per_request if rps else None)
            return made

        if plan is None:
            plan = plan_on(nodes)
            specs = specs_of(opt, baseline, plan)
        elif pool_specs:
            plan = Plan.from_dict(plan.to_dict())  # the caller's plan stays as it was given
            _override_batching(plan, max_batch_size, batch_wait_timeout_s)
            rate = rps or plan.target_rps
            place_on_pools(plan, source, specs, pool_specs, nodes,
                           target_rows_s=rate * plan.rows_per_request if rate else None)
        _settle_plan(plan, nodes, made_here, max_batch_size, batch_wait_timeout_s)
        surge_percent = HANDOVER_SURGE_PERCENT
        if old.apps:
            new_monitor_cpus = plan.monitor_cpus if monitor is not None and f"{name}-monitor" not in old.apps else 0.0
            surge_percent, why = handover.rollout_surge(handover.new_deployments(name, plan, chains), old,
                                                        free_now, monitor_cpus=new_monitor_cpus,
                                                        pinned=handover.pool_pins(name, plan,
                                                                                  [n.node_id for n in free_now]))
            if surge_percent is None and made_here:  # as before: planned on what the running app leaves
                nodes = free_after_chains(free_now, chains) if chains else free_now
                plan = plan_on(nodes)
                specs = specs_of(opt, baseline, plan)
                _settle_plan(plan, nodes, made_here, max_batch_size, batch_wait_timeout_s)
                surge_percent, why = handover.rollout_surge(handover.new_deployments(name, plan, chains), old,
                                                            free_now, monitor_cpus=new_monitor_cpus,
                                                            pinned=handover.pool_pins(
                                                                name, plan, [n.node_id for n in free_now]))
            if surge_percent is None:
                raise ValueError(f"the plan cannot replace the running app {name!r}: what Serve starts before it "
                                 f"stops old replicas does not fit beside them ({why}); shut the app down first, "
                                 "or deploy a plan that adds fewer replicas")
            if surge_percent == 0:
                warnings.warn(f"no room beside the running app {name!r} for a replacement of each of its "
                              f"deployments ({why}): Serve stops old replicas before it starts their "
                              "replacements, so a deployment of one replica answers nothing while its "
                              "replacement starts", stacklevel=2)
        probe_why = probe_blocked(insitu, nodes, min_replicas) if not pool_specs else (
            "the replicas per node pool are the LP's, from rates measured on each pool")
        token = secrets.token_hex(16) if probe_why is None else None
        spec = AppSpec(
            name=name, artifact=vars(source).copy(), plan=plan.to_dict(), baseline=baseline,
            runtime=runtime, batching=batching, monitor=monitor, degrade=degrade,
            deadline_ms=deadline_ms if deadline_ms is not None else p99_ms,
            api_key_hmac=key_digest(api_key, key_secret(create=True)) if api_key else None,
            allowed_hosts=allowed_hosts, max_in_flight=max_in_flight, max_body_bytes=max_body_bytes, max_rows=max_rows,
            min_replicas=min_replicas, max_replicas=max_replicas, downscale_to_zero_s=downscale_to_zero_s,
            autoscaler=autoscaler, gears=gears_info, hedging=hedge_spec, router=router, lost_after_s=lost_after_s,
            probe_sha256=hashlib.sha256(token.encode()).hexdigest() if token else None,
            module_chains=chains or None, audit_rate=audit_rate, on_alarm=on_alarm, log_format=log_format,
            access_log=access_log, surge_percent=surge_percent, monitor_state=monitor_state,
        )
        monitor_app = run_spec(spec, opt)
        if name in old.apps:  # handed over: the artifact the old replicas served is not needed
            artifacts.release_others(source, name)
        if monitor is None and old_monitor.apps and old_app.apps:  # the old app's monitor goes with it
            _discard_monitor_state(f"{name}-monitor")
            delete_app(f"{name}-monitor")
        if token is not None:
            plan, probe_note = refine_in_situ(spec, opt, plan, f"{base}/{name}", token, api_key=api_key,
                                              replan=made_here and not old.apps, budget_cpus=cpus,
                                              overrides=lambda p: _override_batching(p, max_batch_size,
                                                                                     batch_wait_timeout_s))
            notes.append(probe_note)
        elif probe_why and insitu == "auto":
            notes.append(f"in-situ probe not run: {probe_why}")
    except BaseException:
        if ray.is_initialized():
            artifacts.release(source, name)
        raise
    notes += [code_note] if code_note else []
    if api_key and len(nodes) > 1 and not os.environ.get(SECRET_ENV):
        notes.append(f"the API key's digest is keyed with {secret_path()}: every node needs that file (or "
                     f"${SECRET_ENV}), or its ingress replicas will not start")
    exposed = exposure_note(host, port) if started else None
    if exposed:
        warnings.warn(exposed, stacklevel=2)
        notes.append(exposed)
    return ServingApp(name, f"{base}/{name}", plan, source.version, [s.name for s in specs], started,
                      notes + plan.notes, proxy=front, artifact=source, monitor_app=monitor_app, spec=spec)


def hedging_options(hedging: bool | dict[str, float] | None) -> dict[str, float] | None:
    """deploy(hedging=...) as the spec carries it: None (off) or the policy's parameters."""

    if hedging is None or hedging is False:
        return None
    options = {"quantile": HEDGE_QUANTILE, "floor_over_median": HEDGE_FLOOR_OVER_MEDIAN,
               "min_win_share": HEDGE_MIN_WIN_SHARE}
    if isinstance(hedging, dict):
        unknown = sorted(set(hedging) - set(options))
        if unknown:
            raise ValueError(f"hedging: unknown options {unknown}; known: {sorted(options)}")
        options.update({k: float(v) for k, v in hedging.items()})
    elif hedging is not True:
        raise TypeError(f"hedging must be True, False or a dict of options, got {type(hedging).__name__}")
    if not 0 < options["quantile"] < 1 or not options["floor_over_median"] >= 0 \
            or not 0 <= options["min_win_share"] <= 1:
        raise ValueError("hedging: quantile must be in (0, 1), floor_over_median >= 0 and min_win_share in "
                         f"[0, 1], got {options}")
    return options


def serve_start(host: str, port: int, tracing: dict[str, Any] | None = None,
                proxy_location: str | None = None) -> None:
    """Serve started (or joined) with HTTP on ``host:port``; ``tracing``: its TracingConfig and
    ``proxy_location`` (Serve's: None, "EveryNode", "HeadOnly"), which Serve applies only when this
    call starts it."""
    from ray import serve

    kwargs: dict[str, Any] = {} if proxy_location is None else {"proxy_location": proxy_location}
    if tracing is not None:
        from ray.serve.schema import TracingConfig

        kwargs["tracing_config"] = TracingConfig(**tracing)
    serve.start(http_options={"host": host, "port": port}, **kwargs)


def _serve_running() -> bool:
    """Whether a Serve instance already runs on the Ray this process is connected to."""
    import ray

    if not ray.is_initialized():
        return False
    from ray import serve

    try:
        serve.context._get_global_client(raise_if_no_controller_running=True)
    except Exception:
        return False
    return True


def _tracing_note(traced: dict[str, Any], was_running: bool) -> str:
    if was_running:
        return ("tracing asked for, but Serve was already running: its own tracing setting stays (start it with "
                "tracing, or set RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH before `ray start`)")
    import ray

    from serving.core.procstat import session_dir

    where = traced["exporter_import_path"] or (
        f"{session_dir(ray.get_runtime_context().gcs_address) or 'the Ray session'}/logs/serve/spans")
    return f"tracing {traced['sampling_ratio']:.0%} of requests to {where}"


def _use_gpu(opt: OptimizedPipeline, specs: list, device: str, runtime: str, free_gpus: float) -> tuple[bool, list[str]]:
    """Whether the later stages go on GPUs: asked for and possible, or 'auto' and useful."""
    later = specs[1:] if len(specs) > 1 else specs

    capable = all(gpu_capable(opt, s, runtime) or module_groups(opt, s) for s in later)
    if device == "gpu" and free_gpus <= 0:
        raise ValueError("device='gpu' but no GPU is free for this app (the Ray cluster has none free, "
                         "or deploy's gpus= share is 0)")
    if device == "gpu" and not capable:
        raise ValueError(f"device='gpu', but the models of stage(s) {[s.name for s in later]} cannot run on a "
                         "GPU (scikit-learn/LightGBM models run on the CPU); use runtime='onnx' (ONNX Runtime's "
                         "CUDA provider) or torch models, or device='cpu'")
    notes = []
    if device == "auto" and free_gpus > 0 and not capable:
        notes.append("the cluster has GPUs but these stages' models cannot use them: all stages on CPU")
    return device == "gpu" or (device == "auto" and free_gpus > 0 and capable), notes


def make_plan(opt: OptimizedPipeline, source: ArtifactSource, specs: list, nodes: list, costs: HostCosts, *,
              cpus: float | None, use_gpu: bool, baseline: bool, runtime: str, rps: float | None,
              p99_ms: float | None, rows_per_request: int, monitor: dict[str, Any] | None, layout: str,
              gpu_nodes: list | None = None) -> Plan:
    """Profile the stages and the ingress's work in a Ray worker here (GPU stages inside GPU
    actors, on a share of what ``gpu_nodes`` have free, ``nodes`` when None); plan on the nodes
    in ``layout`` (:data:`~serving.planning.planner.CASCADE_LAYOUTS`; "whole" and "auto" time
    the whole cascade as one stage too)."""
    _, record_config = monitor_settings(monitor, opt) if monitor is not None else ({}, {})
    # the stages a GPU will run are timed there only (the baseline too: cascade and full
    # pipeline compared on the same device)
    gpu_specs = (specs if baseline else specs[1:]) if use_gpu else []
    on_gpu = {s.name for s in gpu_specs}
    cpu_profiles, ingress = profile_on_cluster(source, baseline=baseline, rows_per_request=rows_per_request,
                                               schema=row_schema(opt, record_config),
                                               record_config=record_config if monitor is not None else None,
                                               skip=sorted(on_gpu), whole=layout in ("whole", "auto"))
    timed = {p.name: p for p in cpu_profiles}
    for s in gpu_specs:
        # the profiling processes share what one node's GPU has free for this app (``gpus``)
        timed[s.name] = profile_gpu_stage(source, s, 1.0 if baseline else unsure_share(opt), runtime=runtime,
                                          gpus=min(1.0, max((n.gpus for n in (gpu_nodes or nodes)), default=1.0)))
    profiles = [timed[s.name] for s in specs]
    if len(specs) == 1 and layout in ("whole", "auto"):
        layout = "staged"  # one stage (the baseline, a single model): nothing to split or merge
    free_cpus = sum(n.cpus for n in nodes)
    budget = min(cpus, free_cpus) if cpus is not None else free_cpus
    resources = Resources(cpus=max(budget, 0.01), gpus=sum(n.gpus for n in nodes), nodes=nodes)
    return plan_layouts(profiles, timed.get(WHOLE_STAGE), resources, layout=layout, rps=rps, p99_ms=p99_ms,
                        rows_per_request=rows_per_request, monitor=monitor is not None, ingress=ingress, costs=costs)


def _cascade_layout(layout: str, plan: Plan | None, whole: bool, min_replicas: int | None, use_gpu: bool,
                    later_stage_wanted: bool) -> str:
    """The layout to plan in: a given plan's own; "auto" plans a CPU cascade both ways (see
    :func:`~serving.planning.planner.plan_layouts`), and is "staged" when the stages autoscale,
    "fused" when a later stage is on a GPU or is wanted (``later_stage_wanted``: degradation
    answers from the cheap level when the expensive stage is late, hedging re-sends calls to it:
    the whole cascade in the ingress has no such stage; node pools place it). ``whole``: the layout asked for, or the
    given plan's stages, run every level in the ingress."""
    if whole and (use_gpu or min_replicas is not None):
        raise ValueError("layout='whole' runs every level in the ingress replicas, on CPU: not with a GPU stage "
                         "or min_replicas (the ingress does not scale to zero)")
    if plan is not None:
        return plan.layout
    if layout != "auto":
        return layout
    if min_replicas is not None:
        return "staged"
    return "fused" if use_gpu or later_stage_wanted else "auto"


def _settle_plan(plan: Plan, nodes: list, made_here: bool, max_batch_size: int | None,
                 batch_wait_timeout_s: float | None) -> None:
    """A plan made elsewhere is checked against this cluster's nodes; the caller's batching
    overrides apply; a plan no node can hold is refused, an infeasible one warned about."""
    if not made_here:
        problem = placement_problem(plan, nodes)
        if problem is not None:
            plan.placeable, plan.feasible = False, False
            plan.notes.append("cannot be placed: " + problem)
    _override_batching(plan, max_batch_size, batch_wait_timeout_s)
    if not plan.placeable:
        raise ValueError("the plan cannot be placed on this Ray cluster: "
                         + "; ".join(n for n in plan.notes if n.startswith("cannot be placed")))
    if not plan.feasible:
        warnings.warn("the stage plan is not feasible: " + "; ".join(plan.notes), stacklevel=3)


def _override_batching(plan: Plan, max_batch_size: int | None, batch_wait_timeout_s: float | None) -> None:
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if batch_wait_timeout_s is not None and batch_wait_timeout_s < 0:
        raise ValueError(f"batch_wait_timeout_s must be >= 0, got {batch_wait_timeout_s}")
    for stage in plan.stages:
        if max_batch_size is not None:
            stage.max_batch_size = int(max_batch_size)
        if batch_wait_timeout_s is not None:
            stage.batch_wait_timeout_s = float(batch_wait_timeout_s)


#: seconds deploy waits for the running monitor to name its state token
MONITOR_STATE_ASK_S = 10.0


def _discard_monitor_state(monitor_app: str) -> None:
    """Ask the monitor to remove its default state directory (best effort: the app is going)."""
    from ray import serve

    try:
        serve.get_app_handle(monitor_app).discard_state.remote().result(timeout_s=MONITOR_STATE_ASK_S)
    except Exception:
        pass


def _monitor_state(name: str, monitor: dict[str, Any] | None, monitor_running: bool) -> str | None:
    """The token of the monitor's default state folder (serving.runtime.monitor_state): the
    running monitor's, handed on, else a new one; None where the monitor keeps none (no monitor,
    or ``directory`` given: a path, or False for memory)."""
    if monitor is None or monitor.get("directory") is not None:
        return None
    token = _running_monitor_state(name) if monitor_running else None
    if monitor_running and token is None:
        warnings.warn(f"the running monitor of {name!r} named no state folder to hand on (it keeps its state "
                      f"elsewhere, or did not answer within {MONITOR_STATE_ASK_S:g} s): the new monitor starts "
                      "afresh", stacklevel=3)
    return token or secrets.token_hex(8)


def _running_monitor_state(name: str) -> str | None:
    """The state token of ``name``'s running monitor (None: it keeps none, or does not answer)."""
    from ray import serve

    try:
        return serve.get_app_handle(f"{name}-monitor").state_token.remote().result(timeout_s=MONITOR_STATE_ASK_S)
    except Exception:
        return None


def run_spec(spec: AppSpec, opt: OptimizedPipeline | None = None) -> str | None:
    """Run the monitor application (if any) and then the app of ``spec``; returns the
    monitor application's name."""
    logging = logging_config(spec.access_log, spec.log_format)
    monitor_app = None
    if spec.monitor is not None:
        try:
            import drift  # noqa: F401 - the monitor stage needs it on the replicas
        except ImportError as exc:
            raise ValueError(f"monitor= needs the drift package: {exc}") from exc
        monitor_app = f"{spec.name}-monitor"
        run_app(build_monitor(spec, opt), monitor_app, None, logging)
    run_app(build_app(spec, opt), spec.name, f"/{spec.name}", logging)
    return monitor_app
