"""Autoscaling: a stage under three times the load one replica can take scales up and serves
more; idle model stages scale to zero and the first request afterwards still succeeds.

Capacities here are set by sleeps (a per-row lookup), not by computation, so they hold on a
fast, slow or loaded machine."""

from __future__ import annotations

import threading
import time

import numpy as np
import requests

from serving import deploy
from serving.planner import CONCURRENT_BATCHES

from .conftest import wait_for
from .pipelines import set_row_delay

#: seconds of idleness before a stage gives its last replica back (short, for the test)
IDLE_S = 2.0
#: per-row lookup time of the cheap stage in the scale-up test: one replica runs
#: CONCURRENT_BATCHES batches at once, so it serves CONCURRENT_BATCHES / ROW_DELAY_S rows/s
ROW_DELAY_S = 0.025
ROWS_PER_REQUEST = 8
#: closed-loop clients: rows in flight are 3x what one replica holds at once
CLIENTS = 12


def _running(app_name: str) -> dict[str, int]:
    from ray import serve

    deployments = serve.status().applications[app_name].deployments
    return {name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}


def test_three_times_the_load_of_one_replica_scales_the_stage_up(ray_cluster, stallable_opt, request_rows):
    one_replica_rows_s = CONCURRENT_BATCHES / ROW_DELAY_S
    app = deploy(stallable_opt, name="scaleup", port=ray_cluster, cpus=3, device="cpu", min_replicas=1,
                 max_replicas=3, calibrate="never", max_batch_size=ROWS_PER_REQUEST)
    set_row_delay(ROW_DELAY_S)
    done: list[float] = []
    stop = threading.Event()
    body = {"rows": request_rows.iloc[:ROWS_PER_REQUEST].to_dict("records")}

    def client() -> None:
        session = requests.Session()
        while not stop.is_set():
            r = session.post(app.url + "/predict", json=body, timeout=60)
            if r.status_code == 200:
                done.append(time.monotonic())

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    try:
        assert _running("scaleup")["scaleup-cheap"] == 1
        for t in threads:
            t.start()
        scaled = wait_for(lambda: _running("scaleup")["scaleup-cheap"] >= 2 and _running("scaleup"), timeout=90,
                          message="the cheap stage to scale up")
        wait_for(lambda: _running("scaleup")["scaleup-cheap"] == 3, timeout=60, message="a third replica")
        time.sleep(3.0)  # the ingress sees the new replicas within a second
        start = time.monotonic()
        time.sleep(6.0)
        rows_s = ROWS_PER_REQUEST * sum(1 for t in done if t >= start) / (time.monotonic() - start)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        set_row_delay(0.0)
        app.shutdown(stop_ray=False)
    print(f"scale-up: one replica serves {one_replica_rows_s:.0f} rows/s; scaled to {scaled['scaleup-cheap']} "
          f"then 3 replicas; {rows_s:.0f} rows/s with 3")
    assert rows_s >= 1.8 * one_replica_rows_s, (rows_s, one_replica_rows_s)


def test_scale_to_zero_and_cold_start(ray_cluster, synth_opt, request_rows):
    app = deploy(synth_opt, name="zero", port=ray_cluster, cpus=2, device="cpu", min_replicas=0, batching=False,
                 max_replicas=2, downscale_to_zero_s=IDLE_S, calibrate="never")
    try:
        batch = request_rows.iloc[:32]
        r = requests.post(app.url + "/predict", json={"rows": batch.to_dict("records")}, timeout=120)
        assert r.status_code == 200
        counts = wait_for(lambda: (c := _running("zero"))["zero-cheap"] == 0 and c["zero-expensive"] == 0 and c,
                          timeout=120, message="both stages at zero replicas")
        assert counts["zero-ingress"] == app.plan.ingress_replicas >= 1  # the ingress stays to receive HTTP
        start = time.perf_counter()
        r = requests.post(app.url + "/predict", json={"rows": batch.to_dict("records")}, timeout=300)
        cold_start = time.perf_counter() - start
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-9)
        print(f"cold start {cold_start:.2f}s")
    finally:
        app.shutdown(stop_ray=False)
