"""A coroutine an ingress runs on its event loop for the replica's life (the replica watch, the
event-loop lag probe, the metrics' flush): started once from a request (a replica's constructor
has no running loop), cancelled at shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class LoopTask:
    """Runs :meth:`_loop` on the running event loop from the first :meth:`start` on."""

    _task: asyncio.Task | None = None

    def start(self) -> None:
        """Start on the running event loop (once, and only where :meth:`_wanted`; later calls do nothing)."""
        if self._task is None and self._wanted():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _wanted(self) -> bool:
        return True

    async def _loop(self) -> None:
        raise NotImplementedError


class PeriodicTask(LoopTask):
    """Calls ``call`` every ``interval_s`` on the running loop, and once more at :meth:`stop`. A
    call that raises is logged (``failure`` says what was not done) and the next one still runs."""

    def __init__(self, call: Callable[[], None], interval_s: float, failure: str):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.call, self.interval_s, self.failure = call, float(interval_s), failure

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.call()
            except Exception:  # one failed call must not end the task for the replica's life
                log.exception(self.failure)

    def stop(self) -> None:
        super().stop()
        self.call()
