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
time of the read, and a replica that wants a read made at or after a time it names takes the
file instead of reading the endpoint. Reads are kept per *slot*: ``GET /metrics`` takes any read
of the last second; the dashboards' samplers take the first read made in the current period of
a grid every sampler with that period shares (:func:`period_start`), so the gaps between one
sampler's snapshots stay one period long, whatever else read the endpoint in between. A lock
per slot makes the replicas that find the file old at the same moment wait for one read (at
most ``LOCK_WAIT_S``) rather than each make one. A failed read is not kept. Where the folder
cannot be made private (owned by another user, open to others), every read goes to the
endpoint as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import math
import os
import stat
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

#: how long the list of nodes' metric endpoints is reused (seconds)
ENDPOINTS_TTL_S = 10.0
#: per-node read timeout (seconds)
SCRAPE_TIMEOUT_S = 5.0
#: the folder under the machine's temporary directory (the user id appended)
SHARE_DIR_PREFIX = "willump-node-scrapes-"
#: what a kept line of an endpoint contains
APP_FAMILY_MARK = "willump_"
#: seconds a caller waits for another's read of the same slot before it reads on its own
LOCK_WAIT_S = SCRAPE_TIMEOUT_S + 1.0
#: seconds between tries of a taken lock
LOCK_POLL_S = 0.01
#: seconds after which a kept read's files (of a Ray long stopped) are removed
PRUNE_AFTER_S = 3600.0

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


def read_app_lines(endpoint: str) -> str | None:
    """The app families' lines of a node's endpoint, read now; None where the read failed (a
    node going away, an agent restarting: its replicas' counts are missing from this read).
    The endpoint carries every Ray and Serve family; parsing all of it cost about 100 ms of
    CPU, holding the GIL, so the lines are filtered before any parser sees them."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            text = r.read().decode()
    except (OSError, http.client.HTTPException, ValueError):  # ValueError: undecodable, a bad URL
        return None
    return "".join(line + "\n" for line in text.splitlines() if APP_FAMILY_MARK in line)


def period_start(period_s: float, now: float | None = None) -> float:
    """The start of the current period of the grid every sampler with this period shares
    (epoch seconds, multiples of ``period_s``)."""
    now = time.time() if now is None else now
    return math.floor(now / period_s) * period_s


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


def read_shared(node_id: str, endpoint: str, fresh_after: float, *, slot: str, folder: Path | None = None,
                read: Callable[[str], str | None] = read_app_lines,
                clock: Callable[[], float] = time.time) -> tuple[str, float]:
    """The app families' lines of a node's endpoint and the time they were read (epoch
    seconds): the read kept in ``slot`` where it was made at or after ``fresh_after`` (and not
    in the future), else a new one, kept in turn. ``folder`` defaults to :func:`share_dir`;
    without one, or with a lock held past ``LOCK_WAIT_S``, a new read kept nowhere. A failed
    read answers no lines and is not kept."""
    folder = share_dir() if folder is None else folder
    if folder is None:
        return _fresh(endpoint, read, clock)
    key = hashlib.sha256(f"{node_id}|{endpoint}|{slot}".encode()).hexdigest()[:32]
    data, lock = folder / f"{key}.txt", folder / f"{key}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return _fresh(endpoint, read, clock)
    try:
        if not _lock(fd):
            return _fresh(endpoint, read, clock)
        kept = _load(data)
        now = clock()
        if kept is not None and fresh_after <= kept[1] <= now:
            return kept
        text, at = read(endpoint), clock()
        if text is None:
            return "", at
        if kept is None:
            _prune(folder, at)
        _store(data, text, at)
        return text, at
    finally:
        os.close(fd)  # releases the lock


def _fresh(endpoint: str, read: Callable[[str], str | None], clock: Callable[[], float]) -> tuple[str, float]:
    text = read(endpoint)
    return ("" if text is None else text), clock()


def _lock(fd: int) -> bool:
    """The slot's lock, waiting at most LOCK_WAIT_S (who finds the read old reads; the others
    wait for that read)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)


def _prune(folder: Path, now: float) -> None:
    """Remove the files of reads not renewed for PRUNE_AFTER_S (each Ray started is new node ids)."""
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime > PRUNE_AFTER_S:
                    path.unlink()


def _load(path: Path) -> tuple[str, float] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as f:
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
