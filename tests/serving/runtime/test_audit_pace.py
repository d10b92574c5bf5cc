"""The live audit's pace (serving.runtime.audit_pace): its calls fill only the room the request
path leaves on the full model's stage, so the audit waits in a burst instead of buying a replica.
Deterministic: a fake clock, fake rooms and costs; no Ray, no timing."""

from __future__ import annotations

import asyncio
import statistics
import time
import types

import numpy as np
import pandas as pd
import pytest

from serving.runtime.audit import LiveAudit
from serving.runtime.audit_pace import AUDIT_ROOM, PACE_S, AuditPace
from serving.runtime.calls import Deadline
from serving.runtime.hold import full_model_stage
from serving.runtime.monitor_calls import audit_room
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


def test_a_call_starts_once_the_bucket_holds_its_cost_and_carries_what_it_holds():
    clock = _Clock()
    room = [0.5]
    pace = AuditPace(lambda: room[0], clock=clock)
    assert pace.rows_now(128, queued=50) == 1  # cost unknown: one row
    pace.spent(1, 0.05)  # 50 ms a row; the bucket had PACE_S
    assert pace.cost_per_row() == pytest.approx(0.05)
    left = PACE_S - 0.05
    # 3 rows waiting cost what the bucket holds: they go; 50 wait for a full PACE_S
    assert pace.rows_now(128, queued=3) == round(left / 0.05)
    assert pace.rows_now(128, queued=50) == 0
    assert pace.wait_s(50) == pytest.approx((PACE_S - left) / 0.5)
    pace.spent(3, 0.15)
    assert pace.rows_now(128, queued=1) == 0 and pace.wait_s(1) == pytest.approx(0.05 / 0.5)
    clock.now += 10.0  # the bucket fills at the room's rate, up to PACE_S
    assert pace.rows_now(128, queued=50) == round(PACE_S / 0.05)
    assert pace.rows_now(2, queued=50) == 2  # never more than asked
    pace.spent(1, 0.6)  # a call longer than it thought: debt, waited out at the room's rate
    assert pace.rows_now(128, queued=1) == 0
    assert pace.wait_s(1) == pytest.approx((0.6 - PACE_S + pace.cost_per_row()) / 0.5)
    room[0] = 0.0  # no room at all: look again later
    assert pace.wait_s(1) is None and pace.rows_now(128, queued=1) == 0
    # a cheap row: a call waits for PACE_S or for what its rows cost, whichever is less
    cheap = AuditPace(lambda: 0.5, clock=clock)
    cheap.spent(1, 0.0002)
    assert cheap.rows_now(128, queued=5) == 128  # 128 rows fit what the bucket holds
    cheap.busy_s, cheap.rows = 1e-310, 1.0  # a cost of about nothing: every row, no float overflow
    assert cheap.rows_now(128, queued=5) == 128


def test_over_time_the_audit_takes_the_room_and_no_more():
    """Calls started whenever the bucket allows, each spending its rows' cost: the stage's busy
    seconds per second the audit takes match the room, whatever the cost a row."""
    for cost, room in ((0.05, 0.3), (0.0002, 0.05), (0.5, 0.2)):
        clock = _Clock()
        pace = AuditPace(lambda room=room: room, clock=clock)
        start, busy = clock.now, 0.0
        sizes = []
        while clock.now - start < 600.0:
            rows = pace.rows_now(128, queued=1000)  # a backlog
            if rows:
                pace.spent(rows, rows * cost)
                busy += rows * cost
                sizes.append(rows)
            else:
                clock.now += max(pace.wait_s(1000), 1e-3)
        assert busy / (clock.now - start) == pytest.approx(room, rel=0.02, abs=(PACE_S + cost) / 600)
        # calls of about PACE_S of the stage's time (a row at least, the batch at most)
        assert statistics.median(sizes[1:]) == min(max(round(PACE_S / cost), 1), 128)


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
    assert full_model_stage(ingress) == "expensive" and audit_room(ingress) is None  # no replica count yet
    ingress.running_replicas["expensive"] = 2
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2)
    load.arrived(10)
    clock.now += 2.0
    load.answered("expensive", 0.5, 4)
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2 - 0.5 / 2.0)
    load.answered("expensive", 0.1, 4, scale=3.0)  # read by the autoscaler at 3x: the larger counts
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2 - 0.8 / 2.0)
    load.answered("expensive", 0.1, 4, scale=0.25)  # read at less: the device's own counts
    assert audit_room(ingress) == pytest.approx(2 * AUDIT_ROOM / 2 - 0.9 / 2.0)
    load.answered("expensive", 5.0, 4)  # the request path needs more than the share: no room
    assert audit_room(ingress) == 0.0
    ingress.running_replicas["expensive"] = 0  # scaled to zero: the audit does not start one
    assert audit_room(ingress) == 0.0
    ingress.stage_load = None
    assert audit_room(ingress) is None
    single = types.SimpleNamespace(second=None, local=False, stage_names=["all"], stage_load=load,
                                   running_replicas={"all": 1})
    assert full_model_stage(single) == "all" and audit_room(single) is not None
    local = types.SimpleNamespace(second=None, local=True, stage_names=["all"], stage_load=load,
                                  running_replicas={})
    assert full_model_stage(local) is None and audit_room(local) is None
    fused = types.SimpleNamespace(second=object(), local=True, stage_names=["cheap", "expensive"])
    assert full_model_stage(fused) == "expensive"  # the first stage in the ingress, the full model's remote


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

    def rows_now(self, most: int, queued: int) -> int:
        return min(self.allow, most)

    def wait_s(self, queued: int) -> float | None:
        return None if self.allow == 0 else 0.0


def _wait_until(check, timeout_s: float = 30.0) -> None:
    async def go():
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)
    return go()


class _Paced:
    """A LiveAudit with a stand-in pace, its full pipeline's calls (rows each) and the counts it sent."""

    def __init__(self, queue_rows: int, busy=lambda: False):
        self.pace, self.calls, self.sent = _Pace(), [], []

        async def full_classes(rows: pd.DataFrame) -> np.ndarray:
            self.calls.append(len(rows))
            return np.zeros(len(rows), int)

        async def send(entries: list[dict], batch_id: str | None = None) -> None:
            self.sent.extend(entries)

        self.make = lambda: LiveAudit(1.0, [1], full_classes, send, busy, batch_rows=8, queue_rows=queue_rows,
                                      flush_s=0.05, idle=lambda: True, pace=self.pace)

    def total(self, key: str) -> int:
        return sum(e[key] for e in self.sent)


def _observe(audit: LiveAudit, n: int) -> None:
    """A request of ``n`` rows the cheap level answered (every one sampled at rate 1)."""
    audit.observe(pd.DataFrame({"x": np.arange(float(n))}), np.tile([[0.9, 0.1]], (n, 1)), np.zeros(n, int),
                  gear=0, attributes=None)


def test_rows_wait_for_the_pace_are_audited_in_its_calls_and_shed_only_when_the_queue_is_full():
    paced = _Paced(queue_rows=12)

    async def go():
        audit = paced.make()
        for _ in range(4):  # 16 sampled rows: 12 wait, 4 shed at the full queue
            _observe(audit, 4)
        await asyncio.sleep(0.3)  # no room: the rows wait, whatever the worker's wakes
        assert paced.calls == [] and audit.queued == 12
        paced.pace.allow = 4  # room for one request's rows a call
        audit._wake.set()
        await _wait_until(lambda: audit.queued == 0)
        await audit.close()

    asyncio.run(go())
    assert paced.calls == [4, 4, 4] and paced.total("audited") == 12 and paced.total("shed") == 4


def test_paced_rows_wait_while_the_request_path_is_busy_and_a_call_takes_part_of_a_request():
    state = {"busy": True}
    paced = _Paced(queue_rows=64, busy=lambda: state["busy"])

    async def go():
        audit = paced.make()
        _observe(audit, 10)
        paced.pace.allow = 3
        audit._wake.set()
        await asyncio.sleep(0.3)  # busy: the rows wait, none shed
        assert paced.calls == [] and audit.queued == 10
        state["busy"] = False
        audit._wake.set()
        await _wait_until(lambda: audit.queued == 0)
        await audit.close()

    asyncio.run(go())
    assert paced.calls == [3, 3, 3, 1]  # one request's 10 sampled rows, in the pace's calls
    assert paced.total("audited") == 10 and paced.total("shed") == 0
