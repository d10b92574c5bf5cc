"""One Ray per pytest worker, shared by the modules that serve on the standard cluster; small
optimized pipelines to serve.

That Ray gets HAProxy as its front, private HAProxy files and ports, and a private control
directory for the stallable test pipeline (tests/serving/pipelines.py). A module that needs a
cluster of another shape (several raylets, custom resources) calls :func:`release_worker_ray`
first and starts its own; the next module that asks for ``ray_cluster`` starts the shared one
again.
"""

from __future__ import annotations

import inspect
import os
import tempfile

import pytest
from sklearn.linear_model import LogisticRegression

import willump
from tests.conftest import WORKER_RAY, free_port, release_worker_ray, wait_for  # noqa: F401 - shared helpers
from tests.serving.pipelines import CONTROL_ENV, stallable
from tests.serving.pipelines import FIXED_COSTS as STALLABLE_COSTS
from tests.willump.synth import FIXED_COSTS, make_rows, three_groups

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault(CONTROL_ENV, tempfile.mkdtemp(prefix="willump-serving-control-"))


def emulated_cluster(head_resources: dict[str, float], worker_resources: list[dict[str, float]]):
    """A Ray cluster of raylets on this machine (a 2-CPU head, 1-CPU workers) carrying the given
    custom resources, joined by this process with Serve started and no HTTP proxy; a generator
    for module fixtures: yields (cluster, worker nodes), shuts everything down afterwards."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    release_worker_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": head_resources,
                                                      "include_dashboard": False})
    workers = [c.add_node(num_cpus=1, resources=r) for r in worker_resources]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    try:
        yield c, workers
    finally:
        serve.shutdown()
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """The port of this worker's shared Ray's Serve; the module's apps are deleted after it."""
    yield WORKER_RAY.acquire()
    WORKER_RAY.clear()


def _optimize(pipeline, seed: int, costs: dict[str, float]):
    X, y = make_rows(3000, seed=seed)
    kwargs = dict(max_loss=0.02, verbose=False, importance_repeats=1)
    if "fixed_costs" in inspect.signature(willump.optimize).parameters:  # costs that do not depend on timing
        kwargs["fixed_costs"] = costs
    opt = willump.optimize(pipeline, LogisticRegression(), X, y, **kwargs)
    assert opt.report().plan == "cascade" and len(opt.levels) >= 2
    return opt


@pytest.fixture(scope="session")
def synth_opt():
    return _optimize(three_groups, 21, FIXED_COSTS["three_groups"])


@pytest.fixture(scope="session")
def stallable_opt():
    return _optimize(stallable, 24, STALLABLE_COSTS)


@pytest.fixture(scope="session")
def geared_opt():
    """A cascade with a ladder of cheaper certified gears (serving.runtime.gears)."""
    from tests.willump.synth import quiet

    X, y = make_rows(6000, seed=3)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.005, gears=(0.015, 0.04),
                           **quiet(three_groups))
    assert opt.is_cascade and len(opt.gears_) >= 2
    return opt


@pytest.fixture(scope="session")
def request_rows():
    return make_rows(200, seed=22)[0]
