"""One Ray instance per test module; small optimized pipelines to serve."""

from __future__ import annotations

import os
import socket

import pytest
from sklearn.linear_model import LogisticRegression

import willump
from tests.willump.synth import make_rows, three_groups

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """Ray with logical resources for placement (4 CPUs, 1 GPU), Serve on a free port behind
    HAProxy, the front deploy() starts Ray with."""
    import ray
    from ray import serve

    from serving.proxy import release_proxy_files, use_proxy

    use_proxy("haproxy")
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()
    release_proxy_files()


@pytest.fixture(scope="session")
def synth_opt():
    X, y = make_rows(3000, seed=21)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, verbose=False,
                           profile_repeats=1, profile_single_rows=3, importance_repeats=1)
    assert opt.report().plan == "cascade" and len(opt.levels) >= 2
    return opt


@pytest.fixture(scope="session")
def request_rows():
    return make_rows(200, seed=22)[0]
