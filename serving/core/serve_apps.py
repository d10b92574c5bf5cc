"""Serve applications run and deleted with their status looked at soon and then less often:
Serve's own blocking client looks once a second, which added about a second to every deploy
and every delete (a redeploy, a test, a CLI shutdown)."""

from __future__ import annotations

import time
from typing import Any

#: how often an application's status is looked at: first after STATUS_POLL_S, then each wait
#: STATUS_POLL_GROWTH times longer up to STATUS_POLL_MAX_S (each look asks Serve's controller
#: for every application's details: a fixed 0.1 s poll cost it a share of a core)
STATUS_POLL_S = 0.05
STATUS_POLL_GROWTH = 1.5
STATUS_POLL_MAX_S = 0.5


def _pauses():
    pause = STATUS_POLL_S
    while True:
        yield pause
        pause = min(pause * STATUS_POLL_GROWTH, STATUS_POLL_MAX_S)


def wait_running(name: str, timeout_s: float | None = None) -> None:
    """Wait until the Serve application ``name`` runs; RuntimeError with Serve's message
    when its deployment failed, TimeoutError after ``timeout_s`` (None: no limit, as Serve)."""
    from ray import serve

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pauses = _pauses()
    while True:
        app = serve.status().applications.get(name)
        if app is None:
            raise RuntimeError(f"waiting for application {name} to run, but it does not exist")
        if app.status == "RUNNING":
            return
        if app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"deploying application {name} failed: {app.message}")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"application {name} did not run within {timeout_s} s (status {app.status})")
        time.sleep(next(pauses))


#: ``deploy(log_format=...)``: Serve's replica logs as text lines, or one JSON object a line (with
#: the request id, application, deployment and replica of every line logged inside a request)
LOG_FORMATS = ("text", "json")


def logging_config(access_log: bool = False, log_format: str = "text") -> dict[str, Any]:
    """Serve's logging config for an app's deployments. Per-request access logs cost the ingress
    and stages a large share of their CPU here, so they are off unless asked for (/metrics carries
    request counts and latencies instead)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
    return {"enable_access_log": bool(access_log), "log_level": "INFO" if access_log else "WARNING",
            "encoding": log_format.upper()}


#: ``deploy(tracing={...})``'s keys (Ray Serve's TracingConfig, OpenTelemetry spans)
TRACING_KEYS = ("exporter_import_path", "sampling_ratio")
#: the share of requests traced when ``tracing=True`` (Serve's own default is 1%)
DEFAULT_TRACE_SAMPLE = 0.01


def tracing_config(tracing: Any) -> dict[str, Any] | None:
    """``deploy(tracing=...)`` as Serve's TracingConfig fields (None: off). ``True``: Serve's file
    exporter (spans under the Ray session's ``logs/serve/spans``), ``DEFAULT_TRACE_SAMPLE`` of
    requests; a dict sets ``exporter_import_path`` (``"module:function"`` returning OpenTelemetry
    span processors, e.g. an OTLP exporter's) and ``sampling_ratio`` in [0, 1]. ValueError naming
    the argument otherwise."""
    if tracing is None or tracing is False:
        return None
    if tracing is True:
        return {"enabled": True, "exporter_import_path": "", "sampling_ratio": DEFAULT_TRACE_SAMPLE}
    if not isinstance(tracing, dict):
        raise ValueError(f"tracing must be True, False or a dict with {list(TRACING_KEYS)}, got {tracing!r}")
    unknown = sorted(set(tracing) - set(TRACING_KEYS))
    if unknown:
        raise ValueError(f"tracing: unknown key(s) {unknown}; accepted: {list(TRACING_KEYS)}")
    ratio = tracing.get("sampling_ratio", DEFAULT_TRACE_SAMPLE)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"tracing['sampling_ratio'] must be a number in [0, 1], got {ratio!r}")
    path = tracing.get("exporter_import_path", "")
    if not isinstance(path, str) or (path and ":" not in path):
        raise ValueError(f"tracing['exporter_import_path'] must be 'module:function', got {path!r}")
    return {"enabled": True, "exporter_import_path": path, "sampling_ratio": float(ratio)}


def run_app(target, name: str, route_prefix: str | None = None, logging_config: dict | None = None,
            timeout_s: float | None = None) -> None:
    """``serve.run`` of ``target`` as ``name`` (Serve's documented ``run_many``, not waiting),
    waited for with :func:`wait_running`."""
    from ray import serve

    serve.run_many([serve.RunTarget(target, name=name, route_prefix=route_prefix, logging_config=logging_config)],
                   wait_for_applications_running=False)
    wait_running(name, timeout_s)


#: how Serve names a replica's actor: this prefix, then "<app>#<deployment>#<id>"
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"


def delete_app(name: str, timeout_s: float = 60.0) -> None:
    """Delete the Serve application ``name`` and wait until it is gone and its replicas' actors
    have ended, so that their CPUs, GPUs and custom resources are free again for what is
    deployed next (Serve drops the application from its status a moment before that); at
    most ``timeout_s``."""
    import ray
    from ray import serve

    serve.delete(name, _blocking=False)
    deadline, pauses = time.monotonic() + timeout_s, _pauses()
    prefix = f"{REPLICA_ACTOR_PREFIX}{name}#"

    def gone() -> bool:
        if name in serve.status().applications:
            return False
        return not any(a["name"].startswith(prefix) for a in ray.util.list_named_actors(all_namespaces=True))

    while not gone():
        if time.monotonic() > deadline:
            raise TimeoutError(f"application {name} was not deleted within {timeout_s} s")
        time.sleep(next(pauses))
