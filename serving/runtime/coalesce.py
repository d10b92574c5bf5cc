"""Ingress-side batching: the rows of concurrent requests go to a stage in one call.

A hop costs several ms of CPU here, so the ingress pays it per batch, not per request. Unlike
``@serve.batch`` (whose concurrency is fixed when the class is defined), a
:class:`Coalescer`'s limit on calls in flight follows the stage: it is the stage's running
replicas times the batches each replica runs at once, so extra replicas never sit idle
behind the ingress, and a saturated replica holds more calls than Serve's autoscaling target
(the autoscaler sees the load and adds replicas, which raises the limit in turn).

With ``wait_s`` > 0 a batch that is not full waits up to that long after its oldest request
arrived for more rows (the torch-model app plans such a wait; the pipeline app's is 0: under
load, calls queue while the limit is reached and batch anyway).

Each request waits only until its own deadline; a batch call lives until the latest deadline
among its requests. When a merged call fails on the data (a row the stage cannot handle), each
request is retried alone, so one bad row fails only its own request.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from serving.runtime import spans
from serving.runtime.calls import Deadline, DeadlineExceeded, StageOverloaded, retryable


@dataclass
class Item:
    """One request's rows (and the blocks earlier stages computed for them)."""

    rows: Any
    blocks: dict | None
    deadline: Deadline
    future: asyncio.Future = field(repr=False)
    abandoned: bool = False
    #: only items with equal keys share a call (the gear that serves them: serving.runtime.gears)
    key: Any = None
    #: rows in ``rows`` (``len(rows)`` unless the submitter says otherwise)
    size: int = 0
    arrived: float = field(default_factory=time.monotonic)
    #: the submitting request's span context where it is traced (serving.runtime.spans)
    trace: Any = None
    #: out of the queue (taken for a call, or dropped from it)
    taken: bool = False


#: given-up items the queue keeps before it drops them (past half the queue it drops them anyway)
ABANDONED_KEPT = 64

BatchRunner = Callable[[list[Item], Deadline], Awaitable[list[Any]]]


def _consume(future: asyncio.Future) -> None:
    """Mark an abandoned request's exception as seen (asyncio warns about unseen ones)."""
    if not future.cancelled():
        future.exception()


class Coalescer:
    """Merges concurrent requests into batch calls of at most ``max_rows`` rows, with at
    most ``limit`` calls in flight; ``run(items, deadline)`` makes one call and returns one
    output per item, in order."""

    def __init__(self, run: BatchRunner, *, stage: str, max_rows: int, limit: int, max_queued: int = 1024,
                 wait_s: float = 0.0):
        if max_rows < 1 or limit < 1 or max_queued < 1:
            raise ValueError(f"max_rows, limit and max_queued must be >= 1, got {max_rows}, {limit}, {max_queued}")
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s!r}")
        self.run = run
        self.wait_s = float(wait_s)
        self._timer: asyncio.TimerHandle | None = None
        self.stage = stage
        self.max_rows = int(max_rows)
        self.max_queued = int(max_queued)
        self._limit = int(limit)
        self.queue: deque[Item] = deque()
        #: items in ``queue`` whose request gave up (its deadline passed, its client went away):
        #: they wait there until a call slot frees, but count against neither ``max_queued`` nor
        #: the rows a batch waits for
        self._abandoned = 0
        self.in_flight = 0
        self.batches = 0
        self.isolated = 0  # merged calls that failed and were retried request by request
        self._tasks: set[asyncio.Task] = set()
        #: the context each merged call runs in: the one the coalescer was built in, not the copy
        #: of whichever request happened to dispatch it (a traced request's spans would otherwise
        #: parent the untraced calls after it; serving.runtime.spans)
        self._base = contextvars.copy_context()
        self._span_name = f"willump.call {stage}"

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = max(1, int(value))
        self._dispatch()

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a call (requests given up on left out)."""
        return sum(item.size for item in self.queue if not item.abandoned)

    async def submit(self, rows: Any, blocks: dict | None, deadline: Deadline, key: Any = None,
                     size: int | None = None) -> Any:
        """This request's output of the stage, or DeadlineExceeded when its deadline passes;
        StageOverloaded at once when ``max_queued`` requests already wait. Requests with
        different ``key`` never share a call; ``size`` counts the rows when ``len(rows)`` does
        not (a tuple of input arrays)."""
        if len(self.queue) - self._abandoned >= self.max_queued:
            raise StageOverloaded(self.stage)
        future = asyncio.get_running_loop().create_future()
        item = Item(rows, blocks, deadline, future, key=key, size=len(rows) if size is None else int(size),
                    trace=spans.recording())
        self.queue.append(item)
        self._dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(deadline.remaining(), 0.0))
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            self._abandon(item)
            future.add_done_callback(_consume)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise DeadlineExceeded(self.stage, deadline.budget_s) from None

    def _abandon(self, item: Item) -> None:
        """A request gave up on ``item``. Where it still waits in the queue it no longer counts
        as waiting (before, during a stall the requests that had timed out filled
        ``max_queued`` and every new request was refused as overloaded); once most of the
        queue is given up, the queue drops those items (their rows with them)."""
        if item.abandoned:
            return
        item.abandoned = True
        if item.taken:
            return
        self._abandoned += 1
        if self._abandoned > max(ABANDONED_KEPT, len(self.queue) // 2):
            for dropped in self.queue:
                dropped.taken = dropped.taken or dropped.abandoned
            self.queue = deque(it for it in self.queue if not it.abandoned)
            self._abandoned = 0

    def _pop(self) -> Item:
        item = self.queue.popleft()
        item.taken = True
        if item.abandoned:
            self._abandoned -= 1
        return item

    def _take(self) -> list[Item]:
        items: list[Item] = []
        rows = 0
        while self.queue:
            item = self.queue[0]
            if item.abandoned or item.future.done():
                self._pop()
                continue
            if item.deadline.expired():
                self._pop()
                item.future.set_exception(DeadlineExceeded(self.stage, item.deadline.budget_s))
                continue
            if items and (rows + item.size > self.max_rows or item.key != items[0].key):
                break
            items.append(self._pop())
            rows += item.size
        return items

    def _waiting_for_rows(self) -> bool:
        """Whether a batch that is not full should wait (``wait_s``) for more rows; arms a
        timer that dispatches when the oldest request has waited ``wait_s``."""
        if self.wait_s <= 0 or self.queued_rows >= self.max_rows:
            return False
        left = self.queue[0].arrived + self.wait_s - time.monotonic()
        if left <= 0:
            return False
        if self._timer is None:
            def fire() -> None:
                self._timer = None
                self._dispatch()

            self._timer = asyncio.get_running_loop().call_later(left, fire)
        return True

    def _dispatch(self) -> None:
        while self.in_flight < self._limit and self.queue:
            if self._waiting_for_rows():
                return
            items = self._take()
            if not items:
                return
            self.in_flight += 1
            self.batches += 1
            task = self._base.copy().run(asyncio.get_running_loop().create_task, self._call(items))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, items: list[Item]) -> None:
        deadline = max((it.deadline for it in items), key=lambda d: d.at)
        try:
            try:
                with spans.batch_span(self._span_name, [it.trace for it in items], rows=items):
                    outs = await self.run(items, deadline)
            except (DeadlineExceeded, StageOverloaded) as exc:
                _fail(items, exc)
                return
            except Exception as exc:
                if len(items) == 1 or retryable(exc):
                    _fail(items, exc)
                    return
                self.isolated += 1
                await asyncio.gather(*(self._alone(it) for it in items))
                return
            for item, out in zip(items, outs, strict=True):
                if item.future.done():
                    continue
                if isinstance(out, BaseException):  # this request's rows failed, not the others'
                    item.future.set_exception(out)
                else:
                    item.future.set_result(out)
        finally:
            self.in_flight -= 1
            self._dispatch()

    async def _alone(self, item: Item) -> None:
        if item.future.done():
            return
        try:
            with spans.batch_span(self._span_name, [item.trace], rows=[item]):
                out = (await self.run([item], item.deadline))[0]
        except Exception as exc:
            _fail([item], exc)
        else:
            if isinstance(out, BaseException):
                _fail([item], out)
            elif not item.future.done():
                item.future.set_result(out)


def _fail(items: list[Item], exc: BaseException) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(exc)
