"""A plan refined after an app started, handed to its running ingress replicas without a restart.

Why: deploy()'s in-situ probe (serving.launch.insitu) measures the running app and plans
again. Most often the replicas come out the same and only the plan's figures change (its
predictions, the measured CPU factors). Restarting every replica to hand them those figures
costs a full start of the app (on the project machine 10-30 s, and each replica's start CPU);
instead deploy publishes the refined plan in Ray's GCS key-value store under the app's name,
bound to that deploy's probe token (its hash, which the app's ingress replicas were started
with), and each of those replicas adopts it within a second (a watcher thread), or before it
answers a route that shows the plan (/plan, /metrics, the dashboard), whichever comes first; the
probe being over, the replica then also stops honouring the probe's token. A later deploy of
the same name has another token, so a stale entry is never adopted; shutdown withdraws it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

#: the GCS key-value namespace of the entries
NAMESPACE = "willump"
#: seconds after its start an ingress replica keeps looking for its refined plan (the probe runs
#: once, within a minute of the app answering; a probe that failed publishes nothing; a replica
#: started later, say in place of a failed one, finds the plan at its first look)
WATCH_S = 600.0
#: seconds between two looks of a replica's watcher thread
POLL_S = 1.0

log = logging.getLogger("ray.serve")


def _key(app: str) -> bytes:
    return f"plan/{app}".encode()


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def publish_plan(app: str, probe_sha256: str, plan: dict[str, Any]) -> None:
    """Publish ``plan`` for the ingress replicas of ``app`` started with ``probe_sha256``."""
    if not probe_sha256:
        raise ValueError("probe_sha256 names the deploy whose replicas adopt the plan; got none")
    _kv()._internal_kv_put(_key(app), json.dumps({"probe_sha256": probe_sha256, "plan": plan}).encode(),
                           overwrite=True, namespace=NAMESPACE)


def withdraw_plan(app: str) -> None:
    """Remove ``app``'s entry (none is fine)."""
    kv = _kv()
    if kv._internal_kv_initialized():
        kv._internal_kv_del(_key(app), namespace=NAMESPACE)


def published_plan(app: str, probe_sha256: str | None) -> dict[str, Any] | None:
    """The plan published for the replicas of ``app`` started with ``probe_sha256``, or None."""
    if not probe_sha256:
        return None
    raw = _kv()._internal_kv_get(_key(app), namespace=NAMESPACE)
    if raw is None:
        return None
    entry = json.loads(raw)
    return entry["plan"] if entry.get("probe_sha256") == probe_sha256 else None


class PlanAdoption:
    """An ingress replica's side: look for the refined plan of its own deploy until it is found
    or ``watch_s`` after the replica started, then never again. A thread looks every ``poll_s``
    (:meth:`start`), and a route that shows the plan looks once more before it answers
    (:meth:`check`), so an answer given right after deploy returned already shows it. One look
    at a time; a failed read is logged and tried again later. ``adopt`` receives the plan
    (from a thread: it must only swap references)."""

    def __init__(self, app: str, probe_sha256: str | None, adopt: Callable[[dict[str, Any]], None], *,
                 watch_s: float = WATCH_S, poll_s: float = POLL_S):
        self.app, self.probe_sha256, self.adopt, self.poll_s = app, probe_sha256, adopt, float(poll_s)
        self.until = time.monotonic() + watch_s if probe_sha256 else 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> bool:
        return self.until > 0.0 and time.monotonic() < self.until

    def start(self) -> None:
        if self.pending and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="willump-plan-adoption", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while self.pending and not self._stop.is_set():
            self.check()
            self._stop.wait(self.poll_s)

    def check(self) -> bool:
        """Adopt the plan if it is published; whether it was (now)."""
        if not self.pending or not self._lock.acquire(blocking=False):
            return False
        try:
            try:
                plan = published_plan(self.app, self.probe_sha256)
            except Exception as exc:  # the GCS answers again later; the plan in force stays
                log.warning("the refined plan of %s could not be read (%s); looking again", self.app, exc)
                return False
            if plan is None or not self.pending:
                return False
            self.until = 0.0
            self.adopt(plan)
            return True
        finally:
            self._lock.release()
