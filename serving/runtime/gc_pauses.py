"""The collector's pauses in a replica, timed and reported.

A full collection (generation 2) walks every tracked object; in a process holding a loaded
pipeline, Ray and the request path one pass took 127-135 ms (docs/benchmarks.md), every thread
waiting. Ray Serve collects and freezes a replica's heap once it has started
(``RAY_SERVE_FREEZE_GC_ON_STARTUP``, on by default), so later passes walk only what requests
left behind; ``willump_gc_pause_seconds`` shows what they still cost, by generation.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable

from serving.runtime.loop_task import LoopTask

log = logging.getLogger(__name__)

#: the youngest generation whose collections are timed (generation 0's take microseconds)
TIMED_GENERATION = 1
#: seconds between hand-overs of the timed pauses to the metrics, on the replica's event loop
PAUSES_INTERVAL_S = 1.0
#: pauses kept between two hand-overs (the oldest are dropped beyond it)
MAX_PENDING_PAUSES = 10_000


class GcPauses(LoopTask):
    """Times the collector's passes over generation ``min_generation`` and older (``gc.callbacks``)
    and hands each ``(generation, seconds)`` to ``observe`` on the event loop every ``interval_s``:
    the callback itself only appends (it runs inside whatever allocation set the collection off,
    perhaps while ``observe``'s own lock is held)."""

    def __init__(self, observe: Callable[[int, float], None], interval_s: float = PAUSES_INTERVAL_S,
                 min_generation: int = TIMED_GENERATION, clock: Callable[[], float] = time.perf_counter):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if min_generation not in (0, 1, 2):
            raise ValueError(f"min_generation must be 0, 1 or 2, got {min_generation!r}")
        self.observe, self.interval_s, self.min_generation, self.clock = observe, float(interval_s), min_generation, clock
        self.pending: deque[tuple[int, float]] = deque(maxlen=MAX_PENDING_PAUSES)
        self._began: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if info["generation"] < self.min_generation:
            return
        if phase == "start":
            self._began = self.clock()
        elif self._began is not None:  # a pass already running when the hook went in is not timed
            self.pending.append((info["generation"], self.clock() - self._began))
            self._began = None

    def start(self) -> None:
        super().start()  # on the running loop, or it raises before the hook goes in
        if self._task is not None and self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def drain(self) -> None:
        """Hand the pauses timed so far to ``observe``."""
        while self.pending:
            self.observe(*self.pending.popleft())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.drain()
            except Exception:  # one failed hand-over must not end the timing for the replica's life
                log.exception("collector pauses not reported")

    def stop(self) -> None:
        super().stop()
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        self.drain()
