"""A re-certified artifact (opt.recertify(...).pipeline()) handed to a running app under load.

A module of its own on the worker's shared Ray: Serve starts the new replicas before it stops
the old ones, so the hand-over needs room beside the running app (deploy refuses a plan it
cannot place, naming what does not fit), which the other serving modules' apps would take."""

from __future__ import annotations

import json

import pytest
import requests

from serving import deploy
from tests.conftest import OWN_RAY_LANE
from tests.serving.conftest import handed_over

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray
#: a guest of the own-Ray lane (tests/conftest.py: GUEST_MARK), to balance the lanes
RAY_LANE = OWN_RAY_LANE


def post(app, path, body):
    return requests.post(app.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=60)


def rows_of(frame):
    return frame.to_dict("records")


@pytest.fixture(scope="module")
def recertified(synth_opt):
    """synth_opt re-certified on 3,000 fresh rows."""
    from tests.willump import synth
    from tests.willump.synth import make_rows

    synth.SLEEPING = False
    try:
        X, y = make_rows(3000, seed=77)
        done = synth_opt.recertify(X, y)
    finally:
        synth.SLEEPING = True
    assert done.certified
    return done


def test_a_recertified_artifact_replaces_the_running_one_without_a_failed_request(ray_cluster, synth_opt,
                                                                                    recertified, request_rows):
    """opt.recertify(...).pipeline() deployed under the running app's name while clients send
    requests: Serve rolls the app over to it; every request is answered (200), the answers name
    the old version, then the new one, and /report carries the new certificate. The monitor
    keeps its state through it (serving.runtime.monitor_state): a label for a request served
    before the hand-over is joined after it."""
    new = recertified.pipeline()
    monitor = dict(attributes=["region"], pane_seconds=60.0)
    served = deploy(synth_opt, name="recert", port=ray_cluster, cpus=1, device="cpu", insitu="never",
                    calibrate="never", monitor=monitor)
    body = {"rows": rows_of(request_rows.iloc[:8])}
    before = post(served, "/predict", {**body, "attributes": {"region": "eu"}})
    rid, served_class = before.headers["X-Request-Id"], before.json()["predictions"][0]
    assert requests.get(served.url + "/drift", params={"kind": "accuracy"}, timeout=30).status_code == 200  # flushed
    seen = handed_over(served.url + "/predict", body, lambda: deploy(
        new, name="recert", port=ray_cluster, plan=served.plan, insitu="never", calibrate="never", monitor=monitor),
        served.model_version, timeout=120)
    again = seen.result
    try:
        assert again.model_version != served.model_version and seen.versions[-1] == again.model_version
        report = requests.get(again.url + "/report", timeout=30).json()
        assert report["loss_bound"] == pytest.approx(recertified.gears[0].loss_bound) and report["cert_rows"] == 3000
        joined = post(again, "/labels", {"labels": [{"request_id": rid, "row": 0, "label": served_class}]})
        assert joined.status_code == 200 and joined.json() == {"accepted": 1, "unknown": 0, "duplicate": 0}, \
            joined.text
        assert again.spec.monitor_state == served.spec.monitor_state  # the token was handed on
    finally:
        again.shutdown(stop_ray=False)
    from serving.runtime.monitor_state import default_directory

    assert not default_directory("recert", again.spec.monitor_state).exists()  # shutdown removed it


def test_a_hand_over_where_the_running_app_holds_what_the_cluster_has(ray_cluster, synth_opt, recertified,
                                                                        request_rows):
    """The cluster's other CPUs taken: the same plan does not fit beside the running app, and no
    replacement does either. deploy() counts the running replicas' resources as the new app's
    (they come back once the old replicas stop), hands over without the surge (saying so), and
    every request is answered."""
    import warnings

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from serving.core.nodes import nodes
    from serving.planning.planner import placement_problem

    served = deploy(synth_opt, name="held", port=ray_cluster, cpus=1, device="cpu", insitu="never",
                    calibrate="never")
    free = sum(n.cpus for n in nodes(free=True))
    filler = placement_group([{"CPU": free - 0.01}])
    try:
        ray.get(filler.ready(), timeout=60)
        assert placement_problem(served.plan, nodes(free=True)) is not None  # what deploy refused before
        caught: list = []

        def hand_over():
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                again = deploy(recertified.pipeline(), name="held", port=ray_cluster, plan=served.plan,
                               insitu="never", calibrate="never")
            caught.extend(str(w.message) for w in seen)
            return again

        body = {"rows": rows_of(request_rows.iloc[:8])}
        handed_over(served.url + "/predict", body, hand_over, served.model_version, timeout=120)
        assert any("no room beside the running app 'held'" in m for m in caught), caught
    finally:
        remove_placement_group(filler)
        served.shutdown(stop_ray=False)  # the app's name: whichever artifact it serves by now
