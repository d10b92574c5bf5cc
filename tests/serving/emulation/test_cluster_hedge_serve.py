"""Hedged stage calls on a real Ray cluster: two replicas of the cheap stage, one of which
stalls (every call 200x its device time). With hedging on, calls stuck on the stalled replica
are sent again to its peer, the first answer is kept, the stalled copy is cancelled, and the
stalled replica is taken out of routing (reassignment); answers stay the pipeline's. The
assertions are about which replica answered and what was sent, never about latencies."""

from __future__ import annotations

import numpy as np
import pytest

from serving.core.specs import stage_specs
from serving.emulation.hetero_app import DeviceEmulation, deploy_hetero
from tests.serving.conftest import release_worker_ray

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

EMULATION = DeviceEmulation(fixed_ms={"cheap": 2.0, "expensive": 2.0}, per_row_ms={"cheap": 0.0, "expensive": 0.0})
#: replica 0 of the cheap stage: every call 200x slower (0.4 s instead of 2 ms)
STALL = {"cheap@dev/0": (1.0, 200.0)}
#: calls are hedged once they wait longer than this quantile of the stage's recent latencies: a
#: quarter, so that the threshold is a healthy call's latency even when a busy machine routes
#: half of the window's calls or more to the stalled replica (at the median the hedge then fired
#: when the stalled copy was answering too, and lost the race: 0 wins under a CPU hog)
HEDGE_QUANTILE = 0.25


@pytest.fixture(scope="module")
def cluster():
    import os

    import ray
    from ray import serve

    from serving.core.local_ray import ray_system_config

    release_worker_ray()  # a cluster of another shape: custom device resources
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, resources={"dev": 3}, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())  # deploy's worker niceness, as a Ray deploy starts
    serve.start(proxy_location="Disabled")
    yield
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def app(cluster, synth_opt):
    from serving.core.artifacts import resolve

    source = resolve(synth_opt, "test-hedge", "auto")[0]
    specs = stage_specs(synth_opt)
    served = deploy_hetero(source, specs, {("cheap", "dev"): 2, ("expensive", "dev"): 1},
                           {"cheap": {"dev": 1.0}, "expensive": {"dev": 1.0}}, EMULATION, name="hedge",
                           jitter=STALL, hedging=True, hedge_quantile=HEDGE_QUANTILE, probation_s=0.0, hedge_floor=0.0)
    yield served
    served.shutdown()


def _send(app, request_rows, n, start=0, size=8):
    import asyncio

    async def go():
        rows = [request_rows.iloc[(start + i) * size % 192:(start + i) * size % 192 + size].reset_index(drop=True)
                for i in range(n)]
        outs = await asyncio.gather(*(app.ingress.predict.remote(r) for r in rows))
        return rows, outs

    return asyncio.run(go())


def test_hedged_calls_answer_from_the_peer_and_cancel_the_stalled_copy(app, synth_opt, request_rows):
    # sequential calls: the first 32 fill the stage's latency window (about half of them stall),
    # then calls still unanswered at its lower quartile are hedged (no floor over it here: with
    # half the calls stalled, twice the median is the stall itself, and whether a call is hedged
    # would be a race). Probation is 0 s here, so the stalled
    # replica keeps getting calls: it is judged slow (counted) but not routed around for long
    for i in range(40):
        rows, outs = _send(app, request_rows, 1, start=i)
        np.testing.assert_allclose(outs[0]["proba"], synth_opt.predict_proba(rows[0]), atol=1e-9)
    stats = app.stats()
    assert stats["hedges"] >= 1, stats
    assert stats["hedge_wins"] >= 1, stats  # the peer answered calls first sent to the stalled replica
    assert stats["reassigned"] >= 1, stats  # the stalled replica was taken out of routing
    infos = {i["replica"]: i for i in app.replica_info()}
    stalled = app.handle("cheap", "dev", 0).info.remote().result()
    assert stalled["cancelled"] >= 1, infos  # the losing copies were cancelled on the stalled replica
    # every answer is the pipeline's, whichever replica gave it
    rows, outs = _send(app, request_rows, 12, start=50)
    for r, out in zip(rows, outs, strict=True):
        np.testing.assert_allclose(out["proba"], synth_opt.predict_proba(r), atol=1e-9)


def test_hedging_off_sends_each_call_once(app, request_rows):
    app.set_hedging(False)
    try:
        _send(app, request_rows, 6, start=70)
        stats = app.stats()
        assert stats["hedges"] == 0 and stats["calls"] >= 6
    finally:
        app.set_hedging(True)
