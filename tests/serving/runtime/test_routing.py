"""The capacity router's policy, without Ray: a fake clock and replicas with set capacities."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
import time
import types

import numpy as np
import pandas as pd
import pytest

from serving.runtime.routing import BusyMeter, CapacityPolicy, ReplicaView, router_config


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _route(policy: CapacityPolicy, views: list[ReplicaView]) -> str:
    return policy.rank(views)[0][0]


def test_busy_meter_counts_overlapping_calls_once():
    clock = Clock()
    meter = BusyMeter(clock)
    assert meter.report()["rows_per_s"] is None
    meter.start()
    clock.t = 1.0
    meter.start()  # a second call overlaps the first
    clock.t = 2.0
    meter.stop(100)
    meter.stop(100)
    clock.t = 10.0  # idle time does not count
    assert meter.report()["rows_per_s"] == pytest.approx(100.0)
    assert meter.report()["rows_per_s"] == pytest.approx(100.0), "an idle period keeps the last figure"


def test_busy_meter_reports_a_call_still_running():
    clock = Clock()
    meter = BusyMeter(clock)
    meter.start()
    meter.stop(50)
    clock.t = 0.5
    meter.start()
    clock.t = 1.0
    # 50 rows in 0.0 s of the first call plus 0.5 s of the running one
    assert meter.report()["rows_per_s"] == pytest.approx(100.0)
    clock.t = 2.0
    meter.stop(100)
    assert meter.report()["rows_per_s"] == pytest.approx(100.0)


def test_the_autoscalers_window_is_its_own_and_splits_a_running_call():
    """The autoscaling stats (rows answered per second and the busy share since Serve last
    asked) keep their own window: the router's reports do not reset them, and a call running
    across two windows counts in each for its part."""
    clock = Clock()
    meter = BusyMeter(clock)
    meter.start()
    clock.t = 1.0
    meter.report()  # the router's period ends; the autoscaler's window goes on
    clock.t = 2.0
    meter.stop(100)
    clock.t = 4.0

    def stats() -> dict[str, float]:
        return {k: v for k, v in meter.autoscaling_stats().items() if k in ("busy_share", "rows_per_s")}

    assert stats() == pytest.approx({"busy_share": 0.5, "rows_per_s": 25.0})
    meter.start()
    clock.t = 5.0
    assert stats() == pytest.approx({"busy_share": 1.0, "rows_per_s": 0.0})
    clock.t = 7.0
    meter.stop(40)
    clock.t = 9.0
    assert stats() == pytest.approx({"busy_share": 0.5, "rows_per_s": 10.0})
    # the router: 140 rows over 4 busy seconds since its last report (1-2 and 4-7)
    assert meter.report()["rows_per_s"] == pytest.approx(35.0)


def test_the_backlog_the_ingresses_report_and_what_a_row_costs():
    """Each ingress replica says, with every call, how many rows it still queues for the stage;
    the replica reports the sum of the current ones (an ingress silent for BACKLOG_FRESH_S has
    nothing queued for long) and the busy seconds a row took in the window."""
    from serving.runtime.routing import BACKLOG_FRESH_S

    clock = Clock()
    meter = BusyMeter(clock)
    meter.note_backlog("ingress-a", 300)
    meter.note_backlog("ingress-b", 100)
    meter.note_backlog("ingress-a", 200)  # its latest report counts
    meter.start()
    clock.t = 1.0
    meter.stop(50)
    clock.t = 1.5
    stats = meter.autoscaling_stats()
    assert stats["backlog_rows"] == 300 and stats["busy_s_per_row"] == pytest.approx(1.0 / 50)
    clock.t = 1.0 + BACKLOG_FRESH_S  # ingress-a's report is now stale, ingress-b's too
    meter.note_backlog("ingress-b", 40)
    stats = meter.autoscaling_stats()
    assert stats["backlog_rows"] == 40 and stats["busy_s_per_row"] == 0.0  # no rows in this window


def test_the_busy_share_scaled_to_the_deployed_gear():
    """Calls in a cheaper gear say how many times their rows the deployed gear would have sent:
    the replica reports its busy share scaled by the window's row-weighted factor (1 for calls
    that say nothing), or by the last window's where none arrived; an app sized for its cheapest
    gear scales calls of a more accurate one down, and a factor that is not a positive number
    counts as 1."""
    clock = Clock()
    meter = BusyMeter(clock)
    meter.start()
    clock.t = 0.5
    meter.stop(40)
    meter.note_demand(30, 4.0)  # 30 rows in a cheaper gear: the deployed one would send 120
    meter.note_demand(10, 1.0)  # 10 rows in the deployed gear
    meter.note_demand(0, 3.0)
    clock.t = 1.0
    stats = meter.autoscaling_stats()
    assert stats["busy_share"] == pytest.approx(0.5)
    assert stats["deployed_gear_busy_share"] == pytest.approx(0.5 * 130 / 40)
    meter.start()  # a window in which a call computes but none arrives keeps the last scale
    clock.t = 1.5
    meter.stop(40)
    clock.t = 2.0
    stats = meter.autoscaling_stats()
    assert stats["deployed_gear_busy_share"] == pytest.approx(0.5 * 130 / 40)
    meter.start()  # sized for the cheapest gear: gear 0's 40 rows stand for 10 of that gear's
    clock.t = 2.5
    meter.stop(40)
    meter.note_demand(40, 0.25)
    clock.t = 3.0
    stats = meter.autoscaling_stats()
    assert stats["busy_share"] == pytest.approx(0.5)
    assert stats["deployed_gear_busy_share"] == pytest.approx(0.5 * 0.25)
    for bad in (float("nan"), float("inf"), -2.0, 0.0):
        meter.note_demand(10, bad)
    meter.start()
    clock.t = 3.5
    meter.stop(40)
    clock.t = 4.0
    stats = meter.autoscaling_stats()
    assert stats["deployed_gear_busy_share"] == pytest.approx(stats["busy_share"]) == pytest.approx(0.5)
    clock.t = 5.0
    stats = meter.autoscaling_stats()
    assert stats["busy_share"] == 0.0 and stats["deployed_gear_busy_share"] == 0.0


def test_work_every_gear_makes_alike_is_counted_as_it_accrues_and_left_unscaled():
    """A live audit's call (unscaled) runs from 0 to 1.2 s, across three of the autoscaler's
    windows; a cascade call in a cheaper-sized gear (scale 0.25) runs beside it from 0.1 to 0.2 s.
    Each window counts the audit's share of the busy time as it accrued (the overlap split between
    the two calls), scales only the cascade's, and leaves the audit's rows and time out of the
    rates per row; the router's capacity is the cascade's rows per second of its own time."""
    clock = Clock()
    meter = BusyMeter(clock)
    audit = meter.start(unscaled=True)
    clock.t = 0.1
    mark = meter.start()
    clock.t = 0.2
    assert meter.call_busy_s(mark) == pytest.approx(0.05)
    meter.stop(10)
    meter.note_demand(10, 0.25)
    clock.t = 0.5
    stats = meter.autoscaling_stats()  # busy 0.5 s, of it the audit's 0.45 s
    assert stats["busy_share"] == pytest.approx(1.0)
    assert stats["deployed_gear_busy_share"] == pytest.approx(0.1 * 0.25 + 0.9)
    assert stats["busy_s_per_row"] == pytest.approx(0.05 / 10) and stats["rows_per_s"] == pytest.approx(20.0)
    clock.t = 1.0
    stats = meter.autoscaling_stats()  # the audit alone: all of the window, unscaled
    assert stats["busy_share"] == pytest.approx(1.0) and stats["deployed_gear_busy_share"] == pytest.approx(1.0)
    assert stats["busy_s_per_row"] == 0.0
    clock.t = 1.2
    assert meter.call_busy_s(audit) == pytest.approx(1.15)
    meter.stop(50, unscaled=True)
    clock.t = 1.5
    stats = meter.autoscaling_stats()
    assert stats["busy_share"] == pytest.approx(0.4) and stats["deployed_gear_busy_share"] == pytest.approx(0.4)
    assert stats["rows_per_s"] == 0.0
    assert meter.report() == {"rows_per_s": pytest.approx(10 / 0.05), "rows": 60}
    assert meter.active == meter.active_unscaled == 0


def test_the_audits_calls_are_reported_apart_as_work_that_can_wait():
    """An audit piece (deferrable) beside a top-K call (unscaled, a request waits on it): both are
    unscaled work; only the audit's part is reported as deferrable, the overlap split between them."""
    clock = Clock()
    meter = BusyMeter(clock)
    audit = meter.start(deferrable=True)
    topk = meter.start(unscaled=True)
    clock.t = 0.2
    meter.stop(5, unscaled=True, mark=topk)
    clock.t = 0.3
    meter.stop(2, mark=audit, deferrable=True)
    clock.t = 0.5
    stats = meter.autoscaling_stats()
    assert stats["busy_share"] == pytest.approx(0.6) and stats["deployed_gear_busy_share"] == pytest.approx(0.6)
    assert stats["deferrable_busy_share"] == pytest.approx((0.1 + 0.1) / 0.5)
    assert meter.active == meter.active_unscaled == meter.active_deferrable == 0
    clock.t = 1.0
    assert meter.autoscaling_stats()["deferrable_busy_share"] == 0.0


def test_the_audits_calls_held_are_reported_for_the_whole_stay():
    """An audit call held 0.4 s of a 0.5 s window, computing only 0.1 s of it (its pieces wait
    their turn): Serve counts it as ongoing all 0.4 s, and so does ``deferrable_ongoing``; a
    call still held when the window ends counts up to then, and on into the next."""
    clock = Clock()
    meter = BusyMeter(clock)
    clock.t = 0.1
    meter.hold_deferrable(True)
    mark = meter.start(deferrable=True)
    clock.t = 0.2
    meter.stop(4, mark=mark, deferrable=True)
    clock.t = 0.5
    stats = meter.autoscaling_stats()
    assert stats["deferrable_ongoing"] == pytest.approx(0.4 / 0.5)
    assert stats["deferrable_busy_share"] == pytest.approx(0.1 / 0.5)
    clock.t = 1.0
    meter.hold_deferrable(False)
    clock.t = 1.5
    assert meter.autoscaling_stats()["deferrable_ongoing"] == pytest.approx(0.5 / 1.0)
    meter.hold_deferrable(False)  # an unmatched release never counts below none
    assert meter.held_deferrable == 0


def test_a_cascade_call_across_a_report_brings_its_whole_time_with_its_rows():
    """One call at a time (an emulated device): audit pieces of 1.5 s and a 2-row cascade batch of
    0.1 s between them, the router's report falling inside the batch. The batch's rows count
    when it ends, and so does all of its time: 20 rows a second, not the 40 that its tail alone
    beside the audit's time taken out would read."""
    clock = Clock()
    meter = BusyMeter(clock)
    audit = meter.start(unscaled=True)
    clock.t = 1.5
    meter.stop(64, unscaled=True, mark=audit)
    batch = meter.start()
    clock.t = 1.55
    assert meter.report()["rows_per_s"] is None  # no cascade row has ended yet
    clock.t = 1.6
    meter.stop(2, mark=batch)
    audit = meter.start(unscaled=True)
    clock.t = 3.1
    meter.stop(64, unscaled=True, mark=audit)
    clock.t = 3.2
    assert meter.report()["rows_per_s"] == pytest.approx(2 / 0.1)
    window = meter.autoscaling_stats()
    assert window["busy_s_per_row"] == pytest.approx(0.1 / 2) and window["rows_per_s"] == pytest.approx(2 / 3.2)


def test_shares_follow_capacity():
    """Calls held open (none answered) spread in proportion to reported capacity: a replica
    three times as fast as its peer takes three calls of every four."""
    policy = CapacityPolicy(clock=Clock())
    views = {"fast": ReplicaView("fast", rows_per_s=300.0), "slow": ReplicaView("slow", rows_per_s=100.0)}
    for _ in range(40):
        chosen = _route(policy, list(views.values()))
        policy.routed(chosen)
    assert {k: len(v) for k, v in policy.sent.items()} == {"fast": 30, "slow": 10}


def test_serves_default_spreads_evenly_with_equal_capacity():
    policy = CapacityPolicy(clock=Clock())
    views = [ReplicaView(k, rows_per_s=100.0) for k in "abcd"]
    for _ in range(40):
        policy.routed(_route(policy, views))
    assert {len(v) for v in policy.sent.values()} == {10}


def test_queue_lengths_serve_reports_count():
    policy = CapacityPolicy(clock=Clock())
    views = [ReplicaView("a", queued=5, rows_per_s=200.0), ReplicaView("b", queued=0, rows_per_s=100.0)]
    assert _route(policy, views) == "b"  # 6/200 > 1/100


def test_unreported_capacity_comes_from_this_callers_latencies():
    clock = Clock()
    policy = CapacityPolicy(clock=clock)
    for replica, seconds in (("reported", 0.1), ("new", 0.4)):
        policy.routed(replica)
        clock.t += seconds
        policy.completed(replica)
    caps = policy.capacities([ReplicaView("reported", rows_per_s=400.0), ReplicaView("new")])
    assert caps["new"] == pytest.approx(100.0)  # four times the latency: a quarter of the rate


def test_draining_replica_ranks_last():
    policy = CapacityPolicy(clock=Clock())
    ranks = policy.rank([ReplicaView("a", rows_per_s=500.0, draining=True), ReplicaView("b", rows_per_s=100.0),
                         ReplicaView("c", rows_per_s=100.0)])
    assert ranks[-1] == ["a"] and {r[0] for r in ranks[:-1]} == {"b", "c"}


def test_silent_replica_is_suspect_after_its_bound_until_it_answers():
    clock = Clock()
    policy = CapacityPolicy(lost_after_s=2.0, lost_over_service=20.0, clock=clock)
    views = [ReplicaView("a", rows_per_s=100.0), ReplicaView("b", rows_per_s=100.0)]
    for _ in range(5):  # usual latency 0.05 s: the bound is the floor, 2 s
        policy.routed("a")
        clock.t += 0.05
        policy.completed("a")
    policy.routed("a")
    clock.t += 1.9
    assert not policy.suspect("a")
    clock.t += 0.2
    assert policy.suspect("a") and policy.rank(views)[-1] == ["a"]
    clock.t += 2.1  # no trial while it holds a call: a copy of that call must go elsewhere
    assert policy.rank(views)[0] == ["b"] and policy.rank(views)[-1] == ["a"]
    policy.completed("a")  # it answered: back in the ranking
    assert not policy.suspect("a")
    assert sorted(policy.rank(views)) == [["a"], ["b"]], "no rank of demoted replicas"


def test_a_replica_silent_to_probes_is_suspect_and_an_idle_caller_is_not():
    clock = Clock()
    policy = CapacityPolicy(lost_after_s=2.0, clock=clock)
    views = [ReplicaView("a", rows_per_s=300.0), ReplicaView("b", rows_per_s=100.0)]
    assert policy.rank(views)[0] == ["a"]
    clock.t = 10.0  # an idle caller: the offer 10 s ago asked nothing of it
    assert policy.rank(views)[0] == ["a"] and not policy.suspect("a")
    for _ in range(4):  # offered for 0.4 s: not yet
        clock.t += 0.1
        policy.rank(views)
    assert not policy.suspect("a")
    for _ in range(2):  # offered for 0.6 s, never answering a probe nor taking a call
        clock.t += 0.1
        policy.rank(views)
    assert policy.suspect("a") and policy.rank(views)[0] == ["b"]
    policy.heard("a")  # it answered a probe
    assert not policy.suspect("a") and policy.rank(views)[0] == ["a"]


def test_any_silent_tells_a_stuck_replica_from_a_busy_one():
    clock = Clock()
    policy = CapacityPolicy(lost_after_s=2.0, lost_over_service=5.0, clock=clock)
    policy.routed("busy")
    policy.routed("busy")
    for _ in range(30):  # a busy replica: calls wait long, but it answers all the time
        clock.t += 0.1
        policy.completed("busy")
        policy.routed("busy")
    assert not policy.any_silent()
    policy.routed("stuck")
    clock.t += 2.5
    policy.completed("busy")
    assert policy.silent("stuck") and not policy.silent("busy") and policy.any_silent()
    from serving.runtime.router_policies import POLICIES
    from serving.runtime.routing import any_silent

    assert any_silent("no-app", "no-deployment") is None
    POLICIES[("app", "app-cheap")] = policy
    try:
        assert any_silent("app", "app-cheap") is True
    finally:
        POLICIES.pop(("app", "app-cheap"))


def test_bound_scales_with_a_slow_replicas_usual_latency():
    clock = Clock()
    policy = CapacityPolicy(lost_after_s=2.0, lost_over_service=20.0, clock=clock)
    policy.routed("a")
    clock.t += 0.5
    policy.completed("a")
    assert policy.bound_s("a") == pytest.approx(10.0)
    assert policy.bound_s("unknown") == pytest.approx(2.0)


def test_calls_end_oldest_first_and_a_removed_replica_is_forgotten():
    """Serve tells a router of sends and completions by replica only: a completion closes the
    oldest call open there."""
    clock = Clock()
    policy = CapacityPolicy(clock=clock)
    policy.routed("a")
    clock.t = 1.0
    policy.routed("a")
    policy.routed("b")
    clock.t = 3.0
    policy.completed("a")
    assert policy.latency["a"] == pytest.approx(3.0) and list(policy.sent["a"]) == [1.0]
    assert policy.outstanding == {"a": 1, "b": 1}
    policy.completed("c")  # nothing open there: ignored
    policy.forget("a")
    assert "a" not in policy.sent and "a" not in policy.outstanding


def test_arguments_and_config():
    with pytest.raises(ValueError, match="lost_after_s"):
        CapacityPolicy(lost_after_s=0)
    cfg = router_config(lost_after_s=3.0)
    assert cfg["request_router_class"] == "serving.runtime.routing:CapacityRouter"
    assert cfg["request_router_kwargs"] == {"lost_after_s": 3.0}
    from ray.serve.config import RequestRouterConfig

    RequestRouterConfig(**cfg)  # Serve accepts it as it stands


def test_node_emulation_holds_and_straggles(tmp_path, monkeypatch):
    from serving.runtime import emulated_node
    from serving.runtime.emulated_node import NodeEmulation, node_emulation

    assert not node_emulation().active, "outside Ray, or without labels, a replica computes as it is"
    slow = NodeEmulation(slowdown=3.0)
    assert slow.active and slow.hold_s(0.01) == pytest.approx(0.02)
    monkeypatch.setattr(emulated_node, "STRAGGLE_SWITCH", str(tmp_path / "off"))
    straggler = NodeEmulation(slowdown=2.0, straggle_factor=10.0, straggle_share=0.1, seed=3)
    holds = [straggler.hold_s(0.01) for _ in range(2000)]
    slow_share = sum(h > 0.05 for h in holds) / len(holds)
    assert 0.07 < slow_share < 0.13 and max(holds) == pytest.approx(0.19)
    (tmp_path / "off").touch()  # the benchmark's switch: no straggling while it exists
    assert max(straggler.hold_s(0.01) for _ in range(200)) == pytest.approx(0.01)
    assert NodeEmulation(slowdown=0.5, straggle_share=2.0).slowdown == 1.0
    # a device of a fixed speed: at least ms_per_row a row, whatever the compute took
    fixed = NodeEmulation(ms_per_row=2.0)
    assert fixed.active and fixed.hold_s(0.01, rows=32) == pytest.approx(0.064 - 0.01)
    assert fixed.hold_s(0.1, rows=32) == 0.0  # a machine slower than the device: the compute bounds it


def test_a_node_can_emulate_a_device_whose_speed_differs_per_stage(monkeypatch):
    """``willump.io/emulated-slowdown-<stage>`` (and ``-ms-per-row-<stage>``) override the node's
    own for that stage only."""
    import ray

    from serving.runtime.emulated_node import MS_PER_ROW_LABEL, SLOWDOWN_LABEL, node_emulation

    labels = {SLOWDOWN_LABEL: "2", f"{SLOWDOWN_LABEL}-expensive": "8", f"{MS_PER_ROW_LABEL}-cheap": "1.5"}

    class Context:
        def get_node_labels(self):
            return labels

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    assert node_emulation().slowdown == 2.0
    assert node_emulation(stage="cheap").slowdown == 2.0
    assert node_emulation(stage="expensive").slowdown == 8.0
    assert node_emulation(stage="cheap").ms_per_row == 1.5 and node_emulation(stage="expensive").ms_per_row == 0.0


def test_usable_replicas_leave_out_draining_and_silent_ones_and_follow_serves_set():
    """What a caller choosing among deployments counts on (serving.runtime.pools): nothing known
    before a routing step; then the replicas of the last step neither draining nor silent; Serve's
    new replica set replaces the old one (the new replicas count until seen otherwise)."""
    from serving.runtime.routing import VIEW_FRESH_S

    clock = Clock()
    policy = CapacityPolicy(lost_after_s=1.0, clock=clock)
    assert policy.usable() is None
    views = [ReplicaView("a", 0, 100.0), ReplicaView("b", 0, 100.0), ReplicaView("c", 0, 100.0, draining=True)]
    policy.rank(views)
    assert policy.usable() == 2
    policy.routed("a")
    policy.routed("b")
    clock.t = 1.5  # both hold a call unanswered past the bound: a node lost without notice
    assert policy.usable() == 0
    policy.replicas_now({"d": False, "e": False})  # Serve's set after the node's replicas are gone
    assert policy.usable() == 2
    policy.forget("d")
    assert policy.usable() == 1
    policy.replicas_now({})  # Serve routes to none of this deployment's replicas
    assert policy.usable() == 0
    clock.t += VIEW_FRESH_S + 0.1  # nothing routed here since: the view is stale, unknown again
    assert policy.usable() is None


def test_nodes_to_avoid_are_the_draining_and_the_dead(monkeypatch):
    """The GCS's answers read through a stand-in client: a node draining on notice and one the GCS
    holds dead (lost without notice) are both avoided; an unreachable GCS avoids nothing."""
    import ray._private.worker as worker

    from serving.runtime import routing

    class NodeId:
        def __init__(self, h: str):
            self.h = h

        def hex(self) -> str:
            return self.h

    class Info:
        def __init__(self, state: int):
            self.state = state

    class Client:
        def get_draining_nodes(self, timeout=None):
            return [b"aa".hex()]

        def get_all_node_info(self, timeout=None):
            return {NodeId("bb"): Info(routing.ALIVE_STATE), NodeId("cc"): Info(routing.ALIVE_STATE + 1)}

    monkeypatch.setattr(worker.global_worker, "gcs_client", Client(), raising=False)
    assert routing.dead_nodes() == {"cc"} and routing.nodes_to_avoid() == {b"aa".hex(), "cc"}

    class Down:
        def __getattr__(self, name):
            raise ConnectionError("no GCS")

    monkeypatch.setattr(worker.global_worker, "gcs_client", Down(), raising=False)
    assert routing.nodes_to_avoid() == set()


def test_the_router_serve_ships_registers_where_the_ingress_looks():
    """Serve ships a custom router by value (its module pickled with it): a policy registered in a
    global of that module was a copy the ingress never saw, so ``any_silent`` read None for every
    stage and every call was copied at the bound, even to the replica holding the first."""
    from ray.serve.config import RequestRouterConfig

    from serving.runtime.router_policies import POLICIES
    from serving.runtime.routing import ROUTER_PATH, CapacityRouter, any_silent, usable_replicas

    # loaded in the process that pickled it, cloudpickle hands back this very class with its
    # methods replaced by the shipped copies: put the module's own back afterwards
    saved = {k: v for k, v in vars(CapacityRouter).items() if k not in ("__dict__", "__weakref__")}
    shipped = RequestRouterConfig(request_router_class=ROUTER_PATH).get_request_router_class()
    router = shipped.__new__(shipped)  # the class as a replica's handle builds it
    router._deployment_id = types.SimpleNamespace(app_name="shipped-app", name="shipped-app-cheap")
    try:
        router.initialize_state(lost_after_s=2.0)
        assert POLICIES[("shipped-app", "shipped-app-cheap")] is router.policy
        policy = router.policy
        policy.routed("frozen")
        policy.clock = lambda: math.inf
        assert any_silent("shipped-app", "shipped-app-cheap") is True
        assert usable_replicas("shipped-app", "shipped-app-cheap") is None  # no routing step yet
        from serving.runtime import cancelled_calls

        # the shipped router books a cancelled call's end in the process's own notes
        assert router.on_request_completed.__globals__["cancelled_calls"] is cancelled_calls
    finally:
        POLICIES.pop(("shipped-app", "shipped-app-cheap"), None)
        for key, value in saved.items():
            setattr(CapacityRouter, key, value)
    assert CapacityRouter.choose_replicas.__globals__ is vars(sys.modules[CapacityRouter.__module__])


def test_overlapping_calls_share_the_busy_time():
    """Two calls overlapping for 1 s of a replica's 3 busy seconds: each moment is divided among
    the calls running then, so their figures (1.5 + 1.5) add up to the busy time, not to their
    wall times (2 + 2)."""
    clock = Clock()
    meter = BusyMeter(clock)
    a = meter.start()
    clock.t = 1.0
    b = meter.start()
    clock.t = 2.0
    a_busy = meter.call_busy_s(a)
    meter.stop(10)
    clock.t = 3.0
    b_busy = meter.call_busy_s(b)
    meter.stop(10)
    assert (a_busy, b_busy) == (pytest.approx(1.5), pytest.approx(1.5))
    assert meter.autoscaling_stats()["busy_share"] == pytest.approx(1.0)


def test_calls_outside_the_levels_are_metered_and_timed_on_request():
    """The full pipeline's calls (the live audit, a held gear 0) run in a thread, the audit's in
    pieces of the stage's batch rows until their cost is known, and count in the replica's meter as work every
    gear gives the stage alike (neither their rows nor their time in its rates per row); an ingress
    asking for the time gets the busy seconds beside the probabilities (an ingress of earlier
    code, asking without, gets the array)."""
    from serving.runtime.replicas import ModelStage

    threads, pieces = [], []

    def full_proba(rows):
        threads.append(threading.get_ident())
        pieces.append(rows["x"].tolist())
        time.sleep(0.01)
        return np.column_stack([rows["x"], -rows["x"]]).astype(float)

    runner = types.SimpleNamespace(full_proba=full_proba, full_scores=lambda rows, c: full_proba(rows)[:, c])
    stage = ModelStage.func_or_class(None, None, runner=runner, batching=False, inline=True)
    rows = pd.DataFrame({"x": range(4)})

    async def calls() -> tuple:
        return await stage.full_proba(rows, True), await stage.full_proba(rows), threading.get_ident()

    timed, plain, loop_thread = asyncio.run(calls())
    before = len(pieces)
    in_pieces = asyncio.run(stage.full_proba(rows, True, True))  # the audit's, timed: pieces
    np.testing.assert_array_equal(in_pieces["proba"], plain)
    assert in_pieces["busy_s"] >= 0.01 and [x for p in pieces[before:] for x in p] == [0, 1, 2, 3]
    del pieces[before:]
    scored = asyncio.run(stage.full_scores(rows, 0, True))  # top-K's, whole and timed
    np.testing.assert_array_equal(scored["scores"], range(4))
    assert scored["busy_s"] >= 0.01 and pieces[-1] == [0, 1, 2, 3]
    del pieces[-1]
    assert isinstance(plain, np.ndarray) and plain.shape == (4, 2) and loop_thread not in threads
    # the timed call (a request waits on it) runs whole; the audit's in pieces, the first of one
    # row (no cost measured yet), the next as many as PIECE_S holds at that cost
    assert pieces[0] == [0, 1, 2, 3] and pieces[1] == [0] and [x for p in pieces[1:] for x in p] == [0, 1, 2, 3]
    np.testing.assert_array_equal(plain[:, 0], range(4))
    assert set(timed) == {"proba", "busy_s"} and timed["busy_s"] >= 0.01
    np.testing.assert_array_equal(timed["proba"], plain)
    assert stage.meter.total_rows == 16 and stage.meter.window_unscaled_s >= 0.04 and stage.meter.window_rows == 0
    # the audit's calls (in pieces) are held apart for the autoscaler's saturation rule, the
    # whole of their stay; the timed whole calls and top-K's are not
    assert stage.meter.held_deferrable == 0 and stage.meter.window_held_deferrable_s >= 0.02


def test_audit_calls_come_in_pieces_of_a_short_time():
    """A piece is one row until a piece's cost is known, then the rows that take PIECE_S at the
    measured cost (at least one); pieces are indexed from 0."""
    from serving.runtime.outside_calls import PIECE_S, PieceSize

    size = PieceSize()
    assert size.rows_per_piece() == 1
    frame = pd.DataFrame({"x": range(70)}, index=range(100, 170))
    size.observe(1, 0.05)  # 50 ms a row: two rows a piece
    parts = list(size.pieces(frame))
    assert [len(p) for p in parts] == [2] * 35 and all(p.index[0] == 0 for p in parts)
    size.observe(2, 2.0)  # a second a row now weighs in: one row a piece
    assert size.rows_per_piece() == 1
    cheap = PieceSize()
    cheap.observe(128, 128 * 0.0002)  # 0.2 ms a row: PIECE_S holds 500 rows
    assert cheap.rows_per_piece() == int(PIECE_S / 0.0002)
    assert next(iter(cheap.pieces(frame))) is frame
    free = PieceSize()
    free.observe(10, 0.0)
    assert next(iter(free.pieces(frame))) is frame
    for kw, match in (({"piece_s": 0.0}, "piece_s"), ({"half_life_rows": 0}, "half_life_rows")):
        with pytest.raises(ValueError, match=match):
            PieceSize(**kw)


def test_a_cancelled_stage_call_stays_metered_until_its_work_ends():
    """A hedge's losing copy (or a call past its deadline) is cancelled at the replica while its
    thread computes: the thread cannot stop, so the replica stays busy for the meter, and on an
    emulated device stays held, until the work ends. Before, the cancel stopped the meter at once
    (the replica read faster than it was, its rows counted and its busy time cut short) and freed
    the emulated device for the next call beside the running one."""
    from serving.runtime.replicas import ModelStage

    release, entered = threading.Event(), threading.Event()
    running, most = [0], [0]

    def full_scores(rows, c):
        running[0] += 1
        most[0] = max(most[0], running[0])
        entered.set()
        try:
            assert release.wait(10.0)
            return rows["x"].to_numpy(dtype=float)
        finally:
            running[0] -= 1

    stage = ModelStage.func_or_class(None, None, runner=types.SimpleNamespace(full_scores=full_scores),
                                     batching=False)
    stage._emulated = asyncio.Lock()  # as on an emulated device: one call at a time
    rows = pd.DataFrame({"x": range(4)})

    async def run() -> tuple:
        first = asyncio.ensure_future(stage.full_scores(rows, 0))
        while not entered.is_set():
            await asyncio.sleep(0.005)
        first.cancel()  # the caller gave up; the thread goes on
        with contextlib.suppress(asyncio.CancelledError):
            await first
        busy_after_cancel = stage.meter.active
        second = asyncio.ensure_future(stage.full_scores(rows, 0))
        await asyncio.sleep(0.05)
        release.set()
        return busy_after_cancel, await second

    busy, scores = asyncio.run(run())
    assert busy == 1  # the cancelled call still computes
    assert most[0] == 1  # the next call waited for the device
    np.testing.assert_array_equal(scores, range(4))
    assert stage.meter.active == 0 and stage.meter.total_rows == 8  # both calls' rows, once each


def test_the_meter_counts_the_ingress_replicas_that_call_lately():
    from serving.runtime.routing import CALLER_FRESH_S

    now = [0.0]
    meter = BusyMeter(clock=lambda: now[0])
    meter.note_backlog("ingress-a", 10)
    meter.note_backlog("ingress-b", 0)
    meter.note_backlog("ingress-a", 5)
    assert meter.autoscaling_stats()["ingress_callers"] == 2.0
    now[0] += CALLER_FRESH_S - 1
    meter.note_backlog("ingress-b", 0)
    now[0] += 2  # ingress-a silent past the freshness: gone (scaled down, replaced)
    assert meter.autoscaling_stats()["ingress_callers"] == 1.0
