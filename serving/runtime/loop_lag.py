"""How late an ingress replica's event loop wakes up: the time a request that is ready to run
waits before the replica runs it, whether behind other requests' work on the loop or for a CPU
while other processes run (docs/benchmarks.md: at Ray's niceness 15 a replica waited up to
130 ms for one). A task sleeps ``interval_s`` over and over and reports each wake-up's lateness;
it costs one wake-up per interval."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from serving.runtime.loop_task import LoopTask

#: seconds between the probe's wake-ups (each one sample of the loop's lateness)
LAG_INTERVAL_S = 0.1


class LoopLag(LoopTask):
    """Calls ``observe(seconds late)`` after each sleep of ``interval_s`` on the running loop."""

    def __init__(self, observe: Callable[[float], None], interval_s: float = LAG_INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.observe, self.interval_s, self.clock = observe, float(interval_s), clock

    async def _loop(self) -> None:
        while True:
            start = self.clock()
            await asyncio.sleep(self.interval_s)
            self.observe(max(self.clock() - start - self.interval_s, 0.0))
