"""Settings an operator changes on a running app in place: the ingress's Serve ``user_config``.

Why: Ray Serve calls a replica's ``reconfigure(user_config)`` when a deployment's ``user_config``
is the only thing that changed in the config it was deployed from (``serve deploy``; Serve's
lightweight update), so the replicas keep running: no restart, no lost request, no new
profiling. ``willump build`` writes these settings, at their deployed values, under the ingress
deployment's ``user_config`` in the config's ``deployments:`` section; an operator edits them
there. What the plan fixed (stages, replicas' code, the artifact, the certificate) changes by a
new deployment, never here. A setting missing from a ``user_config`` has its deployed value;
an unknown key or a bad value is refused with a message naming it (:func:`reconfigure`).

The settings, with what each changes at once:

- ``deadline_ms``: the default deadline of a request that sends none (> 0);
- ``degrade``: answer from an earlier level when a later stage is late;
- ``max_in_flight``: the ingress's admission bound (requests beyond it get 503);
- ``gear``: ``"auto"`` (the deployed gear mode) or a gear number to serve every request with;
- ``hedging``: copy slow stage calls to another replica;
- ``lost_after_s``: the bound on a call held by a silent replica (> 0, or null: none);
- ``audit_rate``: the live audit's share of cheap-level rows ([0, 1]; an app deployed without
  the audit cannot start one here: its monitor and ledger are set up at deploy);
- ``on_alarm``: ``"alert"`` or ``"step"`` (hold an alarmed gear; needs the audit, and an app
  deployed with ``"step"``, whose monitor's ledger decides the holds: such an app can be set to
  ``"alert"`` and back).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

from serving.core.jsonsafe import clean
from serving.runtime.audit import check_audit_rate
from serving.runtime.calls import MAX_DEADLINE_S
from serving.runtime.hold import ON_ALARM

log = logging.getLogger("ray.serve")

#: every key a ``user_config`` may hold
LIVE_SETTINGS = ("deadline_ms", "degrade", "max_in_flight", "gear", "hedging", "lost_after_s", "audit_rate",
                 "on_alarm")


def _number(key: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    extra = " or null" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"user_config {key}: a finite number > 0{extra}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        raise ValueError(f"user_config {key}: a finite number > 0{extra}, got an integer of {len(str(value))} digits") from None
    if not (math.isfinite(number) and number > 0):  # inf passed, and then /plan could not encode it
        raise ValueError(f"user_config {key}: a finite number > 0{extra}, got {value!r}")
    return number


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"user_config {key}: true or false, got {value!r}")
    return value


def check_live_settings(user_config: Any, gears: int, audited: bool,
                        max_in_flight_cap: int | None = None, deployed_on_alarm: str | None = None) -> dict[str, Any]:
    """The settings of a ``user_config``, checked (ValueError naming the key): ``gears`` is the
    number of gears the app serves, ``audited`` whether it was deployed with the live audit,
    ``max_in_flight_cap`` the most requests Serve lets into a replica (its deployed
    ``max_ongoing_requests``): beyond it Serve queues them, and the admission bound's 503 never
    answers."""
    if user_config is None:
        return {}
    if not isinstance(user_config, Mapping):
        raise ValueError(f"user_config must be a mapping of {list(LIVE_SETTINGS)}, got {type(user_config).__name__}")
    unknown = sorted(set(user_config) - set(LIVE_SETTINGS))
    if unknown:
        raise ValueError(f"user_config: unknown setting(s) {unknown}; the ones that change in place are "
                         f"{list(LIVE_SETTINGS)} (anything else needs a new deployment)")
    out: dict[str, Any] = {}
    for key, value in user_config.items():
        if key == "deadline_ms":
            out[key] = _number(key, value)
            if out[key] > 1000.0 * MAX_DEADLINE_S:  # as the X-Deadline-Ms header is bounded
                raise ValueError(f"user_config deadline_ms: at most {1000.0 * MAX_DEADLINE_S:g}, got {value!r}")
        elif key in ("degrade", "hedging"):
            out[key] = _flag(key, value)
        elif key == "max_in_flight":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"user_config max_in_flight: an integer >= 1, got {value!r}")
            if max_in_flight_cap is not None and value > max_in_flight_cap:
                raise ValueError(f"user_config max_in_flight: at most {max_in_flight_cap} (the deployment's "
                                 f"max_ongoing_requests, set when it was deployed), got {value}")
            out[key] = value
        elif key == "gear":
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                    or not 0 <= value < gears):
                raise ValueError(f"user_config gear: 'auto' or a gear from 0 to {gears - 1}, got {value!r}")
            out[key] = value
        elif key == "lost_after_s":
            out[key] = _number(key, value, allow_none=True)
        elif key == "audit_rate":
            try:
                rate = check_audit_rate(value)
            except ValueError as exc:
                raise ValueError(f"user_config {exc}") from None
            if rate and not audited:
                raise ValueError("user_config audit_rate: this app was deployed without the live audit (its "
                                 "monitor ledger is set up at deploy); deploy with audit_rate > 0 to change it here")
            out[key] = rate
        elif key == "on_alarm":
            if value not in ON_ALARM:
                raise ValueError(f"user_config on_alarm: one of {list(ON_ALARM)}, got {value!r}")
            if value == "step" and not audited:
                raise ValueError("user_config on_alarm='step' acts on the live audit's alarm; this app was "
                                 "deployed without the audit")
            if value == "step" and deployed_on_alarm not in (None, "step"):
                # the monitor's ledger decides holds only where the app was deployed to step: here
                # 'step' would be shown in /plan and never act
                raise ValueError("user_config on_alarm='step': this app was deployed with on_alarm="
                                 f"{deployed_on_alarm!r} (its monitor's ledger holds no gear); deploy with "
                                 "on_alarm='step' to act on the alarm")
            out[key] = value
    return out


def current_settings(ingress: Any) -> dict[str, Any]:
    """The settings the ingress serves with now (what ``/plan`` shows as ``live_settings``)."""
    hedges = list(ingress.hedges.values())
    audit = ingress.audit
    gears = ingress.gears
    return {
        "deadline_ms": 1000.0 * ingress.deadline_s,
        "degrade": bool(ingress.degrade),
        "max_in_flight": int(ingress.max_in_flight),
        "gear": gears.mode if isinstance(gears.mode, int) else "auto",
        # an app whose stages all run in the ingress has no stage calls to copy: what was set
        # is shown (and applies to no call)
        "hedging": any(h.enabled for h in hedges) if hedges else bool(
            ingress.live_values.get("hedging", ingress.config.hedging)),
        "lost_after_s": hedges[0].lost_after_s if hedges else ingress.live_values.get(
            "lost_after_s", ingress.config.lost_after_s),
        "audit_rate": 0.0 if audit is None else audit.rate,
        "on_alarm": (ingress.config.audit or {}).get("on_alarm", "alert"),
    }


def apply_live_settings(ingress: Any, user_config: Any) -> dict[str, Any]:
    """Check a ``user_config`` and apply it to the running ingress; returns what it applied.

    A setting the ``user_config`` leaves out goes back to its deployed value
    (``ingress.deployed_settings``, taken before the first one), so every replica, running or
    started later, serves with the same settings for the same ``user_config``."""
    audited = ingress.audit is not None
    if isinstance(user_config, Mapping) and ingress.deployed_settings is not None:
        user_config = {**ingress.deployed_settings, **user_config}
    settings = check_live_settings(user_config, len(ingress.gears.ladder), audited, ingress.max_in_flight_cap,
                                   (ingress.deployed_settings or {}).get("on_alarm"))
    ingress.live_values = {**ingress.live_values, **settings}
    for key, value in settings.items():
        if key == "deadline_ms":
            ingress.deadline_s = value / 1000.0
        elif key == "degrade":
            ingress.degrade = value
        elif key == "max_in_flight":
            ingress.max_in_flight = value
            for coalescer in ingress.coalescers.values():
                coalescer.max_queued = value
        elif key == "gear":
            ingress.gears.pin(None if value == "auto" else value)
        elif key == "hedging":
            for hedge in ingress.hedges.values():
                hedge.enabled = value
        elif key == "lost_after_s":
            for hedge in ingress.hedges.values():
                hedge.lost_after_s = value
        elif key == "audit_rate" and audited:
            ingress.audit.rate = value
        elif key == "on_alarm" and audited:
            ingress.config.audit["on_alarm"] = value  # read by the audit's answer handler
            if value == "alert":
                ingress.gears.hold(())  # nothing acts on the alarm any more: release what it held
    return settings


def reconfigure(ingress: Any, user_config: Any) -> dict[str, Any] | None:
    """The ingress's ``reconfigure``: apply a ``user_config``; returns what it applied, None
    when refused.

    A replica refuses a bad ``user_config``, serves with the settings it has (a starting one:
    those it was deployed with), and says so: the log, the ``willump_settings_rejected``
    counter, and ``live_settings_rejected`` in ``/plan`` (cleared by the next good one).
    Raising would make Serve stop the replica and retry: one bad edit took one of an app's two
    ingress replicas down until the next good deploy; and since Serve keeps a refused edit as
    the deployment's config, a starting replica that raised on it (before: to fail the deploy
    naming the key) failed every scale-up and every replacement of a lost replica, for good,
    while the running ones served."""
    if ingress.deployed_settings is None:
        ingress.deployed_settings = current_settings(ingress)
    try:
        applied = apply_live_settings(ingress, user_config)
    except ValueError as exc:
        # as /plan can encode it (a refused NaN or inf): before, one such edit made /plan answer 500
        ingress.settings_rejected = {"user_config": clean(user_config), "error": str(exc)}
        ingress.metrics.count("willump_settings_rejected")
        log.error("%s: in-place settings refused, the running ones kept: %s", ingress.name, exc)
        return None
    ingress.settings_applied, ingress.settings_rejected = True, None
    log.info("%s: in-place settings applied: %s", ingress.name, applied)
    return applied
