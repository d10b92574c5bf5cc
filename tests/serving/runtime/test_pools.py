"""A stage on node pools called as one handle (serving.runtime.pools), with fake pool handles:
where calls go at rest and under load, a pool without replicas, and a call's count kept once
whether it is answered, fails or is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from serving.runtime.pools import PooledStage, pooled_stage, stage_deployments


class FakeResponse:
    def __init__(self, pool: str, fail: bool = False):
        self.pool, self.fail = pool, fail
        self.release = asyncio.Event()
        self.cancelled = False

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self):
        await self.release.wait()
        if self.fail:
            raise RuntimeError("replica lost")
        return self.pool

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    def __init__(self, pool: str):
        self.pool = pool
        self.calls: list[FakeResponse] = []
        self.kwargs: dict = {}

    def options(self, **kwargs):
        other = FakeHandle(self.pool)
        other.calls, other.kwargs = self.calls, kwargs
        return other

    def __getattr__(self, method):
        handle = self

        class Method:
            def remote(self, *args, fail=False):
                response = FakeResponse(handle.pool, fail)
                handle.calls.append(response)
                return response

        return Method()


def _stage(rates=None, replicas=None) -> PooledStage:
    rates = rates or {"fast": 300.0, "slow": 100.0}
    return PooledStage({p: FakeHandle(p) for p in rates}, rates, replicas or dict.fromkeys(rates, 1))


def test_at_rest_every_call_goes_to_the_fastest_pool():
    stage = _stage()
    heard: list[str] = []
    stage.on_route = heard.append  # what the ingress counts in /metrics
    for _ in range(5):
        response = stage.run.remote("rows")
        response.cancel()  # nothing left in flight: the next call sees the pools at rest
    assert stage.routed == {"fast": 5, "slow": 0} and stage.in_flight == {"fast": 0, "slow": 0}
    assert heard == ["fast"] * 5


def test_under_load_calls_split_by_capacity():
    """With calls held in flight, each goes where (in flight + 1) / (replicas x rate) is least:
    300 and 100 rows/s per replica, 1 and 2 replicas, split 3 : 2."""
    stage = _stage(replicas={"fast": 1, "slow": 2})
    for _ in range(50):
        stage.run.remote("rows")
    assert stage.routed == {"fast": 30, "slow": 20}, stage.routed


def test_a_pool_without_running_replicas_gets_no_call_while_another_runs():
    stage = _stage()
    stage.set_running("fast", 0)
    for _ in range(4):
        stage.run.remote("rows")
    assert stage.routed == {"fast": 0, "slow": 4}
    stage.set_running("slow", 0)  # none runs anywhere: calls still go (Serve queues them until one starts)
    stage.run.remote("rows")
    assert sum(stage.routed.values()) == 5


def test_a_call_leaves_the_count_once_answered_failed_or_cancelled():
    async def main():
        stage = _stage()
        ok = stage.run.remote("rows")
        bad = stage.run.remote("rows", fail=True)
        gone = stage.run.remote("rows")
        assert sum(stage.in_flight.values()) == 3
        for handle in stage.handles.values():
            for response in handle.calls:
                response.release.set()
        assert await ok in ("fast", "slow")
        with pytest.raises(RuntimeError, match="replica lost"):
            await bad
        gone.cancel()
        gone.cancel()
        assert stage.in_flight == {"fast": 0, "slow": 0}
        assert any(r.cancelled for h in stage.handles.values() for r in h.calls)

    asyncio.run(main())


def test_options_share_the_ledger_and_each_pool_answers_health():
    async def main():
        stage = _stage()
        timed = stage.options(timeout_s=3)
        assert all(h.kwargs == {"timeout_s": 3} for h in timed.handles.values())
        timed.run.remote("rows")
        assert sum(stage.in_flight.values()) == 1  # one ledger for both views

        asked = len(stage.handles["fast"].calls)

        async def release_soon():
            while len(stage.handles["fast"].calls) == asked:  # as soon as the check is asked
                await asyncio.sleep(0)
            stage.handles["fast"].calls[-1].release.set()  # the slow pool's check never answers

        release = asyncio.ensure_future(release_soon())
        health = await stage.health(2.0)  # room for a stalled machine: only the silent pool waits it out
        await release
        # one pool answers: the stage is served (calls avoid the other), the silent pool is named
        assert health["pools"]["fast"] == "fast" and "TimeoutError" in health["pools"]["slow"]["error"]
        assert "error" not in health
        failing = asyncio.ensure_future(stage.health(1.0))
        await asyncio.sleep(0.01)
        for h in stage.handles.values():  # now every pool's check fails
            h.calls[-1].fail = True
            h.calls[-1].release.set()
        assert (await failing)["error"] == "no pool's replicas answer"

    asyncio.run(main())


def test_a_copy_goes_to_another_pool_and_a_lost_replica_steers_the_retry():
    """What serving.runtime.calls does with a pooled stage: a hedge's or a rescue's copy of a call
    avoids the call's own pool (both would otherwise go to the faster pool, onto the replica the
    copy is meant to get around), and a call lost with its replica counts its pool one short, so
    the retry of a pool's only replica goes elsewhere."""
    import ray.exceptions as rex

    from serving.runtime.calls import Deadline, _send, call_stage

    stage = _stage()
    first = _send(stage, "run", ("rows",))
    copy = _send(stage, "run", ("rows",), first)
    assert (first.pool, copy.pool) == ("fast", "slow")
    stage.set_running("slow", 0)  # no other pool runs a replica: the copy may go where the first went
    assert _send(stage, "run", ("rows",), first).pool == "fast"

    async def main():
        stage = _stage()

        class Lost(FakeResponse):
            async def _wait(self):
                raise rex.ActorUnavailableError("the replica's node went away", b"0" * 16)

        fast = stage.handles["fast"]

        class Once:
            def remote(self, *args):
                response = Lost("fast")
                fast.calls.append(response)
                return response

        fast.__dict__["run"] = Once()  # the fast pool's replica is lost mid-call
        slow = stage.handles["slow"]

        async def answer_slow():
            while not slow.calls:
                await asyncio.sleep(0.005)
            slow.calls[0].release.set()

        helper = asyncio.ensure_future(answer_slow())
        out = await call_stage(stage, "run", ("rows",), Deadline.after(5.0), "expensive")
        await helper
        assert out == "slow" and stage.running == {"fast": 0, "slow": 1} and stage.in_flight == {"fast": 0, "slow": 0}

    asyncio.run(main())


def test_the_ingress_reads_pools_from_its_config():
    handles = {"fast": FakeHandle("fast"), "slow": FakeHandle("slow")}
    entry = {"rates": {"fast": 300.0, "slow": 100.0}, "replicas": {"fast": 2, "slow": 1}}
    stage = pooled_stage(handles, entry)
    assert isinstance(stage, PooledStage) and stage.running == {"fast": 2, "slow": 1}
    plain = object()
    assert pooled_stage(plain, None) is plain
    with pytest.raises(ValueError, match="rates and replicas"):
        pooled_stage(handles, None)
    with pytest.raises(ValueError, match="name the same pools"):
        PooledStage(handles, {"fast": 1.0}, {"fast": 1, "slow": 1})
    assert stage_deployments("app", ["cheap", "expensive"], {"expensive": entry}, skip_first=True) == {
        "app-expensive-fast": ("expensive", "fast"), "app-expensive-slow": ("expensive", "slow")}
    assert stage_deployments("app", ["cheap", "expensive"], None, skip_first=False) == {
        "app-cheap": ("cheap", None), "app-expensive": ("expensive", None)}


def test_a_pool_its_router_cannot_count_on_gets_no_call_while_another_can():
    """Replicas all draining or silent (their router says 0 usable): the pool is passed over while
    another pool has some, even though Serve still lists them as running; None (unknown) counts
    as usable, and with every pool at 0 the calls go on as before."""
    stage = _stage()
    usable = {"fast": 0, "slow": None}
    stage.usable = usable.get
    assert stage.pick() == "slow"
    assert stage.options(timeout_s=1).pick() == "slow"  # one ledger, the same view
    usable["slow"] = 0
    assert stage.pick() == "fast"  # nothing usable anywhere: the fastest, as without the view
    usable["fast"] = 2
    assert stage.pick() == "fast"


def test_a_pool_whose_call_was_rescued_waits_until_it_answers_or_serve_sees_it_change():
    """A call on "fast" copied past the silence bound, the copy answering first: "fast" gets no
    call for UNRESPONSIVE_S while "slow" can take it (Serve may list replicas on a vanished node as
    running for seconds); an answer from it, Serve's count of its replicas rising, or the time
    running out ends that."""
    from serving.runtime import pools

    stage = _stage()
    now = [0.0]
    stage.clock = lambda: now[0]
    assert stage.pick() == "fast"
    stage.rescued("fast")
    assert stage.pick() == "slow" and stage.options(timeout_s=1).pick() == "slow"
    now[0] = pools.UNRESPONSIVE_S + 0.1
    assert stage.pick() == "fast"  # time ran out: a call may go there again
    stage.rescued("fast")
    stage.answered("fast")  # one of its calls came back
    assert stage.pick() == "fast"
    stage.rescued("fast")
    stage.set_running("fast", 1)  # the same count: still waiting
    assert stage.pick() == "slow"
    stage.set_running("fast", 0)  # fewer replicas: still waiting
    assert stage.pick() == "slow"
    stage.set_running("fast", 1)  # one started again
    assert stage.pick() == "fast"
    stage.rescued("slow")
    stage.rescued("fast")
    assert stage.pick() == "fast"  # every pool waiting: the calls go on as before
    # a call lost there lowers the pool's running count, not the watch's: the next look at Serve's
    # unchanged count is no rise
    stage.unresponsive.clear()
    stage.set_running("fast", 2)
    stage.lost_one("fast")
    stage.rescued("fast")
    stage.set_running("fast", 2)
    assert stage.pick() == "slow"


def test_a_rescued_pooled_call_tells_its_pool():
    """serving.runtime.calls.hedged: the first call rescued and its copy answering first marks
    the first call's pool (a _PooledResponse's rescued())."""
    from serving.runtime.calls import StageHedge, hedged

    stage = _stage()

    async def run():
        hedge = StageHedge(lambda: 2, enabled=False, lost_after_s=0.05)
        hedge.silent_now = lambda: True

        def call(first):
            response = (stage.copy_of(first) if first is not None else stage).run.remote()
            if first is not None:
                stage.handles[response.pool].calls[-1].release.set()
            return response

        return await hedged(call, 5.0, "expensive", 5.0, hedge)

    assert asyncio.run(run()) == "slow"
    assert "fast" in stage.unresponsive and stage.pick() == "slow"
