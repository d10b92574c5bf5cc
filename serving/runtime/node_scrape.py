"""Reading Ray's per-node metrics endpoints, one read shared by every replica on the machine.

Each ingress replica's dashboard sampler (and ``GET /metrics``) reads every node's endpoint,
which makes that node's metrics agent render the whole of it: about 650 KB of Ray's and Serve's
families for one app, about 40 ms of the agent's CPU a read on the project machine, in one
burst (docs/benchmarks.md). Every ingress replica of every app on a machine samples, so with
five apps of two ingress replicas the agent rendered its endpoint every 3 s while nobody
watched, and each burst took a core from the request path.

The endpoint changes only when the node's processes report to the agent (every
``RAY_metrics_report_interval_ms``), and every replica keeps the same lines of it (the
``willump_`` families). So one read serves all: the lines kept from a node's read are written to
a file in a private folder of this machine (:func:`share_dir`, 0700, the user's own), with the
time of the read, and a replica that wants them no older than it asks for takes the file
instead of reading the endpoint. A lock per endpoint makes the replicas that find the file old
at the same moment wait for one read rather than each make one. Where the folder cannot be made
private (owned by another user, open to others), every read goes to the endpoint as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import time
import urllib.request
from pathlib import Path

#: how long the list of nodes' metric endpoints is reused (seconds)
ENDPOINTS_TTL_S = 10.0
#: per-node read timeout (seconds)
SCRAPE_TIMEOUT_S = 5.0
#: the folder under the machine's temporary directory (the user id appended)
SHARE_DIR_PREFIX = "willump-node-scrapes-"
#: what a kept line of an endpoint contains
APP_FAMILY_MARK = "willump_"

_nodes: tuple[float, list[tuple[str, str]]] = (0.0, [])


def metric_nodes() -> list[tuple[str, str]]:
    """``(node id, host:port)`` of every alive node's Ray metrics export endpoint. The node id
    keys the shared reads: a Ray started again may reuse a port, never a node id."""
    global _nodes
    stamp, cached = _nodes
    if cached and time.monotonic() - stamp < ENDPOINTS_TTL_S:
        return cached
    import ray

    found = [(n["NodeID"], f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}") for n in ray.nodes()
             if n.get("Alive") and n.get("MetricsExportPort")]
    _nodes = (time.monotonic(), found)
    return found


def metric_endpoints() -> list[str]:
    """``host:port`` of every alive node's Ray metrics export endpoint."""
    return [endpoint for _, endpoint in metric_nodes()]


def read_app_lines(endpoint: str) -> str:
    """The app families' lines of a node's endpoint, read now. The endpoint carries every Ray
    and Serve family; parsing all of it cost about 100 ms of CPU, holding the GIL, so the lines
    are filtered before any parser sees them. A node going away reads as no lines (its
    replicas' counts go with it)."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            text = r.read().decode()
    except OSError:
        return ""
    return "".join(line + "\n" for line in text.splitlines() if APP_FAMILY_MARK in line)


def share_dir() -> Path | None:
    """This user's private folder for shared reads, made if missing; None where it is not
    private (another owner, a link, open to group or others) or cannot be made."""
    path = Path(tempfile.gettempdir()) / f"{SHARE_DIR_PREFIX}{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def read_shared(node_id: str, endpoint: str, max_age_s: float, *, folder: Path | None = None,
                read=read_app_lines, clock=time.time) -> tuple[str, float]:
    """The app families' lines of a node's endpoint and the time they were read (epoch
    seconds): a read no older than ``max_age_s`` that a replica on this machine made, else a
    new one, shared in turn. ``folder`` defaults to :func:`share_dir`; without one, a new read."""
    folder = share_dir() if folder is None else folder
    if folder is None or not max_age_s > 0:
        return read(endpoint), clock()
    key = hashlib.sha256(f"{node_id}|{endpoint}".encode()).hexdigest()[:32]
    data, lock = folder / f"{key}.txt", folder / f"{key}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return read(endpoint), clock()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # who finds it old reads; the others wait for that read
        kept = _load(data)
        if kept is not None and 0.0 <= clock() - kept[1] <= max_age_s:
            return kept
        text, at = read(endpoint), clock()
        _store(data, text, at)
        return text, at
    finally:
        os.close(fd)  # releases the lock


def _load(path: Path) -> tuple[str, float] | None:
    try:
        with open(path, encoding="utf-8") as f:
            head, _, text = f.read().partition("\n")
        return text, float(head)
    except (OSError, ValueError):
        return None


def _store(path: Path, text: str, at: float) -> None:
    """Written whole or not at all (a reader sees the previous read or this one)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{at!r}\n{text}")
        os.replace(tmp, path)
    except OSError:  # a full disk: the next replica reads the endpoint itself
        with contextlib.suppress(OSError):
            tmp.unlink()
