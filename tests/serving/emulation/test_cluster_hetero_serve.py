"""Stages on mixed device types on a real 2-node Ray cluster (``ray.cluster_utils.Cluster``):
the head carries one ``dev_fast`` device, a worker two ``dev_slow``. One deployment per
(stage, device type) lands on the nodes carrying its type; answers are the pipeline's; the
ingress splits calls over device types exactly by weight; the throughput matrix is measured
for every pair and the LP plans on it. Nothing here asserts on timings (the machine may be busy)."""

from __future__ import annotations

import numpy as np
import pytest

from serving.core.specs import stage_specs
from serving.emulation.hetero_app import DeviceEmulation, deploy_hetero
from serving.emulation.measure import cluster_devices, measure_matrix, stage_inputs
from serving.planning.hetero import plan_max_rate
from tests.serving.conftest import emulated_cluster

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

EMULATION = DeviceEmulation(fixed_ms={"cheap": 2.0, "expensive": 4.0}, per_row_ms={"cheap": 0.1, "expensive": 1.0},
                            slowdown={"dev_slow": {"cheap": 2.0, "expensive": 4.0}})


@pytest.fixture(scope="module")
def cluster():
    for c, (worker,) in emulated_cluster({"dev_fast": 1}, [{"dev_slow": 2}]):
        yield c, worker


@pytest.fixture(scope="module")
def source(cluster, synth_opt):
    from serving.core.artifacts import resolve

    return resolve(synth_opt, "test-hetero", "auto")[0]


def _requests(request_rows, size=16, n=12):
    return [request_rows.iloc[i * size:(i + 1) * size].reset_index(drop=True) for i in range(n)]


def test_replicas_on_their_device_type_answers_correct_split_by_weight(cluster, source, synth_opt, request_rows):
    import ray

    specs = stage_specs(synth_opt)
    assert [s.name for s in specs] == ["cheap", "expensive"]
    replicas = {("cheap", "dev_fast"): 1, ("cheap", "dev_slow"): 1, ("expensive", "dev_slow"): 1}
    weights = {"cheap": {"dev_fast": 0.75, "dev_slow": 0.25}, "expensive": {"dev_slow": 1.0}}
    app = deploy_hetero(source, specs, replicas, weights, EMULATION, name="hx")
    try:
        head = ray.get_runtime_context().get_node_id()
        worker = cluster[1].node_id
        where = {(i["stage"], i["device"]): i["node_id"] for i in app.replica_info()}
        assert len(where) == 3
        assert where == {("cheap", "dev_fast"): head, ("cheap", "dev_slow"): worker,
                         ("expensive", "dev_slow"): worker}
        requests = _requests(request_rows)
        for rows in requests:
            out = app.ingress.predict.remote(rows).result()
            np.testing.assert_allclose(out["proba"], synth_opt.predict_proba(rows), atol=1e-9)
            assert set(out["device"]) <= {"dev_fast", "dev_slow"}
        stats = app.stats()
        picks = stats["picks"]
        n = len(requests)
        assert abs(picks["cheap@dev_fast/0"] - 0.75 * n) <= 1
        assert picks["cheap@dev_fast/0"] + picks["cheap@dev_slow/0"] == n
        # the expensive stage is called exactly for requests with an unsure row; no hedging asked
        _, visits = stage_inputs(synth_opt, specs, requests)
        assert picks.get("expensive@dev_slow/0", 0) == round(visits["expensive"] * n)
        assert stats["hedges"] == 0
        # switching to uniform routing takes effect at once; a device type without a deployment is refused
        assert app.set_weights({"cheap": {"dev_fast": 1, "dev_slow": 1}, "expensive": {"dev_slow": 1}})["cheap"] == \
            {"dev_fast": 0.5, "dev_slow": 0.5}
        with pytest.raises(Exception, match="without a deployment"):
            app.set_weights({"cheap": {"dev_gpu": 1.0}, "expensive": {"dev_slow": 1.0}})
    finally:
        app.shutdown()


def test_deploy_refuses_a_stage_without_replicas(cluster, source, synth_opt):
    specs = stage_specs(synth_opt)
    with pytest.raises(ValueError, match="'expensive' has no replica"):
        deploy_hetero(source, specs, {("cheap", "dev_fast"): 1}, {}, EMULATION, name="bad")
    with pytest.raises(ValueError, match="does not have"):
        deploy_hetero(source, specs, {("nope", "dev_fast"): 1}, {}, EMULATION, name="bad")
    both = {("cheap", "dev_fast"): 1, ("expensive", "dev_slow"): 1}
    with pytest.raises(ValueError, match="jitter names replicas"):
        deploy_hetero(source, specs, both, {}, EMULATION, name="bad", jitter={"cheap@dev_slow/3": (0.1, 10.0)})
    with pytest.raises(ValueError, match="share of calls"):
        deploy_hetero(source, specs, both, {}, EMULATION, name="bad", jitter={"cheap@dev_fast/0": (0.1, 0.5)})
    with pytest.raises(ValueError, match="device_share"):
        deploy_hetero(source, specs, both, {}, EMULATION, name="bad", device_share=0.0)
    # more devices than the cluster has: refused at once (Serve would wait for them forever)
    with pytest.raises(ValueError, match="dev_fast: 2, 1"):
        deploy_hetero(source, specs, {("cheap", "dev_fast"): 2, ("expensive", "dev_slow"): 1}, {}, EMULATION,
                      name="bad")


def test_matrix_measured_for_every_pair_and_planned(cluster, source, synth_opt, request_rows):
    specs = stage_specs(synth_opt)
    requests = _requests(request_rows)
    matrix = measure_matrix(source, synth_opt, specs, ("dev_fast", "dev_slow"), EMULATION, requests,
                            concurrency=2, warmup_s=0.2, seconds=0.5)
    assert matrix.stages == ("cheap", "expensive") and matrix.rates.shape == (2, 2)
    assert np.all(matrix.rates > 0), matrix.rates
    _, visits = stage_inputs(synth_opt, specs, requests)
    assert matrix.visits == (1.0, visits["expensive"])
    devices = cluster_devices(("dev_fast", "dev_slow"))
    assert devices == {"dev_fast": 1, "dev_slow": 2}
    plan = plan_max_rate(matrix, devices)
    assert sum(plan.replicas.values()) <= 3 and {s for s, _ in plan.replicas} == {"cheap", "expensive"}


def test_emulation_refuses_bad_factors():
    with pytest.raises(ValueError, match="factors must be > 0"):
        DeviceEmulation({"a": 1.0}, {"a": 0.0}, slowdown={"d": {"a": 0.0}})
    with pytest.raises(ValueError, match="fixed_ms"):
        DeviceEmulation({"a": -1.0}, {"a": 0.0})
    assert DeviceEmulation({"a": 1.0}, {"a": 0.5}, slowdown={"d": {"a": 3.0}}).seconds("a", "d", 4) == \
        pytest.approx(0.009)
