"""Straggler policy (serving.runtime.hedge) on a controlled clock and given latencies: the hedge
delay is the stage's own quantile once enough calls are known; a replica far slower than its
peers is taken out of routing for its probation and judged afresh after it; never all."""

from __future__ import annotations

import pytest

from serving.runtime.hedge import HedgeBackoff, LatencyWindow, SlowReplicas


def test_hedge_delay_is_the_stages_own_quantile():
    w = LatencyWindow(size=100, quantile=0.9, min_samples=10, floor_over_median=0.0)
    for i in range(9):
        w.add(0.01 * (i + 1))
    assert w.delay() is None  # too few latencies to know the tail
    w.add(0.10)
    assert w.delay() == pytest.approx(0.091)
    for _ in range(100):  # the window keeps only the newest
        w.add(0.02)
    assert w.delay() == pytest.approx(0.02)
    w.add(float("nan"))
    w.add(-1.0)
    assert len(w.samples) == 100


def test_hedge_delay_never_below_a_multiple_of_the_median():
    """Without stragglers the tail is the ordinary spread: the quantile alone would hedge
    5% of calls; the floor (2x the median) hedges none of them. A straggler's tail is far
    above the floor and sets the delay as before."""
    w = LatencyWindow(size=200, quantile=0.95, min_samples=10)
    spread = [0.010 + 0.0001 * (i % 50) for i in range(200)]  # 10-15 ms, no straggler
    for s in spread:
        w.add(s)
    assert w.delay() == pytest.approx(2.0 * 0.01245, rel=0.02)
    assert sum(s > w.delay() for s in spread) == 0
    for i in range(200):  # 10% of calls 10x slower
        w.add(0.12 if i % 10 == 0 else spread[i])
    assert w.delay() == pytest.approx(0.12)


@pytest.mark.parametrize("kwargs", [dict(quantile=1.0), dict(quantile=0.0), dict(size=0), dict(min_samples=0),
                                    dict(floor_over_median=-1.0), dict(floor_over_median=float("nan"))])
def test_window_refuses_bad_settings(kwargs):
    with pytest.raises(ValueError):
        LatencyWindow(**kwargs)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_slow_replica_is_reassigned_then_judged_afresh():
    clock = Clock()
    s = SlowReplicas(slow_factor=3.0, alpha=0.5, probation_s=2.0, min_samples=3, clock=clock)
    for _ in range(5):
        s.observe("a", "dev", 0.010)
        s.observe("b", "dev", 0.011)
        s.observe("c", "dev", 0.050)  # 5x its peers
    assert s.slow(["a", "b", "c"]) == ["c"] and s.reassigned == 1
    s.observe("c", "dev", 0.060)  # still slow: probation extended, not counted twice
    assert s.reassigned == 1
    clock.t = 1.9
    assert s.slow(["a", "b", "c"]) == ["c"]
    clock.t = 2.5
    assert s.slow(["a", "b", "c"]) == []  # probation over: judged again on new calls only
    for _ in range(3):
        s.observe("c", "dev", 0.012)
    assert s.slow(["a", "b", "c"]) == []


def test_peers_are_the_same_group_and_never_all_are_excluded():
    clock = Clock()
    s = SlowReplicas(slow_factor=3.0, alpha=1.0, min_samples=1, clock=clock)
    s.observe("fast", "dev_fast", 0.01)
    s.observe("slow", "dev_slow", 0.05)  # another device type: slower by design, not a straggler
    assert s.slow(["fast", "slow"]) == []
    s.observe("slow2", "dev_slow", 0.5)
    assert s.slow(["slow", "slow2"]) == ["slow2"]
    s.observe("slow", "dev_slow", 10.0)  # both of one group look slow to each other: one stays
    assert len(s.slow(["slow", "slow2"])) <= 1


def test_slow_replicas_refuses_bad_settings():
    with pytest.raises(ValueError):
        SlowReplicas(slow_factor=1.0)


def test_the_tail_is_read_again_once_a_32nd_of_the_window_is_new():
    """Every stage call asks for the delay and the bound: the window's quantile and median are
    read again only once 1/32 of it is new (here 8 of 256), so a full window's figures lag by
    at most 7 latencies; a window still filling reads every new one."""
    w = LatencyWindow(size=256, quantile=0.99, min_samples=10, floor_over_median=0.0)
    for _ in range(256):
        w.add(0.01)
    assert w.delay() == pytest.approx(0.01) and w.median() == pytest.approx(0.01)
    for _ in range(7):
        w.add(1.0)
    assert w.delay() == pytest.approx(0.01)  # 7 new of 256 (the 99th read afresh would be 1 s): not read yet
    w.add(1.0)
    assert w.delay() == pytest.approx(1.0) and w.median() == pytest.approx(0.01)
    small = LatencyWindow(size=256, quantile=0.5, min_samples=1, floor_over_median=0.0)
    for i in range(1, 20):
        small.add(float(i))
        assert small.delay() == pytest.approx(float(sorted(range(1, i + 1))[(i - 1) // 2]) if i % 2 else (i + 1) / 2)


def test_the_delay_backs_off_while_copies_lose_and_comes_back_while_they_win():
    clock, changes = Clock(), []
    backoff = HedgeBackoff(min_win_share=0.25, outcomes=4, step=2.0, max_factor=8.0, relax_s=30.0,
                           clock=clock, on_change=changes.append)
    assert backoff.factor == 1.0
    for won in (True, False, False, False):  # 1 of 4 won: the share itself is not "below"
        backoff.record(won)
    assert backoff.factor == 1.0 and changes == []
    for _ in range(3):  # three judgments of 4 lost copies each: 2, 4, 8
        for _ in range(4):
            backoff.record(False)
    assert backoff.factor == 8.0 and changes == [2.0, 4.0, 8.0]
    for _ in range(4):
        backoff.record(False)
    assert backoff.factor == 8.0, "capped at max_factor"
    for won in (True, True, False, False):  # copies win again: the delay shortens
        backoff.record(won)
    assert backoff.factor == 4.0 and changes[-1] == 4.0
    for won in (True, False, False, False) * 2:  # winning at the share: one step back each time
        backoff.record(won)
    assert backoff.factor == 1.0 and changes[-2:] == [2.0, 1.0]


def test_a_backed_off_delay_relaxes_when_no_copy_is_decided():
    """A delay backed off past what any call reaches sends no copy, so no outcome; with none
    decided for relax_s the factor steps down once per relax_s."""
    clock = Clock()
    backoff = HedgeBackoff(min_win_share=0.5, outcomes=2, relax_s=30.0, clock=clock)
    for _ in range(4):
        backoff.record(False)
    assert backoff.factor == 4.0
    clock.t += 29.0
    assert backoff.factor == 4.0
    clock.t += 1.0
    assert backoff.factor == 2.0
    clock.t += 10.0
    assert backoff.factor == 2.0, "the next step waits a full relax_s"
    clock.t += 20.0
    assert backoff.factor == 1.0
    clock.t += 100.0
    assert backoff.factor == 1.0


def test_min_win_share_zero_never_backs_off():
    backoff = HedgeBackoff(min_win_share=0.0, outcomes=1)
    for _ in range(50):
        backoff.record(False)
    assert backoff.factor == 1.0


@pytest.mark.parametrize("kwargs", [dict(min_win_share=1.5), dict(min_win_share=-0.1), dict(outcomes=0),
                                    dict(step=1.0), dict(step=float("inf")), dict(max_factor=0.5),
                                    dict(relax_s=0)])
def test_backoff_refuses_bad_settings(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        HedgeBackoff(**kwargs)


def test_deploy_takes_the_backoff_share_with_the_other_hedging_options():
    from serving.launch.deploy import hedging_options
    from serving.runtime.hedge import HEDGE_MIN_WIN_SHARE

    assert hedging_options(True)["min_win_share"] == HEDGE_MIN_WIN_SHARE
    assert hedging_options({"min_win_share": 0})["min_win_share"] == 0.0
    assert hedging_options(False) is None
    with pytest.raises(ValueError, match="min_win_share"):
        hedging_options({"min_win_share": 2})
    with pytest.raises(ValueError, match="unknown options"):
        hedging_options({"win_share": 0.5})


def test_relaxing_steps_once_per_quiet_relax_s_and_copies_being_sent_keep_it():
    clock = Clock()
    backoff = HedgeBackoff(min_win_share=0.5, outcomes=1, relax_s=30.0, clock=clock)
    for _ in range(3):
        backoff.record(False)
    assert backoff.factor == 8.0
    for _ in range(5):  # copies keep going out (their outcomes not in yet): no relaxing
        clock.t += 20.0
        backoff.sent()
        assert backoff.factor == 8.0
    clock.t += 65.0  # two quiet relax_s at once (hedging off, nobody reading): two steps
    assert backoff.factor == 2.0
