"""A plan refined after an app started, handed to its running ingress replicas without a restart.

Why: deploy()'s in-situ probe (serving.launch.insitu) measures the running app and plans
again. Most often the replicas come out the same and only the plan's figures change (its
predictions, the measured CPU factors). Restarting every replica to hand them those figures
costs a full start of the app (on the project machine 10-30 s, and each replica's start CPU);
instead deploy publishes the refined plan in Ray's GCS key-value store under the app's name,
bound to that deploy's probe token (its hash, which the app's ingress replicas were started
with), and each of those replicas adopts it the next time it answers a route that shows the
plan (/plan, /metrics, the dashboard). A later deploy of the same name has another token, so a
stale entry is never adopted; shutdown withdraws it.
"""

from __future__ import annotations

import json
import time
from typing import Any

#: the GCS key-value namespace of the entries
NAMESPACE = "willump"
#: seconds after its start an ingress replica keeps looking for its refined plan (the probe runs
#: once, within a minute of the app answering; a probe that failed publishes nothing)
WATCH_S = 600.0


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
    """An ingress replica's side: look for the refined plan (one key-value read each time a
    route that shows the plan is answered) until it is found or ``WATCH_S`` passed, then never
    again. ``adopt`` receives the plan."""

    def __init__(self, app: str, probe_sha256: str | None, adopt, *, watch_s: float = WATCH_S):
        self.app, self.probe_sha256, self.adopt = app, probe_sha256, adopt
        self.until = time.monotonic() + watch_s if probe_sha256 else 0.0

    @property
    def pending(self) -> bool:
        return self.until > 0.0 and time.monotonic() < self.until

    def check(self) -> bool:
        """Adopt the plan if it is published; whether it was (now)."""
        if not self.pending:
            return False
        plan = published_plan(self.app, self.probe_sha256)
        if plan is None:
            return False
        self.until = 0.0
        self.adopt(plan)
        return True
