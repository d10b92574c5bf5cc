"""A Ray Serve config file for an artifact, for the tools production already runs.

``willump build ARTIFACT -o serve_config.yaml`` plans the app (on a running cluster given
``--address``, measured there; otherwise for ``--cpus`` logical CPUs on one node, with
placeholder HTTP costs, as the plan notes) and writes a config that ``serve deploy``,
``serve run`` and KubeRay's RayService (``serveConfigV2``) accept. Its applications name
:func:`serving.launch.graph.app_builder` (and :func:`serving.launch.graph.monitor_builder`) with the
spec deploy() would run as ``args``, so the deployed app is the one ``willump serve``
would deploy, plan included.

The artifact is referenced by path: every node must read it there (a shared volume, the
same path baked into the image, a KubeRay volume mount). The nodes need the project
installed (the image), since ``serve deploy`` does not upload local code.
"""

from __future__ import annotations

import copy
import os
import secrets
from pathlib import Path
from typing import Any

import yaml

from serving.core.artifacts import ArtifactSource, path_version
from serving.core.constants import LOOPBACK_HOSTS, LOST_AFTER_S
from serving.core.jsonsafe import clean
from serving.core.local_ray import worker_env
from serving.core.serve_apps import logging_config, tracing_config
from serving.core.specs import AppSpec
from serving.launch.graph import deployment_overrides, monitor_settings, row_schema, specs_of
from serving.launch.handover import planned_surge
from serving.measure.stages import profile_baseline, profile_ingress, profile_stages
from serving.planning.planner import Plan, Resources, plan_layouts
from serving.planning.pools import preemptible_pools
from serving.runtime.hold import check_on_alarm
from serving.runtime.keys import key_digest, key_secret


def plan_offline(opt: Any, *, cpus: float, rows_per_request: int, rps: float | None, p99_ms: float | None,
                 layout: str, monitor: dict[str, Any] | None, baseline: bool = False, gpus: float = 0.0) -> Plan:
    """A plan made without a cluster: stage and ingress costs measured here, HTTP and hop
    costs unmeasured (placeholders, noted in the plan), one node of ``cpus`` logical CPUs.
    ``layout``: one of :data:`~serving.planning.planner.CASCADE_LAYOUTS` ("auto": fused, or
    the whole cascade in the ingress where that plans faster; on a GPU, fused)."""
    specs = specs_of(opt, baseline)
    whole = None
    if baseline:
        profiles = [profile_baseline(opt, rows_per_request=rows_per_request)]
    else:
        merged = layout in ("whole", "auto") and len(specs) > 1 and gpus <= 0
        profiles = profile_stages(opt, device="gpu" if gpus > 0 else "cpu", rows_per_request=rows_per_request,
                                  whole=merged)
        if merged:
            whole, profiles = profiles[-1], profiles[:-1]
    _, record_config = monitor_settings(monitor, opt) if monitor is not None else ({}, {})
    ingress = profile_ingress(opt, rows_per_request, schema=row_schema(opt, record_config),
                              record_config=record_config if monitor is not None else None)
    if len(specs) == 1:
        layout = "staged"
    return plan_layouts(profiles, whole, Resources(cpus=cpus, gpus=gpus), layout=layout, rps=rps, p99_ms=p99_ms,
                        rows_per_request=rows_per_request, monitor=monitor is not None, ingress=ingress)


def serve_config(
    artifact: str | os.PathLike,
    plan: Plan,
    *,
    name: str = "willump",
    host: str = "0.0.0.0",
    port: int = 8000,
    monitor: dict[str, Any] | None = None,
    runtime: str = "native",
    batching: bool = True,
    degrade: bool = False,
    deadline_ms: float | None = None,
    api_key: str | None = None,
    api_key_env: str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    autoscaler: str = "serve",
    runtime_env: dict[str, Any] | None = None,
    gears: dict[str, Any] | None = None,
    hedging: dict[str, float] | None = None,
    router: str = "capacity",
    lost_after_s: float | None = LOST_AFTER_S,
    audit_rate: float = 0.0,
    on_alarm: str = "alert",
    log_format: str = "text",
    tracing: bool | dict[str, Any] = False,
) -> dict[str, Any]:
    """The Serve config (a dict ready for YAML) deploying ``artifact`` with ``plan``; ``gears``:
    :func:`serving.runtime.gears.gear_info` (load-adaptive or pinned gears; None: the plan);
    ``hedging``: :func:`serving.launch.deploy.hedging_options` (None: off); ``router`` and
    ``lost_after_s``: as :func:`serving.deploy` takes them (and ``autoscaler``, with
    ``min_replicas``). ``audit_rate``: the
    live audit's share (:func:`serving.runtime.audit.resolve_audit_rate` resolves a default);
    ``on_alarm``: what its alarm does (:mod:`serving.runtime.hold`); ``log_format``: "text" or
    "json" replica logs (:func:`serving.core.serve_apps.logging_config`); ``tracing``: Serve's
    tracing config (:func:`serving.core.serve_apps.tracing_config`).
    ``api_key_env``: the environment variable every ingress replica reads the API key from
    (the key stays out of the file; ``api_key`` instead stores its hash in it). Serving beyond
    loopback with neither is allowed here; ``willump build`` warns about it or refuses it.
    """
    path = str(Path(artifact).resolve())
    source = ArtifactSource(path_version(path), path=path)
    spec = AppSpec(
        name=name, artifact=vars(source).copy(), plan=plan.to_dict(), baseline=False,
        runtime=runtime, batching=batching, monitor=monitor, degrade=degrade,
        deadline_ms=deadline_ms if deadline_ms is not None else plan.target_p99_ms,
        api_key_hmac=key_digest(api_key, key_secret(create=True)) if api_key else None,
        api_key_env=api_key_env, min_replicas=min_replicas,
        allowed_hosts=list(LOOPBACK_HOSTS) if host in LOOPBACK_HOSTS else None, max_replicas=max_replicas, gears=gears, hedging=hedging,
        autoscaler=autoscaler, router=router, lost_after_s=lost_after_s, audit_rate=audit_rate, on_alarm=check_on_alarm(on_alarm, audit_rate), log_format=log_format,
        # the monitor's state outlives its replica: `serve deploy` of an edited config keeps the token
        monitor_state=secrets.token_hex(8) if monitor is not None and monitor.get("directory") is None else None,
        surge_percent=planned_surge(name, plan),
    ).model_dump()
    applications = []
    if monitor is not None:
        applications.append({"name": f"{name}-monitor", "route_prefix": None,
                             "import_path": "serving.launch.graph:monitor_builder", "args": spec})
    # the plan's deployments where an operator tunes them (Serve applies these over the code's)
    applications.append({"name": name, "route_prefix": f"/{name}", "import_path": "serving.launch.graph:app_builder",
                         "args": spec, "deployments": deployment_overrides(spec)})
    # the replicas at deploy's niceness on whatever Ray runs the config (its env_vars under the user's)
    env = dict(runtime_env or {})
    if not isinstance(env.get("env_vars") or {}, dict):
        raise ValueError(f"runtime_env's env_vars must be a mapping, got {env['env_vars']!r}")
    env["env_vars"] = {**worker_env(), **(env.get("env_vars") or {})}
    for entry in applications:
        entry["runtime_env"] = {**env, "env_vars": dict(env["env_vars"])}  # a copy each: no YAML aliases
    # a tier plan's HTTP fronts stay off its preemptible pools, as deploy() keeps them
    proxies = "HeadOnly" if preemptible_pools(plan.pools) else "EveryNode"
    config = {"proxy_location": proxies, "http_options": {"host": host, "port": port},
              "logging_config": logging_config(log_format=log_format),
              "applications": applications}
    traced = tracing_config(tracing)
    if traced is not None:
        config["tracing_config"] = traced
    return config


#: the entry points a Serve config written by `willump build` names (their args hold the spec)
BUILDERS = ("serving.launch.graph:app_builder", "serving.launch.graph:monitor_builder")


def retarget_config(config: dict[str, Any], artifact: str | os.PathLike) -> tuple[dict[str, Any], list[str]]:
    """``config`` (a Serve config `willump build` wrote) serving ``artifact`` instead: every one
    of its applications' artifact reference (path and version) replaced, nothing else. Deployed
    with ``serve deploy``, Serve rolls each application over to the new artifact (new replicas
    first, then the old ones stop: no request is lost). Returns the config and the names of the
    applications changed; ValueError when the config names no willump application."""
    path = str(Path(artifact).resolve())
    source = vars(ArtifactSource(path_version(path), path=path)).copy()
    out = copy.deepcopy(config)
    changed = []
    for app in out.get("applications") or []:
        if app.get("import_path") in BUILDERS and isinstance(app.get("args"), dict):
            app["args"]["artifact"] = dict(source)
            changed.append(app.get("name"))
    if not changed:
        raise ValueError("the config names no application `willump build` wrote (import_path "
                         f"{BUILDERS[0]}); nothing to hand the artifact to")
    return out, changed


def write_serve_config(config: dict[str, Any], path: str | os.PathLike) -> Path:
    out = Path(path)
    header = ("# Ray Serve config written by `willump build` (serve deploy / serve run / KubeRay RayService).\n"
              "# The artifact path must be readable on every node; the plan inside was measured as its notes say.\n")
    out.write_text(header + yaml.safe_dump(clean(config), sort_keys=False))
    return out
