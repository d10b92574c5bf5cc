"""deploy_model on Ray Serve: stage chains answer like the unsplit module; bad input gets 4xx JSON.

One Ray instance for the module, Serve on a free port. Plans are given with a fixed
transport (no timing enters any assertion).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from torch import nn

import serving
import serving.partition as sp
from pipelines._minilm import BertConfig, MiniLM
from serving.model_app.transport import fit_transport

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
FIXED = sp.Transport(5.0, 5e8, "test")


@pytest.fixture(scope="module")
def serve_port(ray_cluster):
    """This worker's shared Ray (tests/serving/conftest.py): deploy_model joins its Serve."""
    return ray_cluster


def _mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)).eval()


def _tiny_bert() -> MiniLM:
    torch.manual_seed(4)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    return MiniLM(cfg).eval()


def _post(url: str, body) -> requests.Response:
    return requests.post(url + "/predict", json=body, timeout=60)


def test_three_stage_chain_equals_the_module(serve_port):
    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(2, 6))
    prof = sp.profile(g, batch_sizes=(4,), repeats=1, warmup=0, transport=FIXED)
    plan = sp.evaluate(prof, [(0, 2, 1), (2, 4, 2), (4, 5, 1)], devices=4)
    app = serving.deploy_model(mlp, torch.randn(2, 6), name="mlp3", plan=plan, graph=g,
                               cpus_per_replica=0.25, batch_wait_ms=5.0)
    try:
        assert app.url.endswith(f":{serve_port}/mlp3") and len(app.stage_names) == 3
        files = sorted(os.listdir(app.workdir))
        assert files == ["stage0.pt", "stage1.pt", "stage2.pt"]  # one file per stage, loaded by its replicas
        x = torch.randn(11, 6)  # more rows than the batch size: cut into chunks and joined again
        r = _post(app.url, {"inputs": x.tolist()})
        assert r.status_code == 200, r.text
        assert torch.allclose(torch.tensor(r.json()["outputs"]), mlp(x), atol=1e-5)
        xs = [torch.randn(1 + k % 3, 6) for k in range(24)]
        with ThreadPoolExecutor(8) as pool:  # concurrent requests coalesce into shared batches
            outs = list(pool.map(lambda t: _post(app.url, {"inputs": t.tolist()}).json()["outputs"], xs))
        for t, o in zip(xs, outs, strict=True):
            assert torch.allclose(torch.tensor(o), mlp(t), atol=1e-5)
        stats = requests.get(app.url + "/stats", timeout=10).json()
        assert stats["rows"] == 11 + sum(len(t) for t in xs)
        assert requests.get(app.url + "/plan", timeout=10).json()["stages"][1]["replicas"] == 2
        ready = requests.get(app.url + "/readyz", timeout=60)  # every stage's canary row, on its device
        assert ready.status_code == 200, ready.text
        assert [v["canary"] for v in ready.json()["stages"].values()] == ["ok", "ok", "ok"]
        # the Open Inference Protocol beside the native route: the same answers, its metadata
        v2 = f"{app.url}/v2/models/mlp3"
        r = requests.post(v2 + "/infer", json={"id": "q1", "inputs": [
            {"name": "input__0", "shape": [11, 6], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert r.json()["id"] == "q1" and out["name"] == "output__0" and out["shape"] == [11, 3]
        assert torch.allclose(torch.tensor(out["data"]).reshape(11, 3), mlp(x), atol=1e-5)
        meta = requests.get(v2, timeout=30).json()
        assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 6]}]
        assert meta["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 3]}]
        assert requests.get(v2 + "/ready", timeout=60).json() == {"name": "mlp3", "ready": True}
        assert requests.get(app.url + "/v2/health/live", timeout=30).json() == {"live": True}
        assert requests.get(app.url + "/v2/health/ready", timeout=60).json() == {"ready": True}
        r = requests.post(f"{app.url}/v2/models/other/infer", json={"inputs": []}, timeout=30)
        assert r.status_code == 404 and r.json()["fields"][0]["field"] == "model"
    finally:
        app.shutdown()


def test_two_input_transformer_split_between_layers(serve_port):
    bert = _tiny_bert()
    ids = torch.randint(1, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.int64)
    g = sp.capture(bert, (ids, mask))
    prof = sp.profile(g, batch_sizes=(2, 8), repeats=1, warmup=0, transport=FIXED)
    # the memory that forces a split holds at the largest batch only (at batch 2 the smaller
    # workspace lets the whole model fit one device): which batch a free choice takes is timing
    plan = sp.plan(prof, 2, memory_per_device=prof.model_bytes * 0.7 + max(w[-1] for w in prof.workspace_bytes),
                   batch_sizes=[8])
    assert len(plan.stages) == 2
    app = serving.deploy_model(bert, (ids, mask), name="bert2", plan=plan, graph=g, cpus_per_replica=0.25)
    try:
        q_ids = torch.randint(1, 50, (5, 12))
        q_mask = torch.ones(5, 12, dtype=torch.int64)
        q_mask[2, 7:] = 0
        r = _post(app.url, {"inputs": [q_ids.tolist(), q_mask.tolist()]})
        assert r.status_code == 200, r.text
        assert torch.allclose(torch.tensor(r.json()["outputs"]), bert(q_ids, q_mask), atol=1e-5)
        # bad input: a clear 4xx with a JSON body naming what is wrong
        cases = [
            ({"inputs": q_ids.tolist()}, 422, "2 inputs"),
            ({"inputs": [q_ids.tolist(), q_mask[:3].tolist()]}, 422, "different numbers of rows"),
            ({"inputs": [q_ids[:, :5].tolist(), q_mask[:, :5].tolist()]}, 422, "expected rows x 12"),
            ({"inputs": [(q_ids + 0.5).tolist(), q_mask.tolist()]}, 422, "integers"),
            ({"inputs": [q_ids.tolist(), q_mask.tolist()], "extra": 1}, 422, "unknown field"),
            ([1, 2], 422, "JSON object"),
        ]
        for body, status, text in cases:
            r = _post(app.url, body)
            assert r.status_code == status and text in r.json()["error"], (body, r.text)
        r = requests.post(app.url + "/predict", data=b"{nope", timeout=30)
        assert r.status_code == 400 and "invalid JSON" in r.json()["error"]
        # two forward arguments as two tensors of the protocol, in either order
        tensors = [{"name": "input__1", "shape": [5, 12], "datatype": "INT64", "data": q_mask.reshape(-1).tolist()},
                   {"name": "input__0", "shape": [5, 12], "datatype": "INT64", "data": q_ids.tolist()}]
        r = requests.post(f"{app.url}/v2/models/bert2/infer", json={"inputs": tensors}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert torch.allclose(torch.tensor(out["data"]).reshape(out["shape"]), bert(q_ids, q_mask), atol=1e-5)
        r = requests.post(f"{app.url}/v2/models/bert2/infer", json={"inputs": tensors[:1]}, timeout=60)
        assert r.status_code == 422 and "input__0" in r.json()["error"], r.text
    finally:
        app.shutdown()


def test_auto_plan_replicates_a_model_that_fits(serve_port):
    mlp = _mlp()
    app = serving.deploy_model(mlp, torch.randn(2, 6), name="mlpauto", plan="auto", devices=2,
                               transport=FIXED, batch_sizes=(1, 8), cpus_per_replica=0.25, max_rows=20)
    try:
        assert [(s.start, s.end, s.replicas) for s in app.plan.stages] == [(0, 5, 2)]
        assert app.profile is not None and app.profile.transport == FIXED
        x = torch.randn(3, 6)
        assert torch.allclose(torch.tensor(_post(app.url, {"inputs": x.tolist()}).json()["outputs"]), mlp(x),
                              atol=1e-5)
        r = _post(app.url, {"inputs": torch.randn(21, 6).tolist()})
        assert r.status_code == 413 and "max_rows" in r.json()["error"]
        r = requests.post(app.url + "/predict", data=b'{"inputs": [[NaN, 1, 1, 1, 1, 1]]}', timeout=30)
        assert r.status_code == 422 and "NaN" in r.json()["error"]
    finally:
        app.shutdown()


def test_a_stage_replica_killed_under_load_loses_no_request(serve_port):
    import threading

    import ray

    # the second stage takes 40 ms a batch, so the killed replica is almost surely mid-batch
    torch.manual_seed(5)
    mlp = nn.Sequential(nn.Linear(8, 8), sp.EmulatedBlock(40.0, 2, 8)).eval()
    g = sp.capture(mlp, torch.randn(2, 8))
    prof = sp.profile(g, batch_sizes=(2,), repeats=1, warmup=0, transport=FIXED)
    plan = sp.evaluate(prof, [(0, 1, 1), (1, 2, 2)], devices=3, batch_size=2)
    app = serving.deploy_model(mlp, torch.randn(2, 8), name="mlpkill", plan=plan, graph=g, cpus_per_replica=0.25)
    results: list[bool] = []
    dropped: list[str] = []  # a connection that failed is counted, not lost with its thread
    stop = threading.Event()

    def client(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with requests.Session() as session:
            while not stop.is_set() and len(results) < 2000:
                x = torch.randn(2, 8, generator=gen)
                try:
                    r = session.post(app.url + "/predict", json={"inputs": x.tolist()}, timeout=60)
                except requests.RequestException as exc:
                    dropped.append(type(exc).__name__)
                    results.append(False)
                    continue
                results.append(r.status_code == 200 and torch.allclose(torch.tensor(r.json()["outputs"]), mlp(x),
                                                                        atol=1e-5))

    try:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        def wait_for_results(count: int) -> None:  # progress, not wall time: the machine may be slow
            deadline = time.monotonic() + 120
            while len(results) < count and time.monotonic() < deadline:
                time.sleep(0.1)

        wait_for_results(10)
        names = [a for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("SERVE_REPLICA::mlpkill#mlpkill-stage1#")]
        assert len(names) == 2
        before = len(results)
        ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)
        wait_for_results(before + 30)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert len(results) > before > 0
        assert all(results), f"{results.count(False)} of {len(results)} requests failed or differed ({dropped[:5]})"
    finally:
        stop.set()
        app.shutdown()


def test_the_model_app_checks_its_key_and_its_body_size_like_the_pipeline_app(serve_port):
    """The shared HTTP edge (serving.runtime.edge): a key is required on every route but
    /healthz; a body over the limit is refused (413) while streaming; a bad deadline header
    is the client's mistake (422)."""
    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(2, 6))
    plan = sp.evaluate(sp.profile(g, batch_sizes=(4,), repeats=1, warmup=0, transport=FIXED), [(0, 5, 1)], devices=1)
    app = serving.deploy_model(mlp, torch.randn(2, 6), name="mlpkey", plan=plan, graph=g, cpus_per_replica=0.25,
                               api_key="s3cret", max_body_bytes=2_000)
    try:
        x = torch.randn(3, 6)
        assert requests.post(app.url + "/predict", json={"inputs": x.tolist()}, timeout=60).status_code == 401
        assert requests.get(app.url + "/plan", timeout=10).status_code == 401
        assert requests.get(app.url + "/healthz", timeout=10).status_code == 200
        keyed = {"X-API-Key": "s3cret"}
        r = requests.post(app.url + "/predict", json={"inputs": x.tolist()}, headers=keyed, timeout=60)
        assert r.status_code == 200 and torch.allclose(torch.tensor(r.json()["outputs"]), mlp(x), atol=1e-5)
        big = requests.post(app.url + "/predict", json={"inputs": torch.randn(200, 6).tolist()}, headers=keyed,
                            timeout=60)
        assert big.status_code == 413 and "limit" in big.json()["error"]
        bad_deadline = requests.post(app.url + "/predict", json={"inputs": x.tolist()},
                                     headers={**keyed, "X-Deadline-Ms": "-5"}, timeout=60)
        assert bad_deadline.status_code == 422 and bad_deadline.json()["fields"]
    finally:
        app.shutdown()


def test_deploy_model_arguments_are_checked(serve_port):
    mlp = _mlp()
    with pytest.raises(ValueError, match="name"):
        serving.deploy_model(mlp, torch.randn(2, 6), name="a/b")
    with pytest.raises(ValueError, match="plan"):
        serving.deploy_model(mlp, torch.randn(2, 6), name="x", plan="fastest")
    with pytest.raises(ValueError, match="device"):
        serving.deploy_model(mlp, torch.randn(2, 6), name="x", device="tpu")
    with pytest.raises(TypeError, match="module"):
        serving.deploy_model(object(), torch.randn(2, 6), name="x")


def test_a_plan_the_cluster_cannot_hold_is_refused_at_once(serve_port):
    """Refused before anything deploys, naming the shortfall (it used to wait forever)."""
    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(2, 6))
    prof = sp.profile(g, batch_sizes=(4,), repeats=1, warmup=0, transport=FIXED)
    plan = sp.evaluate(prof, [(0, 2, 2), (2, 5, 2)], devices=4)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"needs 4 replicas of 1000 CPU"):
        serving.deploy_model(mlp, torch.randn(2, 6), name="too-big", plan=plan, graph=g, cpus_per_replica=1000.0)
    # the shared Ray has one logical GPU: four whole-GPU replicas do not fit (by default they
    # would share it, a quarter each: serving.model_app.placement)
    with pytest.raises(ValueError, match=r"needs 4 replicas of 0 CPU and 1 GPU each.*hold 1"):
        serving.deploy_model(mlp, torch.randn(2, 6), name="whole-gpus", plan=plan, graph=g, device="cuda",
                             gpus_per_replica=1.0)
    assert time.monotonic() - started < 60
    from ray import serve

    assert "too-big" not in serve.status().applications and "whole-gpus" not in serve.status().applications


def test_a_redeploy_under_the_running_name_counts_what_the_running_app_holds(serve_port):
    """A model app holding 90% of the free CPUs is replaced by a redeploy of its plan under its
    name: its replica's CPUs count as the new app's (refused as unplaceable before), no room is
    left for a replacement beside it, so it hands over stop-first with a warning and answers
    after; a plan whose added replica cannot fit beside the running one is refused at once
    (Serve would wait for room forever)."""
    from ray import serve

    from serving.core.nodes import nodes

    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(2, 6))
    prof = sp.profile(g, batch_sizes=(4,), repeats=1, warmup=0, transport=FIXED)
    plan = sp.evaluate(prof, [(0, 5, 1)], devices=1)
    free = sum(n.cpus for n in nodes(free=True))
    app = serving.deploy_model(mlp, torch.randn(2, 6), name="mlpho", plan=plan, graph=g,
                               cpus_per_replica=round(0.9 * free, 3))
    again = None
    try:
        x = torch.randn(3, 6)
        with pytest.warns(UserWarning, match="no room beside the running app 'mlpho'"):
            again = serving.deploy_model(mlp, torch.randn(2, 6), name="mlpho", plan=plan, graph=g,
                                         cpus_per_replica=round(0.9 * free, 3))
        r = _post(again.url, {"inputs": x.tolist()})
        assert r.status_code == 200, r.text
        assert torch.allclose(torch.tensor(r.json()["outputs"]), mlp(x), atol=1e-5)
        # two stages of 45% each fit where the running 90% is given back, but the second
        # stage's replica (added) does not fit beside the running one
        split = sp.evaluate(prof, [(0, 2, 1), (2, 5, 1)], devices=2)
        with pytest.raises(ValueError, match="cannot replace the running app 'mlpho': the 1 replicas it adds"):
            serving.deploy_model(mlp, torch.randn(2, 6), name="mlpho", plan=split, graph=g,
                                 cpus_per_replica=round(0.45 * free, 3))
        assert serve.status().applications["mlpho"].status == "RUNNING"
        assert _post(again.url, {"inputs": x.tolist()}).status_code == 200
    finally:
        (again or app).shutdown()
        app.shutdown()


def test_a_stage_canary_names_a_stage_that_cannot_compute(tmp_path):
    """What a stage replica's health check runs, without Ray: the canary row through the
    loaded stage; a stage answering NaN or raising is unhealthy, by name."""
    from serving.model_app.stage_replica import PartitionStageImpl, canary_inputs

    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(2, 6))
    stages = sp.split(g, [2])
    canaries = canary_inputs(stages, g.example)
    assert canaries[0][0].shape == (1, 6)
    for k, stage in enumerate(stages):
        torch.save(stage, tmp_path / f"s{k}.pt")
        replica = PartitionStageImpl(str(tmp_path / f"s{k}.pt"), "cpu", canary=canaries[k])
        assert replica.canary()["canary"] == "ok"
    broken = nn.Sequential(nn.Linear(6, 6))
    with torch.no_grad():
        broken[0].weight.fill_(float("nan"))
    torch.save(broken, tmp_path / "nan.pt")
    with pytest.raises(RuntimeError, match="non-finite"):
        PartitionStageImpl(str(tmp_path / "nan.pt"), "cpu", canary=(torch.ones(1, 6),)).canary()
    with pytest.raises(RuntimeError, match="canary row failed"):
        PartitionStageImpl(str(tmp_path / "nan.pt"), "cpu", canary=(torch.ones(1, 5),)).canary()
    assert PartitionStageImpl(str(tmp_path / "nan.pt"), "cpu").canary() == {"canary": "none"}


def test_calibration_through_serve(serve_port):
    from serving.model_app.transport import calibrate_transport

    tr = calibrate_transport(sizes=(1024, 512 * 1024), repeats=3)
    assert tr.source == "serve-handle" and tr.fixed_ms >= 0 and len(tr.points) == 2


def test_fit_transport_recovers_a_line():
    pts = [(b, 2.0 + b / 1e6) for b in (1e3, 1e5, 1e6, 4e6)]  # 2 ms + 1 ms per MB
    tr = fit_transport(pts, "x")
    assert tr.fixed_ms == pytest.approx(2.0) and tr.bytes_per_s == pytest.approx(1e9)
    flat = fit_transport([(1e3, 3.0), (1e6, 2.9)], "x")
    assert flat.bytes_per_s == float("inf") and flat.fixed_ms == pytest.approx(2.95)
    # one disturbed size (a load spike) does not tip the line, as it would a least-squares fit
    noisy = [(b, 5.0 + b / 5e5) for b in (1e3, 1.3e5, 5e5, 1e6, 2e6, 4e6)]
    noisy[1] = (1.3e5, 27.0)
    robust = fit_transport(noisy, "x")
    assert robust.bytes_per_s == pytest.approx(5e8, rel=0.01) and robust.fixed_ms == pytest.approx(5.0, rel=0.05)
    with pytest.raises(ValueError):
        fit_transport([(1.0, 1.0)], "x")
