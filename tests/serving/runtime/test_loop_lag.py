"""The event-loop lag probe (serving.runtime.loop_lag): a loop blocked for a while is reported at
least that late; asserted from below only, which a slower machine only makes later."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.runtime.loop_lag import LoopLag

BLOCKED_S = 0.2
INTERVAL_S = 0.01


def test_a_blocked_loop_is_reported_at_least_as_late_as_it_was_blocked():
    seen: list[float] = []

    async def main() -> None:
        lag = LoopLag(seen.append, interval_s=INTERVAL_S)
        lag.start()
        lag.start()  # once: a second start does nothing
        await asyncio.sleep(0)  # the probe takes its start time and sleeps
        time.sleep(BLOCKED_S)  # a callback that holds the loop
        while not seen:
            await asyncio.sleep(INTERVAL_S)
        lag.stop()

    asyncio.run(main())
    assert seen[0] >= BLOCKED_S - INTERVAL_S, seen
    assert all(late >= 0 for late in seen)


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        LoopLag(lambda late: None, interval_s=0)
