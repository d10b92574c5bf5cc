"""The live audit's pace (serving.runtime.audit_pace): its calls fill only the room the request
path leaves on the full model's stage, so the audit waits in a burst instead of buying a replica.
Deterministic: a fake clock, fake rooms and costs; no Ray, no timing."""

from __future__ import annotations

import asyncio
import time
import types

import numpy as np
import pandas as pd
import pytest

from serving.runtime.audit import LiveAudit
from serving.runtime.audit_pace import AUDIT_ROOM, PACE_S, AuditPace
from serving.runtime.calls import Deadline
from serving.runtime.monitor_calls import audit_room, audit_stage
from serving.runtime.stage_load import StageLoad


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_room_sits_below_the_autoscalers_target():
    from serving.planning.planner import HEADROOM

    assert 0 < AUDIT_ROOM < HEADROOM


def test_without_a_known_room_or_timed_calls_nothing_is_paced():
    clock = _Clock()
    pace = AuditPace(lambda: None, clock=clock)
    assert pace.rows_now(128) == 128 and pace.wait_s() == 0.0
    broken = AuditPace(lambda: 1 / 0, clock=clock)  # a room that cannot be told: not paced
    assert broken.rows_now(128) == 128
    untimed = AuditPace(lambda: 0.5, clock=clock)
    assert untimed.rows_now(128) == 1  # the first call learns what a row costs
    untimed.spent(1, None)  # ... but the stage did not time it
    assert untimed.rows_now(128) == 128 and untimed.wait_s() == 0.0
    with pytest.raises(ValueError, match="pace_s"):
        AuditPace(lambda: None, pace_s=0)
    with pytest.raises(ValueError, match="half_life_rows"):
        AuditPace(lambda: None, half_life_rows=-1)


def test_calls_carry_what_the_bucket_holds_at_the_measured_cost():
    clock = _Clock()
    room = [0.5]
    pace = AuditPace(lambda: room[0], clock=clock)
    assert pace.rows_now(128) == 1  # cost unknown: one row
    pace.spent(1, 0.05)  # 50 ms a row; the bucket had PACE_S
    assert pace.cost_per_row() == pytest.approx(0.05)
    assert pace.rows_now(128) == int((PACE_S - 0.05) / 0.05)
    pace.spent(3, 0.15)
    assert pace.rows_now(128) == 0 and pace.wait_s() == pytest.approx(0.0, abs=1e-6)
    clock.now += 10.0  # the bucket fills at the room's rate, up to PACE_S
    assert pace.rows_now(128) == int(PACE_S / 0.05)
    pace.spent(1, 0.6)  # a call longer than it thought: debt, waited out at the room's rate
    assert pace.rows_now(128) == 0
    assert pace.wait_s() == pytest.approx((0.6 - PACE_S) / 0.5)
    room[0] = 0.0  # no room at all: look again later
    assert pace.wait_s() is None and pace.rows_now(128) == 0
    room[0] = 0.5
    clock.now += (0.6 - PACE_S) / 0.5 + 0.1
    assert pace.rows_now(128) == 1  # some tokens: a call of one row at least


def test_over_time_the_audit_takes_the_room_and_no_more():
    """Calls started whenever the bucket allows, each spending its rows' cost: the stage's busy
    seconds per second the audit takes match the room, whatever the cost a row."""
    for cost, room in ((0.05, 0.3), (0.0002, 0.05), (0.5, 0.2)):
        clock = _Clock()
        pace = AuditPace(lambda room=room: room, clock=clock)
        start, busy = clock.now, 0.0
        while clock.now - start < 600.0:
            rows = pace.rows_now(128)
            if rows:
                pace.spent(rows, rows * cost)
                busy += rows * cost
            else:
                clock.now += max(pace.wait_s(), 1e-3)
        assert busy / (clock.now - start) == pytest.approx(room, rel=0.02, abs=(PACE_S + cost) / 600)


def test_the_request_paths_load_is_measured_per_stage_beside_the_audits():
    clock = _Clock()
    load = StageLoad(window_s=4.0, clock=clock)
    load.arrived(32)
    load.answered("cheap", 0.4, 32, per_row=False)  # the first stage: load, no cost per row
    load.answered("expensive", 0.2, 2)
    load.extra("expensive", 0.2)  # top-K, a held gear 0: the request path's too
    load.audited("expensive", 5.0)  # the audit's own: not the request path's
    assert load.busy_per_row("cheap") is None and load.busy_per_row("expensive") == pytest.approx(0.1)
    # under half a window of traffic: over half a window
    assert load.request_busy_per_s("expensive") == pytest.approx(0.4 / 2.0)
    clock.now += 3.0
    load.arrived(32)
    assert load.request_busy_per_s("expensive") == pytest.approx(0.4 / 3.0)
    assert load.request_busy_per_s("cheap") == pytest.approx(0.4 / 3.0)
    clock.now += 2.0  # the first calls left the window
    assert load.request_busy_per_s("expensive") == 0.0 and load.request_busy_per_s("other") == 0.0


def test_the_room_is_the_ingresss_share_of_the_replicas_less_its_own_load():
    clock = _Clock()
    load = StageLoad(window_s=2.0, ingresses=2, clock=clock)
    ingress = types.SimpleNamespace(second=object(), local=False, stage_names=["cheap", "expensive"],
                                    stage_load=load, running_replicas={"cheap": 1})
    assert audit_stage(ingress) == "expensive" and audit_room(ingress) is None  # no replica count yet
    ingress.running_replicas["expensive"] = 2
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2)
    load.arrived(10)
    clock.now += 2.0
    load.answered("expensive", 0.5, 4)
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2 - 0.5 / 2.0)
    load.answered("expensive", 5.0, 4)  # the request path needs more than the share: no room
    assert audit_room(ingress) == 0.0
    ingress.stage_load = None
    assert audit_room(ingress) is None
    single = types.SimpleNamespace(second=None, local=False, stage_names=["all"], stage_load=load,
                                   running_replicas={"all": 1})
    assert audit_stage(single) == "all" and audit_room(single) is not None
    local = types.SimpleNamespace(second=None, local=True, stage_names=["all"], stage_load=load,
                                  running_replicas={})
    assert audit_stage(local) is None and audit_room(local) is None


def test_the_audits_calls_report_the_stages_busy_seconds_to_the_pace():
    from serving.runtime.hold import full_proba
    from tests.serving.conftest import timed_stage

    heard: list = []
    load = StageLoad(clock=_Clock())
    rows = pd.DataFrame({"x": np.arange(3.0)})
    for takes_timed, busy in ((True, 0.25), (False, None)):
        ingress = types.SimpleNamespace(local=False, stage_names=["cheap", "expensive"], stage_load=load,
                                        second=timed_stage("full_proba", "proba",
                                                           lambda r: np.full((len(r), 2), 0.5), 0.25, [], takes_timed))
        asyncio.run(full_proba(ingress, rows, Deadline.after(5.0), on_busy=heard.append))
        assert heard[-1] == busy


class _Pace:
    """A stand-in pace that allows what the test says."""

    def __init__(self):
        self.allow = 0

    def rows_now(self, most: int) -> int:
        return min(self.allow, most)

    def wait_s(self) -> float | None:
        return None if self.allow == 0 else 0.0


def _wait_until(check, timeout_s: float = 30.0) -> None:
    async def go():
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)
    return go()


def test_rows_wait_for_the_pace_are_audited_in_its_calls_and_shed_only_when_the_queue_is_full():
    calls: list[int] = []
    pace = _Pace()

    async def full_classes(rows: pd.DataFrame) -> np.ndarray:
        calls.append(len(rows))
        return np.zeros(len(rows), int)

    sent: list[dict] = []

    async def send(entries: list[dict]) -> None:
        sent.extend(entries)

    async def go():
        audit = LiveAudit(1.0, [1], full_classes, send, lambda: False, batch_rows=8, queue_rows=12,
                          flush_s=0.05, idle=lambda: True, pace=pace)
        rows = pd.DataFrame({"x": np.arange(4.0)})
        proba, level = np.tile([[0.9, 0.1]], (4, 1)), np.zeros(4, int)
        for _ in range(4):  # 16 sampled rows: 12 wait, 4 shed at the full queue
            audit.observe(rows, proba, level, gear=0, attributes=None)
        await asyncio.sleep(0.3)  # no room: the rows wait, whatever the worker's wakes
        assert calls == [] and audit.queued == 12
        pace.allow = 4  # room for one request's rows a call
        audit._wake.set()
        await _wait_until(lambda: audit.queued == 0)
        await audit.close()

    asyncio.run(go())
    assert calls == [4, 4, 4]
    assert sum(e["audited"] for e in sent) == 12 and sum(e["shed"] for e in sent) == 4
