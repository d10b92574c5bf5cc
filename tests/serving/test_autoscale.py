"""Serverless: model stages scale to zero, and the first request afterwards still succeeds
(served with batching off, so the unbatched path is exercised too)."""

from __future__ import annotations

import time

import numpy as np
import requests

from serving import deploy

#: seconds of idleness before a stage gives its last replica back (short, for the test)
IDLE_S = 2.0


def _running(app_name: str) -> dict[str, int]:
    from ray import serve

    deployments = serve.status().applications[app_name].deployments
    return {name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}


def test_scale_to_zero_and_cold_start(ray_cluster, synth_opt, request_rows):
    app = deploy(synth_opt, name="zero", port=ray_cluster, cpus=2, device="cpu", min_replicas=0, batching=False,
                 max_replicas=2, downscale_to_zero_s=IDLE_S)
    try:
        batch = request_rows.iloc[:32]
        r = requests.post(app.url + "/predict", json={"rows": batch.to_dict("records")}, timeout=120)
        assert r.status_code == 200
        deadline = time.time() + 120
        while time.time() < deadline:
            counts = _running("zero")
            if counts["zero-cheap"] == 0 and counts["zero-expensive"] == 0:
                break
            time.sleep(0.5)
        assert counts["zero-cheap"] == 0 and counts["zero-expensive"] == 0, counts
        assert counts["zero-ingress"] == 1  # the ingress stays to receive HTTP
        start = time.perf_counter()
        r = requests.post(app.url + "/predict", json={"rows": batch.to_dict("records")}, timeout=300)
        cold_start = time.perf_counter() - start
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["probabilities"]), synth_opt.predict_proba(batch),
                                   atol=1e-9)
        start = time.perf_counter()
        requests.post(app.url + "/predict", json={"rows": batch.to_dict("records")}, timeout=60)
        warm = time.perf_counter() - start
        print(f"cold start {cold_start:.2f}s (warm request {1000 * warm:.1f} ms)")
        assert cold_start > warm
    finally:
        app.shutdown(stop_ray=False)
