"""The collector's pauses in a replica, timed and reported.

A full collection (generation 2) walks every tracked object; in a process holding a loaded
pipeline, Ray and the request path one pass took 127-135 ms (docs/benchmarks.md), every thread
waiting. Ray Serve collects and freezes a replica's heap once it has started
(``RAY_SERVE_FREEZE_GC_ON_STARTUP``, on by default), so later passes walk only what requests
left behind; ``willump_gc_pause_seconds`` shows what they still cost, by generation.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable

from serving.runtime.loop_task import PeriodicTask

#: the youngest generation whose collections are timed (generation 0's take microseconds)
TIMED_GENERATION = 1
#: seconds between hand-overs of the timed pauses to the metrics, on the replica's event loop
PAUSES_INTERVAL_S = 1.0
#: pauses kept between two hand-overs (the oldest are dropped beyond it)
MAX_PENDING_PAUSES = 10_000


class GcPauses(PeriodicTask):
    """Times the collector's passes over generation ``min_generation`` and older (``gc.callbacks``)
    and hands each ``(generation, seconds)`` to ``observe`` on the event loop every ``interval_s``:
    the callback itself only appends (it runs inside whatever allocation set the collection off,
    perhaps while ``observe``'s own lock is held)."""

    def __init__(self, observe: Callable[[int, float], None], interval_s: float = PAUSES_INTERVAL_S,
                 min_generation: int = TIMED_GENERATION, clock: Callable[[], float] = time.perf_counter):
        super().__init__(self.drain, interval_s, "collector pauses not reported")
        if min_generation not in (0, 1, 2):
            raise ValueError(f"min_generation must be 0, 1 or 2, got {min_generation!r}")
        self.observe, self.min_generation, self.clock = observe, min_generation, clock
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
        """On the running loop (it raises before the hook goes in without one); the hook goes in
        with the task, so a later call (every request makes one) costs one attribute test."""
        if self._task is not None:
            return
        super().start()
        gc.callbacks.append(self._callback)

    def drain(self) -> None:
        """Hand the pauses timed so far to ``observe``."""
        while self.pending:
            self.observe(*self.pending.popleft())

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        super().stop()  # and the last hand-over
