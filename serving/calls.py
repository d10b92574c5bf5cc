"""Stage calls with a deadline: timeouts that cancel the call, bounded retries with jittered
backoff, and Serve's back-pressure turned into an answer the client can act on.

Every request carries a :class:`Deadline` (default from the plan's p99 target, overridable
per request with the ``X-Deadline-Ms`` header). A stage call waits at most until the
deadline; when it passes, the call is cancelled (``DeploymentResponse.cancel``, which also
cancels the work on the replica) and :class:`DeadlineExceeded` is raised. A replica that
died mid-call is retried (predictions are idempotent) at most ``retries`` times, after a
full-jitter exponential backoff (AWS architecture blog, "Exponential Backoff And Jitter"),
and never past the deadline. A stage whose queue is full (``max_queued_requests``) raises
:class:`StageOverloaded`, answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .schema import RequestError

#: header a client sets to give one request its own deadline (milliseconds)
DEADLINE_HEADER = "x-deadline-ms"
#: longest deadline a client may ask for (seconds): nothing holds a connection longer
MAX_DEADLINE_S = 120.0
#: deadline of a request when the plan has no p99 target and the client sets none (seconds)
DEFAULT_DEADLINE_S = 30.0
#: the default deadline is this multiple of the plan's p99 target (Clipper's SLO: the
#: target itself; rows past it are late by the target's own definition)
DEADLINE_OVER_P99 = 1.0
#: times a stage call is retried after its replica died mid-call
STAGE_RETRIES = 2
#: first backoff ceiling (seconds); doubles per attempt up to BACKOFF_MAX_S
BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 1.0
#: Retry-After (seconds) sent with a 503 when a queue is full
RETRY_AFTER_S = 1


class DeadlineExceeded(Exception):
    """The request's deadline passed while ``stage`` was working on it."""

    def __init__(self, stage: str, budget_s: float):
        super().__init__(f"deadline of {1000 * budget_s:.0f} ms exceeded at the {stage} stage")
        self.stage = stage
        self.budget_s = budget_s


class StageOverloaded(Exception):
    """A stage's queue is full (``max_queued_requests``): shed the request."""

    def __init__(self, stage: str, retry_after_s: float = RETRY_AFTER_S):
        super().__init__(f"the {stage} stage is overloaded (its queue is full); retry later")
        self.stage = stage
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered, on the monotonic clock."""

    at: float
    budget_s: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def reserve(self, share: float) -> Deadline:
        """The same deadline brought forward by ``share`` of its budget (time kept to answer
        another way when a stage is late)."""
        return Deadline(self.at - share * self.budget_s, self.budget_s)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], default_s: float) -> Deadline:
        """The request's deadline: the ``X-Deadline-Ms`` header when given, else ``default_s``.
        A malformed or out-of-range header is the client's mistake (422), not ignored."""
        raw = headers.get(DEADLINE_HEADER)
        if raw is None:
            return cls.after(default_s)
        try:
            ms = float(raw)
        except ValueError:
            ms = math.nan
        if not (0 < ms <= 1000 * MAX_DEADLINE_S):
            raise RequestError(422, f"{DEADLINE_HEADER} must be a number of milliseconds in "
                                    f"(0, {1000 * MAX_DEADLINE_S:g}], got {raw!r}",
                               [{"field": f"header:{DEADLINE_HEADER}", "error": "out of range"}])
        return cls.after(ms / 1000.0)


def default_deadline_s(target_p99_ms: float | None, factor: float = DEADLINE_OVER_P99) -> float:
    """A request's deadline when the client gives none: ``factor`` times the plan's p99
    target, or DEFAULT_DEADLINE_S without a target."""
    if target_p99_ms is None:
        return DEFAULT_DEADLINE_S
    return min(MAX_DEADLINE_S, factor * target_p99_ms / 1000.0)


def backoff_s(attempt: int, rng: random.Random, base_s: float = BACKOFF_BASE_S,
              max_s: float = BACKOFF_MAX_S) -> float:
    """Full jitter: uniform in [0, min(max_s, base_s * 2**attempt)]."""
    return rng.uniform(0.0, min(max_s, base_s * (2 ** attempt)))


async def wait_or_cancel(response: Any, timeout_s: float, stage: str, budget_s: float) -> Any:
    """Await a stage call for at most ``timeout_s``; past it (or if the caller is cancelled,
    e.g. the client went away), cancel the call so its replica stops working on it."""

    async def resolve() -> Any:
        return await response

    task = asyncio.ensure_future(resolve())
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
    except BaseException:
        _cancel(response, task)
        raise
    if not done:
        _cancel(response, task)
        raise DeadlineExceeded(stage, budget_s)
    return task.result()


def _cancel(response: Any, task: asyncio.Future) -> None:
    cancel = getattr(response, "cancel", None)
    if callable(cancel):
        try:
            cancel()
        except Exception:  # best effort: the call may have finished meanwhile
            pass
    task.cancel()


def retryable(exc: BaseException) -> bool:
    """A replica died or vanished mid-call: the same call on another replica may succeed."""
    import ray.exceptions as rex

    return isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError))


def overloaded(exc: BaseException) -> bool:
    from ray.serve.exceptions import BackPressureError

    return isinstance(exc, BackPressureError)


async def call_stage(
    handle: Any,
    method: str,
    args: tuple,
    deadline: Deadline,
    stage: str,
    *,
    retries: int = STAGE_RETRIES,
    rng: random.Random | None = None,
    on_retry: Callable[[], None] | None = None,
) -> Any:
    """``handle.method.remote(*args)`` within ``deadline``, retried on replica death."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise DeadlineExceeded(stage, deadline.budget_s)
        try:
            return await wait_or_cancel(getattr(handle, method).remote(*args), remaining, stage,
                                        deadline.budget_s)
        except DeadlineExceeded:
            raise
        except Exception as exc:
            if overloaded(exc):
                raise StageOverloaded(stage) from exc
            if not retryable(exc) or attempt >= retries:
                raise
            pause = backoff_s(attempt, rng)
            if pause >= deadline.remaining():
                raise DeadlineExceeded(stage, deadline.budget_s) from exc
            attempt += 1
            if on_retry is not None:
                on_retry()
            await asyncio.sleep(pause)
