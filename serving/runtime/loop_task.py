"""A coroutine an ingress runs on its event loop for the replica's life (the replica watch, the
event-loop lag probe): started once from a request (a replica's constructor has no running
loop), cancelled at shutdown."""

from __future__ import annotations

import asyncio


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
