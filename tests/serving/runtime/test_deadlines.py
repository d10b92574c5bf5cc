"""Deadlines, overload and isolation, with a feature lookup the test can stall.

The stall is a sleep in the expensive stage's lookup (tests/serving/pipelines.py), so the
outcomes depend on the deadline and the stall, not on how fast or loaded the machine is."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
import requests

from serving import deploy
from serving.core.specs import stage_specs
from serving.runtime.stage_runner import StageRunner
from tests.serving.conftest import wait_for
from tests.serving.pipelines import POISON, set_delay, stall_once
from tests.willump.synth import make_rows

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

#: a stalled lookup takes this long; every deadline below is well under it
STALL_S = 4.0


#: the rate the strict app is planned for: one replica of each deployment at any measured cost
STRICT_RPS = 1.0


@pytest.fixture(scope="module")
def strict(ray_cluster, stallable_opt):
    """No degradation; at most 2 requests in flight per ingress replica; the live audit samples
    every cheap row (the monitor keeps its counts). Planned for a low rate (``rps``), so one
    replica of each deployment whatever the profiles measure on a busy machine: the shedding
    test needs the stalled request and the next one on the same ingress replica."""
    app = deploy(stallable_opt, name="strict", port=ray_cluster, cpus=1.5, device="cpu", calibrate="never", insitu="never",
                 deadline_ms=3000, max_in_flight=2, layout="fused", monitor=True, audit_rate=1.0, rps=STRICT_RPS)
    yield app
    app.shutdown(stop_ray=False)


@pytest.fixture(scope="module")
def lenient(ray_cluster, stallable_opt):
    """Degradation on: rows whose expensive stage is late get the cheap level's answer; a stage
    per deployment, so the first stage is called over a hop too."""
    app = deploy(stallable_opt, name="lenient", port=ray_cluster, cpus=1.5, device="cpu", calibrate="never", insitu="never",
                 degrade=True, layout="staged")
    yield app
    app.shutdown(stop_ray=False)


@pytest.fixture
def stall():
    set_delay(STALL_S)
    yield
    set_delay(0.0)


@pytest.fixture(scope="module")
def split_rows(stallable_opt):
    """Rows that reach the stalling lookup (no cheap level answers them), and rows the first
    level answers itself. (With three levels, rows the first leaves are not all stalled: the
    second, in the expensive stage, answers some without the lookup.)"""
    rows = make_rows(4000, seed=25)[0]
    reach = stallable_opt.run_levels(rows, 0, len(stallable_opt.levels) - 2)
    first = stallable_opt.run_levels(rows, 0, 0)
    unsure = rows.iloc[reach.unsure].reset_index(drop=True)
    sure = rows.drop(index=rows.index[first.unsure]).reset_index(drop=True)
    assert len(unsure) >= 8, len(unsure)
    return unsure, sure


def post(app, rows, headers=None, timeout=60):
    return requests.post(app.url + "/predict", data=json.dumps({"rows": rows.to_dict("records")}),
                         headers={"Content-Type": "application/json", **(headers or {})}, timeout=timeout)


def metric(app, name: str) -> float:
    text = requests.get(app.url + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_a_stalled_stage_answers_504_at_the_deadline(strict, split_rows, stall):
    unsure, _ = split_rows
    start = time.monotonic()
    # 1.5 s: room to clear the cheap stage on a stalled machine, well short of the 4 s stall
    r = post(strict, unsure.iloc[:4], headers={"X-Deadline-Ms": "1500"})
    elapsed = time.monotonic() - start
    assert r.status_code == 504, r.text
    body = r.json()
    assert "deadline of 1500 ms exceeded at the expensive stage" in body["error"] and body["request_id"]
    assert elapsed < STALL_S  # answered at the deadline, not when the lookup returned
    # without the header the app's own deadline (3 s) applies, still short of the stall
    r = post(strict, unsure.iloc[:4])
    assert r.status_code == 504 and "3000 ms" in r.json()["error"]
    wait_for(lambda: metric(strict, 'willump_deadline_exceeded_total{app="strict",stage="expensive"}') >= 2,
             timeout=30, message="deadline misses counted")


def test_the_live_audit_waits_while_the_request_path_is_busy_and_sheds_past_its_queue(strict, split_rows, stall):
    """Under load the audit gives way, and what it drops is counted: the strict app's full model
    sits in a stage of its own, so its audit is paced (serving.runtime.audit_pace). While a
    stalled request holds half the ingress's admission bound, a request of more cheap rows than
    the audit's queue holds is answered (200), the rows past the queue are shed at once, and the
    rest wait; once the stall ends they are audited, none lost."""
    from serving.runtime.audit import AUDIT_QUEUE_ROWS

    unsure, sure = split_rows
    past = 64
    assert strict.plan.ingress_replicas == 1, "the stalled request must hold the replica the next one reaches"
    assert len(sure) >= AUDIT_QUEUE_ROWS + past

    def guarantee() -> dict:
        return requests.get(strict.url + "/drift", params={"kind": "guarantee"}, timeout=30).json()["result"]["gears"][0]

    before = guarantee()
    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(post, strict, unsure.iloc[:4])
        time.sleep(0.5)  # the stalled request is in flight (its lookup stalls STALL_S, its deadline is 3 s)
        r = post(strict, sure.iloc[:AUDIT_QUEUE_ROWS + past])
        assert r.status_code == 200, r.text
        set_delay(0.0)  # the lookups the audit makes later do not stall (the stalled one still does)
        assert stalled.result().status_code == 504
    after = wait_for(lambda: (g := guarantee())["audited_rows"] >= before["audited_rows"] + AUDIT_QUEUE_ROWS and g,
                     timeout=90, message="the rows that waited, audited")
    assert after["shed_audits"] - before["shed_audits"] == past
    assert after["audited_rows"] - before["audited_rows"] == AUDIT_QUEUE_ROWS
    # /metrics sums the replicas' last exports (one every RAY_metrics_report_interval_ms)
    wait_for(lambda: metric(strict, 'willump_audit_rows_total{app="strict",outcome="shed"}') >= past,
             timeout=60, message="the shed audits in /metrics")


def test_a_bad_deadline_header_is_the_clients_mistake(strict, request_rows):
    r = post(strict, request_rows.iloc[:2], headers={"X-Deadline-Ms": "soon"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "header:x-deadline-ms"


def test_beyond_max_in_flight_the_ingress_answers_503_with_retry_after(strict, split_rows, stall):
    unsure, _ = split_rows
    admitted = 2 * strict.plan.ingress_replicas  # max_in_flight per ingress replica
    n = admitted + 6
    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(lambda i: post(strict, unsure.iloc[i % len(unsure):][:1],
                                                 headers={"X-Deadline-Ms": "2000"}), range(n)))
    shed = [r for r in responses if r.status_code == 503]
    assert len(shed) >= n - admitted, [r.status_code for r in responses]
    assert all(int(r.headers["Retry-After"]) >= 1 and "overloaded" in r.json()["error"] for r in shed)
    assert {r.status_code for r in responses} <= {503, 504}  # the admitted ones waited for the stall


def test_one_bad_row_fails_only_its_own_request(lenient, stallable_opt, request_rows):
    """Requests arriving together are merged into one stage call; a row that makes a feature
    raise fails its own request (500, a request id, no exception text), not the others."""
    poisoned = request_rows.iloc[:4].copy()
    poisoned.loc[poisoned.index[1], "a"] = POISON
    batches = [request_rows.iloc[i * 8:(i + 1) * 8] for i in range(8)]
    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(post, lenient, b) for b in batches] + [pool.submit(post, lenient, poisoned)]
        results = [f.result() for f in futures]
    for batch, r in zip(batches, results[:-1], strict=True):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), stallable_opt.predict_proba(batch),
                                   atol=1e-9)
    bad = results[-1]
    assert bad.status_code == 500
    body = bad.json()
    assert body["request_id"] == bad.headers["x-request-id"]
    assert "poisoned" not in bad.text and "ValueError" not in bad.text  # logged, not echoed


def test_degraded_answers_come_from_the_cheap_level_in_time(lenient, stallable_opt, split_rows, stall):
    unsure, sure = split_rows
    rows = pd.concat([sure.iloc[:20], unsure.iloc[:4], sure.iloc[20:30]], ignore_index=True)
    start = time.monotonic()
    r = post(lenient, rows, headers={"X-Deadline-Ms": "2000"})  # the cheap stage's room on a stalled machine
    elapsed = time.monotonic() - start
    assert r.status_code == 200, r.text
    body = r.json()
    runner = StageRunner(stallable_opt, stage_specs(stallable_opt)[0], fallback=True)
    first = runner.run(rows.reset_index(drop=True))
    expected = first["proba"].copy()
    expected[first["unsure"]] = first["fallback"]
    degraded = np.zeros(len(rows), dtype=bool)
    degraded[first["unsure"]] = True
    assert degraded.any() and not degraded.all()
    assert body["degraded"] == degraded.tolist()
    np.testing.assert_allclose(np.array(body["probabilities"]), expected, atol=1e-9)
    assert all(lv == 0 for lv, d in zip(body["level"], body["degraded"], strict=True) if d)
    assert elapsed < STALL_S
    set_delay(0.0)
    wait_for(lambda: post(lenient, rows).json()["degraded"] == [False] * len(rows), timeout=60,
             message="full answers once the stall ends")


def test_a_stage_replica_isolates_a_bad_request_from_its_batch(stallable_opt, request_rows):
    """Inside a replica (and a fused ingress), calls merged into one pass fall back to one
    pass per call when the merged pass fails: only the bad call gets the exception."""
    runner = StageRunner(stallable_opt, stage_specs(stallable_opt)[0])
    poisoned = request_rows.iloc[:4].copy()
    poisoned.loc[poisoned.index[2], "a"] = POISON
    good = [request_rows.iloc[10:20], request_rows.iloc[20:25]]
    outs = runner.run_many([(good[0], None), (poisoned, None), (good[1], None)])
    assert isinstance(outs[1], ValueError)
    for rows, out in zip(good, (outs[0], outs[2]), strict=True):
        expected = stallable_opt.run_levels(rows.reset_index(drop=True), 0, 0)
        np.testing.assert_array_equal(out["level"], expected.level)


@pytest.fixture(scope="module")
def hedged(ray_cluster, stallable_opt, strict):
    """Hedging on, two replicas of the expensive stage, one ingress replica (beside strict and
    lenient, which leave it one of the 4 CPUs)."""
    from dataclasses import replace

    plan = replace(strict.plan, ingress_replicas=1, ingress_cpus=0.1, stages=[
        replace(s, replicas=2 if s.name == "expensive" else s.replicas, num_cpus=0.1) for s in strict.plan.stages])
    app = deploy(stallable_opt, name="hedged", port=ray_cluster, plan=plan, calibrate="never", insitu="never",
                 deadline_ms=60_000, hedging=True)
    yield app
    app.shutdown(stop_ray=False)


def test_a_straggling_stage_call_is_hedged_to_the_other_replica(hedged, stallable_opt, split_rows):
    """deploy(hedging=True): once the expensive stage's latency tail is known, a call stuck on a
    straggling replica (a one-off stall of STALL_S) is sent again, the copy answers first, and
    the answer is the pipeline's; /metrics counts the hedge the copy won."""
    unsure, _ = split_rows
    for i in range(40):  # the stage's latency window (32 calls) before hedging starts
        assert post(hedged, unsure.iloc[i % 8:i % 8 + 1]).status_code == 200
    stall_once(STALL_S)
    try:
        rows = unsure.iloc[:4]
        r = post(hedged, rows)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), stallable_opt.predict_proba(rows),
                                   atol=1e-9)
        wait_for(lambda: metric(hedged, 'willump_stage_hedges_total{app="hedged",stage="expensive",won="true"}')
                 >= 1, timeout=30, message="a hedge won by its copy, counted")
    finally:
        stall_once(0.0)  # a stall not taken is defused
