"""The load generator says what failed, not only how many: HTTP statuses and client errors
are counted by kind (a benchmark's "13 errors" on the GPU machine could not be explained)."""

from __future__ import annotations

import asyncio
import math
import socket

import numpy as np
from aiohttp import web

from serving.measure.loadgen import closed_loop, server_timing, tail_split


def test_closed_loop_counts_errors_by_kind():
    async def scenario() -> dict:
        calls = {"n": 0}

        async def predict(request: web.Request) -> web.Response:
            calls["n"] += 1
            await request.read()
            if calls["n"] % 2 == 0:
                return web.json_response({"error": "busy"}, status=503)
            return web.json_response({"level": [0]})

        app = web.Application()
        app.router.add_post("/predict", predict)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            # one client, ten requests: the count does not depend on how fast the machine is
            return await closed_loop(f"http://127.0.0.1:{port}/predict", [b'{"rows": []}'], 4, clients=1,
                                     duration=300.0, max_requests=10)
        finally:
            await runner.cleanup()

    out = asyncio.run(scenario())
    assert out["requests"] == 5 and out["errors"] == 5
    assert out["error_kinds"] == {"HTTP 503": 5}


def test_closed_loop_counts_refused_connections():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = asyncio.run(closed_loop(f"http://127.0.0.1:{port}/predict", [b"{}"], 1, clients=1, duration=300.0,
                                  max_requests=3))
    assert out["requests"] == 0 and out["errors"] == 3
    assert list(out["error_kinds"]) == ["ClientConnectorError"]


def test_load_phases_time_on_a_settled_heap_and_leave_it_as_it_was():
    """The measuring process's long-lived objects are frozen while a phase times (its own full
    collections would read as the app's latency), re-entrantly, and thawed afterwards."""
    import asyncio
    import gc

    from serving.measure.loadgen import settled_heap, timed_on_a_settled_heap

    assert gc.get_freeze_count() == 0
    seen = []

    @timed_on_a_settled_heap
    async def phase():
        seen.append(gc.get_freeze_count())
        with settled_heap():  # a phase inside a phase: still frozen, thawed only at the end
            pass
        seen.append(gc.get_freeze_count())
        return "done"

    @timed_on_a_settled_heap
    def local_phase():
        return gc.get_freeze_count()

    # still frozen after the inner phase (not thawed: 0); the count itself may fall as frozen
    # objects are freed by other threads meanwhile
    assert asyncio.run(phase()) == "done" and seen[0] > 0 and seen[1] > 0
    assert local_phase() > 0 and gc.get_freeze_count() == 0


def test_payloads_send_a_missing_value_as_null():
    """UCI Adult's test rows miss some categories: sent as NaN (not JSON), 58 of its 62 benchmark
    requests were refused with 422; a client sends null."""
    import json

    import numpy as np
    import pandas as pd

    from serving.measure.loadgen import payloads

    X = pd.DataFrame({"age": [30, 40, 50, 60], "occupation": ["a", np.nan, "b", np.nan]})  # object, as read
    bodies, frames = payloads(X, 2)
    rows = [json.loads(b)["rows"] for b in bodies]  # json.loads would take NaN: the text must not hold it
    assert all(b"NaN" not in b for b in bodies)
    assert rows == [[{"age": 30, "occupation": "a"}, {"age": 40, "occupation": None}],
                    [{"age": 50, "occupation": "b"}, {"age": 60, "occupation": None}]]
    assert [len(f) for f in frames] == [2, 2]


def test_server_timing_reads_the_routes_duration():
    assert server_timing("app;dur=2.5") == 2.5
    assert server_timing("db;dur=1, app;desc=\"route\";dur=0.75") == 0.75
    for header in (None, "", "db;dur=3", "app", "app;dur=x"):
        assert math.isnan(server_timing(header)), header


def test_tail_split_says_whether_the_slowest_requests_waited_inside_the_route():
    """100 requests: 98 of 3 ms (2 in the route), 2 of 30 ms (25 in the route): the slowest
    requests' median is 30 ms of which 25 inside; answers without the header are left out, and
    none with it gives None."""
    latencies = np.array([3.0] * 98 + [30.0, 30.0, 40.0])
    server = np.array([2.0] * 98 + [25.0, 25.0, np.nan])
    split = tail_split(latencies, server)
    assert split["slowest"] == {"requests": 2, "client_ms": 30.0, "server_ms": 25.0}
    assert split["server_p50_ms"] == 2.0 and split["outside_p50_ms"] == 1.0
    assert tail_split(latencies, np.full(latencies.size, np.nan)) is None
