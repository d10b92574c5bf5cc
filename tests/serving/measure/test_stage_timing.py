"""Stage timing on a busy machine (serving.measure.stages._timed): other processes' turns on the
CPU are not the stage's waits, so a CPU-bound stage still reads as CPU-bound (and runs inline)
when the machine is busy while deploy profiles it."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from serving.core.procstat import runqueue_wait_s
from serving.measure.stages import _timed

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def test_a_cpu_bound_call_sharing_its_cpu_reads_as_cpu_bound():
    """Two processes on one CPU: the call's wall clock doubles, its run-queue wait says why, and
    the timed wall is its CPU time again (a share far above INLINE_CPU_SHARE)."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    hog = multiprocessing.get_context("fork").Process(target=_hog, args=(cpu,), daemon=True)
    hog.start()
    try:
        os.sched_setaffinity(0, {cpu})
        q0, w0 = runqueue_wait_s(), time.perf_counter()
        _spin(0.2)
        raw_wall, waited = time.perf_counter() - w0, runqueue_wait_s() - q0
        wall, cpu_s = _timed(lambda: _spin(0.05), repeats=5)
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.join()
    assert raw_wall > 1.5 * 0.2 and waited > 0.3 * raw_wall  # the hog took turns, and schedstat saw them
    assert cpu_s / wall >= 0.9, (cpu_s, wall)


class _Clocks:
    """Deterministic wall, CPU and run-queue clocks that a fake call advances: the process's
    other threads (a Ray driver's, execnet's) cannot add CPU to the call, so the test reads
    _timed's arithmetic and nothing of the machine."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.queued = 0.0

    def run(self, cpu: float = 0.0, wait: float = 0.0, queued: float = 0.0) -> None:
        self.cpu += cpu
        self.queued += queued
        self.wall += cpu + wait + queued


@pytest.fixture
def clocks(monkeypatch):
    c = _Clocks()
    fake_time = type("T", (), {"perf_counter": staticmethod(lambda: c.wall),
                               "process_time": staticmethod(lambda: c.cpu)})
    monkeypatch.setattr("serving.measure.stages.time", fake_time)
    monkeypatch.setattr("serving.measure.stages.runqueue_wait_s", lambda: c.queued)
    return c


def test_a_call_that_waits_every_time_keeps_its_waits_and_one_disturbed_repeat_does_not_count(clocks):
    """20 ms of CPU and a 20 ms wait per call: half of its time is its own wait. A CPU-bound
    call whose repeats are disturbed now and then (a wait standing in for the GIL held
    elsewhere) reads as CPU-bound, and run-queue turns are never its waits."""
    wall, cpu_s = _timed(lambda: clocks.run(cpu=0.02, wait=0.02), repeats=3)
    assert (wall, cpu_s) == pytest.approx((0.04, 0.02))
    calls = iter(range(100))
    wall, cpu_s = _timed(lambda: clocks.run(cpu=0.02, wait=0.04 * (next(calls) % 2)), repeats=5)
    assert (wall, cpu_s) == pytest.approx((0.02, 0.02))
    wall, cpu_s = _timed(lambda: clocks.run(cpu=0.02, queued=0.05), repeats=3)
    assert (wall, cpu_s) == pytest.approx((0.02, 0.02))


def test_a_call_that_only_waits_reads_its_median_wall_clock(clocks):
    waits = iter([0.01, 0.03, 0.05, 0.02])
    wall, cpu_s = _timed(lambda: clocks.run(wait=next(waits)), repeats=3)
    assert (wall, cpu_s) == (pytest.approx(0.03), 0.0)
