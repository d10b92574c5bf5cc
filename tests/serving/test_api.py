"""The HTTP API end to end on Ray Serve: results, routes, and every kind of bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from serving import deploy


@pytest.fixture(scope="module")
def app(ray_cluster, synth_opt):
    served = deploy(synth_opt, name="api", port=ray_cluster, cpus=2, device="cpu",
                    monitor=dict(attributes=["region"], features=["a"], pane_seconds=1.0,
                                 auto_reference_panes=1))
    yield served
    served.shutdown(stop_ray=False)


def post(app, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(app.url + path, data=data, headers={"Content-Type": "application/json"},
                         timeout=60, **kw)


def rows_of(frame):
    return frame.to_dict("records")


def test_predict_equals_in_process(app, synth_opt, request_rows):
    batch = request_rows
    assert (synth_opt.predict_with_levels(batch)[1] > 0).any()
    r = post(app, "/predict", {"rows": rows_of(batch), "attributes": {"region": "eu"}})
    assert r.status_code == 200, r.text
    body = r.json()
    proba, level = synth_opt.predict_with_levels(batch)
    np.testing.assert_allclose(np.array(body["probabilities"]), proba, atol=1e-9)
    assert body["level"] == level.tolist()
    assert body["predictions"] == synth_opt.predict(batch).tolist()
    assert body["model_version"] == app.model_version
    assert len(set(body["level"])) > 1  # both stages answered some rows


def test_single_row_and_top_k(app, synth_opt, request_rows):
    r = post(app, "/predict", {"rows": rows_of(request_rows.iloc[:1])})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 1
    r = post(app, "/top_k", {"rows": rows_of(request_rows), "k": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = synth_opt.top_k(request_rows, 10)
    assert body["indices"] == expected.indices.tolist()
    assert body["approximate"] == expected.approximate[expected.indices].tolist()
    r = post(app, "/top_k", {"rows": rows_of(request_rows), "k": 5, "label": 0})
    assert r.status_code == 200 and r.json()["label"] == 0


def test_static_routes(app):
    report = requests.get(app.url + "/report", timeout=30).json()
    assert report["plan"] == "cascade" and report["loss_bound"] <= report["max_loss"]
    plan = requests.get(app.url + "/plan", timeout=30).json()
    assert [s["name"] for s in plan["stages"]] == ["cheap", "expensive"]
    health = requests.get(app.url + "/healthz", timeout=30).json()
    assert health == {"status": "ok", "app": "api", "model_version": app.model_version,
                      "stages": ["cheap", "expensive"], "monitor": True}
    doc = requests.get(app.url + "/openapi.json", timeout=30).json()
    assert set(doc["components"]["schemas"]["Row"]["required"]) == {"a", "b", "c"}
    assert requests.get(app.url + "/docs", timeout=30).status_code == 200


def test_metrics_count_requests_and_levels(app, request_rows):
    post(app, "/predict", {"rows": rows_of(request_rows.iloc[:32])})
    text = requests.get(app.url + "/metrics", timeout=30).text
    assert 'willump_requests_total{app="api",route="predict",status="200"}' in text
    assert 'willump_rows_total{app="api",level="0"}' in text
    assert 'willump_stage_latency_seconds_bucket{app="api",le="0.005",stage="cheap"}' in text


def test_monitor_routes_answer(app, request_rows):
    for _ in range(3):
        post(app, "/predict", {"rows": rows_of(request_rows.iloc[:50]), "attributes": {"region": "us"}})
    r = requests.get(app.url + "/explain", params={"metric": "latency_ms"}, timeout=60)
    assert r.status_code in (200, 409), r.text  # 409: the traffic reference is not frozen yet
    r = requests.get(app.url + "/drift", params={"kind": "changes"}, timeout=60)
    assert r.status_code in (200, 409), r.text
    r = requests.get(app.url + "/explain", params={"kind": "nonsense"}, timeout=30)
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "kind"
    r = requests.get(app.url + "/explain", params={"bogus_param": 3}, timeout=30)
    assert r.status_code == 422 and "bogus_param" in r.json()["error"]


def good_row(frame):
    return rows_of(frame.iloc[:1])[0]


@pytest.mark.parametrize(
    ("make_body", "status", "field"),
    [
        (lambda row: b"{not json", 400, None),
        (lambda row: {"rows": []}, 422, "rows"),
        (lambda row: {"rows": [{k: v for k, v in row.items() if k != "b"}]}, 422, "rows[0].b"),
        (lambda row: {"rows": [{**row, "zzz": 1}]}, 422, "rows[0].zzz"),
        (lambda row: {"rows": [{**row, "a": "text"}]}, 422, "rows[0].a"),
        (lambda row: {"rows": [{**row, "a": None}]}, 422, "rows[0].a"),
        (lambda row: {"rows": [{**row, "a": True}]}, 422, "rows[0].a"),
        (lambda row: '{"rows": [{"a": NaN, "b": 1, "c": 1}]}', 422, "rows[0].a"),
        (lambda row: '{"rows": [{"a": Infinity, "b": 1, "c": 1}]}', 422, "rows[0].a"),
        (lambda row: {"rows": [row], "extra": 1}, 422, "extra"),
        (lambda row: {"rows": "nope"}, 422, "rows"),
        (lambda row: [1, 2], 422, "body"),
    ],
    ids=["invalid-json", "empty-rows", "missing-column", "extra-column", "wrong-type", "null",
         "bool-for-number", "nan", "infinity", "extra-field", "rows-not-list", "not-an-object"],
)
def test_bad_predict_requests(app, request_rows, make_body, status, field):
    r = post(app, "/predict", make_body(good_row(request_rows)))
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]
    if field is not None:
        assert any(f["field"].startswith(field) for f in body["fields"]), body


def test_bad_top_k_requests(app, request_rows):
    rows = rows_of(request_rows.iloc[:20])
    for k in (0, 21, -3):
        r = post(app, "/top_k", {"rows": rows, "k": k})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "k", r.text
    r = post(app, "/top_k", {"rows": rows, "k": "five"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "k"
    r = post(app, "/top_k", {"rows": rows})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "k"
    r = post(app, "/top_k", {"rows": rows, "k": 3, "label": "purple"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "label"


def test_oversized_body_is_refused(app, request_rows):
    big = json.dumps({"rows": rows_of(request_rows) * 400})  # well over 4 MiB
    assert len(big) > 4 * 1024 * 1024
    r = post(app, "/predict", big)
    assert r.status_code == 413 and "limit" in r.json()["error"]


def test_app_still_answers_correctly_after_bad_input(app, synth_opt, request_rows):
    post(app, "/predict", b"\x00\xff garbage")
    post(app, "/predict", {"rows": [{"a": "x"}]})
    batch = request_rows.iloc[100:140]
    r = post(app, "/predict", {"rows": rows_of(batch)})
    assert r.status_code == 200
    np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch), atol=1e-9)


def test_gpu_placement_runs_on_cpu_here(ray_cluster, synth_opt, request_rows):
    """With a (logical) GPU the expensive stage asks for it; ONNX falls back to the CPU provider.
    Batch settings given to deploy override the plan's."""
    served = deploy(synth_opt, name="gpu", port=ray_cluster, cpus=1.5, device="gpu", runtime="onnx",
                    max_batch_size=16, batch_wait_timeout_s=0.001)
    try:
        plan = requests.get(served.url + "/plan", timeout=30).json()
        assert all(s["max_batch_size"] == 16 and s["batch_wait_timeout_s"] == 0.001 for s in plan["stages"])
        stage = served.plan.stage("expensive")
        assert stage.device == "gpu" and 0 < stage.num_gpus <= 1
        assert served.plan.stage("cheap").num_gpus == 0
        batch = request_rows.iloc[:40]
        r = post(served, "/predict", {"rows": rows_of(batch)})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-4)
    finally:
        served.shutdown(stop_ray=False)


def test_haproxy_front_and_ray_transport_staged(ray_cluster, app, synth_opt, request_rows):
    """The default front here is HAProxy; stage calls over Ray actor calls (transport="ray")
    and the staged layout (a deployment per stage) give the same answers as gRPC and the
    default fused layout."""
    assert app.proxy == "haproxy" and app.plan.layout == "fused"
    served = deploy(synth_opt, name="rayrpc", port=ray_cluster, cpus=1, device="cpu", transport="ray",
                    layout="staged", monitor=True)
    try:
        assert served.plan.layout == "staged" and served.plan.ingress_replicas == 1
        batch = request_rows.iloc[:50]
        r = post(served, "/predict", {"rows": rows_of(batch)})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-9)
        assert requests.get(served.url + "/explain", params={"metric": "latency_ms"}, timeout=30).status_code in (200, 409)
    finally:
        served.shutdown(stop_ray=False)


def test_large_request_bypasses_the_ingress_batcher(app, synth_opt):
    from tests.willump.synth import make_rows

    frame = make_rows(3000, seed=33)[0]
    r = post(app, "/predict", {"rows": rows_of(frame)})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(frame), atol=1e-9)
