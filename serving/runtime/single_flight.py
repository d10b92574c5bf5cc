"""One run of a blocking check at a time, shared by everyone who asks while it runs.

Why: readiness probes run a stage's canary row in a thread (``/readyz`` every few seconds, from
Kubernetes or a load balancer). A thread cannot be stopped, so a canary that hangs (a broken
CUDA context, a feature store that never answers) outlives the probe that timed out on it; with a
new thread per probe, the stuck threads filled the replica's default executor within a minute,
and every other ``asyncio.to_thread`` of the replica (its stage calls, parsing, the live audit)
then waited behind them: one hung canary stopped the replica serving, while ``/healthz`` still
answered. Here a probe that comes while the last run is still going waits on that run (within
its own time limit) instead of starting another, so a hung check holds one thread, not one per
probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class SingleFlight:
    """``await flight(timeout_s)``: ``fn()``'s result, run in a thread; a call made while an
    earlier run is still going shares that run. A caller that times out (``asyncio.TimeoutError``)
    or is cancelled leaves the run going for the next caller."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self._running: asyncio.Future | None = None
        #: runs started (a hung one is counted once, however many callers waited on it)
        self.runs = 0

    @property
    def running(self) -> bool:
        return self._running is not None and not self._running.done()

    async def __call__(self, timeout_s: float) -> Any:
        if not self.running:
            self.runs += 1
            self._running = asyncio.ensure_future(asyncio.to_thread(self.fn))
            self._running.add_done_callback(_seen)
        return await asyncio.wait_for(asyncio.shield(self._running), timeout_s)


def _seen(future: asyncio.Future) -> None:
    """Mark a run's failure as retrieved: every caller may have left before it ended."""
    if not future.cancelled():
        future.exception()
