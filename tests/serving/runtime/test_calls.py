"""Stage calls and ingress batching without Ray: deadlines, cancellation, retries with
jittered backoff, back-pressure, per-request failure isolation, parsing off the event loop.
Fake handles stand in for Serve's; time is asyncio's, never the machine's speed."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import types

import pytest
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from serving.core.schema import ColumnSpec, PredictRequest, RequestError, RowSchema
from serving.runtime.calls import (
    BACKOFF_BASE_S,
    MAX_DEADLINE_S,
    Deadline,
    DeadlineExceeded,
    StageOverloaded,
    backoff_s,
    call_stage,
    default_deadline_s,
)
from serving.runtime.coalesce import Coalescer
from serving.runtime.keys import KeyCheck


class _Response:
    """Looks like a DeploymentResponse: awaitable, cancellable."""

    def __init__(self, coro):
        self.task = asyncio.ensure_future(coro)
        self.cancelled = False

    def __await__(self):
        return self.task.__await__()

    def cancel(self):
        self.cancelled = True
        self.task.cancel()


class _Handle:
    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.calls = 0
        self.responses: list[_Response] = []
        handle = self

        class _Method:
            def remote(self, *args):
                handle.calls += 1
                response = _Response(handle.behaviour(handle.calls, *args))
                handle.responses.append(response)
                return response

        self.run = _Method()


def test_deadline_from_header_and_its_limits():
    assert Deadline.from_headers({}, 2.0).budget_s == 2.0
    assert Deadline.from_headers({"x-deadline-ms": "250"}, 2.0).budget_s == pytest.approx(0.25)
    for bad in ("0", "-5", "soon", str(1000 * MAX_DEADLINE_S + 1), "nan"):
        with pytest.raises(RequestError) as info:
            Deadline.from_headers({"x-deadline-ms": bad}, 2.0)
        assert info.value.status == 422 and "x-deadline-ms" in info.value.message
    assert default_deadline_s(None) == 30.0 and default_deadline_s(150.0) == pytest.approx(0.15)
    d = Deadline.after(1.0)
    assert d.reserve(0.2).at == pytest.approx(d.at - 0.2)


def test_backoff_is_full_jitter_and_capped():
    rng = random.Random(0)
    draws = [backoff_s(a, rng) for a in range(10) for _ in range(50)]
    assert all(0 <= d <= 1.0 for d in draws)
    first = [backoff_s(0, rng) for _ in range(200)]
    assert max(first) <= BACKOFF_BASE_S and min(first) < BACKOFF_BASE_S / 4  # jitter, not a fixed pause


def test_call_retries_a_dead_replica_with_backoff_then_succeeds():
    async def behaviour(n, x):
        if n <= 2:
            raise RayActorError()
        return x * 2

    handle, retries = _Handle(behaviour), []

    async def run():
        return await call_stage(handle, "run", (21,), Deadline.after(5.0), "expensive",
                                rng=random.Random(1), on_retry=lambda: retries.append(1))

    assert asyncio.run(run()) == 42
    assert handle.calls == 3 and len(retries) == 2


def test_call_gives_up_after_bounded_retries():
    async def behaviour(n, x):
        raise RayActorError()

    handle = _Handle(behaviour)
    with pytest.raises(RayActorError):
        asyncio.run(call_stage(handle, "run", (1,), Deadline.after(30.0), "s", retries=2, rng=random.Random(2)))
    assert handle.calls == 3


def test_a_late_call_is_cancelled_at_the_deadline():
    async def behaviour(n, x):
        await asyncio.sleep(60)

    handle = _Handle(behaviour)

    async def run():
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(DeadlineExceeded, match="at the expensive stage"):
            await call_stage(handle, "run", (1,), Deadline.after(0.05), "expensive")
        return loop.time() - start

    assert asyncio.run(run()) < 5.0
    assert handle.responses[0].cancelled


def test_back_pressure_becomes_overloaded():
    async def behaviour(n, x):
        raise BackPressureError(num_queued_requests=8, max_queued_requests=8)

    with pytest.raises(StageOverloaded) as info:
        asyncio.run(call_stage(_Handle(behaviour), "run", (1,), Deadline.after(5.0), "expensive"))
    assert info.value.retry_after_s >= 1


def test_coalescer_merges_waiting_requests_and_follows_the_replica_count():
    in_flight, peak, sizes = [0], [0], []

    async def run(items, deadline):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        sizes.append(sum(it.size for it in items))
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return [it.rows for it in items]

    async def main(limit):
        co = Coalescer(run, stage="s", max_rows=8, limit=limit)
        deadline = Deadline.after(30.0)
        outs = await asyncio.gather(*(co.submit([i] * 2, None, deadline) for i in range(40)))
        return co, outs

    co, outs = asyncio.run(main(limit=1))
    assert outs == [[i] * 2 for i in range(40)]  # each request gets its own rows back
    assert peak[0] == 1 and max(sizes) == 8 and co.batches < 40
    peak[0] = 0
    asyncio.run(main(limit=4))  # e.g. 1 replica -> 4 replicas: more calls in flight at once
    assert peak[0] == 4


def test_the_rows_still_queued_are_what_a_call_tells_the_stage():
    """What each stage call carries for the stage's autoscaler: rows waiting behind the calls in
    flight, requests given up on left out."""
    release = asyncio.Event()
    seen: list[int] = []

    async def main():
        co = Coalescer(run, stage="s", max_rows=4, limit=1)
        d = Deadline.after(30.0)
        first = asyncio.ensure_future(co.submit([0] * 4, None, d))
        await asyncio.sleep(0)  # in flight: the limit is taken
        waiting = [asyncio.ensure_future(co.submit([i] * 3, None, d)) for i in range(3)]
        await asyncio.sleep(0)
        seen.append(co.queued_rows)
        gone = asyncio.ensure_future(co.submit([9] * 2, None, Deadline.after(0.01)))
        with pytest.raises(DeadlineExceeded):
            await gone
        seen.append(co.queued_rows)
        release.set()
        await asyncio.gather(first, *waiting)
        seen.append(co.queued_rows)

    async def run(items, deadline):
        await release.wait()
        return [it.rows for it in items]

    asyncio.run(main())
    assert seen == [9, 9, 0]


def test_requests_given_up_on_do_not_fill_the_queue_of_a_stalled_stage():
    """A stage stalls (its only call slot held): the requests that waited past their deadline
    leave their items in the queue, but those no longer count against ``max_queued``, so a new
    request waits its turn instead of being refused as overloaded; once most of the queue is
    given up on, the queue drops those items and their rows."""
    from serving.runtime.calls import StageOverloaded

    release = asyncio.Event()

    async def run(items, deadline):
        await release.wait()
        return [it.rows for it in items]

    async def main():
        co = Coalescer(run, stage="s", max_rows=4, limit=1, max_queued=3)
        first = asyncio.ensure_future(co.submit([0] * 4, None, Deadline.after(30.0)))
        await asyncio.sleep(0)  # in flight: the stage's one slot is taken, and stalls
        for _ in range(30):  # wave after wave of requests times out behind it
            results = await asyncio.gather(*(co.submit([1], None, Deadline.after(0.005)) for _ in range(3)),
                                           return_exceptions=True)
            assert all(isinstance(r, DeadlineExceeded) for r in results), results
        assert len(co.queue) <= 64 + 3  # most of the 90 given-up items dropped with their rows
        waiting = [asyncio.ensure_future(co.submit([i], None, Deadline.after(30.0))) for i in range(3)]
        await asyncio.sleep(0)
        assert co.queued_rows == 3
        with pytest.raises(StageOverloaded):  # three live requests wait: the bound holds for them
            await co.submit([9], None, Deadline.after(30.0))
        release.set()
        return await asyncio.gather(first, *waiting)

    assert asyncio.run(main()) == [[0] * 4, [0], [1], [2]]


def test_a_batch_waits_for_rows_up_to_wait_s_and_no_longer_when_full():
    """wait_s (the torch-model app's batch wait): a batch that is not full waits for more
    rows; a full one goes at once; a lone request still goes when the wait ends. Outcomes
    only: a wrongly applied wait would hang the full batch for a minute (and fail here)."""
    calls = []

    async def run(items, deadline):
        calls.append([it.rows for it in items])
        return [it.rows for it in items]

    async def full():
        co = Coalescer(run, stage="s", max_rows=4, limit=1, wait_s=60.0)
        d = Deadline.after(120.0)
        first = asyncio.ensure_future(co.submit(("a", "b"), None, d, size=2))
        await asyncio.sleep(0)  # queued and waiting for rows: nothing sent yet
        sent_before = len(calls)
        second = co.submit(("c", "d"), None, d, size=2)  # the batch is full now
        return sent_before, await asyncio.wait_for(asyncio.gather(first, second), 30.0)

    sent_before, outs = asyncio.run(full())
    assert sent_before == 0 and outs == [("a", "b"), ("c", "d")] and calls == [[("a", "b"), ("c", "d")]]

    async def lone():
        co = Coalescer(run, stage="s", max_rows=4, limit=1, wait_s=0.05)
        return await asyncio.wait_for(co.submit(("x",), None, Deadline.after(120.0), size=1), 30.0)

    calls.clear()
    assert asyncio.run(lone()) == ("x",) and calls == [[("x",)]]
    with pytest.raises(ValueError, match="wait_s"):
        Coalescer(run, stage="s", max_rows=4, limit=1, wait_s=-1.0)


def test_one_bad_request_fails_alone():
    async def run(items, deadline):
        if any(it.rows == "poison" for it in items):
            raise ValueError("bad row")
        return [f"ok:{it.rows}" for it in items]

    async def main():
        co = Coalescer(run, stage="s", max_rows=100, limit=1)
        deadline = Deadline.after(30.0)
        blocker = asyncio.ensure_future(co.submit("first", None, deadline))  # holds the one slot
        rest = [asyncio.ensure_future(co.submit(x, None, deadline)) for x in ("a", "poison", "b")]
        await blocker
        return await asyncio.gather(*rest, return_exceptions=True)

    a, bad, b = asyncio.run(main())
    assert a == "ok:a" and b == "ok:b"
    assert isinstance(bad, ValueError)


def test_queue_is_bounded_and_waiting_requests_time_out():
    release = asyncio.Event

    async def main():
        gate = release()

        async def run(items, deadline):
            await gate.wait()
            return [it.rows for it in items]

        co = Coalescer(run, stage="expensive", max_rows=1, limit=1, max_queued=2)
        first = asyncio.ensure_future(co.submit([1], None, Deadline.after(30.0)))
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(co.submit([i], None, Deadline.after(0.05))) for i in (2, 3)]
        await asyncio.sleep(0)
        with pytest.raises(StageOverloaded):
            await co.submit([4], None, Deadline.after(30.0))
        results = await asyncio.gather(*queued, return_exceptions=True)
        gate.set()
        return await first, results

    first, results = asyncio.run(main())
    assert first == [1] and all(isinstance(r, DeadlineExceeded) for r in results)


class _Request:
    def __init__(self, body: bytes):
        self.body, self.headers = body, {"content-length": str(len(body))}
        self.state = types.SimpleNamespace()

    async def stream(self):
        for start in range(0, len(self.body), 65536):
            yield self.body[start:start + 65536]


@pytest.mark.parametrize("rows", [10, 20_000])
def test_the_ingress_parses_large_bodies_off_the_event_loop(monkeypatch, rows):
    """Bodies over PARSE_INLINE_BYTES are parsed in a thread: the event loop keeps serving
    other requests meanwhile; small ones are parsed inline (a thread hop costs more)."""
    import serving.runtime.ingress as app_module

    threads = []

    class Schema(RowSchema):  # notes the thread that builds the frame
        def to_frame(self, rows, max_rows):
            threads.append(threading.get_ident())
            return super().to_frame(rows, max_rows)

    schema = Schema([ColumnSpec(c, "number", False, "float64") for c in "abc"])
    body = json.dumps({"rows": [{"a": 1.5, "b": 2.5, "c": float(i)} for i in range(rows)]}).encode()
    cls = app_module.Ingress.func_or_class  # the ingress's own methods, on a stand-in instance
    ingress = types.SimpleNamespace(schema=schema, max_body=10 * len(body), max_rows=50_000)
    ingress.read_body = lambda request: cls.read_body(ingress, request)
    ingress._read_body = lambda request: cls._read_body(ingress, request)
    ingress._parse = lambda request, model: cls._parse(ingress, request, model)

    async def main():
        ticks, done = 0, False

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.ensure_future(ticker())
        _, frame = await ingress._parse(_Request(body), PredictRequest)
        done = True
        await tick_task
        return threading.get_ident(), frame

    loop_thread, frame = asyncio.run(main())
    assert len(frame) == rows
    assert (threads[0] != loop_thread) == (len(body) > app_module.PARSE_INLINE_BYTES)


def _hedge(replicas: int = 2, known: float = 0.01):
    """A StageHedge whose window already holds 40 latencies of ``known`` seconds (delay: twice
    that, the floor over the median)."""
    from serving.runtime.calls import StageHedge

    heard: list[bool] = []
    hedge = StageHedge(lambda: replicas, on_hedge=heard.append)
    for _ in range(40):
        hedge.window.add(known)
    return hedge, heard


def test_a_straggling_call_is_hedged_and_the_first_answer_kept():
    """The first call stalls; after the stage's latency tail a copy is sent, answers, and the
    stalled call is cancelled; the window records how long the first had taken by then."""
    hedge, heard = _hedge()

    async def behaviour(n, *args):
        if n == 1:
            await asyncio.sleep(30)  # the straggler
        return {"call": n}

    handle = _Handle(behaviour)
    out = asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "expensive", hedge=hedge))
    assert out == {"call": 2} and handle.calls == 2
    assert handle.responses[0].cancelled and not handle.responses[1].cancelled
    assert (hedge.calls, hedge.hedges, hedge.wins) == (1, 1, 1) and heard == [True]
    assert hedge.window.samples[-1] >= 0.02  # not the copy's own (short) time


def test_a_copy_that_loses_backs_the_delay_off_and_one_that_wins_brings_it_back():
    """Outcomes reach the stage's HedgeBackoff: a copy beaten by the call it copied lengthens the
    delay (here after one outcome), a copy that answers first shortens it again."""
    from serving.runtime.hedge import HedgeBackoff

    hedge, heard = _hedge()
    backoffs: list[float] = []
    hedge.backoff = HedgeBackoff(min_win_share=0.5, outcomes=1, on_change=backoffs.append)
    base = hedge.delay()

    async def first_wins(n, *args):
        await asyncio.sleep(0.05 if n == 1 else 30)  # the copy stalls: the first answers
        return {"call": n}

    out = asyncio.run(call_stage(_Handle(first_wins), "run", (), Deadline.after(60), "s", hedge=hedge))
    assert out == {"call": 1} and heard == [False] and backoffs == [2.0]
    assert hedge.delay() == pytest.approx(2 * base)

    async def copy_wins(n, *args):
        await asyncio.sleep(30 if n == 1 else 0)
        return {"call": n}

    out = asyncio.run(call_stage(_Handle(copy_wins), "run", (), Deadline.after(60), "s", hedge=hedge))
    assert out == {"call": 2} and heard == [False, True] and backoffs == [2.0, 1.0]
    assert hedge.delay() == pytest.approx(base)


def test_no_hedge_for_a_prompt_call_a_single_replica_or_an_unknown_tail():
    async def prompt(n, *args):
        return {"call": n}

    for replicas, known in ((2, 0.5), (1, 0.001)):  # answers before the delay; one replica
        hedge, heard = _hedge(replicas, known)
        handle = _Handle(prompt)
        assert asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "s", hedge=hedge)) == {"call": 1}
        assert handle.calls == 1 and hedge.hedges == 0 and heard == []
    from serving.runtime.calls import StageHedge

    fresh = StageHedge(lambda: 4)  # too few latencies known yet
    assert fresh.delay() is None


def test_a_hedged_pair_fails_over_and_meets_the_deadline():
    """One of the pair failing leaves the other's answer; both failing is the first's error
    (so the caller's retry rules apply); both late is DeadlineExceeded with both cancelled."""
    async def first_dies(n, *args):
        if n == 1:
            await asyncio.sleep(0.1)
            raise RayActorError()
        await asyncio.sleep(0.3)
        return {"call": n}

    hedge, heard = _hedge()
    out = asyncio.run(call_stage(_Handle(first_dies), "run", (), Deadline.after(60), "s", hedge=hedge, retries=0))
    assert out == {"call": 2} and heard == [True]

    async def both_fail(n, *args):
        await asyncio.sleep(0.1 * n)
        raise ValueError(f"call {n}")

    hedge, _ = _hedge()
    with pytest.raises(ValueError, match="call 1"):
        asyncio.run(call_stage(_Handle(both_fail), "run", (), Deadline.after(60), "s", hedge=hedge))

    async def both_stall(n, *args):
        await asyncio.sleep(30)

    hedge, _ = _hedge()
    handle = _Handle(both_stall)
    with pytest.raises(DeadlineExceeded):
        asyncio.run(call_stage(handle, "run", (), Deadline.after(0.3), "s", hedge=hedge))
    assert handle.calls == 2 and all(r.cancelled for r in handle.responses)


def test_no_copy_is_sent_while_every_replica_is_busy():
    """With as many of this ingress's calls in flight as the stage has replicas, the tail is
    queueing: the late call waits for its own answer instead of being copied."""
    from serving.runtime.calls import StageHedge

    busy = StageHedge(lambda: 2, in_flight=lambda: 2)
    free = StageHedge(lambda: 2, in_flight=lambda: 1)
    for hedge in (busy, free):
        for _ in range(40):
            hedge.window.add(0.01)

    async def answers_once_passed_over(n, *args):  # the first call answers once its copy was skipped
        while n == 1 and busy.skipped_busy == 0:
            await asyncio.sleep(0.01)
        return {"call": n}

    async def stalled_first(n, *args):
        await asyncio.sleep(30 if n == 1 else 0.0)
        return {"call": n}

    handle = _Handle(answers_once_passed_over)
    assert asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "s", hedge=busy)) == {"call": 1}
    assert handle.calls == 1 and busy.hedges == 0 and busy.skipped_busy == 1
    handle = _Handle(stalled_first)
    assert asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "s", hedge=free)) == {"call": 2}
    assert free.hedges == 1 and free.skipped_busy == 0
    assert StageHedge(lambda: 2, in_flight=lambda: 5, idle_only=False).spare()


def test_a_call_held_past_the_bound_is_copied_with_hedging_off_and_every_replica_busy():
    """A replica nobody reported lost (it never answers): the call is copied at the bound,
    max(lost_after_s, lost_over_median x median), whatever the hedging settings or the load."""
    from serving.runtime.calls import StageHedge

    async def silent_first(n, *args):
        await asyncio.sleep(30 if n == 1 else 0.0)
        return {"call": n}

    for enabled, in_flight in ((False, 1), (True, 2)):
        heard: list[bool] = []
        hedge = StageHedge(lambda: 2, in_flight=lambda f=in_flight: f, enabled=enabled, lost_after_s=0.1,
                           lost_over_median=2.0, on_rescue=heard.append)
        for _ in range(40):
            hedge.window.add(0.01)
        assert hedge.bound() == pytest.approx(0.1)
        handle = _Handle(silent_first)
        assert asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "s", hedge=hedge)) == {"call": 2}
        assert (hedge.rescues, hedge.hedges, heard) == (1, 0, [True]) and handle.responses[0].cancelled
        assert hedge.skipped_busy == (1 if enabled else 0)
    assert StageHedge(lambda: 2, lost_after_s=0.1, lost_over_median=2.0).bound() == pytest.approx(0.1)
    slow = StageHedge(lambda: 2, lost_after_s=0.1, lost_over_median=2.0)
    for _ in range(5):
        slow.window.add(1.0)
    assert slow.bound() == pytest.approx(2.0), "never sooner than lost_over_median x the median"
    assert StageHedge(lambda: 1).bound() is None, "a single replica: nowhere to copy to"
    assert StageHedge(lambda: 2, enabled=False).delay() is None
    with pytest.raises(ValueError, match="lost_after_s"):
        StageHedge(lambda: 2, lost_after_s=0)


def test_past_the_bound_a_copy_waits_until_a_replica_is_silent():
    """The router knows whether any replica went silent: while every replica answers, a call
    past the bound is queued behind live work and is not copied; once one is silent, it is."""
    from serving.runtime.calls import StageHedge

    state = {"silent": False}

    async def answers_once_passed_over(n, *args):  # the first call answers once the router was asked
        while n == 1 and hedge.skipped_answering == 0:
            await asyncio.sleep(0.01)
        return {"call": n}

    hedge = StageHedge(lambda: 2, enabled=False, lost_after_s=0.1, silent=lambda: state["silent"])
    for _ in range(40):  # median 0.5 s: the bound 2.5 s, a copy regardless at 5 s
        hedge.window.add(0.5)
    handle = _Handle(answers_once_passed_over)
    assert asyncio.run(call_stage(handle, "run", (), Deadline.after(60), "s", hedge=hedge)) == {"call": 1}
    assert handle.calls == 1 and hedge.rescues == 0 and hedge.skipped_answering >= 1
    # the router hears every replica, but the call outlasts twice its bound (0.1 s): its replica
    # may be one the router forgot (lost with its node): copied
    async def lost_first(n, *args):
        await asyncio.sleep(30 if n == 1 else 0.0)
        return {"call": n}

    deaf = StageHedge(lambda: 2, enabled=False, lost_after_s=0.1, silent=lambda: False)
    assert asyncio.run(call_stage(_Handle(lost_first), "run", (), Deadline.after(60), "s", hedge=deaf)) == {"call": 2}
    assert deaf.rescues == 1

    async def flips_then_answers():
        async def flip():
            await asyncio.sleep(0.3)
            state["silent"] = True
        flipper = asyncio.ensure_future(flip())
        out = await call_stage(handle2, "run", (), Deadline.after(60), "s", hedge=hedge2)
        await flipper
        return out

    state["silent"] = False
    hedge2 = StageHedge(lambda: 2, enabled=False, lost_after_s=0.1, silent=lambda: state["silent"])
    handle2 = _Handle(lost_first)
    assert asyncio.run(flips_then_answers()) == {"call": 2} and hedge2.rescues == 1

    async def stalls(n, *args):
        await asyncio.sleep(30)

    # a replica the router calls silent: copied at lost_after_s, though the stage's median would
    # put the blind bound (lost_over_median x median) at 5 s
    hedge4 = StageHedge(lambda: 2, enabled=False, lost_after_s=0.1, lost_over_median=5.0, silent=lambda: True)
    for _ in range(40):
        hedge4.window.add(1.0)
    assert hedge4.bound() == pytest.approx(5.0)
    handle4 = _Handle(lost_first)
    assert asyncio.run(call_stage(handle4, "run", (), Deadline.after(60), "s", hedge=hedge4)) == {"call": 2}
    assert hedge4.rescues == 1

    hedge3 = StageHedge(lambda: 2, enabled=False, lost_after_s=0.05, silent=lambda: False)
    with pytest.raises(DeadlineExceeded):  # waiting on the router never outlasts the deadline
        asyncio.run(call_stage(_Handle(stalls), "run", (), Deadline.after(0.4), "s", hedge=hedge3))


def test_a_hedge_delay_past_lost_after_s_still_copies_a_silent_replicas_call_as_a_rescue():
    """A hedge delay (here backed off to 4x) that runs past lost_after_s does not hold back the
    bound on a silent replica: the call is copied as a rescue well before the delay, and the
    rescue leaves the backoff alone."""
    from serving.runtime.calls import StageHedge

    async def lost_first(n, *args):
        await asyncio.sleep(30 if n == 1 else 0.0)
        return {"call": n}

    hedge = StageHedge(lambda: 2, lost_after_s=0.05, lost_over_median=200.0, silent=lambda: True,
                       in_flight=lambda: 2)  # every replica busy: no hedge would go at the delay anyway
    for _ in range(40):
        hedge.window.add(0.05)
    hedge.backoff._factor = 4.0  # backed off: the hedge delay is 4 x 2 x 0.05 = 0.4 s, the bound 10 s
    assert hedge.delay() == pytest.approx(0.4) and hedge.bound() == pytest.approx(10.0)
    out = asyncio.run(call_stage(_Handle(lost_first), "run", (), Deadline.after(60), "s", hedge=hedge))
    assert out == {"call": 2} and (hedge.rescues, hedge.hedges, hedge.skipped_busy) == (1, 0, 0)
    assert hedge.backoff.factor == 4.0


def test_hedging_turned_off_while_a_call_waits_sends_no_copy():
    hedge, heard = _hedge()  # delay 0.02 s

    async def slow_first(n, *args):
        await asyncio.sleep(0.2 if n == 1 else 30)
        return {"call": n}

    async def main():
        async def turn_off():
            await asyncio.sleep(0.005)
            hedge.enabled = False  # as live_settings does, in place
        switch = asyncio.ensure_future(turn_off())
        out = await call_stage(handle, "run", (), Deadline.after(60), "s", hedge=hedge)
        await switch
        return out

    handle = _Handle(slow_first)
    assert asyncio.run(main()) == {"call": 1}
    assert handle.calls == 1 and hedge.hedges == 0 and heard == []


def test_a_copy_beaten_by_the_deadline_counts_as_lost_and_a_copy_that_cannot_be_sent_cancels_the_first():
    from serving.runtime.calls import hedged
    from serving.runtime.hedge import HedgeBackoff

    hedge, _ = _hedge()
    hedge.backoff = HedgeBackoff(min_win_share=0.5, outcomes=1)

    async def stalls(n, *args):
        await asyncio.sleep(30)

    with pytest.raises(DeadlineExceeded):
        asyncio.run(call_stage(_Handle(stalls), "run", (), Deadline.after(0.3), "s", hedge=hedge))
    assert hedge.hedges == 1 and hedge.backoff.factor == 2.0, "a copy that did not answer first did not win"

    hedge, _ = _hedge()
    handle = _Handle(stalls)

    def send(first):
        if first is not None:
            raise RuntimeError("no replica to send the copy to")
        return handle.run.remote()

    with pytest.raises(RuntimeError, match="no replica"):
        asyncio.run(hedged(send, 60.0, "s", 60.0, hedge))
    assert handle.responses[0].cancelled, "the first call was left running"


class _Trickle(_Request):
    """A client that sends its body a byte at a time, every ``every_s``, and never finishes."""

    def __init__(self, every_s: float):
        super().__init__(b"")
        self.headers = {}
        self.every_s = every_s

    async def stream(self):
        while True:
            await asyncio.sleep(self.every_s)
            yield b" "


class _Metrics:
    flusher = types.SimpleNamespace(start=lambda: None)

    def count(self, *a, **k):
        pass

    def observe(self, *a, **k):
        pass


def test_a_trickling_body_holds_no_admission_slot_and_times_out():
    """The ingress reads a body before it takes one of its admission slots, under a time limit:
    with one slot, a client trickling its body does not stop another client's request, and gets
    408 itself (the slot count is back to 0 after both)."""
    import serving.runtime.ingress as app_module

    cls = app_module.Ingress.func_or_class
    ingress = types.SimpleNamespace(api_key=KeyCheck(), probe_hash=None, allowed_hosts=None, max_body=1000,
                                    in_flight=0, max_in_flight=1, metrics=_Metrics(), _start_watch=lambda: None,
                                    gc_pauses=types.SimpleNamespace(start=lambda: None))
    for name in ("check_origin", "check_key", "authorized", "_read_body", "_probe", "_guarded"):
        setattr(ingress, name, getattr(cls, name).__get__(ingress))
    ingress.read_body = lambda request, timeout_s=None: cls.read_body(ingress, request, timeout_s=0.5)

    async def answer(request):
        body = request.state.body
        return {"bytes": len(body)}

    async def main():
        slow = _Trickle(0.01)
        slow_task = asyncio.ensure_future(ingress._guarded("predict", slow, lambda: answer(slow), admit=True))
        await asyncio.sleep(0.05)  # the trickler is reading its body now
        fast = _Request(b'{"rows": []}')
        fast_response = await ingress._guarded("predict", fast, lambda: answer(fast), admit=True)
        return fast_response, await slow_task

    fast, slow = asyncio.run(main())
    assert fast.status_code == 200 and json.loads(fast.body) == {"bytes": 12}
    assert slow.status_code == 408 and "did not arrive" in json.loads(slow.body)["error"]
    assert ingress.in_flight == 0


def test_a_request_whose_client_went_away_is_counted_as_such():
    """Serve cancels a request whose client disconnected: it is counted under 499 (client closed
    request), not as an answered 200, its time still observed (those who gave up are the tail),
    and its admission slot is back."""
    import serving.runtime.ingress as app_module

    cls = app_module.Ingress.func_or_class
    counted, observed = [], []
    metrics = types.SimpleNamespace(flusher=types.SimpleNamespace(start=lambda: None),
                                    count=lambda name, *a, **k: counted.append((name, k)),
                                    observe=lambda name, *a, **k: observed.append(name))
    ingress = types.SimpleNamespace(api_key=KeyCheck(), probe_hash=None, allowed_hosts=None, max_body=1000,
                                    in_flight=0, max_in_flight=4, metrics=metrics, _start_watch=lambda: None,
                                    gc_pauses=types.SimpleNamespace(start=lambda: None))
    for name in ("check_origin", "check_key", "authorized", "_read_body", "read_body", "_probe", "_guarded"):
        setattr(ingress, name, getattr(cls, name).__get__(ingress))
    started = asyncio.Event()

    async def never():
        started.set()
        await asyncio.sleep(3600)

    async def main():
        request = _Request(b'{"rows": []}')
        task = asyncio.ensure_future(ingress._guarded("predict", request, never, admit=True))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert counted == [("willump_requests", {"route": "predict", "status": "499"})]
    assert observed == ["willump_request_latency_seconds"] and ingress.in_flight == 0


def test_a_stage_replica_of_the_previous_code_is_called_as_it_takes():
    """A rolling update across code versions: the old replica refuses the argument this code added
    (Ray returns the replica's TypeError); the call goes again with what it takes. Any other
    TypeError is the caller's."""
    import asyncio

    from serving.runtime.calls import Deadline, call_stage_compatible

    calls: list[tuple] = []

    class Old:
        class run:
            @staticmethod
            def remote(*args):
                calls.append(args)

                async def answer():
                    if len(args) > 3:
                        raise TypeError("run() takes from 2 to 4 positional arguments but 5 were given")
                    return "answered"

                return answer()

    class Middle:  # takes the backlog, but as (replica, rows): note_backlog(*backlog) refuses a third
        class run:
            @staticmethod
            def remote(*args):
                calls.append(args)

                async def answer():
                    if len(args) > 3 and len(args[3]) > 2:
                        raise TypeError("note_backlog() takes 3 positional arguments but 4 were given")
                    return "answered"

                return answer()

    async def main():
        out = await call_stage_compatible(Old(), "run", (1, 2, 3, 4), [(1, 2, 3)], Deadline.after(5), "expensive")
        assert out == "answered" and calls == [(1, 2, 3, 4), (1, 2, 3)]
        calls.clear()
        newest, older = (1, 2, 3, ("r", 5, 2.0)), [(1, 2, 3, ("r", 5)), (1, 2, 3)]
        assert await call_stage_compatible(Middle(), "run", newest, older, Deadline.after(5), "expensive") == "answered"
        assert calls == [newest, older[0]]  # the newest form the replica takes, not the oldest
        calls.clear()
        assert await call_stage_compatible(Old(), "run", newest, older, Deadline.after(5), "expensive") == "answered"
        assert calls == [newest, *older]

        class Broken:
            class run:
                @staticmethod
                def remote(*args):
                    async def answer():
                        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

                    return answer()

        with pytest.raises(TypeError, match="unsupported operand"):
            await call_stage_compatible(Broken(), "run", (1,), (), Deadline.after(5), "expensive")

    asyncio.run(main())


def test_a_later_stage_call_carries_the_deployed_gears_scale_and_falls_back_for_older_replicas():
    """The ingress's stage call (Ingress._remote_batch, on a stand-in instance): a call in gear 1
    of an adaptive app carries, in its backlog, how many times its rows gear 0 would send (the
    gears' measured shares: 6% against 2%, so 3); the first stage's calls and gear 0's carry 1; a
    replica of the code before the scale gets (replica, rows), one older still no backlog; an app
    sized for its cheapest gear scales gear 0's calls down."""
    import numpy as np
    import pandas as pd

    import serving.runtime.ingress as app_module
    from serving.runtime.coalesce import Item
    from serving.runtime.gears import GearSwitch

    ladder = [{"gear": g, "max_loss": 0.01 * (g + 1), "loss_bound": 0.005 * (g + 1), "method": "x"} for g in range(2)]
    gears = GearSwitch({"mode": "adaptive", "ladder": ladder, "policy": {"slo_ms": 100.0}})
    for _ in range(30):
        gears.demand.observe(0, 100, 6)
        gears.demand.observe(1, 100, 2)
    sent: list[tuple] = []

    def handle(refuse_after: int | None = None, refuse_scale: bool = False):
        class Run:
            @staticmethod
            def remote(*args):
                sent.append(args)

                async def answer():
                    if refuse_after is not None and len(args) > refuse_after:
                        raise TypeError("run() takes from 2 to 4 positional arguments but 5 were given")
                    if refuse_scale and len(args) > 3 and len(args[3]) > 2:
                        raise TypeError("note_backlog() takes 3 positional arguments but 4 were given")
                    n = len(args[0])
                    return {"proba": np.zeros((n, 2)), "level": np.ones(n, dtype=int), "unsure": np.array([], int),
                            "blocks": None, "seconds": 0.0, "replica": "r"}

                return answer()

        return types.SimpleNamespace(run=Run)

    cls = app_module.Ingress.func_or_class
    ingress = types.SimpleNamespace(
        replica="ingress-1", gears=gears, stage_names=["cheap", "expensive"], hedges={},
        coalescers={"cheap": types.SimpleNamespace(queued_rows=7), "expensive": types.SimpleNamespace(queued_rows=5)},
        metrics=types.SimpleNamespace(count=lambda *a, **k: None), _observe_stage=lambda stage, out, scale=1.0: None)

    async def call(stage: str, gear: int, h) -> None:
        loop = asyncio.get_running_loop()
        rows = pd.DataFrame({"x": [1.0, 2.0]})
        item = Item(rows, None, Deadline.after(5), loop.create_future(), key=gear, size=2)
        await cls._remote_batch(ingress, h, stage)([item], Deadline.after(5))

    async def main() -> None:
        await call("expensive", 1, handle())
        assert sent[-1][2] == 1 and sent[-1][3][:2] == ("ingress-1", 5)
        assert sent[-1][3][2] == pytest.approx(3.0)
        await call("expensive", 0, handle())
        assert sent[-1][3] == ("ingress-1", 5, 1.0)
        await call("cheap", 1, handle())
        assert sent[-1][3] == ("ingress-1", 7, 1.0)
        sent.clear()
        await call("expensive", 1, handle(refuse_scale=True))
        assert [a[3] if len(a) > 3 else None for a in sent] == [sent[0][3], ("ingress-1", 5)]
        sent.clear()
        await call("expensive", 1, handle(refuse_after=3))
        assert [len(a) for a in sent] == [4, 4, 3]
        # sized for the cheapest gear (the artifact's shares known before it served): a call in
        # gear 0 carries a third of its rows' worth
        ingress.gears = GearSwitch({"mode": "adaptive", "ladder": ladder, "sent_on": [0.06, 0.02],
                                    "policy": {"slo_ms": 100.0, "replicas_for": "cheapest"}})
        await call("expensive", 0, handle())
        assert sent[-1][3][2] == pytest.approx(1 / 3)

    asyncio.run(main())


def test_the_ingress_measures_a_later_stages_load_for_the_gears_step_back():
    """Ingress._observe_stage and _follow_replicas on a stand-in instance: a later stage's answer
    adds its busy seconds and rows (0.05 s a row), the first stage's do not count, nor an answer
    of a replica of earlier code; the running replicas per stage are what the switch's
    prediction divides by. Every stage's busy seconds are the request path's load there."""
    import numpy as np

    import serving.runtime.ingress as app_module
    from serving.runtime.gears import GearSwitch
    from serving.runtime.stage_load import StageLoad

    ladder = [{"gear": g, "max_loss": 0.01 * (g + 1), "loss_bound": 0.005 * (g + 1), "method": "x"} for g in range(2)]
    gears = GearSwitch({"mode": "adaptive", "ladder": ladder, "policy": {"slo_ms": 100.0}, "sent_on": [0.06, 0.02]})
    now = [0.0]
    load = StageLoad(window_s=2.0, clock=lambda: now[0])
    cls = app_module.Ingress.func_or_class
    ingress = types.SimpleNamespace(
        stage_names=["cheap", "expensive"], gears=gears, stage_load=load,
        metrics=types.SimpleNamespace(observe=lambda *a, **k: None),
        deployments={"app-cheap": ("cheap", None), "app-expensive": ("expensive", None)},
        coalescers={"cheap": types.SimpleNamespace(limit=1), "expensive": types.SimpleNamespace(limit=1)})
    load.arrived(600)
    cls._observe_stage(ingress, "expensive", {"seconds": 0.1, "busy_s": 0.5, "level": np.ones(10)})
    cls._observe_stage(ingress, "cheap", {"seconds": 0.1, "busy_s": 9.0, "level": np.ones(10)})
    cls._observe_stage(ingress, "expensive", {"seconds": 0.1, "level": np.ones(10)})  # earlier code
    cls._follow_replicas(ingress, {"app-cheap": 1, "app-expensive": 2})
    now[0] = 2.0
    assert load.busy_per_row("expensive") == pytest.approx(0.05) and load.busy_per_row("cheap") is None
    assert ingress.running_replicas == {"cheap": 1, "expensive": 2}
    assert gears.predicted_fits(load, ingress.running_replicas, ["expensive"], 0)
    assert not gears.predicted_fits(load, {"expensive": 1}, ["expensive"], 0)
    # every stage's busy seconds are the request path's load there (the live audit's room), a call
    # the autoscaler reads at 3x its share counted so
    assert load.request_busy_per_s("expensive") == pytest.approx(0.5 / 2.0)
    assert load.request_busy_per_s("cheap") == pytest.approx(9.0 / 2.0)
    cls._observe_stage(ingress, "expensive", {"seconds": 0.1, "busy_s": 0.5, "level": np.ones(10)}, 3.0)
    assert load.request_busy_per_s("expensive") == pytest.approx((0.5 + 1.5) / 2.0)
    assert load.busy_per_row("expensive") == pytest.approx(0.05)  # the cost per row is the device's own


def test_top_k_scoring_every_row_is_load_for_the_step_back_and_falls_back_for_older_replicas():
    """Top-K without a certified filter scores every row at the later stage (Ingress._full_scores,
    on a stand-in instance): asked timed, its busy seconds join the gears' step-back load; a stage
    replica of earlier code refuses the timed form and answers the scores alone; without a step
    back to feed (no adaptive gears) the call is the plain one."""
    import numpy as np
    import pandas as pd

    import serving.runtime.ingress as app_module
    from serving.runtime.stage_load import StageLoad
    from tests.serving.conftest import timed_stage

    sent: list[tuple] = []

    def stage(takes_timed: bool) -> types.SimpleNamespace:
        return timed_stage("full_scores", "scores", lambda rows: np.arange(len(rows), dtype=float), 0.5, sent,
                           takes_timed, plain_args=2)

    now = [0.0]
    load = StageLoad(window_s=2.0, clock=lambda: now[0])
    load.arrived(10)
    cls = app_module.Ingress.func_or_class
    ingress = types.SimpleNamespace(second=stage(True), stage_load=load, stage_names=["cheap", "expensive"],
                                    metrics=types.SimpleNamespace(count=lambda *a, **k: None))
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0]})
    scores = asyncio.run(cls._full_scores(ingress, 1, frame, 0, Deadline.after(5)))
    np.testing.assert_array_equal(scores, [0.0, 1.0, 2.0])
    ingress.second = stage(False)
    older = asyncio.run(cls._full_scores(ingress, 1, frame, 0, Deadline.after(5)))
    np.testing.assert_array_equal(older, scores)
    now[0] = 2.0
    assert [len(a) for a in sent] == [3, 3, 2] and load.extra_busy_per_s("expensive") == pytest.approx(0.5 / 2.0)
    ingress.stage_load, ingress._call = None, lambda i, method, *args, deadline: cls._call(ingress, i, method, *args,
                                                                                         deadline=deadline)
    ingress.local, ingress.first = False, None
    plain = asyncio.run(cls._full_scores(ingress, 1, frame, 0, Deadline.after(5)))
    np.testing.assert_array_equal(plain, scores)
    assert len(sent[-1]) == 2
