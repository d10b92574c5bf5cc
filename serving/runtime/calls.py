"""Stage calls with a deadline: timeouts that cancel the call, bounded retries with jittered
backoff, and Serve's back-pressure turned into an answer the client can act on.

Every request carries a :class:`Deadline` (default from the plan's p99 target, overridable
per request with the ``X-Deadline-Ms`` header). A stage call waits at most until the
deadline; when it passes, the call is cancelled (``DeploymentResponse.cancel``, which also
cancels the work on the replica) and :class:`DeadlineExceeded` is raised. A replica that
died mid-call is retried (predictions are idempotent) at most ``retries`` times, after a
full-jitter exponential backoff (AWS architecture blog, "Exponential Backoff And Jitter"),
and never past the deadline. A stage whose queue is full (``max_queued_requests``) raises
:class:`StageOverloaded`, answered 503 with ``Retry-After``. With a :class:`StageHedge`, a
call still unanswered after the stage's own latency tail is sent once more (hedged) and the
first answer kept.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.core.schema import RequestError
from serving.runtime import cancelled_calls
from serving.runtime.hedge import (
    HEDGE_FLOOR_OVER_MEDIAN,
    HEDGE_IDLE_ONLY,
    HEDGE_MIN_WIN_SHARE,
    HEDGE_QUANTILE,
    LOST_AFTER_S,
    LOST_OVER_MEDIAN,
    HedgeBackoff,
    LatencyWindow,
)

#: header a client sets to give one request its own deadline (milliseconds)
DEADLINE_HEADER = "x-deadline-ms"
#: longest deadline a client may ask for (seconds): nothing holds a connection longer
MAX_DEADLINE_S = 120.0
#: deadline of a request when the plan has no p99 target and the client sets none (seconds)
DEFAULT_DEADLINE_S = 30.0
#: the default deadline is this multiple of the plan's p99 target (Clipper's SLO: the
#: target itself; rows past it are late by the target's own definition)
DEADLINE_OVER_P99 = 1.0
#: seconds between asks whether a replica went silent, for a call past the bound on a silent replica
SILENT_RECHECK_S = 0.25
#: a call unanswered this many times its bound is copied though the router says every replica
#: answers: the router's view can miss a lost replica's calls (likely: Serve reports the replica
#: dead and the router forgets it with the calls it held, which never end). Without this, tier
#: preemptions left 37 requests in 6 preemptions to answer 504 at the 30 s deadline (2026-12-07)
UNHEARD_COPY_OVER_BOUND = 2.0
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


async def _resolve(response: Any) -> Any:
    return await response


async def wait_or_cancel(response: Any, timeout_s: float, stage: str, budget_s: float) -> Any:
    """Await a stage call for at most ``timeout_s``; past it (or if the caller is cancelled,
    e.g. the client went away), cancel the call so its replica stops working on it."""

    return await _finish(asyncio.ensure_future(_resolve(response)), response, timeout_s, stage, budget_s)


async def _finish(task: asyncio.Future, response: Any, timeout_s: float, stage: str, budget_s: float) -> Any:
    """The result of ``task`` (awaiting ``response``) within ``timeout_s``, else cancel both."""
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
    except BaseException:
        _cancel(response, task)
        raise
    if not done:
        _cancel(response, task)
        raise DeadlineExceeded(stage, budget_s)
    return task.result()


def _cancel(response: Any, task: asyncio.Future, answered_by: Any = None) -> None:
    """Cancel a stage call (``answered_by``: its copy's response, where that answered first)."""
    cancel = getattr(response, "cancel", None)
    if callable(cancel):
        if not task.done():  # its end at the router will be no answer from the replica
            try:
                cancelled_calls.note(response, answered_by)
            except Exception:  # bookkeeping only: the cancel must happen
                pass
        try:
            cancel()
        except Exception:  # best effort: the call may have finished meanwhile
            pass
    task.cancel()


class StageHedge:
    """Copies of slow calls to one stage. Two triggers:

    * hedging ("The Tail at Scale"; FlexRR's straggler mitigation for serving; ``enabled``): a
      call still unanswered after the stage's own latency quantile, and never before
      ``floor_over_median`` times its median (:class:`serving.runtime.hedge.LatencyWindow`),
      is sent once more through the same handle, whose router gives it to another replica;
      with ``idle_only`` (``HEDGE_IDLE_ONLY``) only while this ingress has fewer calls in
      flight to the stage (``in_flight()``) than it has replicas: with every replica busy the
      tail is queueing, which a copy only lengthens. ``on_hedge`` hears of each hedge once
      decided (True: the copy answered first). The delay backs off while copies lose
      (:class:`serving.runtime.hedge.HedgeBackoff`: fewer than ``min_win_share`` of them
      winning; 0 turns it off); ``on_backoff`` hears of each new factor.
    * the bound on a silent replica (always): a call unanswered after ``lost_after_s`` is copied
      whatever the load (its replica may be lost without anyone having said so) as soon as
      ``silent()`` says a replica of the stage has gone silent (the capacity router judges each
      replica against its own latency: serving.runtime.routing). False (every replica answers:
      the call is queued, and a copy would only add work) waits, asking again every
      ``SILENT_RECHECK_S``, until the call is past ``UNHEARD_COPY_OVER_BOUND`` times
      ``bound()``; None (no router knows) copies once the call is past ``bound()``,
      ``max(lost_after_s, lost_over_median * the stage's median latency)``. ``on_rescue``
      hears of each copy.

    Both need at least two running replicas (``replicas()``); the first answer is kept and the
    other call cancelled."""

    def __init__(self, replicas: Callable[[], int], quantile: float | None = None,
                 floor_over_median: float | None = None, on_hedge: Callable[[bool], None] | None = None,
                 in_flight: Callable[[], int] | None = None, idle_only: bool | None = None, *,
                 enabled: bool = True, lost_after_s: float | None = LOST_AFTER_S,
                 lost_over_median: float = LOST_OVER_MEDIAN, on_rescue: Callable[[bool], None] | None = None,
                 silent: Callable[[], bool | None] | None = None, min_win_share: float | None = None,
                 on_backoff: Callable[[float], None] | None = None):
        if lost_after_s is not None and not lost_after_s > 0:
            raise ValueError(f"lost_after_s must be > 0 (None: no bound), got {lost_after_s!r}")
        self.window = LatencyWindow(
            quantile=HEDGE_QUANTILE if quantile is None else quantile,
            floor_over_median=HEDGE_FLOOR_OVER_MEDIAN if floor_over_median is None else floor_over_median)
        self.replicas, self.on_hedge, self.in_flight = replicas, on_hedge, in_flight
        self.idle_only = HEDGE_IDLE_ONLY if idle_only is None else bool(idle_only)
        self.enabled, self.on_rescue = bool(enabled), on_rescue
        self.lost_after_s = None if lost_after_s is None else float(lost_after_s)
        self.lost_over_median = float(lost_over_median)
        self.silent = silent
        self.backoff = HedgeBackoff(HEDGE_MIN_WIN_SHARE if min_win_share is None else min_win_share,
                                    on_change=on_backoff)
        self.calls = self.hedges = self.wins = self.skipped_busy = self.rescues = self.skipped_answering = 0

    def delay(self) -> float | None:
        """Seconds after which a call is hedged; None: not now (hedging off, too few latencies
        known, or a single replica)."""
        if not self.enabled or self.replicas() < 2:
            return None
        delay = self.window.delay()
        return None if delay is None else delay * self.backoff.factor

    def bound(self) -> float | None:
        """Seconds after which a call is copied whatever the load; None with a single replica or
        no bound."""
        if self.lost_after_s is None or self.replicas() < 2:
            return None
        median = self.window.median()
        return self.lost_after_s if median is None else max(self.lost_after_s, self.lost_over_median * median)

    def silent_now(self) -> bool | None:
        """Whether a replica of the stage has gone silent (None: nobody knows)."""
        return None if self.silent is None else self.silent()

    def spare(self) -> bool:
        """Whether a replica is free for a copy now (always, without ``idle_only`` or a count
        of calls in flight)."""
        if not self.idle_only or self.in_flight is None:
            return True
        return self.in_flight() < self.replicas()


def _rescue_due(hedge: StageHedge, waited: float, bound: float) -> bool:
    """Whether a call past ``lost_after_s`` is copied now as a rescue: a replica of the stage is
    silent, or nobody knows and the call is past ``bound``, or it is past
    ``UNHEARD_COPY_OVER_BOUND`` times ``bound`` whatever the replicas say."""
    silent = hedge.silent_now()
    if silent or (silent is None and waited >= bound) or waited >= UNHEARD_COPY_OVER_BOUND * bound:
        return True
    if silent is False:  # every replica answers: the call is queued behind live work
        hedge.skipped_answering += 1
    return False


async def _copy_due(task: asyncio.Future, t0: float, delay: float | None, bound: float | None,
                    hedge: StageHedge, until: float) -> str | None:
    """Wait on the first call until a copy is due: "hedge" (its tail, hedging still on, a
    replica spare), "rescue" (past the bound while a replica of the stage is silent: checked
    from ``lost_after_s`` on, while a longer hedge delay runs too), or None (it answered, the
    deadline ``until`` passed, or no copy will be sent: wait for it)."""
    # read once: an in-place settings change (serving.runtime.live_settings) may set it to None
    # while this call waits
    lost_after_s = hedge.lost_after_s if hedge.lost_after_s is not None else bound
    if delay is not None and (bound is None or delay < bound):
        # the hedge delay (backed off, it may pass lost_after_s: the silence check starts there)
        first_wait = delay if bound is None else min(delay, lost_after_s)
        done, _ = await asyncio.wait({task}, timeout=first_wait)
        if done:
            return None
        while bound is not None and (waited := time.monotonic() - t0) < delay:
            if _rescue_due(hedge, waited, bound):
                return "rescue"
            done, _ = await asyncio.wait({task}, timeout=min(SILENT_RECHECK_S, delay - waited))
            if done:
                return None
        if hedge.enabled:  # turned off in place while this call waited: no copy now
            if hedge.spare():
                return "hedge"
            hedge.skipped_busy += 1  # every replica is busy: a copy would queue behind them
    if bound is None:
        return None
    done, _ = await asyncio.wait({task}, timeout=max(lost_after_s - (time.monotonic() - t0), 0.0))
    while not done and time.monotonic() < until:
        if _rescue_due(hedge, time.monotonic() - t0, bound):
            return "rescue"
        done, _ = await asyncio.wait({task}, timeout=min(SILENT_RECHECK_S, max(until - time.monotonic(), 0.0)))
    return None


async def hedged(call: Callable[[Any], Any], timeout_s: float, stage: str, budget_s: float,
                 hedge: StageHedge) -> Any:
    """``call(None)`` (it sends the stage call and returns its response) awaited for at most
    ``timeout_s``, copied once with ``call(first_response)`` (a stage on node pools sends the
    copy to another pool): at ``hedge.delay()`` where a replica is spare, else at
    ``hedge.bound()``. A call answered by its copy is recorded at the time the first had taken
    then (a lower bound), so copies do not hide from the window the tail they cut."""
    hedge.calls += 1
    delay, bound = hedge.delay(), hedge.bound()
    delay = delay if delay is not None and delay < timeout_s else None
    bound = bound if bound is not None and bound < timeout_s else None
    t0 = time.monotonic()
    first = call(None)
    task1 = asyncio.ensure_future(_resolve(first))
    try:
        kind = await _copy_due(task1, t0, delay, bound, hedge, t0 + timeout_s)
    except BaseException:
        _cancel(first, task1)
        raise
    if kind is None:
        out = await _finish(task1, first, t0 + timeout_s - time.monotonic(), stage, budget_s)
        hedge.window.add(time.monotonic() - t0)
        return out
    rescue = kind == "rescue"
    try:
        second = call(first)
    except BaseException:  # the copy could not be sent: the first call is left to no one
        _cancel(first, task1)
        raise
    task2 = asyncio.ensure_future(_resolve(second))
    if rescue:
        hedge.rescues += 1
    else:
        hedge.hedges += 1
        hedge.backoff.sent()
    pending, winner = {task1, task2}, None
    try:
        while pending and winner is None:
            left = t0 + timeout_s - time.monotonic()
            done, pending = await asyncio.wait(pending, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the deadline passed with neither answered: the copy did not win
                if not rescue:
                    hedge.backoff.record(False)
                raise DeadlineExceeded(stage, budget_s)
            answered = [t for t in done if t.exception() is None]  # every failure retrieved
            winner = answered[0] if answered else None
    except BaseException:
        _cancel(first, task1)
        _cancel(second, task2)
        raise
    hedge.window.add(time.monotonic() - t0)
    if winner is None:  # both failed: the first call's error is the answer
        return task1.result()
    if winner is task2:
        if not rescue:
            hedge.wins += 1
        elif callable(getattr(type(first), "rescued", None)):  # a stage on node pools: its pool waits a while
            first.rescued()
        _cancel(first, task1, answered_by=second)
    else:
        _cancel(second, task2, answered_by=first)
    if not rescue:
        hedge.backoff.record(winner is task2)
    heard = hedge.on_rescue if rescue else hedge.on_hedge
    if heard is not None:
        heard(winner is task2)
    return winner.result()


def _send(handle: Any, method: str, args: tuple, first: Any = None) -> Any:
    """``handle.method.remote(*args)``; a copy of ``first`` through ``handle.copy_of(first)`` where
    the handle routes over node pools (serving.runtime.pools: the copy goes to another pool)."""
    # looked up on the class: a Serve handle makes any attribute a method handle
    pooled = first is not None and callable(getattr(type(handle), "copy_of", None))
    target = handle.copy_of(first) if pooled else handle
    return getattr(target, method).remote(*args)


def older_signature(exc: BaseException) -> bool:
    """A replica of the app's previous code refused an argument this code added: during a rolling
    update across code versions Serve replaces deployments one by one, so a new ingress may call
    an old stage or monitor replica for a while (the replica's TypeError comes back as one)."""
    text = str(exc)
    return isinstance(exc, TypeError) and ("positional argument" in text or "unexpected keyword argument" in text)


async def first_accepted(call: Callable[[tuple], Awaitable[Any]], attempts: Sequence[tuple]) -> Any:
    """``call(args)`` with the first of ``attempts`` (newest code's arguments first) that the
    replica takes: a replica of earlier code refuses newer arguments with a TypeError
    (:func:`older_signature`), and the next, older form goes instead; any other error is raised."""
    for i, args in enumerate(attempts):
        try:
            return await call(args)
        except TypeError as exc:
            if i == len(attempts) - 1 or not older_signature(exc):
                raise
    raise ValueError("first_accepted needs at least one set of arguments")


async def call_stage_compatible(handle: Any, method: str, args: tuple, older: Sequence[tuple], deadline: Deadline,
                                stage: str, **kwargs: Any) -> Any:
    """:func:`call_stage` with ``args``; where the replica refused the call's arguments, again
    with each of ``older`` in turn (what earlier code versions' replicas take, newest first)."""
    return await first_accepted(lambda attempt: call_stage(handle, method, attempt, deadline, stage, **kwargs),
                                (args, *older))


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
    hedge: StageHedge | None = None,
) -> Any:
    """``handle.method.remote(*args)`` within ``deadline``, retried on replica death, hedged
    with ``hedge``."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise DeadlineExceeded(stage, deadline.budget_s)
        try:
            if hedge is not None:
                return await hedged(lambda first: _send(handle, method, args, first), remaining, stage,
                                    deadline.budget_s, hedge)
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
