"""A Ray started here for a single-machine app, with its control plane closed to the network.

Ray's control plane is code execution: its job API runs what it is sent, its gRPC servers
(GCS, raylet, each worker, each Serve replica's inter-deployment server) unpickle what they
receive. A Ray that ``ray.init`` starts binds most of them to the machine's network address,
and some (the dashboard agent, every Serve replica) to all interfaces, even when the app's own
HTTP port is on loopback. A single-machine app needs none of them beyond this machine, so a
Ray started here:

- runs in Ray's own single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, how Ray runs
  on macOS and Windows): every Ray process advertises and binds 127.0.0.1;
- binds each Serve replica's inter-deployment gRPC server, which Ray 2.60 binds to ``[::]``
  unconditionally, to loopback too (:func:`loopback_grpc_hook`, a worker setup hook);
- has Ray's token authentication on (``RAY_AUTH_MODE=token``), with the token in a file only
  its owner can read (Ray writes ``~/.ray/auth_token`` world-readable);
- runs its workers, so the Serve replicas, at :data:`WORKER_NICENESS` rather than Ray's 15.

:func:`exposed_listeners` checks the result: the TCP ports this Ray's processes listen on
beyond loopback. A multi-machine cluster is one the user starts (``ray start``); which of its
ports must stay private is in deploy/README.md.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import sys
import warnings
from pathlib import Path
from typing import Any

from serving.core.constants import LOOPBACK_HOSTS
from serving.core.procstat import Listener, descendants, listening_sockets

logger = logging.getLogger(__name__)

#: Ray's switch for its single-machine mode: node address 127.0.0.1, servers bound to it
SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: Ray's authentication switch (read from the environment only) and the mode set here
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_MODE = "token"
#: random bits of a token generated here (Ray's own generator uses the same)
TOKEN_BYTES = 32
#: the setup hook every worker of a Ray started here runs before it builds anything
SETUP_HOOK = "serving.core.local_ray.loopback_grpc_hook"
#: the addresses meaning "every interface" that the hook rewrites to loopback
_ALL_INTERFACES = ("[::]", "0.0.0.0", "[::0]")
#: niceness of the Ray workers deploy's apps run in, so of every Serve replica, relative to their
#: raylet's (Ray adds it when a worker starts). Ray's own default (15) keeps batch jobs from
#: starving its control plane, and puts every replica below the raylet, the GCS, the metrics
#: agent and any other program at 0: a replica ready to answer waited for the
#: CPU while one of them ran (single rows at half of peak, the toxic app: up to 130 ms of run-queue
#: wait in one pause; single-row p99 medians 19.0 ms at 15, 13.8 at 0, docs/benchmarks.md). Serving
#: replicas are the request path, with their own admission bound, so they share the CPU as equals.
WORKER_NICENESS = 0
#: Ray's setting (an environment variable of its processes); a value already in this process's
#: environment is kept
WORKER_NICENESS_ENV = "RAY_worker_niceness"
#: where Ray's job submission hands its driver the job's config (runtime_env included), as JSON
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def token_path() -> Path:
    """Where Ray reads its token from: ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def ensure_private_token() -> Path | None:
    """A token Ray will use, readable by its owner only: generated here (``TOKEN_BYTES`` random
    bytes, file 0600 in a 0700 folder) when there is none, tightened when it is readable by
    others. None when the token comes from ``$RAY_AUTH_TOKEN`` (nothing on disk)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = token_path()
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(TOKEN_BYTES))
        logger.info("generated Ray's authentication token in %s (mode 0600)", path)
        return path
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, 0o600)
        logger.warning("Ray's authentication token %s was readable by other users: now 0600", path)
    return path


def close_control_plane() -> None:
    """Set this process's environment so that the next Ray it starts is bound to loopback with
    token authentication on. An explicit ``RAY_AUTH_MODE`` other than ``token`` is kept, with
    a warning (any local user can then run code in the app's Ray)."""
    os.environ.update(SINGLE_MACHINE_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray read the environment when it was imported
        constants.ENABLE_RAY_CLUSTER = False
    mode = os.environ.setdefault(AUTH_MODE_ENV, AUTH_MODE)
    if mode.lower() != AUTH_MODE:
        warnings.warn(f"{AUTH_MODE_ENV}={mode}: Ray's control plane answers any process on this "
                      "machine without a token (unset it to keep token authentication on)", stacklevel=3)
    else:
        ensure_private_token()


def worker_niceness() -> int:
    """The niceness of the Ray workers deploy's apps run in: the environment's
    ``RAY_worker_niceness`` where set, else :data:`WORKER_NICENESS`."""
    value = os.environ.get(WORKER_NICENESS_ENV)
    try:
        return WORKER_NICENESS if value is None else int(value)
    except ValueError:
        raise ValueError(f"{WORKER_NICENESS_ENV} must be an integer, got {value!r}") from None


def ray_system_config() -> dict[str, Any]:
    """``ray.init(_system_config=...)`` of a Ray started for deploy's apps (every node of a
    cluster takes it from the head): workers at :func:`worker_niceness`."""
    return {"worker_niceness": worker_niceness()}


def worker_env() -> dict[str, str]:
    """A job's ``runtime_env`` ``env_vars`` that set :func:`worker_niceness` on its own workers in
    a cluster started elsewhere (Ray reads its settings from the worker's environment, where the
    cluster's system config does not set them). Empty where a submitted Ray job's own runtime_env
    already sets it: its value stands, and Ray refuses a ``ray.init`` naming the same variable."""
    if WORKER_NICENESS_ENV in _submitted_job_env_vars():
        return {}
    return {WORKER_NICENESS_ENV: str(worker_niceness())}


def _submitted_job_env_vars() -> dict[str, Any]:
    """The ``env_vars`` of the runtime_env Ray's job submission gave this driver (none outside one)."""
    raw = os.environ.get(JOB_CONFIG_ENV)
    try:
        env_vars = ((json.loads(raw) if raw else {}).get("runtime_env") or {}).get("env_vars")
    except (ValueError, AttributeError):
        return {}
    return dict(env_vars) if isinstance(env_vars, dict) else {}


def start_local_ray(**init_kwargs: Any) -> None:
    """``ray.init`` a new Ray on this machine (not one another process started) with its control
    plane closed; ``init_kwargs`` go to ``ray.init`` (their ``runtime_env`` gets the hook)."""
    import ray

    close_control_plane()
    if os.environ[AUTH_MODE_ENV].lower() == AUTH_MODE:
        try:  # Ray caches its settings at import: make this process see token mode too
            from ray._private.authentication.authentication_token_setup import _enable_token_auth
        except ImportError:  # a Ray without token authentication: loopback is all there is
            warnings.warn("this Ray has no token authentication: its control plane is open to any "
                          "process on this machine", stacklevel=2)
        else:
            _enable_token_auth()
    runtime_env = dict(init_kwargs.pop("runtime_env", None) or {})
    runtime_env.setdefault("worker_process_setup_hook", SETUP_HOOK)
    system_config = {**ray_system_config(), **init_kwargs.pop("_system_config", {})}
    ray.init(address="local", runtime_env=runtime_env, _system_config=system_config, **init_kwargs)


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in _ALL_INTERFACES else address


def loopback_grpc_hook() -> None:
    """Worker setup hook: gRPC servers Ray binds to every interface bind to 127.0.0.1 instead.
    Ray 2.60's Serve replica binds its inter-deployment server to ``[::]:0`` with no setting
    to change it; in single-machine mode every peer dials 127.0.0.1, so loopback serves all
    of them. Ray versions without that code path are left as they are (the listener check
    reports what stays open)."""
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        return  # a worker of a cluster: its peers dial the node's address
    from ray._common import tls_utils

    original = getattr(tls_utils, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "_loopback", False):
        return

    def add_port_to_grpc_server(server: Any, address: str) -> int:
        return original(server, _loopback(address))

    add_port_to_grpc_server._loopback = True  # type: ignore[attr-defined]
    tls_utils.add_port_to_grpc_server = add_port_to_grpc_server
    replica = sys.modules.get("ray.serve._private.replica")
    if replica is not None:  # imported before the hook ran: it holds its own reference
        replica.add_port_to_grpc_server = add_port_to_grpc_server


def exposed_listeners(root: int | None = None) -> list[Listener]:
    """TCP ports that ``root`` (default: this process) and every process below it (a Ray
    started here: GCS, raylet, agents, workers, HAProxy) listen on beyond loopback."""
    pids = descendants({os.getpid() if root is None else root})
    return [listener for listener in listening_sockets(pids) if not listener.loopback]


def unexpected_listeners(http_host: str, http_port: int, root: int | None = None) -> list[Listener]:
    """:func:`exposed_listeners` less the app's own HTTP, which ``http_host`` may put beyond
    loopback on purpose: its front's port and, in HAProxy mode, the ingress replicas' HTTP
    servers (Serve binds them to the same host)."""
    # Ray Serve's range for the ingress replicas' HTTP servers (its settings, its defaults)
    lo = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", 30000))
    hi = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", 31000))
    public = http_host not in LOOPBACK_HOSTS
    return [x for x in exposed_listeners(root) if x.port != http_port and not (public and lo <= x.port <= hi)]


def exposure_note(http_host: str, http_port: int, root: int | None = None) -> str | None:
    """A warning naming what a Ray started here listens on beyond loopback (besides the app's
    HTTP), or None when nothing does."""
    found = unexpected_listeners(http_host, http_port, root)
    if not found:
        return None
    where = ", ".join(f"{x.address}:{x.port} ({x.title.split()[0]})" for x in found[:6])
    more = f" and {len(found) - 6} more" if len(found) > 6 else ""
    return (f"Ray's processes listen beyond loopback on {where}{more}: firewall them "
            "(deploy/README.md, 'Threat model')")
