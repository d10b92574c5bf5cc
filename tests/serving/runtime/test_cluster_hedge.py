"""Straggler policy (serving.runtime.hedge) on a controlled clock and given latencies: the hedge
delay is the stage's own quantile once enough calls are known; a replica far slower than its
peers is taken out of routing for its probation and judged afresh after it; never all."""

from __future__ import annotations

import pytest

from serving.runtime.hedge import LatencyWindow, SlowReplicas


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
