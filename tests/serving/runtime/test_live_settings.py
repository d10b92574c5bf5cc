"""The ingress's in-place settings (Serve's user_config -> Ingress.reconfigure), without Ray:
each setting reaches what it steers, the deployed values come back on "auto", and a bad
user_config fails with a message naming the key while nothing is half applied."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from serving.runtime.calls import StageHedge
from serving.runtime.gears import GearSwitch
from serving.runtime.live_settings import (
    LIVE_SETTINGS,
    apply_live_settings,
    check_live_settings,
    current_settings,
    reconfigure,
)

LADDER = [{"gear": g, "max_loss": 0.01 * g or None, "loss_bound": None, "method": "", "cert_rows": None,
           "cert_disagreed": None} for g in range(3)]


def _ingress(audited: bool = True, adaptive: bool = True, stages: tuple = ("expensive",)) -> SimpleNamespace:
    policy = {"slo_ms": 100.0} if adaptive else {}
    gears = GearSwitch({"mode": "adaptive" if adaptive else 0, "ladder": LADDER, "policy": policy})
    hedges = {s: StageHedge(lambda: 2, enabled=False, lost_after_s=2.0) for s in stages}
    audit = SimpleNamespace(rate=0.01) if audited else None
    counted: list[str] = []
    return SimpleNamespace(
        name="app", settings_applied=False, settings_rejected=None, deployed_settings=None, counted=counted,
        max_in_flight_cap=None, live_values={},
        metrics=SimpleNamespace(count=lambda metric, *a, **k: counted.append(metric)),
        deadline_s=1.0, degrade=False, max_in_flight=64, coalescers={"expensive": SimpleNamespace(max_queued=64)},
        gears=gears, hedges=hedges, audit=audit,
        config=SimpleNamespace(audit={"on_alarm": "alert"} if audited else None, lost_after_s=2.0, hedging=None))


def test_every_setting_reaches_what_it_steers():
    ing = _ingress()
    ing.gears.hold([1])
    applied = apply_live_settings(ing, {"deadline_ms": 250, "degrade": True, "max_in_flight": 8, "gear": 2,
                                        "hedging": True, "lost_after_s": None, "audit_rate": 0.1,
                                        "on_alarm": "step"})
    assert set(applied) == set(LIVE_SETTINGS)
    assert ing.deadline_s == pytest.approx(0.25) and ing.degrade and ing.max_in_flight == 8
    assert ing.coalescers["expensive"].max_queued == 8
    assert ing.gears.begin()[1] == 2 and ing.gears.policy is None  # pinned: the policy steps aside
    assert ing.hedges["expensive"].enabled and ing.hedges["expensive"].lost_after_s is None
    assert ing.audit.rate == 0.1 and ing.config.audit["on_alarm"] == "step"
    assert current_settings(ing) == {"deadline_ms": 250.0, "degrade": True, "max_in_flight": 8, "gear": 2,
                                     "hedging": True, "lost_after_s": None, "audit_rate": 0.1, "on_alarm": "step"}
    # back to the deployed gear mode (the adaptive policy, with its state); alert releases holds
    apply_live_settings(ing, {"gear": "auto", "on_alarm": "alert"})
    assert ing.gears.adaptive and current_settings(ing)["gear"] == "auto" and ing.gears.held == frozenset()


def test_a_setting_left_out_goes_back_to_its_deployed_value():
    """Every replica, running or started later, serves with the same settings for the same
    user_config: a key removed from it is not kept at its last value (found in review)."""
    ing = _ingress(adaptive=False)
    deployed = current_settings(ing)
    assert deployed["gear"] == 0  # an app deployed on gear 0 shows it
    reconfigure(ing, {"deadline_ms": 500, "gear": 2, "max_in_flight": 8})
    assert current_settings(ing) == {**deployed, "deadline_ms": 500.0, "gear": 2, "max_in_flight": 8}
    reconfigure(ing, {"deadline_ms": 500})
    assert current_settings(ing) == {**deployed, "deadline_ms": 500.0}
    reconfigure(ing, {})
    assert current_settings(ing) == deployed
    assert apply_live_settings(ing, None) == {}


def test_max_in_flight_stays_under_serves_own_bound():
    """Beyond the deployment's max_ongoing_requests Serve queues requests itself, and the
    admission bound's 503 never answers: refused, naming the bound."""
    ing = _ingress()
    ing.max_in_flight_cap = 128
    assert reconfigure(ing, {"max_in_flight": 128})["max_in_flight"] == 128
    assert reconfigure(ing, {"max_in_flight": 129}) is None
    assert "at most 128" in ing.settings_rejected["error"] and current_settings(ing)["max_in_flight"] == 128


@pytest.mark.parametrize(("config", "named"), [
    ({"deadline": 5}, "unknown setting"),
    ({"deadline_ms": 0}, "deadline_ms"),
    ({"deadline_ms": True}, "deadline_ms"),
    ({"degrade": "yes"}, "degrade"),
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"max_in_flight": 2.5}, "max_in_flight"),
    ({"gear": 3}, "gear"),
    ({"gear": "fast"}, "gear"),
    ({"lost_after_s": -1}, "lost_after_s"),
    ({"audit_rate": 1.5}, "audit_rate"),
    ({"on_alarm": "page"}, "on_alarm"),
    (["deadline_ms"], "mapping"),
    ({"deadline_ms": float("inf")}, "deadline_ms"),  # accepted before, and /plan then could not encode it
    ({"deadline_ms": float("nan")}, "deadline_ms"),
    ({"deadline_ms": 10**400}, "deadline_ms"),  # OverflowError escaped the refusal: the replica failed
    ({"deadline_ms": 10**9}, "deadline_ms"),  # past the bound a request's own X-Deadline-Ms has
    ({"lost_after_s": float("inf")}, "lost_after_s"),
])
def test_a_bad_user_config_names_its_key_and_applies_nothing(config, named):
    ing = _ingress()
    before = current_settings(ing)
    with pytest.raises(ValueError, match=named):
        apply_live_settings(ing, {"deadline_ms": 100, **config} if isinstance(config, dict) else config)
    assert current_settings(ing) == before


def test_the_audit_cannot_be_started_in_place():
    """Its ledger and the monitor's terms are set up at deploy: an app without the audit refuses
    a rate or on_alarm='step', and takes a rate of 0 or 'alert'."""
    with pytest.raises(ValueError, match="without the live audit"):
        check_live_settings({"audit_rate": 0.05}, gears=3, audited=False)
    with pytest.raises(ValueError, match="without the audit"):
        check_live_settings({"on_alarm": "step"}, gears=3, audited=False)
    ing = _ingress(audited=False)
    assert apply_live_settings(ing, {"audit_rate": 0.0, "on_alarm": "alert"}) == {"audit_rate": 0.0,
                                                                                   "on_alarm": "alert"}
    assert current_settings(ing)["audit_rate"] == 0.0


def test_a_bad_user_config_is_refused_and_every_replica_keeps_serving():
    """Raising in a running replica made Serve stop it and retry: one bad edit took one of two
    ingress replicas down (served, 2026-12-05). And Serve keeps a refused edit as the config new
    replicas start with: a starting replica that raised on it failed every scale-up and
    replacement. Every replica refuses, serves with what it has, and says so."""
    ing = _ingress()
    deployed = current_settings(ing)
    assert reconfigure(ing, {"gear": 99}) is None  # at start: the deployed settings, the refusal shown
    assert current_settings(ing) == deployed and "gear" in ing.settings_rejected["error"]
    ing.counted.clear()
    assert reconfigure(ing, {"deadline_ms": 300})["deadline_ms"] == 300.0 and ing.settings_applied
    before = current_settings(ing)
    assert reconfigure(ing, {"deadline_ms": 100, "gear": 99}) is None
    assert current_settings(ing) == before and ing.counted == ["willump_settings_rejected"]
    assert ing.settings_rejected["user_config"] == {"deadline_ms": 100, "gear": 99}
    assert "gear" in ing.settings_rejected["error"]
    assert reconfigure(ing, {"deadline_ms": 100}) is not None and ing.settings_rejected is None
    assert reconfigure(ing, {"deadline_ms": float("nan")}) is None  # refused, and /plan can show it
    json.dumps(ing.settings_rejected, allow_nan=False)


def test_an_app_without_remote_stages_shows_the_hedging_settings_it_was_given():
    """Every level in the ingress: no stage call to copy, but /plan shows what was set."""
    ing = _ingress(stages=())
    assert current_settings(ing)["hedging"] is False and current_settings(ing)["lost_after_s"] == 2.0
    apply_live_settings(ing, {"hedging": True, "lost_after_s": 5.0})
    assert current_settings(ing)["hedging"] is True and current_settings(ing)["lost_after_s"] == 5.0


def test_serve_runs_the_ingress_reconfigure_on_the_requests_event_loop():
    """Serve runs a plain method in a worker thread beside the requests (its
    RAY_SERVE_RUN_SYNC_IN_THREADPOOL), where a request could read a setting half changed; a
    coroutine it awaits on the replica's loop, between two steps of the requests."""
    import inspect

    from serving.runtime.ingress import Ingress

    assert inspect.iscoroutinefunction(Ingress.func_or_class.reconfigure)


def test_stepping_on_the_alarm_needs_an_app_deployed_to_step():
    """The monitor's ledger decides holds only in an app deployed with on_alarm='step': an app
    deployed to alert is refused 'step' in place (it would show in /plan and never act); one
    deployed to step can be set to alert and back."""
    alerting = _ingress()
    reconfigure(alerting, {"deadline_ms": 500})  # started: its deployed settings recorded
    assert reconfigure(alerting, {"on_alarm": "step"}) is None
    assert "deployed with on_alarm='alert'" in alerting.settings_rejected["error"]
    stepping = _ingress()
    stepping.config.audit["on_alarm"] = "step"
    reconfigure(stepping, {"deadline_ms": 500})
    assert reconfigure(stepping, {"on_alarm": "alert"})["on_alarm"] == "alert"
    assert reconfigure(stepping, {"on_alarm": "step"})["on_alarm"] == "step"
