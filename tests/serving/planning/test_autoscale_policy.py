"""The planner as Serve's autoscaler (serving.planning.autoscale), on plain objects: replicas
from the replicas' worth of work the stage's replicas measure (their busy shares) over the
planner's headroom; one more replica whenever every call slot the ingress keeps is taken;
nothing reported yet, what there is; bad figures refused by name; the policy entry accepted by
Serve's own config."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from serving.core.constants import CONCURRENT_BATCHES
from serving.planning.autoscale import (
    BACKLOG_METRIC,
    BUSY_METRIC,
    CALLERS_METRIC,
    COST_METRIC,
    DEFERRABLE_METRIC,
    DEFERRABLE_ONGOING_METRIC,
    DEPLOYED_GEAR_BUSY_METRIC,
    POLICY_PATH,
    ROWS_METRIC,
    SCALE_LOG,
    START_LOG,
    PlannerAutoscaler,
    planned_replicas,
    policy_config,
)
from serving.planning.planner import HEADROOM


def _ctx(current: int, busy: dict[str, float] | None, ongoing: float = 0.0, target: int | None = None,
         raw: dict[str, list[tuple[float, float]]] | None = None,
         backlog: dict[str, dict[str, list[tuple[float, float]]]] | None = None):
    metrics = {} if busy is None else {BUSY_METRIC: busy, ROWS_METRIC: {k: 100.0 * v for k, v in busy.items()}}

    def series(replicas: dict[str, list[tuple[float, float]]]) -> dict:
        return {k: [SimpleNamespace(timestamp=t, value=v) for t, v in points] for k, points in replicas.items()}

    raw_metrics = {BUSY_METRIC: series(raw)} if raw else {}
    raw_metrics.update({metric: series(replicas) for metric, replicas in (backlog or {}).items()})
    return SimpleNamespace(current_num_replicas=current, target_num_replicas=current if target is None else target,
                           total_num_requests=ongoing, aggregated_metrics=metrics, raw_metrics=raw_metrics)


def test_a_rise_is_read_from_the_latest_reports_a_lull_from_the_whole_window():
    """Up fast, down slowly: a burst in the last seconds counts before the window's mean has it;
    a quiet last few seconds do not pull below the window's mean."""
    policy = PlannerAutoscaler(headroom=1.0, react_s=2.0)
    rising = {"r1": [(t, 0.2) for t in range(10)] + [(10.0, 1.0), (11.0, 1.0)]}
    wanted, state = policy(_ctx(1, {"r1": 0.33}, raw=rising))
    assert state["busy_replicas_recent"] == pytest.approx(1.0) and wanted == pytest.approx(1.0)
    falling = {"r1": [(t, 0.9) for t in range(10)] + [(10.0, 0.0), (11.0, 0.0)]}
    wanted, _ = policy(_ctx(1, {"r1": 0.75}, raw=falling))
    assert wanted == pytest.approx(0.75)  # the window's mean, not the last seconds'


def test_replicas_follow_the_work_the_replicas_measure():
    policy = PlannerAutoscaler()
    wanted, state = policy(_ctx(2, {"r1": 0.9, "r2": 0.6}, ongoing=3))
    assert wanted == pytest.approx(1.5 / HEADROOM) and not state["saturated"]
    assert state["busy_replicas"] == pytest.approx(1.5) and state["rows_per_s"] == pytest.approx(150.0)
    wanted, _ = policy(_ctx(3, {"r1": 0.1, "r2": 0.05, "r3": 0.0}))  # quiet: fewer replicas
    assert wanted == pytest.approx(0.15 / HEADROOM) and wanted < 1
    assert planned_replicas(1.5, headroom=0.5) == pytest.approx(3.0)


def test_a_saturated_stage_gets_one_more_replica_than_it_has():
    """Busy shares are capped by the replicas there are; the queue says there is more."""
    policy = PlannerAutoscaler(headroom=1.0)
    wanted, state = policy(_ctx(2, {"r1": 1.0, "r2": 1.0}, ongoing=2 * CONCURRENT_BATCHES))
    assert wanted == 3 and state["saturated"]
    # Serve's count is a mean over its window: 90% of the slots taken reads as saturated
    wanted, _ = policy(_ctx(2, {"r1": 1.0, "r2": 1.0}, ongoing=0.9 * 2 * CONCURRENT_BATCHES))
    assert wanted == 3
    wanted, _ = policy(_ctx(2, {"r1": 1.0, "r2": 1.0}, ongoing=0.8 * 2 * CONCURRENT_BATCHES))
    assert wanted == pytest.approx(2.0)


def test_the_audits_calls_in_serves_count_are_no_saturation():
    """Serve counts a live audit call as ongoing while it waits its turn in pieces: with the
    request path at 80% of the slots and one audit call held per replica, Serve's count crosses
    90%, yet only the request path's share is read (the replicas report the audit's calls apart)."""
    policy = PlannerAutoscaler(headroom=1.0)
    ctx = _ctx(2, {"r1": 0.7, "r2": 0.7}, ongoing=0.8 * 2 * CONCURRENT_BATCHES + 2)
    assert policy(ctx)[1]["saturated"]  # a replica of earlier code reports no audit calls: read as before
    ctx.aggregated_metrics[DEFERRABLE_ONGOING_METRIC] = {"r1": 1.0, "r2": 1.0}
    wanted, state = policy(ctx)
    assert not state["saturated"] and wanted == pytest.approx(1.4)
    assert state["ongoing"] == pytest.approx(0.8 * 2 * CONCURRENT_BATCHES) and state["audit_ongoing"] == 2.0


def test_work_queued_at_the_ingresses_is_asked_for_in_one_step():
    """A burst queues rows at the ingresses faster than the replicas there are can take them:
    their busy shares are capped, and one replica more per start time left the queue to grow.
    The rows queued (the largest any replica heard, the latest report each) times what a row
    costs (the replicas' median) over DRAIN_S are the replicas the queue needs beside the load."""
    policy = PlannerAutoscaler(headroom=1.0, drain_s=4.0)
    queued = {BACKLOG_METRIC: {"r1": [(9.0, 6000.0), (10.0, 4000.0)], "r2": [(10.0, 3000.0)]},
              COST_METRIC: {"r1": [(10.0, 0.003)], "r2": [(10.0, 0.002), (10.5, 0.0)]}}
    wanted, state = policy(_ctx(2, {"r1": 1.0, "r2": 1.0}, ongoing=2 * CONCURRENT_BATCHES, backlog=queued))
    # 4,000 rows x 2.5 ms / 4 s = 2.5 replicas' worth beside the 2 busy ones
    assert state["queued_rows"] == 4000 and state["queued_replicas"] == pytest.approx(2.5)
    assert wanted == pytest.approx(4.5)
    stale = {BACKLOG_METRIC: {"r1": [(1.0, 4000.0)], "r2": [(10.0, 0.0)]}, COST_METRIC: queued[COST_METRIC]}
    assert policy(_ctx(2, {"r1": 0.5, "r2": 0.5}, backlog=stale))[0] == pytest.approx(1.0)  # older than react_s
    no_cost = {BACKLOG_METRIC: queued[BACKLOG_METRIC]}
    assert policy(_ctx(2, {"r1": 0.5, "r2": 0.5}, backlog=no_cost))[0] == pytest.approx(1.0)  # nothing to price it
    with pytest.raises(ValueError, match="drain_s"):
        PlannerAutoscaler(drain_s=0)


def test_a_cheaper_gear_answering_a_burst_still_gets_the_deployed_gears_replicas():
    """The app serves a burst in a cheaper gear, whose rows keep the stage's one replica 40% busy;
    the deployed gear would send 4 times the rows: the policy asks for the replicas of that load
    (sized on the busy share alone it would keep one replica and the app in the cheaper gear).
    A replica of the previous code, reporting no deployed-gear share, is read as before."""
    policy = PlannerAutoscaler(headroom=0.8, react_s=2.0)
    ctx = _ctx(1, {"r1": 0.4})
    ctx.aggregated_metrics[DEPLOYED_GEAR_BUSY_METRIC] = {"r1": 1.6}
    ctx.raw_metrics[DEPLOYED_GEAR_BUSY_METRIC] = {"r1": [SimpleNamespace(timestamp=t, value=1.6) for t in range(3)]}
    wanted, state = policy(ctx)
    assert wanted == pytest.approx(1.6 / 0.8)
    assert state["busy_replicas"] == pytest.approx(0.4) and state["deployed_gear_busy_replicas"] == pytest.approx(1.6)
    wanted, state = policy(_ctx(1, {"r1": 0.4}))
    assert wanted == pytest.approx(0.4 / 0.8) and state["deployed_gear_busy_replicas"] == pytest.approx(0.4)
    # a rolling update: r1 runs this code, r2 the previous one (no deployed-gear share): each counts
    ctx = _ctx(2, {"r1": 0.4, "r2": 0.5})
    ctx.aggregated_metrics[DEPLOYED_GEAR_BUSY_METRIC] = {"r1": 1.6}
    wanted, state = policy(ctx)
    assert state["deployed_gear_busy_replicas"] == pytest.approx(2.1) and wanted == pytest.approx(2.1 / 0.8)


def test_the_audits_paced_load_counts_over_the_window_and_never_as_a_burst(caplog):
    """One replica at 0.25 of the request path's work and 0.45 of the live audit's (paced by the
    ingress to the room left below AUDIT_ROOM): the window's reading plans both; the recent one
    leaves the audit out, so a moment of the audit filling the room asks for no replica. A rise of
    the request path's own still does, and the policy says why in Serve's controller log, once
    per ask."""
    policy = PlannerAutoscaler(headroom=0.75, react_s=2.0)

    def ctx(recent_busy: float, current: int = 1, before: dict | None = None):
        c = _ctx(current, {"r1": 0.7}, raw={"r1": [(t, 0.7) for t in range(8)] + [(8.0, recent_busy), (9.0, recent_busy)]})
        c.aggregated_metrics[DEFERRABLE_METRIC] = {"r1": 0.45}
        c.raw_metrics[DEFERRABLE_METRIC] = {"r1": [SimpleNamespace(timestamp=t, value=0.45) for t in range(10)]}
        c.app_name, c.deployment_name, c.policy_state = "app", "expensive", before or {}
        return c

    with caplog.at_level(logging.INFO, logger="ray.serve"):
        wanted, state = policy(ctx(0.74))  # the audit filling the room: 0.29 recent, 0.7 over the window
        assert state["busy_replicas_recent"] == pytest.approx(0.29) and wanted == pytest.approx(0.7 / 0.75)
        assert state["deferrable_busy_replicas"] == pytest.approx(0.45) and state["asked"] == 1
        wanted, state = policy(ctx(1.0))  # the device full: the request path's 0.55 of it is no burst
        assert state["busy_replicas_recent"] == pytest.approx(0.55) and state["asked"] == 1
        wanted, state = policy(ctx(1.45))  # to 1.0: two replicas' worth at the headroom
        assert wanted == pytest.approx(1.0 / 0.75) and state["asked"] == 2
        policy(ctx(1.45, before=state))  # the same ask again: not logged twice
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(SCALE_LOG)]
    assert len(lines) == 1 and lines[0].startswith(f"{SCALE_LOG} app/expensive: 2 replicas") and "less the audit's 0.45" in lines[0]


def test_nothing_reported_keeps_what_there_is():
    assert PlannerAutoscaler()(_ctx(2, None, target=2))[0] == 2


def test_bad_figures_are_refused_by_name():
    for kwargs, name in (({"headroom": 0.0}, "headroom"), ({"headroom": 1.5}, "headroom"),
                         ({"headroom": True}, "headroom"), ({"saturated_ongoing": 0}, "saturated_ongoing"),
                         ({"react_s": 0}, "react_s")):
        with pytest.raises(ValueError, match=name):
            PlannerAutoscaler(**kwargs)
    with pytest.raises(ValueError, match="headroom"):
        policy_config(2.0)


def test_the_policy_entry_is_one_serve_accepts_and_builds():
    """Serve's AutoscalingConfig takes the entry as a config file holds it; the class it names is
    what Serve builds with the kwargs (Serve's controller unpickles the same)."""
    from ray.serve.config import AutoscalingConfig

    entry = policy_config()
    assert entry == {"policy_function": POLICY_PATH,
                     "policy_kwargs": {"headroom": HEADROOM, "saturated_ongoing": float(CONCURRENT_BATCHES)}}
    assert policy_config(ingress_replicas=2)["policy_kwargs"]["saturated_ongoing"] == 2 * CONCURRENT_BATCHES
    config = AutoscalingConfig(min_replicas=0, max_replicas=4, policy=entry)
    assert config.policy.policy_function == POLICY_PATH
    built = config.policy.get_policy()(**config.policy.policy_kwargs)
    assert built.headroom == HEADROOM


def _walk(policy: PlannerAutoscaler, steps: list[tuple[float, int, int]], busy: dict[str, float] | None = None,
          backlog: dict | None = None) -> dict:
    """Call the policy as Serve's controller does, at each (time, target, running), carrying the
    state it returns into the next call's ``policy_state``; the last state."""
    state: dict = {}
    for now, target, running in steps:
        ctx = _ctx(running, busy, target=target, backlog=backlog)
        ctx.current_time, ctx.policy_state = now, dict(state)
        _, state = policy(ctx)
    return state


def test_a_replica_start_is_measured_from_serves_own_counts(caplog):
    """Two replicas asked for at t=10 come up at 14 and 16: starts of 4 and 6 s, median 5, each
    logged where Serve's controller logs."""
    policy = PlannerAutoscaler(headroom=1.0)
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        state = _walk(policy, [(9.0, 1, 1), (10.0, 1, 1), (10.2, 3, 1), (14.0, 3, 2), (15.0, 3, 2), (16.0, 3, 3)],
                      busy={"r1": 0.5})
    assert state["start_samples_s"] == pytest.approx([4.0, 6.0]) and state["replica_start_s"] == pytest.approx(5.0)
    assert state["start_asked_at"] == [] and state["drain_s"] == pytest.approx(5.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(START_LOG)]
    assert lines[-1].endswith("replica start 6.00 s; start time 5.00 s (median of the latest 2)"), lines


def test_a_start_from_zero_counts_from_the_last_call_before_serves_fast_path():
    """At zero with no request Serve calls the policy; once requests wait it scales to one without
    calling it (its cold-start path). The start counts from the last call before: 7 s here; the
    state keeps it for the next start from zero."""
    policy = PlannerAutoscaler()
    state = _walk(policy, [(t, 0, 0) for t in range(6)] + [(12.0, 1, 1)])
    assert state["replica_start_s"] == pytest.approx(7.0)
    ctx = _ctx(0, None, target=0)
    ctx.current_time, ctx.policy_state = 100.0, dict(state)
    assert policy(ctx)[1]["replica_start_s"] == pytest.approx(7.0)


def test_a_lost_replica_replaced_is_a_start_and_a_withdrawn_ask_is_none():
    policy = PlannerAutoscaler()
    # r2 lost at 20 (running 2 -> 1, target kept): Serve replaces it, up at 23
    assert _walk(policy, [(19.0, 2, 2), (20.0, 2, 1), (23.0, 2, 2)])["start_samples_s"] == pytest.approx([3.0])
    # two asked at the call of 30 (the target rose after it), one withdrawn at 31: one start of 6 s
    state = _walk(policy, [(30.0, 2, 2), (30.5, 4, 2), (31.0, 3, 2), (36.0, 3, 3)])
    assert state["start_samples_s"] == pytest.approx([6.0]) and state["start_asked_at"] == []


def test_the_queue_drains_within_the_measured_start_time():
    """The rows queued at the ingresses are asked for over the measured start time (2 s here),
    not the DRAIN_S typed in before any start was seen; measure_start=False keeps drain_s."""
    queued = {BACKLOG_METRIC: {"r1": [(10.0, 4000.0)]}, COST_METRIC: {"r1": [(10.0, 0.002)]}}
    steps = [(0.0, 1, 1), (1.0, 1, 1), (1.1, 2, 1), (3.0, 2, 2), (3.5, 2, 2)]
    state = _walk(PlannerAutoscaler(headroom=1.0, drain_s=4.0), steps, busy={"r1": 1.0, "r2": 1.0}, backlog=queued)
    assert state["replica_start_s"] == pytest.approx(2.0)
    assert state["queued_replicas"] == pytest.approx(4000 * 0.002 / 2.0) and state["wanted"] == pytest.approx(6.0)
    fixed = _walk(PlannerAutoscaler(headroom=1.0, drain_s=4.0, measure_start=False), steps,
                  busy={"r1": 1.0, "r2": 1.0}, backlog=queued)
    assert "replica_start_s" not in fixed and fixed["queued_replicas"] == pytest.approx(2.0)


def test_replicas_are_matched_by_id_where_serve_gives_them():
    """Serve's running replica ids: a replica swapped for another within one call (lost and
    replaced between two looks) is no start of about nothing; a new one after an ask is."""
    policy = PlannerAutoscaler()
    state: dict = {}
    for now, target, ids in [(0.0, 2, ["a", "b"]), (1.0, 2, ["a", "c"]),  # b swapped for c unseen
                             (2.0, 2, ["a", "c"]), (2.5, 3, ["a", "c"]), (6.5, 3, ["a", "c", "d"])]:
        ctx = _ctx(len(ids), None, target=target)
        ctx.current_time, ctx.policy_state, ctx.running_replicas = now, dict(state), ids
        _, state = policy(ctx)
    assert state["start_samples_s"] == pytest.approx([4.5]) and state["running_ids"] == ["a", "c", "d"]


def test_the_answer_serve_rounds_up_is_the_count_the_policy_names():
    """Busy shares whose sum over the headroom is one replica up to float noise ask for one
    replica: Serve rounds the answer up, and 1.0000000000000002 asked for two."""
    policy = PlannerAutoscaler(headroom=0.75)
    wanted, state = policy(_ctx(4, {"r1": 0.2, "r2": 0.2, "r3": 0.2, "r4": 0.15}))
    assert wanted == 1.0 and state["asked"] == 1


def test_each_replica_is_read_on_its_own_reports():
    """Replicas push at their own phases and clocks: a replica just started (nothing queued, no
    cost yet) that pushed last does not hide the backlog another reported 3.9 s before (read
    against the newest report of any replica within react_s, it did); a replica silent for
    longer than STALE_REPORT_S by the controller's clock no longer counts."""
    policy = PlannerAutoscaler(headroom=1.0, drain_s=4.0)
    queued = {BACKLOG_METRIC: {"old": [(98.0, 300.0), (100.0, 400.0)], "new": [(103.9, 0.0)]},
              COST_METRIC: {"old": [(100.0, 0.02)], "new": [(103.9, 0.0)]}}
    _, state = policy(_ctx(2, {"old": 1.0, "new": 0.0}, backlog=queued))
    assert state["queued_rows"] == 400 and state["queued_replicas"] == pytest.approx(400 * 0.02 / 4.0)
    ctx = _ctx(2, {"old": 1.0, "new": 0.0}, backlog=queued)
    ctx.current_time = 106.0  # "old" silent for 6 s
    assert policy(ctx)[1]["queued_rows"] == 0


def test_the_saturation_rule_counts_the_ingress_replicas_that_call():
    """An operator edits a built config to two ingress replicas against the planned one: their
    calls in flight doubled, and every tick read as saturated (one replica more each time, up to
    max_replicas). The stage replicas report the ingress replicas that call them; the rule counts
    those slots (the planned count until they report)."""
    policy = PlannerAutoscaler(headroom=1.0, saturated_ongoing=CONCURRENT_BATCHES)  # planned: 1 ingress
    ctx = _ctx(2, {"r1": 0.7, "r2": 0.7}, ongoing=0.9 * 2 * 2 * CONCURRENT_BATCHES * 0.6)
    assert policy(ctx)[1]["saturated"]  # read against one ingress's slots
    ctx.aggregated_metrics[CALLERS_METRIC] = {"r1": 2.0, "r2": 1.8}
    wanted, state = policy(ctx)
    assert not state["saturated"] and state["saturated_ongoing"] == 2 * CONCURRENT_BATCHES
    assert wanted == pytest.approx(1.4)
    ctx = _ctx(2, {"r1": 1.0, "r2": 1.0}, ongoing=2 * 2 * CONCURRENT_BATCHES)  # both ingresses' slots taken
    ctx.aggregated_metrics[CALLERS_METRIC] = {"r1": 2.0, "r2": 2.0}
    assert policy(ctx)[0] == 3
