"""A readiness check whose canary hangs holds one thread, however often it is probed."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from serving.runtime.single_flight import SingleFlight


def test_a_hung_canary_is_run_once_however_many_probes_time_out_on_it():
    release = threading.Event()
    threads: list[int] = []

    def canary():
        threads.append(threading.get_ident())
        assert release.wait(30.0)
        return {"canary": "ok"}

    async def main():
        flight = SingleFlight(canary)
        for _ in range(5):  # probes every few seconds, each giving up on the hung canary
            with pytest.raises(asyncio.TimeoutError):
                await flight(0.05)
        assert flight.running and flight.runs == 1
        release.set()  # it answers at last: the next probe shares that answer
        answer = await flight(30.0)
        again = await flight(30.0)  # the run is over: a new one starts
        return answer, again, flight.runs

    answer, again, runs = asyncio.run(main())
    assert answer == again == {"canary": "ok"} and runs == 2 and len(threads) == 2


def test_a_failing_canary_fails_every_probe_that_waited_on_it():
    calls = []

    def canary():
        calls.append(1)
        raise RuntimeError("the canary row failed")

    async def main():
        flight = SingleFlight(canary)
        return await asyncio.gather(flight(30.0), flight(30.0), return_exceptions=True)

    outs = asyncio.run(main())
    assert [type(o) for o in outs] == [RuntimeError, RuntimeError] and len(calls) == 1


def test_the_stage_replica_probes_its_canary_once_at_a_time():
    """ModelStage.health, what the ingress's /readyz asks every stage replica."""
    from serving.runtime.replicas import ModelStage

    release, runs = threading.Event(), []

    def canary():
        runs.append(1)
        assert release.wait(30.0)
        return {"canary": "ok"}

    stage = ModelStage.func_or_class(None, None, runner=types.SimpleNamespace(canary=canary), batching=False)

    async def main():
        for _ in range(3):
            with pytest.raises(asyncio.TimeoutError):
                await stage.health(0.05)
        release.set()
        return await stage.health(30.0)

    answer = asyncio.run(main())
    assert answer["canary"] == "ok" and len(runs) == 1


def test_the_ingress_probes_its_own_stage_once_at_a_time():
    """/readyz of an ingress that runs the cheap stage itself (the fused layout): a hung canary is
    reported as not ready on every probe, and runs once."""
    import serving.runtime.ingress as ingress_module

    release, runs = threading.Event(), []

    def canary():
        runs.append(1)
        assert release.wait(30.0)
        return {"canary": "ok"}

    ingress = types.SimpleNamespace(stage_names=["cheap"], first=types.SimpleNamespace(runner=types.SimpleNamespace(
        canary=canary)), second=None, local=True)
    health = ingress_module.Ingress.func_or_class.stage_health.__get__(ingress)

    async def main():
        probes = [await health(0.05) for _ in range(3)]
        release.set()
        while ingress._canary.running:
            await asyncio.sleep(0.01)
        return probes, await health(30.0)

    probes, after = asyncio.run(main())
    assert all(not ready and "TimeoutError" in stages["cheap"]["error"] for stages, ready in probes)
    assert after == ({"cheap": {"canary": "ok"}}, True) and len(runs) == 2
