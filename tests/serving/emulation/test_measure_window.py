"""The closed-loop measurement behind the throughput matrix: a replica stalled past the
window is measured slow, never at 0 calls/s, and one that never answers is named."""

import asyncio

import pytest

from serving.emulation.measure import _drive


def test_a_stall_past_the_window_extends_it_until_enough_calls_completed():
    calls = {"n": 0}

    async def call(_item):
        calls["n"] += 1
        await asyncio.sleep(0.3 if calls["n"] <= 2 else 0.001)

    done, elapsed = asyncio.run(_drive(call, [0], concurrency=2, warmup_s=0.01, seconds=0.05, min_calls=5))
    assert done >= 5 and elapsed >= 0.05
    assert done / elapsed > 0


def test_a_replica_that_never_answers_in_time_is_an_error_not_a_zero_rate():
    async def call(_item):
        await asyncio.sleep(0.2)

    with pytest.raises(TimeoutError, match="of 50 calls completed within 0.1 s"):
        asyncio.run(_drive(call, [0], concurrency=1, warmup_s=0.0, seconds=0.05, min_calls=50, max_seconds=0.1))
