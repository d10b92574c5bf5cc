"""The HTTP API end to end on Ray Serve: results, routes, and every kind of bad input."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from serving import deploy
from serving.launch.proxy import metrics_interval_s
from tests.serving.conftest import free_port, wait_for

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray


#: the in-situ probe's load here (seconds of warm-up, seconds measured): these tests check what
#: the probe does (factors, replanning, its rows kept from the monitor), not how close its
#: figures come (`python -m benchmarks.serving` prints them); the defaults are 2 s and 4 s
PROBE_WARMUP_S, PROBE_S = 1.0, 2.0


@pytest.fixture(scope="module")
def app(ray_cluster, synth_opt):
    import serving.launch.insitu

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving.launch.insitu, "probe", functools.partial(
            serving.launch.insitu.probe, warmup_s=PROBE_WARMUP_S, seconds=PROBE_S))
        served = deploy(synth_opt, name="api", port=ray_cluster, cpus=2, device="cpu", calibrate="never",
                        monitor=dict(attributes=["region"], features=["a"], pane_seconds=1.0,
                                     auto_reference_panes=1), insitu="always", layout="fused")
    yield served
    served.shutdown(stop_ray=False)


def post(app, path, body, headers=None, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(app.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})},
                         timeout=60, **kw)


def rows_of(frame):
    return frame.to_dict("records")


def test_deploy_probed_the_running_app_and_planned_again(app):
    """deploy(insitu=...) loaded the app for a few seconds before returning, measured each
    process group's CPU, planned again with measured over modelled CPU, and serves that plan:
    GET /plan carries the factors and the probe's figures; the probe's rows never reached the
    monitor (this test runs before any other sends a request)."""
    probe = app.plan.in_situ
    assert probe["requests"] > 0 and probe["errors"] == 0 and probe["clients"] >= 1
    assert probe["factors"] and all(v > 0 for v in probe["factors"].values())
    assert "ingress" in probe["factors"] and probe["measured_cpu_ms_per_request"]["ingress"] > 0
    assert "max_rows_per_s" in probe["before"] and isinstance(probe["replanned"], bool)
    assert any(n.startswith("in situ (") for n in app.notes), app.notes
    # the same replicas planned: the running ones adopted the refined plan (no restart); else redeployed
    kept = "replicas unchanged, kept running" if not probe["replanned"] else "replicas planned again"
    assert any(kept in n for n in app.notes), app.notes
    served = requests.get(app.url + "/plan", timeout=30).json()
    assert served["in_situ"]["factors"] == pytest.approx(probe["factors"])
    assert served["max_rows_per_s"] == pytest.approx(app.plan.max_rows_per_s)
    text = requests.get(app.url + "/metrics", timeout=30).text
    def total(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    # neither recorded by the monitor nor counted as the users' requests
    assert total("drift_rows_ingested_total") == 0
    assert total('willump_requests_total{app="api",route="predict"') == 0


def test_a_refined_plan_is_published_for_its_own_deploy_only(ray_cluster):
    """serving.core.plan_board on Ray's key-value store: the entry answers the token it was
    published for, no other, and is gone once withdrawn."""
    from serving.core.plan_board import publish_plan, published_plan, withdraw_plan

    publish_plan("board-test", "h1", {"max_rows_per_s": 12.5})
    try:
        assert published_plan("board-test", "h1") == {"max_rows_per_s": 12.5}
        assert published_plan("board-test", "h2") is None and published_plan("board-test", None) is None
    finally:
        withdraw_plan("board-test")
    assert published_plan("board-test", "h1") is None


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
    assert body["degraded"] == [False] * len(batch)
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
    # the filter's certificate travels with the answer; an uncertified one was scored exactly
    if expected.certificate is None:
        assert body["certificate"] is None
    else:
        assert body["certificate"] == expected.certificate.to_dict()
        assert (body["ratio"] is not None) == expected.certificate.certified
    r = post(app, "/top_k", {"rows": rows_of(request_rows), "k": 5, "label": 0})
    assert r.status_code == 200 and r.json()["label"] == 0


def test_static_routes(app):
    report = requests.get(app.url + "/report", timeout=30).json()
    assert report["plan"] == "cascade" and report["loss_bound"] <= report["max_loss"]
    plan = requests.get(app.url + "/plan", timeout=30).json()
    assert [s["name"] for s in plan["stages"]] == ["cheap", "expensive"]
    # Serve handed the ingress its user_config at start (Ingress.reconfigure): the in-place
    # settings at the deployed values, audited at the default rate
    live = plan["live_settings"]
    assert live["gear"] == "auto" and live["audit_rate"] == 0.01 and live["on_alarm"] == "alert"
    assert live["max_in_flight"] >= 1 and live["deadline_ms"] > 0 and live["lost_after_s"] == 2.0
    # /healthz is open to anyone and says nothing about the app; /readyz (behind the key, when
    # there is one) names the app, its version and every stage's canary
    assert requests.get(app.url + "/healthz", timeout=30).json() == {"status": "ok"}
    ready = requests.get(app.url + "/readyz", timeout=60).json()
    assert {k: ready[k] for k in ("status", "app", "model_version", "monitor")} == {
        "status": "ready", "app": "api", "model_version": app.model_version, "monitor": True}
    assert list(ready["stages"]) == ["cheap", "expensive"]
    # a key-less app's /plan names no address of the cluster
    text = requests.get(app.url + "/plan", timeout=30).text
    hosts = {n.host for n in app.plan.nodes} | {n.node_id for n in app.plan.nodes}
    assert hosts and not any(h in text for h in hosts) and "host-0" in text
    doc = requests.get(app.url + "/openapi.json", timeout=30).json()
    assert set(doc["components"]["schemas"]["Row"]["required"]) == {"a", "b", "c"}
    explain = {p["name"]: p for p in doc["paths"]["/explain"]["get"]["parameters"]}
    assert explain["kind"]["schema"]["enum"] == ["anomalies", "mix", "conditional", "cascade"]
    assert explain["max_order"]["schema"]["maximum"] == 3 and "securitySchemes" not in doc["components"]
    docs = requests.get(app.url + "/docs", timeout=30)
    assert docs.status_code == 200 and "https://" not in docs.text  # Swagger UI served by the app
    asset = requests.get(app.url + "/docs/assets/swagger-ui-bundle.js", timeout=30)
    assert asset.status_code == 200 and asset.headers["content-type"].startswith("text/javascript")
    assert requests.get(app.url + "/docs/assets/index.html", timeout=30).status_code == 404


def test_metrics_count_requests_and_levels(app, request_rows):
    r = post(app, "/predict", {"rows": rows_of(request_rows.iloc[:32])})
    assert r.status_code == 200

    def scraped():
        text = requests.get(app.url + "/metrics", timeout=30).text
        wanted = ['willump_requests_total{app="api",route="predict",status="200"}',
                  'willump_rows_total{app="api",level="0"}',
                  'willump_stage_latency_seconds_bucket{app="api",le="0.005",stage="cheap"}',
                  'willump_event_loop_lag_seconds_count{app="api"}']  # the ingress's loop probe
        return text if all(w in text for w in wanted) else None

    text = wait_for(scraped, timeout=30, message="the app's metrics in /metrics")
    # the monitor's verdicts ride along (drift's Prometheus collector), and the records it got
    assert "drift_rows_ingested_total" in text
    wait_for(lambda: 'willump_monitor_records_sent_total{app="api"}' in requests.get(app.url + "/metrics",
                                                                                      timeout=30).text,
             timeout=30, message="records sent to the monitor, counted")


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
    # the monitor's own errors keep their status and reason (drift.DriftError.to_http())
    r = requests.get(app.url + "/drift", params={"reference": "nosuch"}, timeout=30)
    assert r.status_code == 409 and r.json()["reason"] == "no_reference" and "reference=-1h" in r.json()["error"]
    r = requests.get(app.url + "/explain", params={"metric": "nosuch"}, timeout=30)
    assert r.status_code == 422 and r.json()["reason"] == "schema", r.text
    # the live audit runs by default on a cascade with the monitor (1% of the cheap rows)
    gear = wait_for(lambda: (lambda g: g if g["served_rows"] >= 150 else None)(
        requests.get(app.url + "/drift", params={"kind": "guarantee"}, timeout=30).json()["result"]["gears"][0]),
        timeout=30)
    assert gear["max_loss"] is not None and gear["alarm"] is False and gear["cheap_rows"] <= gear["served_rows"]


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
        (lambda row: '{"rows": [{"a": ' + "9" * 5000 + ', "b": 1, "c": 1}]}', 400, None),
        (lambda row: '{"rows": [{"a": 1' + "0" * 400 + ', "b": 1, "c": 1}]}', 422, "rows[0].a"),
        (lambda row: '{"rows": ' + "[" * 50_000 + "]" * 50_000 + "}", 400, None),
        (lambda row: json.dumps({"rows": [row]})[:-1] + ', "attributes": {"source": "\\ud800"}}', 422,
         "body.attributes.source"),
        (lambda row: json.dumps({"rows": [{**row, "a": 1.0}], "attributes": {f"k{i}": 1 for i in range(40)}}), 422,
         "attributes"),
        (lambda row: json.dumps({"rows": [row], "attributes": {"source": "x" * 1000}}), 422, "attributes.source"),
    ],
    ids=["invalid-json", "empty-rows", "missing-column", "extra-column", "wrong-type", "null",
         "bool-for-number", "nan", "infinity", "extra-field", "rows-not-list", "not-an-object",
         "huge-integer-literal", "integer-beyond-float", "deep-nesting", "lone-surrogate",
         "too-many-attributes", "long-attribute"],
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


def test_cross_site_calls_and_foreign_hosts_are_refused(app, request_rows):
    """An app bound to loopback: a web page's cross-site text/plain POST (no CORS preflight) is
    refused (415), as is a browser call whose Origin is another site (403) and a request whose
    Host is not a loopback name (421: DNS rebinding); each with the usual JSON error."""
    body = json.dumps({"rows": rows_of(request_rows.iloc[:2])})
    r = requests.post(app.url + "/predict", data=body, headers={"Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 415 and r.json()["fields"][0]["field"] == "header:Content-Type"
    r = post(app, "/predict", body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["fields"][0]["field"] == "header:Origin"
    r = requests.get(app.url + "/plan", headers={"Host": "evil.example"}, timeout=60)
    assert r.status_code == 421 and "evil.example" in r.json()["error"]
    assert post(app, "/predict", body).status_code == 200  # the app's own clients still pass


def test_app_still_answers_correctly_after_bad_input(app, synth_opt, request_rows):
    post(app, "/predict", b"\x00\xff garbage")
    post(app, "/predict", {"rows": [{"a": "x"}]})
    batch = request_rows.iloc[100:140]
    r = post(app, "/predict", {"rows": rows_of(batch)})
    assert r.status_code == 200
    np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch), atol=1e-9)


def test_gpu_placement_runs_on_cpu_here(ray_cluster, synth_opt, request_rows, monkeypatch):
    """With a (logical) GPU the expensive stage asks for it; ONNX falls back to the CPU provider.
    Batch settings given to deploy override the plan's. ``gpus=0.5``: the app (its profiling
    too) holds at most half the GPU, and leaves the rest free for another app."""
    import ray

    import serving.measure.stages

    monkeypatch.setattr(serving.measure.stages, "GPU_CONCURRENCY", (1, 2))  # (1, 2, 4) by default: time
    served = deploy(synth_opt, name="gpu", port=ray_cluster, cpus=1.5, gpus=0.5, device="gpu", runtime="onnx",
                    insitu="never", max_batch_size=16, batch_wait_timeout_s=0.001, calibrate="never")
    try:
        held = sum(s.num_gpus * s.replicas for s in served.plan.stages)
        assert 0 < held <= 0.5 + 1e-9
        assert ray.available_resources().get("GPU", 0.0) >= ray.cluster_resources()["GPU"] - 0.5 - 1e-9
        plan = requests.get(served.url + "/plan", timeout=30).json()
        assert all(s["max_batch_size"] == 16 and s["batch_wait_timeout_s"] == 0.001 for s in plan["stages"])
        stage = served.plan.stage("expensive")
        assert stage.device == "gpu" and 0 < stage.num_gpus <= 1
        # profiled inside GPU actors (here a logical GPU, so on the CPU, which the plan says)
        profile = served.plan.profiles[1]
        assert profile.device == "gpu" and set(profile.speedup) == {1, 2}
        assert profile.measured_on.startswith("cpu") and any("GPU timings" in n for n in served.plan.notes)
        assert served.plan.stage("cheap").num_gpus == 0
        batch = request_rows.iloc[:40]
        r = post(served, "/predict", {"rows": rows_of(batch)})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-4)
    finally:
        served.shutdown(stop_ray=False)


def test_haproxy_front_and_staged_layout(ray_cluster, app, synth_opt, request_rows):
    """The default front here is HAProxy; the staged layout (a deployment per stage) gives the
    same answers as the default fused layout."""
    assert app.proxy == "haproxy" and app.plan.layout == "fused"
    served = deploy(synth_opt, name="staged", port=ray_cluster, cpus=1, device="cpu", layout="staged", insitu="never",
                    monitor=True, calibrate="never", audit_rate=1.0, on_alarm="step")
    try:
        assert served.plan.layout == "staged" and served.plan.ingress_replicas == 1
        batch = request_rows.iloc[:50]
        r = post(served, "/predict", {"rows": rows_of(batch)})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-9)
        # audit_rate=1: every cheap row ran through the full pipeline on the expensive stage, and
        # the monitor counts exactly the rows whose class differs from the full pipeline's
        proba, level = synth_opt.predict_with_levels(batch)
        cheap = level != len(synth_opt.levels) - 1
        differ = cheap & (proba.argmax(axis=1) != synth_opt.baseline.predict_proba(batch).argmax(axis=1))
        gear = wait_for(lambda: (lambda g: g if g["audited_rows"] + g["shed_audits"] >= cheap.sum() else None)(
            requests.get(served.url + "/drift", params={"kind": "guarantee"}, timeout=30).json()["result"]["gears"][0]),
            timeout=60)
        assert (gear["served_rows"], gear["cheap_rows"], gear["shed_audits"]) == (50, cheap.sum(), 0), gear
        assert (gear["audited_rows"], gear["disagreed_rows"]) == (cheap.sum(), differ.sum()), gear
        wait_for(lambda: 'willump_audit_rows_total{app="staged",outcome="agree"}' in requests.get(
            served.url + "/metrics", timeout=30).text, timeout=60, message="the audit's rows in /metrics")
        # labels fed back join the served rows by the answer's X-Request-Id and the row's index
        rid, served_labels = r.headers["X-Request-Id"], r.json()["predictions"]
        labels = [{"request_id": rid, "row": i, "label": label} for i, label in enumerate(served_labels[:10])]
        out = post(served, "/labels", {"labels": [*labels, labels[0], {**labels[0], "request_id": "nosuch"}]})
        assert out.status_code == 200 and out.json() == {"accepted": 10, "unknown": 1, "duplicate": 1}, out.text
        bad = post(served, "/labels", {"labels": [{**labels[0], "label": "no such class"}]})
        assert bad.status_code == 422 and bad.json()["fields"][0]["field"] == "labels[0].label", bad.text
        accuracy = requests.get(served.url + "/drift", params={"kind": "accuracy"}, timeout=30).json()["result"]
        assert accuracy["gears"][0]["labelled_rows"] == 10 and accuracy["gears"][0]["accuracy"] == 1.0, accuracy
        # the default monitor freezes its reference from the first 5 panes of traffic: until then
        # a query says so, with how long to wait (in the body and as Retry-After)
        r = requests.get(served.url + "/explain", params={"metric": "latency_ms"}, timeout=30)
        assert r.status_code == 409 and r.json()["reason"] == "reference_pending", r.text
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["retry_after_s"] > 0
        _hold_and_release(served, synth_opt)
    finally:
        served.shutdown(stop_ray=False)


def _cheap_rows(opt, n: int = 20_000, seed: int = 99):
    """Rows the cheap level answers, split by whether its class differs from the full pipeline's."""
    from tests.willump.synth import make_rows

    rows = make_rows(n, seed=seed)[0]
    proba, level = opt.predict_with_levels(rows)
    cheap = level != len(opt.levels) - 1
    same = proba.argmax(axis=1) == opt.baseline.predict_proba(rows).argmax(axis=1)
    return rows[cheap & ~same].reset_index(drop=True), rows[cheap & same].reset_index(drop=True)


def _hold_and_release(served, opt) -> None:
    """deploy(on_alarm="step") on an app auditing every cheap row: rows the cheap level answers
    unlike the full pipeline ring the alarm and hold gear 0; the full pipeline then answers
    every row (and audits gear 0's decisions on them) until the rows audited since pass the
    release test; then the cascade answers again."""
    differ, agree = _cheap_rows(opt)
    full_level = len(opt.levels) - 1

    def answer(rows) -> dict:
        r = post(served, "/predict", {"rows": rows_of(rows)})
        assert r.status_code == 200, r.text
        return r.json()

    def guarantee() -> dict:
        return requests.get(served.url + "/drift", params={"kind": "guarantee"}, timeout=30).json()["result"]

    assert not answer(differ.iloc[:40])["full_pipeline"]
    wait_for(lambda: guarantee()["held"] == [0], timeout=60, message="the alarm to hold gear 0")
    wait_for(lambda: answer(agree.iloc[:1])["full_pipeline"], timeout=60, message="the ingress to serve in full")
    batch = agree.iloc[1:151]
    held = answer(batch)
    assert held["full_pipeline"] and held["level"] == [full_level] * len(batch)
    np.testing.assert_allclose(np.array(held["probabilities"]), opt.baseline.predict_proba(batch), atol=1e-9)
    report = guarantee()["gears"][0]
    # the rows just answered in full are audited too: where their counts reached the monitor (every
    # 2 s) before this query, the release test may already have let the hold go (a loaded suite run)
    assert report["holds"] == 1 and report["held"] == report["alarm"], report
    wait_for(lambda: not answer(agree.iloc[151:161])["full_pipeline"], timeout=60, message="the hold released")
    report = guarantee()
    assert report["held"] == [] and report["gears"][0]["holds"] == 1 and not report["gears"][0]["alarm"], report
    wait_for(lambda: 'willump_gear_rows_total{app="staged",gear="full"}' in requests.get(served.url + "/metrics",
                                                                                       timeout=30).text,
             timeout=60, message="the rows served in full counted in /metrics")


def test_whole_layout_serves_every_level_in_the_ingress(ray_cluster, synth_opt, request_rows):
    """layout="whole": one stage runs every level inside the ingress (no stage deployment, no
    hop); answers, levels, top-K and readiness as in process. Its logs are JSON, one object a
    line, an access line per request carrying the client's request id."""
    from ray import serve

    served = deploy(synth_opt, name="whole", port=ray_cluster, cpus=1, device="cpu", layout="whole", insitu="never",
                    calibrate="never", degrade=True, log_format="json", access_log=True)
    try:
        assert served.plan.layout == "fused" and [s.name for s in served.plan.stages] == ["cascade"]
        assert list(serve.status().applications["whole"].deployments) == ["whole-ingress"]
        batch = request_rows
        r = post(served, "/predict", {"rows": rows_of(batch)})
        assert r.status_code == 200, r.text
        proba, level = synth_opt.predict_with_levels(batch)
        body = r.json()
        np.testing.assert_allclose(np.array(body["probabilities"]), proba, atol=1e-9)
        assert body["level"] == level.tolist() and len(set(level.tolist())) > 1
        assert body["degraded"] == [False] * len(batch)
        r = post(served, "/top_k", {"rows": rows_of(batch), "k": 10})
        assert r.status_code == 200 and r.json()["indices"] == synth_opt.top_k(batch, 10).indices.tolist()
        ready = requests.get(served.url + "/readyz", timeout=60)
        assert ready.status_code == 200 and list(ready.json()["stages"]) == ["cascade"], ready.text
        rid = "json-log-check-1"
        assert post(served, "/predict", {"rows": rows_of(batch.iloc[:2])}, headers={"X-Request-Id": rid}).ok
        line = wait_for(lambda: _logged(rid, "whole"), timeout=60, message="the request's JSON log line")
        assert line["application"] == "whole" and line["deployment"].endswith("whole-ingress"), line
        assert line["request_id"] == rid and line["message"].startswith("POST /whole/predict 200"), line
    finally:
        served.shutdown(stop_ray=False)


def _logged(request_id: str, app: str) -> dict | None:
    """The first JSON line of ``app``'s replica logs carrying ``request_id`` (None: none yet)."""
    import ray

    from serving.core.procstat import session_dir

    logs = Path(session_dir(ray.get_runtime_context().gcs_address)) / "logs" / "serve"
    for path in sorted(logs.glob(f"replica_{app}_*.log")):
        for text in path.read_text(errors="replace").splitlines():
            if request_id in text:
                return json.loads(text)  # a line that is not JSON fails the test here
    return None


def test_the_open_inference_protocol_answers_like_predict(app, synth_opt, request_rows):
    """POST /v2/models/{name}/infer (KServe's and Triton's protocol): one tensor per column in,
    the cascade's answer out, equal to POST /predict's; the metadata, readiness and liveness
    routes; mistakes answered in the app's error shape."""
    batch = request_rows.iloc[:24]
    body = {"id": "req-1", "inputs": [{"name": c, "shape": [len(batch)], "datatype": "FP64",
                                       "data": batch[c].tolist()} for c in batch.columns]}
    r = post(app, "/v2/models/api/infer", body)
    assert r.status_code == 200, r.text
    out = r.json()
    native = post(app, "/predict", {"rows": rows_of(batch)}).json()
    tensors = {t["name"]: t for t in out["outputs"]}
    assert out["model_name"] == "api" and out["id"] == "req-1" and out["model_version"] == app.model_version
    assert tensors["probabilities"]["shape"] == [len(batch), 2]
    np.testing.assert_allclose(np.array(tensors["probabilities"]["data"]).reshape(len(batch), 2),
                               np.array(native["probabilities"]), atol=1e-12)
    np.testing.assert_allclose(np.array(tensors["probabilities"]["data"]).reshape(len(batch), 2),
                               synth_opt.predict_proba(batch), atol=1e-9)
    assert tensors["predictions"]["data"] == native["predictions"] and tensors["level"]["data"] == native["level"]
    assert out["parameters"]["gear"] == 0 and out["parameters"]["full_pipeline"] is False
    only = post(app, "/v2/models/api/infer", {**body, "outputs": [{"name": "predictions"}]}).json()
    assert [t["name"] for t in only["outputs"]] == ["predictions"]
    meta = requests.get(app.url + "/v2/models/api", timeout=30).json()
    assert meta["name"] == "api" and [i["name"] for i in meta["inputs"]] == list(batch.columns)
    assert requests.get(app.url + "/v2/models/api/ready", timeout=60).json() == {"name": "api", "ready": True}
    assert requests.get(app.url + "/v2/health/ready", timeout=60).status_code == 200
    assert requests.get(app.url + "/v2/health/live", timeout=30).json() == {"live": True}
    wrong = post(app, "/v2/models/other/infer", body)
    assert wrong.status_code == 404 and wrong.json()["fields"][0]["field"] == "path:model", wrong.text
    bad = post(app, "/v2/models/api/infer", {**body, "inputs": body["inputs"][:2]})
    assert bad.status_code == 422 and bad.json()["request_id"] and "missing input" in bad.text, bad.text
    wait_for(lambda: 'willump_requests_total{app="api",route="infer",status="200"}' in requests.get(
        app.url + "/metrics", timeout=30).text, timeout=60, message="infer requests in /metrics")


def test_large_request_bypasses_the_ingress_batcher(app, synth_opt):
    from tests.willump.synth import make_rows

    frame = make_rows(3000, seed=33)[0]
    r = post(app, "/predict", {"rows": rows_of(frame)})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(frame), atol=1e-9)


def test_gpu_is_refused_for_models_that_cannot_use_it(ray_cluster, synth_opt):
    with pytest.raises(ValueError, match="cannot run on a GPU"):
        deploy(synth_opt, name="nogpu", port=ray_cluster, device="gpu", runtime="native", calibrate="never")


def test_errors_carry_a_request_id(app):
    r = post(app, "/predict", {"rows": []}, headers={"X-Request-Id": "client-chosen-42"})
    assert r.status_code == 422
    assert r.json()["request_id"] == "client-chosen-42" == r.headers["x-request-id"]
    r = post(app, "/predict", {"rows": []})
    assert r.json()["request_id"] == r.headers["x-request-id"] and len(r.json()["request_id"]) >= 16


@pytest.fixture(scope="module")
def keyed(ray_cluster, synth_opt, app):
    """Two ingress replicas behind an API key, deployed asking for a port Serve does not use."""
    from dataclasses import replace

    plan = replace(app.plan, ingress_replicas=2, ingress_cpus=0.2)
    served = deploy(synth_opt, name="keyed", port=free_port(), plan=plan, api_key="s3cret", calibrate="never",
                    insitu="never")
    yield served
    served.shutdown(stop_ray=False)


def test_url_is_where_serve_answers(keyed, ray_cluster):
    """Serve keeps the port it started with; deploy returns that, not the one asked for."""
    assert keyed.url == f"http://127.0.0.1:{ray_cluster}/keyed"
    assert requests.get(keyed.url + "/healthz", timeout=30).status_code == 200


def test_api_key_is_required_except_for_health(keyed, request_rows):
    body = {"rows": rows_of(request_rows.iloc[:4])}
    assert post(keyed, "/predict", body).status_code == 401
    assert post(keyed, "/predict", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert requests.get(keyed.url + "/metrics", timeout=30).status_code == 401
    ok = post(keyed, "/predict", body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200, ok.text
    assert post(keyed, "/predict", body, headers={"X-API-Key": "s3cret"}).status_code == 200
    assert "s3cret" not in keyed.spec.model_dump_json()  # only its hash travels with the app
    assert requests.get(keyed.url + "/readyz", timeout=30).status_code == 401
    assert requests.get(keyed.url + "/healthz", timeout=30).json() == {"status": "ok"}
    assert requests.get(keyed.url + "/v2/health/live", timeout=30).status_code == 200  # open, as /healthz
    assert requests.get(keyed.url + "/v2/health/ready", timeout=30).status_code == 401
    infer = {"inputs": [{"name": c, "shape": [4], "datatype": "FP64", "data": request_rows[c].iloc[:4].tolist()}
                        for c in request_rows.columns]}
    assert post(keyed, "/v2/models/keyed/infer", infer).status_code == 401
    assert post(keyed, "/v2/models/keyed/infer", infer, headers={"X-API-Key": "s3cret"}).status_code == 200
    plan = requests.get(keyed.url + "/plan", headers={"Authorization": "Bearer s3cret"}, timeout=30).json()
    assert plan["nodes"][0]["host"] == keyed.plan.nodes[0].host  # with the key: the plan as made
    doc = requests.get(keyed.url + "/openapi.json", headers={"X-API-Key": "s3cret"}, timeout=30).json()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert doc["security"] and doc["paths"]["/healthz"]["get"]["security"] == []


def test_metrics_are_exact_across_ingress_replicas(keyed, request_rows):
    """/metrics answers from one ingress replica but counts every replica's requests."""
    from concurrent.futures import ThreadPoolExecutor

    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    url = keyed.url + "/metrics"

    def count() -> float:
        text = requests.get(url, headers=auth, timeout=30).text
        line = [x for x in text.splitlines()
                if x.startswith('willump_requests_total{app="keyed",route="predict",status="200"}')]
        return float(line[0].split()[-1]) if line else 0.0

    # earlier tests' requests reach the totals within an export interval: start from a settled count
    settled = [count(), -1.0]

    def stable() -> bool:  # unchanged over two export periods (one export may come late on a busy machine)
        time.sleep(2 * metrics_interval_s() + 0.5)
        settled[1], settled[0] = settled[0], count()
        return settled[0] == settled[1]

    wait_for(stable, timeout=90, message="a settled request count")
    before = settled[0]
    body = json.dumps({"rows": rows_of(request_rows.iloc[:8])})
    n = 60
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: requests.post(keyed.url + "/predict", data=body, headers=auth,
                                                      timeout=60).status_code, range(n)))
    assert codes == [200] * n
    wait_for(lambda: count() == before + n, timeout=60, message=f"{before + n} requests counted")
    # both replicas served some of them: the total is a sum over replicas, not one replica's count
    import ray

    from serving.runtime.node_scrape import metric_nodes, read_app_lines

    raw = "".join(read_app_lines(e) or "" for _, e in metric_nodes())
    workers = {line.split('WorkerId="')[1].split('"')[0] for line in raw.splitlines()
               if line.startswith("ray_willump_requests_total") and 'app="keyed"' in line and 'route="predict"' in line}
    assert len(workers) == 2, workers
    assert ray.is_initialized()


def test_adaptive_gears_switch_and_every_answer_names_its_gear(ray_cluster, app, geared_opt, request_rows):
    """An SLO far below any latency puts every request after the first at risk: the ingress
    steps one certified gear cheaper per request (no interval, no way back), each answer names
    its gear and certified bound, equals that gear's in-process answer, and /metrics counts
    rows per gear. The planner autoscales the stages (one replica at most here) for the
    cheapest gear: /plan says so, and that a call in gear 0 stands for fewer rows of it."""
    from dataclasses import replace

    ladder = geared_opt.gears_
    # one ingress replica (each switches on its own queue), small reservations beside the other apps
    plan = replace(app.plan, ingress_replicas=1, ingress_cpus=0.1,
                   stages=[replace(s, num_cpus=min(s.num_cpus, 0.1)) for s in app.plan.stages])
    served = deploy(geared_opt, name="geared", port=ray_cluster, plan=plan, calibrate="never", insitu="never",
                    gears="adaptive", gear_policy={"slo_ms": 0.001, "up_interval_s": 0.0, "down_after_s": 3600.0,
                                                   "window_s": 600.0, "replicas_for": "cheapest"},
                    autoscaler="planner", min_replicas=1, max_replicas=1)
    try:
        batch = request_rows.iloc[:64]
        seen = []
        for i in range(len(ladder) + 1):
            body = post(served, "/predict", {"rows": rows_of(batch)}).json()
            gear = min(i, len(ladder) - 1)
            assert (body["gear"], body["gear_loss_bound"]) == (gear, ladder[gear].loss_bound), body
            assert body["gear_loss_bound"] <= body["gear_max_loss"] == ladder[gear].max_loss
            np.testing.assert_allclose(np.array(body["probabilities"]), geared_opt.gear(gear).predict_proba(batch),
                                       atol=1e-9)
            seen.append(body["level"])
        assert seen[-1].count(0) > seen[0].count(0)  # the cheap level answered more rows in the cheapest gear
        wanted = [f'willump_gear_rows_total{{app="geared",gear="{g}"}}' for g in range(len(ladder))]
        wait_for(lambda: all(w in requests.get(served.url + "/metrics", timeout=30).text for w in wanted),
                 timeout=30, message="rows per gear in /metrics")
        # what the autoscaler is told a cheaper gear's rows stand for (the artifact's shares until served)
        demand = requests.get(served.url + "/plan", timeout=30).json()["gear_demand"]
        assert len(demand["share_sent_on"]) == len(ladder) == len(demand["demand_scale"]), demand
        assert demand["replicas_for"] == "cheapest" and demand["demand_scale"][-1] == 1.0, demand
        assert demand["demand_scale"][0] < 1.0, demand  # gear 0 sends more rows on than the cheapest
        with pytest.raises(ValueError, match="certifies gears"):
            deploy(geared_opt, name="geared2", port=ray_cluster, plan=app.plan, calibrate="never", gears=7)
    finally:
        served.shutdown(stop_ray=False)


def test_sixty_four_trickling_connections_do_not_lock_out_other_clients(app, request_rows):
    """Over the real front (HAProxy or Serve's proxy, then the ingress): 64 clients that send
    their headers and a few bytes of a large body, then stall, hold no admission slot: other
    clients' requests are answered 200 meanwhile, not 503 (the ingress reads a body before it
    takes a slot, under a 10 s limit). Functional only: no rate is asserted."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(app.url)
    head = (f"POST {url.path}/predict HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"rows\": [").encode()
    stalled = []
    try:
        for _ in range(64):
            s = socket.create_connection((url.hostname, url.port), timeout=10)
            s.sendall(head)
            stalled.append(s)
        body = {"rows": rows_of(request_rows.iloc[:8])}
        answers = [post(app, "/predict", body).status_code for _ in range(5)]
        assert answers == [200] * 5, answers
    finally:
        for s in stalled:
            s.close()

