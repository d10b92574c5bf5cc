"""The collector's pauses in an ingress replica, timed by a gc callback and handed to the
metrics on the event loop."""

from __future__ import annotations

import asyncio
import gc

import pytest

from serving.runtime.gc_pauses import GcPauses


def timed(pauses: GcPauses, seen: list, collect) -> None:
    """Start ``pauses`` on a loop, run ``collect`` with automatic collections off (another
    thread's allocations would add passes of their own), wait for the hand-over, stop."""

    async def run():
        pauses.start()
        collect()
        assert not seen  # the callback only queues
        for _ in range(500):
            await asyncio.sleep(0.01)
            if seen:
                break

    was = gc.isenabled()
    gc.disable()
    try:
        asyncio.run(run())
    finally:
        pauses.stop()
        if was:
            gc.enable()


def test_the_collectors_passes_are_timed_and_handed_over_on_the_loop():
    seen = []
    ticks = iter(range(1000))
    pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds)), interval_s=0.01,
                      clock=lambda: float(next(ticks)))

    def collect():
        gc.collect(0)  # generation 0: not timed
        gc.collect(2)
        gc.collect(1)

    timed(pauses, seen, collect)
    assert seen == [(2, 1.0), (1, 1.0)]
    assert pauses._callback not in gc.callbacks
    gc.collect(2)
    assert len(seen) == 2  # stopped: nothing timed any more


def test_a_pass_that_began_before_the_hook_is_not_timed():
    seen = []
    pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds)), clock=lambda: 5.0)
    pauses._callback("stop", {"generation": 2})  # its start was never seen
    pauses.drain()
    assert seen == []


def test_a_hand_over_that_fails_is_logged_and_timing_goes_on(caplog):
    seen, calls = [], []

    def observe(generation, seconds):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("metrics refused")
        seen.append(generation)

    pauses = GcPauses(observe, interval_s=0.01)
    timed(pauses, seen, lambda: (gc.collect(2), gc.collect(2)))
    assert seen and "collector pauses not reported" in caplog.text


def test_without_a_running_loop_no_hook_is_left_behind():
    pauses = GcPauses(print)
    with pytest.raises(RuntimeError):
        pauses.start()
    assert pauses._callback not in gc.callbacks


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="interval_s"):
        GcPauses(print, interval_s=0)
    with pytest.raises(ValueError, match="min_generation"):
        GcPauses(print, min_generation=3)


def test_a_start_on_every_request_installs_the_hook_once():
    pauses = GcPauses(print)

    async def run():
        for _ in range(3):
            pauses.start()
        assert gc.callbacks.count(pauses._callback) == 1

    try:
        asyncio.run(run())
    finally:
        pauses.stop()
    assert pauses._callback not in gc.callbacks
