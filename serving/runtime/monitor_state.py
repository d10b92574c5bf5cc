"""Where a served monitor keeps its state when the user names no directory, so that it outlives
the monitor replica: a hand-over (a re-certified artifact deployed under the running app's
name) redeploys the monitor application too, and Serve restarts a crashed replica.

Why: an in-memory monitor starts empty each time. After every hand-over its window and its
reference (minutes of traffic) were gone, so drift and explanations were blind until a new
reference filled, and labels for requests served before the hand-over came back "unknown". The
monitor (drift.Monitor, drift.LabelJoin, drift.GuaranteeLedger) already persists to a directory
and recovers from it; a served app now gets one by default, in a private folder (0700, owned by
this user, not a link) under the machine's temporary directory, named by a hash of the app's
name and a token that deploy() draws for a new app and hands on to the app that replaces it
(``willump build`` writes one into the Serve config, so ``serve deploy`` of an edited config
keeps it). ``monitor=dict(directory=False)`` keeps the state in memory instead. The old replica
closes the directory as it stops (Serve calls its ``__del__``); the new one waits for drift's
directory lock meanwhile. State stored under another monitor configuration (the attributes or
features changed) is set aside and the monitor starts afresh. Unlocked folders of other tokens
of the app, and any unlocked folder untouched for ``STALE_AFTER_S``, are removed; ``shutdown()``
removes the app's own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
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
#: an unlocked state folder untouched this long (seconds) belongs to no running app: removed
STALE_AFTER_S = 7 * 24 * 3600.0
#: what a token may hold (it names a folder)
TOKEN = re.compile(r"^[0-9a-f]{8,64}$")

log = logging.getLogger("ray.serve")
T = TypeVar("T")


class UnsafeRoot(RuntimeError):
    """The root folder is not this user's private folder: the state is kept in memory."""


def root() -> Path:
    """This user's folder of default monitor states on this machine."""
    return Path(tempfile.gettempdir()) / f"{ROOT_NAME}-{os.getuid()}"


def private_root() -> Path:
    """:func:`root`, created 0700 if missing, checked to be a directory (not a link) of this
    user that nobody else may write (then made 0700); UnsafeRoot otherwise."""
    path = root()
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UnsafeRoot(f"{path} is not a directory of this user that only it may write (mode "
                         f"{oct(info.st_mode)}, owner {info.st_uid}): the monitor keeps its state in memory")
    if info.st_mode & 0o077:  # this user's, nobody else could write in it: made private
        os.chmod(path, 0o700)
    return path


def app_folder(app: str) -> str:
    """The folder name of ``app``'s states: a hash of the name (any name, none that escapes)."""
    return hashlib.sha256(app.encode()).hexdigest()[:24]


def default_directory(app: str, token: str) -> Path:
    """The default state directory of ``app``'s monitor for ``token`` (nothing created)."""
    if not TOKEN.match(token):
        raise ValueError(f"monitor state token must be 8-64 lowercase hex digits, got {token!r}")
    return root() / app_folder(app) / token


def _inside_root(path: Path) -> bool:
    return root().resolve() in Path(path).resolve().parents


def clear_others(directory: Path, now: float | None = None) -> list[Path]:
    """Remove the folders no monitor holds: the app's other tokens, and any app's token folder
    untouched for ``STALE_AFTER_S``; returns those removed."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    base = root()
    if not base.is_dir():
        return removed
    for app_dir in base.iterdir():
        if not app_dir.is_dir() or app_dir.is_symlink():
            continue
        for other in app_dir.iterdir():
            if other == directory or not TOKEN.match(other.name) or not other.is_dir() or other.is_symlink():
                continue
            same_app = app_dir == directory.parent
            if not same_app and now - other.stat().st_mtime < STALE_AFTER_S:
                continue
            if _locked(other) or not _inside_root(other):
                continue
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def _locked(directory: Path) -> bool:
    from drift._store import LOCK_NAME

    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        return True
    lock = directory / LOCK_NAME
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


def open_default(make: Callable[[str | None], T], directory: Path) -> T:
    """``make(directory)`` on a default state directory: waiting while the replica it replaces
    still holds it; state of another monitor configuration set aside (removed, logged); in
    memory (``make(None)``, logged) where the root is not private."""
    from drift import StateError

    try:
        private_root()
    except (UnsafeRoot, OSError) as exc:
        log.warning("monitor state: %s", exc)
        return make(None)
    try:
        return open_when_free(lambda: make(str(directory)))
    except StateError as exc:
        if "another configuration" not in str(exc):
            raise
        log.warning("monitor state: %s; the stored state is set aside, the monitor starts afresh", exc)
        discard(directory)
        return open_when_free(lambda: make(str(directory)))


def discard(directory: Path) -> None:
    """Remove a default state directory (never a user's: only inside :func:`root`)."""
    directory = Path(directory)
    if _inside_root(directory) and not directory.is_symlink():
        shutil.rmtree(directory, ignore_errors=True)
