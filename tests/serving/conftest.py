"""One Ray per pytest worker, shared by the modules that serve on the standard cluster; small
optimized pipelines to serve.

That Ray gets HAProxy as its front, private HAProxy files and ports, and a private control
directory for the stallable test pipeline (tests/serving/pipelines.py). A module that needs a
cluster of another shape (several raylets, custom resources) calls :func:`release_worker_ray`
first and starts its own; the next module that asks for ``ray_cluster`` starts the shared one
again.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
import requests
from sklearn.linear_model import LogisticRegression

import willump
from tests.conftest import WORKER_RAY, free_port, release_worker_ray, wait_for
from tests.serving.pipelines import CONTROL_ENV, stallable
from tests.serving.pipelines import FIXED_COSTS as STALLABLE_COSTS
from tests.willump.synth import FIXED_COSTS, make_rows, three_groups

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault(CONTROL_ENV, tempfile.mkdtemp(prefix="willump-serving-control-"))


#: seconds a raylet may take to register: Ray's own wait is 30 s, and a suite run with heavy
#: tests beside it once ran past that (a re-added raylet of the tiers module)
NODE_START_S = 120.0


def raylets(head: dict, workers: list[dict]):
    """A head and worker raylets on this machine, each waited for in turn (the driver joins
    the first one registered) for up to NODE_START_S: (cluster, worker nodes)."""
    from ray.cluster_utils import Cluster

    from serving.core.local_ray import ray_system_config

    c = Cluster()
    # every raylet takes the head's system config: workers at deploy's niceness, as in a Ray deploy starts
    c.add_node(wait=False, **{"_system_config": ray_system_config(), **head})
    c.wait_for_nodes(timeout=NODE_START_S)
    return c, [add_raylet(c, **w) for w in workers]


def add_raylet(c, **node_args):
    """One more raylet on ``c``, waited for up to NODE_START_S."""
    node = c.add_node(wait=False, **node_args)
    c.wait_for_nodes(timeout=NODE_START_S)
    return node


def emulated_cluster(head_resources: dict[str, float], worker_resources: list[dict[str, float]]):
    """A Ray cluster of raylets on this machine (a 2-CPU head, 1-CPU workers) carrying the given
    custom resources, joined by this process with Serve started and no HTTP proxy; a generator
    for module fixtures: yields (cluster, worker nodes), shuts everything down afterwards."""
    import ray
    from ray import serve

    release_worker_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c, workers = raylets({"num_cpus": 2, "resources": head_resources, "include_dashboard": False},
                         [{"num_cpus": 1, "resources": r} for r in worker_resources])
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


def predict_load(url: str, batches: list, expected: list, stop, results: list) -> None:
    """One closed-loop client of ``url`` (the app's /predict) until ``stop`` is set: appends
    (time.perf_counter() at the answer, status, answer correct, seconds, detail) per request."""
    import numpy as np
    import requests

    session = requests.Session()
    i = 0
    while not stop.is_set():
        j = i % len(batches)
        i += 1
        start = time.perf_counter()
        try:
            r = session.post(url, json={"rows": batches[j]}, timeout=60)
            ok = r.status_code == 200
            correct = ok and np.allclose(np.array(r.json()["probabilities"]), expected[j], atol=1e-9)
            results.append((time.perf_counter(), r.status_code, correct, time.perf_counter() - start,
                            "" if ok else r.text[:120]))
        except requests.RequestException as exc:
            results.append((time.perf_counter(), -1, False, time.perf_counter() - start, type(exc).__name__))


def answer_rate(results: list, t0: float, t1: float) -> float:
    """Requests answered 200 per second between t0 and t1 (perf_counter times)."""
    return sum(1 for t, status, *_ in results if t0 <= t < t1 and status == 200) / (t1 - t0)


def replica_nodes(app_name: str) -> dict[str, set[str]]:
    """Deployment name -> the node ids its alive replicas run on (Ray's state API, this cluster)."""
    import ray
    from ray.util.state import list_actors

    out: dict[str, set[str]] = {}
    # this cluster's address: another Ray on the machine must not be picked up instead
    address = ray.get_runtime_context().gcs_address
    for actor in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000):
        if actor.class_name.startswith(f"ServeReplica:{app_name}:"):
            out.setdefault(actor.class_name.rsplit(":", 1)[1], set()).add(actor.node_id)
    return out


def request_batches(opt, rows, size: int, total: int = 160) -> tuple[list, list]:
    """Request bodies' rows of ``size`` rows each from the first ``total`` of ``rows``, and the
    probabilities ``opt`` gives them in process (what a served answer must equal)."""
    batches, expected = [], []
    for start in range(0, total, size):
        frame = rows.iloc[start:start + size]
        batches.append(frame.to_dict("records"))
        expected.append(opt.predict_proba(frame))
    return batches, expected


@contextlib.contextmanager
def under_load(url: str, batches: list, expected: list, clients: int):
    """``clients`` threads of :func:`predict_load` on ``url`` for the block's duration; yields
    the list their results go to (stopped and joined on the way out)."""
    results: list = []
    with _threads(lambda stop: predict_load(url, batches, expected, stop, results), clients, join_s=120):
        yield results


@contextlib.contextmanager
def _threads(loop, clients: int, join_s: float = 60.0):
    """``clients`` threads running ``loop(stop)`` for the block's duration; stopped and joined
    on the way out."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(stop,)) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=join_s)


@contextlib.contextmanager
def version_clients(url: str, body: dict, clients: int = 2):
    """``clients`` threads posting ``body`` to ``url`` (an app's /predict) in a loop for the
    block's duration, as during a hand-over: yields lists of the statuses, the model versions
    answering, and the errors (a dropped connection counts, never dies silently)."""
    seen = SimpleNamespace(statuses=[], versions=[], errors=[])

    def client(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                r = requests.post(url, json=body, timeout=60)
                seen.statuses.append(r.status_code)
                if r.status_code == 200:
                    seen.versions.append(r.json()["model_version"])
            except Exception as exc:
                seen.errors.append(repr(exc))

    with _threads(client, clients):
        yield seen


def handed_over(url: str, body: dict, hand_over, old_version: str, timeout: float = 240.0) -> SimpleNamespace:
    """A hand-over under load (:func:`version_clients` on ``url``): ``hand_over()`` once ten
    requests were answered, then until an answer names a version other than ``old_version``
    and ten more requests were sent. Returns what the clients saw, ``result`` the hand-over's
    return; every request answered 200, first by the old version, then by the new, is asserted."""
    with version_clients(url, body) as seen:
        wait_for(lambda: len(seen.statuses) >= 10, timeout=60, message="requests before the hand-over")
        seen.result = hand_over()
        wait_for(lambda: seen.versions and seen.versions[-1] != old_version, timeout=timeout, interval=0.5,
                 message="answers from the new artifact")
        count = len(seen.statuses)
        wait_for(lambda: len(seen.statuses) >= count + 10, timeout=60, message="requests after the hand-over")
    new = seen.versions[-1]
    print(f"hand-over: {len(seen.statuses)} requests, {seen.statuses.count(200)} answered 200, "
          f"{seen.versions.count(old_version)} by the old artifact, {seen.versions.count(new)} by the new")
    assert seen.errors == [] and set(seen.statuses) == {200}, (seen.errors[:3], sorted(set(seen.statuses)))
    assert seen.versions[0] == old_version
    return seen


def two_raylets(worker_labels: dict[str, str] | None = None, head_labels: dict[str, str] | None = None):
    """A head and one worker raylet (2 CPUs each) on this machine, the dashboard on (Ray's state
    API reads it), the worker with ``worker_labels`` and the head with ``head_labels``: for
    module fixtures, yields (cluster, worker); Serve and Ray are shut down with it."""
    import ray
    from ray import serve

    release_worker_ray()  # two raylets of its own
    head = {"num_cpus": 2, "include_dashboard": True, "dashboard_port": free_port()}
    c, (worker,) = raylets({**head, "labels": head_labels} if head_labels else head,
                           [{"num_cpus": 2, "labels": worker_labels or {}}])
    try:
        yield c, worker
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        c.shutdown()


def timed_stage(method: str, key: str, answer, busy_s: float, calls: list, takes_timed: bool = True,
                plain_args: int = 1) -> SimpleNamespace:
    """A stand-in stage handle whose ``method`` answers ``answer(rows)``: as ``{key: ...,
    "busy_s": busy_s}`` when called with more than ``plain_args`` arguments (the timed form), the
    array alone otherwise; one of earlier code (``takes_timed`` False) refuses the timed form with
    Python's own TypeError. Every call's arguments are appended to ``calls``."""

    def remote(*args):
        calls.append(args)

        async def reply():
            if len(args) > plain_args and not takes_timed:
                raise TypeError(f"{method}() takes {plain_args + 1} positional arguments but {len(args) + 1} were given")
            out = answer(args[0])
            return {key: out, "busy_s": busy_s} if len(args) > plain_args else out

        return reply()

    return SimpleNamespace(**{method: SimpleNamespace(remote=remote)})
