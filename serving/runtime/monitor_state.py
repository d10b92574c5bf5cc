"""Where a served monitor keeps its state when the user names no directory, so that it outlives
the monitor replica: a hand-over (a re-certified artifact deployed under the running app's
name) redeploys the monitor application too, and Serve restarts a crashed replica.

Why: an in-memory monitor starts empty each time. After every hand-over its window and its
reference (minutes of traffic) were gone, so drift and explanations were blind until a new
reference filled, and labels for requests served before the hand-over came back "unknown". The
monitor (drift.Monitor, drift.LabelJoin, drift.GuaranteeLedger) already persists to a directory
and recovers from it; a served app now gets one by default, under the machine's temporary
directory, named by the app and a token that deploy() draws for a new app and hands on to the
app that replaces it (``willump build`` writes one into the Serve config, so ``serve deploy`` of
an edited config keeps it). The old replica closes the directory as it stops (Serve calls its
``__del__``); the new one waits for drift's directory lock meanwhile. Directories of other
tokens of the same app, left by earlier deploys, are removed when unlocked; ``shutdown()``
removes the app's own.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

#: the folder, under the temporary directory, holding every app's default monitor state
ROOT_NAME = "willump-monitor-state"
#: seconds a new monitor replica waits for the directory its predecessor still holds (above
#: serving.launch.graph.GRACEFUL_SHUTDOWN_S, the time the old replica may take to stop)
LOCK_WAIT_S = 30.0
#: seconds between two tries
LOCK_POLL_S = 0.25
#: what a token may hold (it names a folder)
TOKEN = re.compile(r"^[0-9a-f]{8,64}$")

T = TypeVar("T")


def root() -> Path:
    """This user's folder of default monitor states on this machine."""
    return Path(tempfile.gettempdir()) / f"{ROOT_NAME}-{os.getuid()}"


def default_directory(app: str, token: str) -> Path:
    """The default state directory of ``app``'s monitor for ``token``."""
    if not TOKEN.match(token):
        raise ValueError(f"monitor state token must be 8-64 lowercase hex digits, got {token!r}")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", app) or "_"
    return root() / safe / token


def clear_others(directory: Path) -> list[Path]:
    """Remove the sibling directories of ``directory`` (other tokens of the same app) that no
    monitor holds; returns those removed."""
    from drift._store import LOCK_NAME

    removed = []
    parent = directory.parent
    if not parent.is_dir():
        return removed
    for other in parent.iterdir():
        if other == directory or not other.is_dir():
            continue
        if _locked(other / LOCK_NAME):
            continue
        shutil.rmtree(other, ignore_errors=True)
        removed.append(other)
    return removed


def _locked(lock: Path) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        return True
    if not lock.exists():
        return False
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


def open_when_free(make: Callable[[], T], wait_s: float = LOCK_WAIT_S, poll_s: float = LOCK_POLL_S) -> T:
    """``make()`` (which opens a monitor directory), tried again while another process still
    holds the directory (drift's StateError "in use"), for at most ``wait_s``."""
    from drift import StateError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return make()
        except StateError as exc:
            if "in use" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(poll_s)


def discard(directory: Path) -> None:
    """Remove a default state directory (never a user's: only below :func:`root`)."""
    directory = Path(directory)
    if root() in directory.parents:
        shutil.rmtree(directory, ignore_errors=True)
