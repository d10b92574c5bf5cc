"""Load-adaptive gears without Ray: the switching policy on a fake clock and synthetic queue
signals, the ingress's switch, the stage runners per gear, and the ingress's batching by gear."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from serving.core.specs import stage_specs
from serving.runtime.calls import Deadline
from serving.runtime.coalesce import Coalescer
from serving.runtime.gears import (
    DEMAND_MIN_ROWS,
    GearDemand,
    GearPolicy,
    GearRunners,
    GearSwitch,
    check_gears,
    gear_info,
    ladder,
)
from serving.runtime.records import record_columns
from serving.runtime.stage_load import StageLoad
from serving.runtime.stage_runner import StageRunner, merge_chunks, with_busy_s
from tests.willump.synth import make_rows


class Clock:
    """A fake monotonic clock the tests move by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def geared(geared_opt):
    return geared_opt


def policy(**kw) -> GearPolicy:
    return GearPolicy(3, slo_ms=100.0, **{"up_at": 0.5, "down_at": 0.2, "up_interval_s": 0.25,
                                          "down_after_s": 2.0, "window_s": 1.0, **kw})


def test_policy_steps_up_one_gear_per_interval_while_the_queue_is_old():
    p = policy()
    assert p.update(0.0, oldest_ms=10.0) == 0  # well inside the SLO
    assert p.update(0.1, oldest_ms=60.0) == 1  # past half the SLO: one step
    assert p.update(0.2, oldest_ms=90.0) == 1  # too soon for another
    assert p.update(0.4, oldest_ms=90.0) == 2
    assert p.update(0.7, oldest_ms=500.0) == 2  # the cheapest gear is the last
    assert p.switches == 2


def test_policy_steps_back_only_after_a_calm_dwell_and_one_gear_at_a_time():
    p = policy()
    for t, gear in ((0.0, 1), (0.3, 2)):
        assert p.update(t, oldest_ms=80.0) == gear
    assert p.update(1.0, oldest_ms=5.0) == 2  # calm since 0.3, when the signal was last seen hot
    assert p.update(2.2, oldest_ms=5.0) == 2  # not calm long enough
    assert p.update(2.5, oldest_ms=5.0) == 1  # 2 s calm: one step back
    assert p.update(4.0, oldest_ms=5.0) == 1  # the next step needs another full calm period
    assert p.update(4.6, oldest_ms=5.0) == 0


def test_policy_hysteresis_between_the_thresholds_holds_the_gear_and_resets_the_calm():
    p = policy()
    p.update(0.0, oldest_ms=70.0)
    assert p.gear == 1
    p.update(1.0, oldest_ms=10.0)  # calm from t=1
    p.update(2.5, oldest_ms=30.0)  # between down_at (20 ms) and up_at (50 ms): hold, calm broken
    assert p.update(3.2, oldest_ms=10.0) == 1  # calm again only since 2.5, when it was last seen hot
    assert p.update(4.4, oldest_ms=10.0) == 1
    assert p.update(4.5, oldest_ms=10.0) == 0


def test_policy_after_idle_steps_back_at_once_but_not_right_after_a_switch():
    p = policy()
    p.update(0.0, oldest_ms=80.0)
    assert p.update(0.1, oldest_ms=80.0) == 1  # hot until 0.1; no request for a minute
    assert p.update(60.0, oldest_ms=0.0) == 0  # the queue was calm all along: back at once
    q = policy()
    assert q.update(0.0, oldest_ms=80.0) == 1  # switched at 0, hot never seen since
    assert q.update(1.0, oldest_ms=0.0) == 1 and q.update(2.0, oldest_ms=0.0) == 0


def test_policy_signal_remembers_recent_latencies_for_its_window():
    p = policy()
    for i in range(10):
        p.record(0.1 * i, 80.0)  # requests that finished late
    assert p.signal(1.0) == pytest.approx(80.0)
    assert p.update(1.0, oldest_ms=0.0) == 1  # nothing waits now, but the tail was late
    assert p.signal(2.5) == 0.0  # out of the window


@pytest.mark.parametrize("kw, match", [
    (dict(slo_ms=0), "slo_ms"), (dict(down_at=0.6), "down_at < up_at"), (dict(window_s=-1), "window_s"),
    (dict(quantile=0), "quantile"), (dict(replicas_for="both"), "replicas_for")])
def test_policy_rejects_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        GearPolicy(2, **{"slo_ms": 100.0, **kw})


def test_switch_uses_the_oldest_request_in_flight_and_its_latency():
    now = [0.0]
    info = {"mode": "adaptive", "ladder": [{"gear": i, "max_loss": m, "loss_bound": b, "method": "x"}
                                           for i, (m, b) in enumerate([(0.01, 0.008), (0.02, 0.015)])],
            "policy": {"slo_ms": 100.0, "up_interval_s": 0.0}}
    switch = GearSwitch(info, clock=lambda: now[0])
    slow, gear = switch.begin()
    assert gear == 0
    now[0] = 0.06  # the first request has waited 60 ms: the next one is served cheaper
    fast, gear = switch.begin()
    assert gear == 1 and switch.fields(gear) == {"gear": 1, "gear_max_loss": 0.02, "gear_loss_bound": 0.015,
                                                  "full_pipeline": False}
    switch.end(slow)
    switch.end(fast)
    pinned = GearSwitch({**info, "mode": 1, "policy": {}})
    assert pinned.begin()[1] == 1 and not pinned.adaptive
    assert GearSwitch(None).begin()[1] == 0


def test_demand_scale_is_what_the_deployed_gear_would_send_per_row_a_cheaper_one_sends():
    """Gear 0 sends 4% of rows on, gear 2 1%: a call in gear 2 carries a quarter of what gear 0
    would send (scale 4), and a call in gear 0 four times what gear 2 would (scale 1/4, toward a
    cheaper target); unknown shares and the target gear itself scale 1; a gear that sends
    nothing on is capped at max_scale."""
    demand = GearDemand(3, half_life_rows=10_000, max_scale=20.0)
    assert demand.scale(2) == 1.0  # nothing measured yet
    for _ in range(40):
        demand.observe(0, 100, 4)
    assert demand.share(0) == pytest.approx(0.04) and demand.scale(2) == 1.0  # gear 2 not measured
    demand.observe(2, DEMAND_MIN_ROWS // 2, 1)
    assert demand.share(2) is None and demand.scale(2) == 1.0  # too few rows to count
    for _ in range(40):
        demand.observe(2, 100, 1)
    assert demand.scale(2) == pytest.approx(4.0, rel=0.05) and demand.scale(0) == 1.0
    assert demand.scale(0, target=2) == pytest.approx(0.25, rel=0.05)  # toward the cheapest gear
    demand.observe(2, 100_000, 20_000)  # noise that reverses the order never reverses the scale
    assert demand.scale(2) == 1.0 and demand.scale(0, target=2) == 1.0
    demand = GearDemand(3, half_life_rows=10_000, max_scale=20.0)
    for _ in range(40):
        demand.observe(0, 100, 4)
        demand.observe(2, 100, 1)
    for _ in range(200):
        demand.observe(1, 100, 0)
    assert demand.scale(1) == 20.0
    assert demand.to_dict()["share_sent_on"][0] == pytest.approx(0.04)
    with pytest.raises(ValueError, match="gears"):
        GearDemand(0)
    with pytest.raises(ValueError, match="max_scale"):
        GearDemand(2, max_scale=0.5)


def test_demand_starts_from_the_artifacts_shares_and_the_served_rows_take_over():
    """A prior per gear (the artifact's sample rows) makes the scale known from the first request,
    before the cheaper gear ever served; the served rows replace it within a few half-lives."""
    demand = GearDemand(3, half_life_rows=1000, prior=[0.04, None, 0.01])
    assert demand.share(0) == pytest.approx(0.04) and demand.share(1) is None
    assert demand.scale(0, target=2) == pytest.approx(0.25) and demand.scale(2) == pytest.approx(4.0)
    assert demand.scale(1) == 1.0  # no prior, nothing served
    for _ in range(100):
        demand.observe(2, 100, 2)
    assert demand.share(2) == pytest.approx(0.02, rel=0.01) and demand.scale(2) == pytest.approx(2.0, rel=0.01)
    for prior, match in [([0.1], "one share per gear"), ([0.1, 1.5, None], r"prior\[1\]"),
                         ([0.1, "x", None], r"prior\[1\]")]:
        with pytest.raises(ValueError, match=match):
            GearDemand(3, prior=prior)


def test_demand_follows_a_gears_recent_rows():
    """A gear's share decays with its own rows (half-life in rows): a shift in what it sends on
    shows within a few half-lives; another gear's rows do not age it."""
    demand = GearDemand(2, half_life_rows=1000)
    for _ in range(50):
        demand.observe(0, 100, 2)
    for _ in range(500):
        demand.observe(1, 100, 1)  # gear 0's share stays as last measured
    assert demand.share(0) == pytest.approx(0.02)
    for _ in range(60):
        demand.observe(0, 100, 6)
    assert demand.share(0) == pytest.approx(0.06, rel=0.02)


def test_switch_asks_for_the_deployed_gear_only_when_adaptive():
    info = {"mode": "adaptive", "ladder": [{"gear": i, "max_loss": m, "loss_bound": b, "method": "x"}
                                           for i, (m, b) in enumerate([(0.01, 0.008), (0.02, 0.015)])],
            "policy": {"slo_ms": 100.0}}
    switch = GearSwitch(info)
    for _ in range(30):
        switch.demand.observe(0, 100, 6)
        switch.demand.observe(1, 100, 2)
    assert switch.demand_scale(1) == pytest.approx(3.0) and switch.demand_scale(0) == 1.0
    switch.pin(1)  # an operator's pinned gear is the one to size for
    assert switch.demand_scale(1) == 1.0
    switch.pin(None)
    assert switch.demand_scale(1) == pytest.approx(3.0)
    assert GearSwitch({**info, "mode": 1, "policy": {}}).demand_scale(1) == 1.0
    served = GearSwitch({**info, "policy": {"slo_ms": 100.0, "replicas_for": "served"}})
    for _ in range(30):
        served.demand.observe(0, 100, 6)
        served.demand.observe(1, 100, 2)
    assert served.demand_scale(1) == 1.0  # sized for the gear it serves
    cheapest = GearSwitch({**info, "policy": {"slo_ms": 100.0, "replicas_for": "cheapest"},
                           "sent_on": [0.06, 0.02]})
    # sized for gear 1 from the first request (the artifact's shares), gear 0's rows a third of it
    assert cheapest.demand_scale(0) == pytest.approx(1 / 3) and cheapest.demand_scale(1) == 1.0
    cheapest.pin(0)
    assert cheapest.demand_scale(0) == 1.0


def test_each_gear_runs_as_opt_gear_does_across_the_two_stages(geared):
    rows = make_rows(300, seed=5)[0]
    for g in range(len(geared.gears_)):
        cheap, expensive = (GearRunners(StageRunner(geared, s)).get(g) for s in stage_specs(geared))
        first = cheap.run(rows)
        proba = first["proba"].copy()
        if first["unsure"].size:
            rest = expensive.run(rows.iloc[first["unsure"]].reset_index(drop=True), first["blocks"])
            proba[first["unsure"]] = rest["proba"]
        np.testing.assert_allclose(proba, geared.gear(g).predict_proba(rows), atol=1e-12)


def test_deploy_options_are_checked_against_the_artifact(geared, synth_opt):
    check_gears("adaptive", {"slo_ms": 50}, geared, baseline=False)
    for gears, policy_, opt, match in [
            ("fast", None, geared, "gears must be one of"), (9, None, geared, "certifies gears 0"),
            ("adaptive", None, synth_opt, "needs an artifact with certified gears"),
            ("adaptive", {"slo": 1}, geared, "unknown key"), ("off", {"slo_ms": 1}, geared, "only used with")]:
        with pytest.raises(ValueError, match=match):
            check_gears(gears, policy_, opt, baseline=False)
    with pytest.raises(ValueError, match="baseline"):
        check_gears(1, None, geared, baseline=True)
    with pytest.raises(ValueError, match="needs an SLO"):
        gear_info("adaptive", None, geared, None)
    info = gear_info("adaptive", None, geared, 250.0)
    assert info["policy"]["slo_ms"] == 250.0 and info["ladder"] == ladder(geared)
    assert [g["loss_bound"] <= g["max_loss"] for g in info["ladder"]] == [True] * len(geared.gears_)
    # each gear's share of the sample rows its first level sends on (plus half a row): the demand's prior
    sample = geared.sample_rows_
    assert info["sent_on"] == [pytest.approx(((geared.gear(g).predict_with_levels(sample)[1] > 0).sum() + 0.5)
                                             / (len(sample) + 1)) for g in range(len(geared.gears_))]
    assert info["sent_on"][-1] < info["sent_on"][0]  # the cheapest gear sends fewer rows on
    assert "sent_on" not in gear_info(1, None, geared, None)


def test_ladder_carries_what_certification_saw(geared):
    """A live audit compares its disagreement rate with certification's: each gear's rows and
    rows whose predicted class differed from the full pipeline's (None when unknown)."""
    n = geared.report().splits["certification"]
    steps = ladder(geared)
    assert [(g["cert_rows"], g["cert_disagreed"]) for g in steps] == \
        [(g.cert_rows, g.cert_disagreed) for g in geared.gears_]
    assert all(g["cert_rows"] == n and 0 <= g["cert_disagreed"] <= n for g in steps)
    unknown = geared.gear(0)  # a copy: its gears_ is replaced below, not changed
    unknown.gears_ = [type(g)(g.max_loss, g.levels, g.loss_bound, g.method) for g in unknown.gears_]
    assert {(g["cert_rows"], g["cert_disagreed"]) for g in ladder(unknown)} == {(None, None)}


def test_requests_of_different_gears_never_share_a_stage_call():
    calls: list[list] = []

    async def run(items, deadline):
        calls.append([it.key for it in items])
        return [it.rows for it in items]

    async def main():
        c = Coalescer(run, stage="cheap", max_rows=100, limit=1)
        deadline = Deadline.after(5.0)
        return await asyncio.gather(*(c.submit([i], None, deadline, key=k) for i, k in enumerate([0, 0, 1, 1, 0])))

    assert asyncio.run(main()) == [[0], [1], [2], [3], [4]]
    assert all(len(set(keys)) == 1 for keys in calls) and sorted(k for keys in calls for k in keys) == [0, 0, 0, 1, 1]


def test_records_carry_the_gear():
    frame = make_rows(4, seed=1)[0]
    proba = np.full((4, 2), 0.5)
    cols = record_columns(frame, proba, np.zeros(4, dtype=int), np.full(4, "r"), 1.0, 0.0, "v", None, {}, gear=2)
    assert cols["gear"].tolist() == ["2"] * 4
    assert "gear" not in record_columns(frame, proba, np.zeros(4, dtype=int), np.full(4, "r"), 1.0, 0.0, "v",
                                        None, {})


def test_time_to_accuracy_fields_for_a_configuration(synth_opt):
    """benchmarks.serving's time-to-accuracy fields: accuracy of the answers, loss vs the full
    pipeline, the certified bound, and cost per million predictions at the simulated price."""
    from benchmarks._time_to_accuracy import PRICE_PER_CPU_HOUR, at_accuracy

    X, y = make_rows(2000, seed=9)
    fields = at_accuracy({"rows_per_s": 3600.0, "p99_ms": 5.0}, synth_opt, (X, y), baseline=False, cpus=2.0)
    assert fields["accuracy"] == pytest.approx(np.mean(synth_opt.predict(X) == y))
    assert fields["accuracy_loss"] == pytest.approx(np.mean(synth_opt.baseline.predict(X) == y) - fields["accuracy"])
    assert fields["certified_loss_bound"] == synth_opt.gears_[0].loss_bound <= fields["max_loss"]
    assert fields["cost_per_million_predictions"] == pytest.approx(2.0 * PRICE_PER_CPU_HOUR / 3600.0 ** 2 * 1e6)
    full = at_accuracy({"rows_per_s": 100.0, "p99_ms": 5.0}, synth_opt, (X, y), baseline=True, cpus=2.0)
    assert full["accuracy_loss"] == 0.0 and full["certified_loss_bound"] == 0.0
    assert at_accuracy({"rows_per_s": 0.0}, synth_opt, None, baseline=True, cpus=1.0)["accuracy"] is None


def test_willump_serve_takes_the_gear_options():
    from serving.cli import build_parser

    args = build_parser().parse_args(["serve", "art", "--gears", "adaptive", "--gear-slo-ms", "200"])
    assert (args.gears, args.gear_slo_ms) == ("adaptive", 200.0)
    from serving.cli import _gear_policy

    assert _gear_policy(args) == {"slo_ms": 200.0}
    served = build_parser().parse_args(["serve", "art", "--gears", "adaptive", "--gear-replicas-for", "served"])
    assert _gear_policy(served) == {"replicas_for": "served"}
    assert build_parser().parse_args(["serve", "art", "--gears", "2"]).gears == 2
    assert build_parser().parse_args(["serve", "art"]).gears == "off"


def test_willump_build_writes_the_gears_into_the_serve_config(geared, tmp_path):
    import yaml

    from serving.cli import main

    geared.save(tmp_path / "art")
    out = tmp_path / "serve.yaml"
    assert main(["build", str(tmp_path / "art"), "-o", str(out), "--cpus", "2", "--gears", "adaptive",
                 "--p99-ms", "300"]) == 0
    spec = yaml.safe_load(out.read_text())["applications"][-1]["args"]
    assert spec["gears"]["mode"] == "adaptive" and spec["gears"]["policy"]["slo_ms"] == 300.0
    assert [g["loss_bound"] for g in spec["gears"]["ladder"]] == [g.loss_bound for g in geared.gears_]
    assert main(["build", str(tmp_path / "art"), "-o", str(out), "--cpus", "2", "--gears", "9"]) == 1  # named error


def test_policy_steps_back_only_into_a_gear_the_replicas_would_hold():
    """A calm queue in gear 2 steps back to gear 1 only once ``fits(1)`` says the replicas hold
    gear 1's load; it stays in gear 2 meanwhile (no step back into a load that would send it up
    again), and steps on to gear 0 when that fits too."""
    policy = GearPolicy(3, slo_ms=100.0, down_after_s=1.0, up_interval_s=0.0)
    for t in (0.0, 0.1):
        policy.update(t, 80.0)
    assert policy.gear == 2
    fitting = {0: False, 1: False}
    for t in np.arange(0.2, 5.0, 0.1):
        assert policy.update(float(t), 0.0, fits=lambda g: fitting[g]) == 2
    fitting[1] = True
    assert policy.update(5.0, 0.0, fits=lambda g: fitting[g]) == 1
    assert policy.update(5.5, 0.0, fits=lambda g: fitting[g]) == 1  # another calm dwell first
    assert policy.update(6.1, 0.0, fits=lambda g: fitting[g]) == 1  # gear 0 would not fit
    fitting[0] = True
    assert policy.update(6.2, 0.0, fits=lambda g: fitting[g]) == 0


def test_stage_load_is_arriving_rows_times_a_gears_share_times_a_rows_cost():
    """Rows arriving over the window, from every ingress, times the share a gear sends on, times
    the stage's measured busy seconds per row: known while the stage is not called at all."""
    clock = Clock()
    load = StageLoad(window_s=4.0, ingresses=2, half_life_rows=1e9, clock=clock)
    assert load.busy_replicas("expensive", 0.05) is None
    for _ in range(10):
        load.arrived(32)  # 320 rows at t=0
    load.answered("expensive", 0.4, 8)  # 0.05 s a row
    load.answered("expensive", 0.2, 2)  # 0.1 s a row: 0.06 over the 10 rows
    for bad in (None, "x", float("nan"), -1.0):
        load.answered("expensive", bad, 5)
    load.answered("expensive", 1.0, 0)
    assert load.busy_per_row("expensive") == pytest.approx(0.06) and load.busy_per_row("cheap") is None
    clock.t = 1.0
    assert load.rows_per_s() is None  # under half a window measured
    clock.t = 2.0
    assert load.rows_per_s() == pytest.approx(160.0)
    assert load.busy_replicas("expensive", 0.05) == pytest.approx(160.0 * 0.05 * 0.06 * 2)
    assert load.busy_replicas("expensive", None) is None and load.busy_replicas("cheap", 0.05) is None
    clock.t = 4.5  # the rows left the window, and none came since: the stage has nothing to do
    assert load.rows_per_s() == 0.0 and load.busy_replicas("expensive", 0.05) == 0.0
    load.arrived(100)  # traffic resumes after the pause: its rate is taken from now, not over the lull
    clock.t = 6.5
    load.arrived(100)
    assert load.rows_per_s() == pytest.approx(200 / 2.0)
    for kw, match in [({"window_s": 0}, "window_s"), ({"ingresses": 0}, "ingresses"),
                      ({"half_life_rows": 0}, "half_life_rows")]:
        with pytest.raises(ValueError, match=match):
            StageLoad(**kw)


def test_stage_load_counts_the_work_every_gear_makes_alike():
    """The live audit's calls (and the full pipeline's while gear 0 is held) busy the stage the
    same in every gear: their busy seconds per second over the window add to a gear's predicted
    load, and leave it with the window."""
    clock = Clock()
    load = StageLoad(window_s=2.0, half_life_rows=1e9, clock=clock)
    load.arrived(600)
    load.answered("expensive", 0.5, 10)  # 0.05 s a row
    load.extra("expensive", 0.4)
    load.extra("expensive", 0.2)
    for bad in (None, "x", float("nan"), -1.0):
        load.extra("expensive", bad)
    assert load.extra_busy_per_s("expensive") == 0.0  # under half a window measured
    clock.t = 2.0
    assert load.extra_busy_per_s("expensive") == pytest.approx(0.3) and load.extra_busy_per_s("cheap") == 0.0
    assert load.busy_replicas("expensive", 0.02) == pytest.approx(300 * 0.02 * 0.05 + 0.3)
    load.arrived(600)
    clock.t = 3.0  # the first arrivals and both calls left the window
    assert load.extra_busy_per_s("expensive") == 0.0
    assert load.busy_replicas("expensive", 0.02) == pytest.approx(300 * 0.02 * 0.05)
    # the live audit's calls: busy seconds per row arriving, decayed over the rows that arrive
    audit = StageLoad(window_s=2.0, half_life_rows=1e9, audit_half_life_rows=600, clock=clock)
    audit.arrived(600)
    audit.answered("expensive", 0.5, 10)
    audit.audited("expensive", 3.0)
    for bad in (None, float("inf"), -1.0):
        audit.audited("expensive", bad)
    assert audit.audit_busy_per_row("expensive") == pytest.approx(3.0 / 600) and audit.audit_busy_per_row("x") == 0.0
    clock.t = 5.0
    assert audit.busy_replicas("expensive", 0.02) == pytest.approx(300 * (0.02 * 0.05 + 3.0 / 600))
    audit.arrived(600)  # one half-life of rows with no audit call: half the weight, more rows
    assert audit.audit_busy_per_row("expensive") == pytest.approx(1.5 / (300 + 600))


def test_switch_predicts_a_gears_load_on_the_running_replicas():
    """Gear 0 sends 6% of rows on, gear 1 2%: at 300 rows a second and 0.05 s a row, gear 0 is
    0.9 replicas' worth of work, gear 1 0.3: one replica holds gear 1 and not gear 0 (over 0.85
    of its time), two hold gear 0; unknown load or replicas never hold the step back."""
    info = {"mode": "adaptive", "ladder": [{"gear": i, "max_loss": m, "loss_bound": b, "method": "x"}
                                           for i, (m, b) in enumerate([(0.01, 0.008), (0.02, 0.015)])],
            "policy": {"slo_ms": 100.0}, "sent_on": [0.06, 0.02]}
    switch = GearSwitch(info)
    assert switch.demand.share(0) == pytest.approx(0.06)
    clock = Clock()
    load = StageLoad(window_s=2.0, clock=clock)
    load.arrived(600)
    load.answered("expensive", 0.5, 10)
    clock.t = 2.0
    assert load.busy_replicas("expensive", 0.06) == pytest.approx(0.9)
    assert switch.predicted_fits(load, {"expensive": 1}, ["expensive"], 1)
    assert not switch.predicted_fits(load, {"expensive": 1}, ["expensive"], 0)
    assert switch.predicted_fits(load, {"expensive": 2}, ["expensive"], 0)
    assert switch.predicted_fits(load, {}, ["expensive"], 0)
    # no replica running there (crashed, restarting, scaled to zero): a known 0, no room for a step back
    assert not switch.predicted_fits(load, {"expensive": 0}, ["expensive"], 1)
    assert switch.predicted_fits(StageLoad(clock=clock), {"expensive": 1}, ["expensive"], 0)


def test_cheapest_sizing_stops_at_the_gears_the_live_audit_holds():
    """Sized for the cheapest gear the app may serve: with gear 2 held it is gear 1, with gear 0
    held (the full pipeline answers) nothing is scaled."""
    info = {"mode": "adaptive", "ladder": [{"gear": i, "max_loss": 0.01 * (i + 1), "loss_bound": 0.005 * (i + 1),
                                            "method": "x"} for i in range(3)],
            "policy": {"slo_ms": 100.0, "replicas_for": "cheapest"}, "sent_on": [0.06, 0.03, 0.01]}
    switch = GearSwitch(info)
    assert switch.demand_scale(0) == pytest.approx(1 / 6)
    switch.hold([2])
    assert switch.demand_scale(0) == pytest.approx(0.5) and switch.demand_scale(1) == 1.0
    switch.hold([0])
    assert switch.demand_scale(0) == 1.0


def test_a_stage_answer_carries_its_busy_seconds_shared_by_rows():
    one = with_busy_s({"level": np.zeros(3)}, 0.3)
    assert one["busy_s"] == 0.3
    parts = with_busy_s([{"level": np.zeros(1)}, RuntimeError("x"), {"level": np.zeros(3)}], 0.4)
    assert parts[0]["busy_s"] == pytest.approx(0.1) and parts[2]["busy_s"] == pytest.approx(0.3)
    empty = with_busy_s([{"level": np.zeros(0)}, {"level": np.zeros(0)}], 0.4)
    assert [o["busy_s"] for o in empty] == [pytest.approx(0.2)] * 2
    assert with_busy_s(None, 1.0) is None
    chunk = {"proba": np.zeros((2, 2)), "level": np.zeros(2, dtype=np.int64), "unsure": np.zeros(0, dtype=np.int64),
             "blocks": None, "seconds": 0.1}
    merged = merge_chunks([{**chunk, "busy_s": 0.2}, {**chunk, "busy_s": 0.3}], [2, 2])
    assert merged["busy_s"] == pytest.approx(0.5)
    assert "busy_s" not in merge_chunks([dict(chunk), dict(chunk)], [2, 2])


def test_a_request_refused_at_once_feeds_no_latency_to_the_policy():
    """A client's mistake (422) or a shed request (503) leaves in microseconds: counted as served
    latency it pulled the tail the policy reads down while the app was shedding load."""
    recorded = []
    switch = GearSwitch({"mode": "pinned", "gear": 0, "ladder": [{"gear": 0, "max_loss": 0.01, "loss_bound": 0.008,
                                                                  "method": "x"}]})
    switch.policy = types.SimpleNamespace(record=lambda now, ms: recorded.append(ms), update=lambda *a: 0)
    token, _ = switch.begin()
    switch.end(token, timed=False)
    token, _ = switch.begin()
    switch.end(token)
    assert len(recorded) == 1 and not switch._started
