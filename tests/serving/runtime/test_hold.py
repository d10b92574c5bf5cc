"""The live audit's automatic response (serving.runtime.hold), in this process (no Ray): which
gear serves while gears are held, the full pipeline's answers replacing the cascade's with gear
0's decisions counted as its audits, the degrade path, the monitor replica naming the held gears
in its answer to the audit's counts, and the ingress's audit acting on that answer."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pandas as pd
import pytest

from serving.runtime.audit import LiveAudit
from serving.runtime.calls import Deadline, DeadlineExceeded
from serving.runtime.gears import GearSwitch
from serving.runtime.hold import answer_in_full, check_on_alarm, held_gear
from serving.runtime.replicas import MonitorStage

LADDER = [{"gear": g, "max_loss": m, "loss_bound": m / 2, "method": "", "cert_rows": 4000, "cert_disagreed": 40}
          for g, m in enumerate((0.01, 0.02, 0.04))]


def test_never_a_held_gear_nor_one_cheaper():
    assert held_gear(2, frozenset()) == (2, False)
    assert held_gear(0, frozenset({1})) == (0, False)
    assert held_gear(1, frozenset({1})) == (0, False) and held_gear(2, frozenset({1})) == (0, False)
    assert held_gear(2, frozenset({2})) == (1, False)
    assert held_gear(0, frozenset({0})) == (0, True) and held_gear(2, frozenset({0, 2})) == (0, True)
    switch = GearSwitch({"mode": 2, "policy": {}, "ladder": LADDER})
    switch.hold([1, 7])  # a gear the ladder does not have is ignored
    assert switch.held == frozenset({1}) and held_gear(switch.begin()[1], switch.held) == (0, False)
    assert switch.fields(0, True) == {"gear": 0, "gear_max_loss": 0.01, "gear_loss_bound": 0.005, "full_pipeline": True}
    assert switch.fields(2)["full_pipeline"] is False


def test_on_alarm_is_checked():
    assert check_on_alarm("alert", 0.0) == "alert" and check_on_alarm("step", 0.01) == "step"
    with pytest.raises(ValueError, match="on_alarm must be one of"):
        check_on_alarm("panic", 0.01)
    with pytest.raises(ValueError, match="audit_rate > 0"):
        check_on_alarm("step", 0.0)


def _ingress(full, degrade=False):
    counted: list[tuple] = []
    runner = types.SimpleNamespace(full_proba=full)
    metrics = types.SimpleNamespace(count=lambda name, n=1, **labels: counted.append((name, n)))
    return types.SimpleNamespace(second=None, local=True, first=types.SimpleNamespace(runner=runner),
                                 degrade=degrade, metrics=metrics, stage_names=["cascade"]), counted


def test_the_full_pipeline_answers_every_row_below_the_full_level_and_gear_0s_decisions_are_counted():
    rows = pd.DataFrame({"x": np.arange(6.0)})
    proba = np.array([[0.9, 0.1]] * 4 + [[0.3, 0.7]] * 2)
    level = np.array([0, 0, 1, 0, 2, 2])      # full level 2; rows 0, 1, 3 cheap, row 2 an intermediate level
    degraded = np.array([False, False, False, True, False, False])  # row 3: a late stage's fallback
    replica = np.array(["r"] * 6, dtype=object)
    seen: list[int] = []

    def full(frame):
        seen.extend(frame["x"].astype(int).tolist())
        return np.array([[0.2, 0.8], [0.6, 0.4], [0.1, 0.9], [0.7, 0.3]])

    ingress, _ = _ingress(full)
    decided, disagreed = asyncio.run(answer_in_full(ingress, rows, proba, level, replica, degraded, 2,
                                                    Deadline.after(5.0)))
    assert seen == [0, 1, 2, 3]
    # rows 0, 1, 2 were the cascade's own decisions (row 3 was degraded); rows 0 and 2 differ
    assert (decided, disagreed) == (3, 2)
    np.testing.assert_allclose(proba[:4], [[0.2, 0.8], [0.6, 0.4], [0.1, 0.9], [0.7, 0.3]])
    assert level.tolist() == [2] * 6 and not degraded.any() and replica[:4].tolist() == ["full"] * 4


def test_past_the_deadline_the_cascade_answers_degraded_or_the_request_fails():
    rows = pd.DataFrame({"x": [1.0, 2.0]})

    def late(frame):
        raise DeadlineExceeded("cascade", 0.1)

    for degrade in (True, False):
        proba, level = np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1])
        degraded, replica = np.zeros(2, dtype=bool), np.array(["r", "r"], dtype=object)
        ingress, counted = _ingress(late, degrade)
        call = answer_in_full(ingress, rows, proba, level, replica, degraded, 1, Deadline.after(5.0))
        if not degrade:
            with pytest.raises(DeadlineExceeded):
                asyncio.run(call)
            continue
        assert asyncio.run(call) == (0, 0)
        assert degraded.tolist() == [True, False] and level.tolist() == [0, 1]
        assert counted == [("willump_degraded_rows", 1)]


def test_the_full_pipeline_in_the_ingress_keeps_the_requests_deadline():
    """Where the ingress runs every level itself, a held gear 0's full pipeline runs in a thread:
    past the request's deadline the request answers degraded (or 504) at the deadline instead of
    waiting for the thread, whose CPU is still counted once it ends."""
    import threading

    from serving.runtime.hold import full_proba

    release = threading.Event()

    def slow(frame):
        assert release.wait(30.0)
        return np.full((len(frame), 2), 0.5)

    rows = pd.DataFrame({"x": [1.0, 2.0]})
    ingress, counted = _ingress(slow, degrade=True)
    heard: list[float] = []

    async def main():
        with pytest.raises(DeadlineExceeded, match="cascade stage"):
            await full_proba(ingress, rows, Deadline.after(0.05), on_cpu=heard.append, request_path=True)
        release.set()
        for _ in range(3000):
            if heard:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(heard) == 1 and heard[0] >= 0.0
    proba, level = np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1])
    degraded, replica = np.zeros(2, dtype=bool), np.array(["r", "r"], dtype=object)
    release.clear()

    async def degraded_at_the_deadline():
        try:
            return await answer_in_full(ingress, rows, proba, level, replica, degraded, 1, Deadline.after(0.05))
        finally:
            release.set()  # the thread ends (asyncio.run waits for it)

    assert asyncio.run(degraded_at_the_deadline()) == (0, 0) and degraded.tolist() == [True, False]
    assert counted == [("willump_degraded_rows", 1)]


def test_the_monitor_names_the_held_gears_and_the_ingress_audit_acts_on_them(tmp_path):
    config = {"attributes": ["region"], "metrics": ["latency_ms"], "directory": str(tmp_path)}
    terms = {"gears": [{"gear": 0, "max_loss": 0.02, "cert_rows": 4000, "cert_disagreed": 40}],
             "rowwise": True, "confidence": 0.95, "segments": [], "hold": True}
    stage = MonitorStage.func_or_class(config, None, terms)
    quiet = {"gear": 0, "served": 1_000, "cheap": 800, "audited": 800, "disagreed": 8, "shed": 0, "segment": {}}
    assert asyncio.run(stage.audit([quiet])) == {"accepted": 1, "held": []}
    answer = asyncio.run(stage.audit([{**quiet, "disagreed": 200}]))
    assert answer == {"accepted": 1, "held": [0]}
    report = stage._query("guarantee", {})["result"]
    assert report["held"] == [0] and report["gears"][0]["held"] and report["gears"][0]["holds"] == 1
    assert 'drift_guarantee_held{gear="0"} 1.0' in asyncio.run(stage.prometheus())
    stage.monitor.close()
    again = MonitorStage.func_or_class(config, None, terms)  # a restarted monitor keeps the hold
    assert again._query("guarantee", {})["result"]["held"] == [0]
    again.monitor.close()

    # the ingress side: the answer to a send reaches the switch; shadow counts go out as audits
    switch = GearSwitch({"mode": "off", "policy": {}, "ladder": LADDER[:1]})
    sent: list[dict] = []

    async def send(entries, batch_id=None):
        sent.extend(entries)
        return {"accepted": len(entries), "held": [0]}

    async def go():
        audit = LiveAudit(0.01, [1], None, send, lambda: False, on_answer=lambda a: switch.hold(a["held"]))
        audit.shadow(0, 32, 30, 3, None)
        audit.shadow(0, 0, 0, 0, None)  # an empty request counts nothing
        await audit.flush()
        await audit.close()

    asyncio.run(go())
    assert switch.held == frozenset({0})
    assert [(e["served"], e["cheap"], e["audited"], e["disagreed"]) for e in sent] == [(32, 30, 30, 3)]
    assert all(e["shadow"] for e in sent), "the held gear's census travels apart from the served rows' counts"


def test_the_full_pipelines_calls_are_load_for_the_step_back():
    """While gear 0 is held, requests wait on the full pipeline's calls: the stage answers them
    whole and timed, and the busy seconds join the gears' step-back load over its window
    (StageLoad.extra). The live audit's calls ask for pieces, timed too: their busy seconds count
    per row arriving (StageLoad.audited). A stage replica of earlier code refuses both forms and
    answers the array to the rows alone; without a step back to feed, the call is that one."""
    from serving.runtime.hold import full_proba
    from serving.runtime.stage_load import StageLoad
    from tests.serving.conftest import timed_stage

    sent: list[tuple] = []

    def stage(takes_timed: bool) -> types.SimpleNamespace:
        return timed_stage("full_proba", "proba", lambda rows: np.full((len(rows), 2), 0.5), 0.25, sent, takes_timed)

    def calls() -> list[tuple]:  # each call's arguments after the rows
        return [args[1:] for args in sent]

    now = [0.0]
    load = StageLoad(window_s=2.0, clock=lambda: now[0])
    load.arrived(100)
    ingress = types.SimpleNamespace(second=stage(True), local=False, stage_names=["cheap", "expensive"],
                                    stage_load=load)
    rows = pd.DataFrame({"x": np.arange(3.0)})
    held = asyncio.run(full_proba(ingress, rows, Deadline.after(5.0), request_path=True))
    audited = asyncio.run(full_proba(ingress, rows, Deadline.after(5.0)))
    assert held.shape == audited.shape == (3, 2) and calls() == [(True,), (True, True)]
    now[0] = 2.0
    assert load.extra_busy_per_s("expensive") == pytest.approx(0.25 / 2.0)
    assert load.audit_busy_per_row("expensive") == pytest.approx(0.25 / 100)
    ingress.second = stage(False)
    sent.clear()
    for request_path in (True, False):
        older = asyncio.run(full_proba(ingress, rows, Deadline.after(5.0), request_path=request_path))
        assert older.shape == (3, 2)
    assert calls() == [(True,), (), (True, True), ()]
    ingress.stage_load = None
    asyncio.run(full_proba(ingress, rows, Deadline.after(5.0)))
    assert calls()[-1] == ()
    assert load.extra_busy_per_s("expensive") == pytest.approx(0.25 / 2.0)
    assert load.audit_busy_per_row("expensive") == pytest.approx(0.25 / 100)


def _request_path(held: set, stage2=None, degrade=False):
    """An ingress on plain objects for the request path (``Ingress._predict``): a cheap stage whose
    rows 0-2 it answers and row 3 it leaves unsure, with a fallback; ``stage2`` the later stage."""
    import serving.runtime.ingress as ingress_module

    frame = pd.DataFrame({"x": np.arange(4.0)})
    observed, shadowed, degraded = [], [], []

    class _Coalescer:
        def __init__(self, fn):
            self.fn = fn

        async def submit(self, rows, blocks, deadline, key=None):
            return await self.fn(rows)

    async def cheap(rows):
        return {"proba": np.array([[0.9, 0.1]] * 4), "level": np.zeros(4, dtype=np.int64), "unsure": np.array([3]),
                "replica": "r", "blocks": None, "fallback": np.array([[0.6, 0.4]])}

    gears = types.SimpleNamespace(adaptive=False, held=frozenset(held), fields=lambda g, full: {"gear": g, "full_pipeline": full})
    audit = types.SimpleNamespace(final_levels=[1], observe=lambda rows, proba, level, gear, attributes, **kw: observed.append(
        (rows["x"].tolist(), level.tolist())), shadow=lambda *a: shadowed.append(a),
        degraded=lambda gear, rows, attributes: degraded.append((gear, rows)))
    metrics = types.SimpleNamespace(count=lambda *a, **k: None)
    runner = types.SimpleNamespace(full_proba=lambda rows: np.full((len(rows), 2), [0.2, 0.8]))
    ingress = types.SimpleNamespace(
        _deadline=lambda request: Deadline.after(30.0), stage_spans=["s0", "s1"], stage_names=["cheap", "expensive"],
        coalescers={"cheap": _Coalescer(cheap), "expensive": _Coalescer(stage2)}, stage_load=None, gears=gears,
        second=object(), local=True, first=types.SimpleNamespace(runner=runner), degrade=degrade, metrics=metrics,
        first_level=0, audit=audit, _probe=lambda request: False, info={"levels": [0, 1]}, records=None,
        version="v", classes=np.asarray(["neg", "pos"], dtype=object))

    async def parse(request, model):
        return types.SimpleNamespace(attributes=None), frame

    ingress._parse = parse
    ingress.degraded_counted = degraded
    predict = ingress_module.Ingress.func_or_class._predict.__get__(ingress)
    return ingress, predict, observed, shadowed


def test_a_gear_held_while_its_request_is_in_flight_answers_in_full(monkeypatch):
    """The alarm holds gear 0 while the request waits on its later stage: the answer is the full
    pipeline's (every gear's certificate is against it), not the cascade's whose guarantee no
    longer holds."""
    import json

    async def expensive(rows):
        ingress.gears.held = frozenset({0})  # the audit's answer arrives meanwhile
        return {"proba": np.array([[0.1, 0.9]]), "level": np.array([1]), "replica": "e"}

    async def full(ingress, rows, deadline, **kw):  # the stage holding the full model
        return np.full((len(rows), 2), [0.2, 0.8])

    monkeypatch.setattr("serving.runtime.hold.full_proba", full)
    ingress, predict, observed, shadowed = _request_path(set(), expensive)
    answer = json.loads(asyncio.run(predict(types.SimpleNamespace(state=types.SimpleNamespace()), 0)).body)
    # rows the cascade answered below its full level get the full pipeline's answer (row 3 had it)
    assert answer["full_pipeline"] is True and answer["probabilities"][:3] == [[0.2, 0.8]] * 3
    assert observed == [] and len(shadowed) == 1


def test_rows_a_late_stage_left_to_the_fallback_are_not_audited_as_the_gears_decisions():
    async def late(rows):
        raise DeadlineExceeded("expensive", 1.0)

    ingress, predict, observed, _ = _request_path(set(), late, degrade=True)
    asyncio.run(predict(types.SimpleNamespace(state=types.SimpleNamespace()), 0))
    assert observed == [([0.0, 1.0, 2.0], [0, 0, 0])]  # row 3 answered by the fallback: left out
    assert ingress.degraded_counted == [(0, 1)]  # ... and counted apart
