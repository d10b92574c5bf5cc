"""Deploy a torch model on Ray Serve as a pipeline of stages planned by serving.partition.

::

    app = deploy_model(module, example, name="bert", plan="auto", devices=4)
    requests.post(f"{app.url}/predict", json={"inputs": rows}).json()["outputs"]
    app.shutdown()

``plan="auto"`` captures the module, profiles it on ``device`` at ``batch_sizes``,
measures the Serve hop on this cluster (:func:`serving.model_app.transport.calibrate_transport`)
unless ``transport`` is given, and plans with :func:`serving.partition.plan`. Each stage
is one deployment with the plan's replicas; each replica asks Ray for ``num_gpus=1`` on
a GPU plan, else ``num_cpus=cpus_per_replica``. Stage modules are written to
``workdir`` (one file per stage) and every replica loads its own file: on a multi-node
cluster ``workdir`` must be a path every node sees.
"""

from __future__ import annotations

import os
import socket
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from serving import partition as sp
from serving.core import running_apps
from serving.core.constants import HANDOVER_SURGE_PERCENT, LOOPBACK_HOSTS
from serving.core.local_ray import start_local_ray, worker_env
from serving.core.nodes import nodes
from serving.core.serve_apps import delete_app, run_app
from serving.model_app.oip import output_specs
from serving.model_app.placement import check_placeable, fits, replica_resources
from serving.model_app.stage_replica import canary_inputs, write_stage_file
from serving.model_app.stages import (
    MAX_BODY_BYTES,
    MAX_ROWS,
    InputSpec,
    ModelIngress,
    PartitionStage,
)
from serving.model_app.transport import calibrate_transport
from serving.runtime.keys import key_digest, key_secret

#: batch sizes profiled by plan="auto"
AUTO_BATCH_SIZES = (1, 4, 16, 32)
#: longest the ingress waits for a micro-batch to fill (ms)
DEFAULT_BATCH_WAIT_MS = 2.0

_TRANSPORT_CACHE: dict[str, sp.Transport] = {}


@dataclass
class ModelApp:
    """A deployed partitioned model: where it answers, its plan, how to stop it."""

    name: str
    url: str
    plan: sp.Plan
    profile: sp.Profile | None
    stage_names: list[str]
    started_ray: bool
    workdir: str
    notes: list[str] = field(default_factory=list)
    _tmp: Any = None

    def shutdown(self, *, stop_ray: bool | None = None) -> None:
        """Delete the app (and its stage files if deploy chose the folder); stop Serve and
        Ray too when deploy started them."""
        from ray import serve

        try:
            delete_app(self.name)
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
            if stop_ray if stop_ray is not None else self.started_ray:
                import ray

                serve.shutdown()
                ray.shutdown()


def _ensure_ray(address: str | None, cpus: float | None, gpus: float | None) -> bool:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is not None:
        # this job's workers (the app's replicas) at deploy's niceness, unless the cluster's system
        # config or a submitted job's runtime_env sets it
        ray.init(address=address, runtime_env={"env_vars": worker_env()}, **kwargs)
        return False
    if cpus is not None:
        kwargs["num_cpus"] = cpus
    if gpus is not None:
        kwargs["num_gpus"] = gpus
    start_local_ray(**kwargs)  # a new Ray here, not one another process started; loopback only
    return True


def _serve_port() -> int | None:
    """The HTTP port of a Serve already running in this cluster, or None."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return int(client.http_config.port) if client is not None else None


def cluster_transport(*, refresh: bool = False) -> sp.Transport:
    """The Serve hop of the running cluster, measured once per process."""
    import ray

    key = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "none"
    if refresh or key not in _TRANSPORT_CACHE:

        _TRANSPORT_CACHE[key] = calibrate_transport()
    return _TRANSPORT_CACHE[key]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (Serve's default 8000 may be another app's)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"name must be a non-empty string of letters, digits, '-' or '_', got {name!r}")
    return name


def _default_devices(device: str, cpus_per_replica: float, node_list: list) -> int:
    """Devices an "auto" plan may use on ``node_list`` (free resources, a running app's under
    the same name given back)."""
    if device == "cuda":
        return max(int(sum(n.gpus for n in node_list) + 1e-9), 1)
    # one CPU is left for the ingress and the HTTP proxy
    return max(int((sum(n.cpus for n in node_list) - 1.0 + 1e-9) // cpus_per_replica), 1)


def _handover_surge(name: str, the_plan: sp.Plan, need: Any, old: running_apps.Running,
                    free_nodes: list) -> int:
    """The surge percent a redeploy under a running app's name hands over with: Serve starts,
    per stage, the replicas the plan adds plus (surging) one replacement before it stops an
    old replica (serving.launch.handover). The surge where those fit beside the running app,
    stop-first (with a warning) where only the added replicas do, a ValueError where not even
    those fit (Serve would wait forever). Every stage's replicas need the same resources."""
    if not old.apps:
        return HANDOVER_SURGE_PERCENT
    targets = {f"{name}-stage{k}": st.replicas for k, st in enumerate(the_plan.stages)}
    surging = sum(running_apps.started_first(targets, old.replicas, surge=True).values())
    if fits(surging, need, free_nodes) >= surging:
        return HANDOVER_SURGE_PERCENT
    added = sum(running_apps.started_first(targets, old.replicas, surge=False).values())
    room = ", ".join(f"{n.host}: {n.cpus:g} CPU, {n.gpus:g} GPU" for n in free_nodes)
    if fits(added, need, free_nodes) < added:
        raise ValueError(f"the plan cannot replace the running app {name!r}: the {added} replicas it adds do not "
                         f"fit beside the running ones (free: {room}); shut the app down first, or deploy a plan "
                         "that adds fewer replicas")
    warnings.warn(f"no room beside the running app {name!r} for a replacement of each of its stages (free: "
                  f"{room}): Serve stops old replicas before it starts their replacements, so a stage of one "
                  "replica answers nothing while its replacement starts", stacklevel=3)
    return 0


def deploy_model(
    module: torch.nn.Module,
    example: Any,
    *,
    name: str,
    plan: sp.Plan | str = "auto",
    devices: int | None = None,
    memory_per_device: float | None = None,
    objective: str = "throughput",
    rate: float | None = None,
    slo_ms: float | None = None,
    device: str | None = None,
    batch_sizes: tuple[int, ...] = AUTO_BATCH_SIZES,
    transport: sp.Transport | None = None,
    graph: sp.Graph | None = None,
    profile: sp.Profile | None = None,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float | None = None,
    threads: int | None = 1,
    batch_wait_ms: float = DEFAULT_BATCH_WAIT_MS,
    max_inflight: int | None = None,
    max_rows: int = MAX_ROWS,
    max_body_bytes: int = MAX_BODY_BYTES,
    workdir: str | os.PathLike | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    address: str | None = None,
    cpus: float | None = None,
    gpus: float | None = None,
    api_key: str | None = None,
) -> ModelApp:
    """Serve ``module`` at ``/{name}``: ``POST /predict {"inputs": ...}`` ->
    ``{"outputs": ...}`` equal (allclose) to ``module(*inputs)``.

    ``plan``: "auto" (capture, profile, calibrate, plan; see the module docstring), or a
    :class:`serving.partition.Plan` computed elsewhere (e.g. from a saved profile);
    ``graph``/``profile`` skip capture/profiling when already done. ``device`` "cpu" or
    "cuda" (alias "gpu"); by default the device a given plan was made for (a plan from
    a GPU profile serves on GPUs, an emulated or CPU one on CPUs), else "cpu". ``cpus_per_replica`` may be fractional (emulated devices).
    Each replica is one device: ``gpus_per_replica`` (default: 1, or the free GPUs shared
    among the plan's replicas when there are fewer GPUs than replicas, see
    :mod:`serving.model_app.placement`). A plan the cluster's free resources cannot hold is
    refused with a ValueError naming the shortfall before anything is deployed. Deployed under
    a running app's name, it replaces that app without downtime: the running replicas'
    resources count as the new app's, and Serve starts a replacement before it stops an old
    replica where there is room for one (else stop-first, with a warning; a plan whose added
    replicas cannot fit beside the running ones is refused).
    Starts Ray (``cpus``/``gpus``) and Serve on ``host:port`` (a free port by default) when
    none is running; joins a running Serve otherwise. ``api_key`` requires ``Authorization:
    Bearer KEY`` (or ``X-API-Key``) on every route but ``/healthz``, as the pipeline app does;
    only its hash is stored in the app.
    """
    from ray import serve

    _check_name(name)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if device is None:  # a given plan says where it was planned for; "auto" plans on CPU
        planned = plan.stages[0].device if isinstance(plan, sp.Plan) and plan.stages else "cpu"
        device = "cuda" if planned in ("cuda", "gpu") else "cpu"
    device = {"gpu": "cuda"}.get(device, device)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' ('gpu'), got {device!r}")
    if not isinstance(plan, (sp.Plan, str)) or (isinstance(plan, str) and plan != "auto"):
        raise ValueError(f"plan must be 'auto' or a serving.partition.Plan, got {plan!r}")
    if not cpus_per_replica > 0 or batch_wait_ms < 0 or max_rows < 1:
        raise ValueError("cpus_per_replica must be > 0, batch_wait_ms >= 0 and max_rows >= 1")
    if devices is not None and (not isinstance(devices, int) or devices < 1):
        raise ValueError(f"devices must be a positive int, got {devices!r}")
    graph = graph if graph is not None else sp.capture(module, example)
    args = graph.example
    started = _ensure_ray(address, cpus, gpus)
    notes: list[str] = []
    try:
        existing = _serve_port()
        if existing is None:
            port = port if port is not None else free_port(host)
            serve.start(http_options={"host": host, "port": port})
        elif port is not None and port != existing:
            notes.append(f"Serve already runs on port {existing}; port={port} ignored")
        http_port = existing if existing is not None else port
        # a redeploy under a running app's name: its replicas' resources come back to the new app
        old = running_apps.running_by_app([name]).get(name, running_apps.Running()) if existing is not None \
            else running_apps.Running()
        free_nodes = nodes(free=True)
        node_list = running_apps.with_returned(free_nodes, old.held)
        if isinstance(plan, str):
            if profile is None:
                tr = transport or cluster_transport()
                profile = sp.profile(graph, batch_sizes=batch_sizes, device=device, threads=threads,
                                     transport=tr, name=name)
            elif transport is not None:
                profile = profile.with_transport(transport)
            m = devices or _default_devices(device, cpus_per_replica, node_list)
            the_plan = sp.plan(profile, m, memory_per_device, objective, rate=rate, slo_ms=slo_ms)
            if not the_plan.feasible:
                raise ValueError("no feasible plan: " + "; ".join(the_plan.notes))
        else:
            the_plan = plan
            if not the_plan.stages:
                raise ValueError("the plan has no stages (an infeasible plan cannot be deployed)")
        # each replica is one device: refuse a plan the free resources cannot hold, now
        need = replica_resources(the_plan.devices_used, device, node_list, cpus_per_replica=cpus_per_replica,
                                 gpus_per_replica=gpus_per_replica)
        check_placeable(the_plan.devices_used, need, node_list)
        surge = _handover_surge(name, the_plan, need, old, free_nodes)
        if 0 < need.num_gpus < 1:
            notes.append(f"{the_plan.devices_used} replicas share the GPUs: {need.num_gpus:g} GPU each")
        stages = sp.split(graph, the_plan)
        canaries = canary_inputs(stages, args)
        tmp = None
        if workdir is None:
            tmp = tempfile.TemporaryDirectory(prefix=f"willump-model-{name}-")
            folder = Path(tmp.name)
        else:
            folder = Path(workdir)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        inflight = max_inflight or 2 * the_plan.devices_used + len(the_plan.stages)
        handles = []
        stage_names = []
        for k, (mod, st) in enumerate(zip(stages, the_plan.stages, strict=True)):
            path = folder / f"stage{k}.pt"
            digest = write_stage_file(mod, path)
            stage_name = f"{name}-stage{k}"
            stage_names.append(stage_name)
            handles.append(PartitionStage.options(
                # room for every batch the ingress lets in: a full replica would make Serve's
                # router back off and retry; the replica's lock still runs one batch at a time
                name=stage_name, num_replicas=st.replicas, max_ongoing_requests=max(4, inflight),
                max_surge_percent=surge, ray_actor_options=need.as_options(),
            ).bind(str(path), device, threads, digest, canaries[k]))
        info = {
            "name": name, "outputs": output_specs(stages[-1], canaries[-1]),
            "inputs": [vars(InputSpec.of(a)) for a in args], "batch_size": the_plan.batch_size,
            "batch_wait_ms": batch_wait_ms, "max_inflight": inflight, "max_rows": max_rows,
            "max_body_bytes": max_body_bytes, "plan": the_plan.to_dict(),
            "api_key_hmac": key_digest(api_key, key_secret(create=True)) if api_key else None,
            "allowed_hosts": list(LOOPBACK_HOSTS) if host in LOOPBACK_HOSTS else None,
        }
        ingress = ModelIngress.options(name=f"{name}-ingress", max_ongoing_requests=4096,
                                       max_surge_percent=HANDOVER_SURGE_PERCENT,
                                       ray_actor_options={"num_cpus": 0.0}).bind(handles, info)
        run_app(ingress, name, f"/{name}", {"enable_access_log": False, "log_level": "WARNING"})
    except BaseException:
        if started:
            import ray

            serve.shutdown()
            ray.shutdown()
        raise
    if not the_plan.feasible:
        warnings.warn("deploying an infeasible plan: " + "; ".join(the_plan.notes), stacklevel=2)
    return ModelApp(name, f"http://{host}:{http_port}/{name}", the_plan, profile, stage_names, started,
                    str(folder), notes + list(the_plan.notes), tmp)
