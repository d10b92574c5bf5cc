"""Shared fixtures: the real-data location and its skip-or-fail rule."""

from __future__ import annotations

import functools
import os
import random
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
#: seconds a Ray this suite starts may take to bind its GCS (Ray's default, 30, ran out once on the
#: 2-core machine while lanes' apps, the browser tests and another Ray started at once; a raylet's
#: own 30 s, fixed in Ray, once too): a start-up deadline, not a measurement, so a loaded machine
#: gets a generous one
os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
#: pytest-xdist lanes of the tests that start Ray, servers, subprocess apps or a browser (the
#: modules marked ``pytestmark = pytest.mark.starts_ray``). Each lane runs on one worker, module
#: after module: the modules that serve on the worker's shared Ray in one, those that start Rays
#: of their own (clusters of another shape, subprocess apps) in the other, so a worker's shared
#: Ray is never stopped and started again mid-run. `make test` runs ``-n 3 --dist loadgroup``:
#: the lanes mostly wait on Ray (deploys, rolling updates, subprocesses), so the third worker
#: takes the CPU-bound tests beside them, and each lane's worker joins it when its lane is done.
#: tests/serving/test_ray_free.py checks the marks.
SHARED_RAY_LANE = "ray-shared"
OWN_RAY_LANE = "ray-own"
#: what marks a module as one of a lane (read from its source: xdist's scheduler sees node ids, not marks)
SERIAL_MARK = "pytest.mark.starts_ray"
#: a module serving on the shared Ray that runs in the own-Ray lane instead, after that lane's own
#: modules (one shared Ray started there, at the end): it balances the two lanes, whose lengths
#: are the run's (the shared lane was the longer by 150 s of test time in the runs of 2026-12-05)
GUEST_MARK = "RAY_LANE = OWN_RAY_LANE"


@functools.cache
def _marked(path: str) -> bool:
    file = REPO_ROOT / path
    return file.is_file() and SERIAL_MARK in file.read_text()


@functools.cache
def _own_cluster(path: str) -> bool:
    """Whether a module that starts Ray does without the worker's shared one (a cluster of
    another shape, or subprocesses that start their own)."""
    file = REPO_ROOT / path
    return file.is_file() and _marked(path) and "ray_cluster" not in file.read_text()


def serial(nodeid: str) -> bool:
    """Whether a test belongs to a module that starts Ray, servers, subprocess apps or a browser."""
    return _marked(nodeid.split("::", 1)[0])


def lane(nodeid: str) -> str | None:
    """The lane a test runs in (None: any worker may take it on its own)."""
    return _module_lane(nodeid.split("::", 1)[0])


@functools.cache
def _module_lane(module: str) -> str | None:
    if not _marked(module):
        return None
    return OWN_RAY_LANE if _own_cluster(module) or _guest(module) else SHARED_RAY_LANE


@functools.cache
def _guest(path: str) -> bool:
    """Whether a module on the shared Ray runs in the own-Ray lane (``GUEST_MARK``)."""
    file = REPO_ROOT / path
    return file.is_file() and GUEST_MARK in file.read_text()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """The lanes' modules first, largest first, then the apps in subprocesses, then the tests
    marked slow, then the rest: the long work starts early, so short tests fill the workers at
    the end instead of one long test holding the run's tail."""
    if config.getoption("dist", None) != "loadgroup":
        return
    sizes: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        sizes[module] = sizes.get(module, 0) + 1
    order = {m: i for i, m in enumerate(sizes)}

    def key(item) -> tuple:
        module = item.nodeid.split("::", 1)[0]
        if serial(item.nodeid):  # a lane's guests after its own modules: one shared Ray started, at the end
            return (0, _guest(module), -sizes[module], order[module])
        if item.get_closest_marker("app_in_subprocess"):
            return (1, 0, order[module])
        return (2 if item.get_closest_marker("slow") else 3, 0, order[module])

    items.sort(key=key)  # stable: tests keep their order inside a module


#: niceness a worker takes on when it starts a test outside the lanes: the lanes mostly wait on
#: Ray (deploys, rolling updates, subprocess apps), and their replicas' CPU is the run's critical
#: path, while the other tests are CPU-bound and have slack; on two cores, equal priority stretched
#: the lanes by about 1.4x. The apps in subprocesses (``app_in_subprocess``: the demo, the README
#: tour, which send traffic by the clock) keep normal priority and run first. One-way (a worker
#: never raises its priority again): a lane's worker takes other tests only once its lane is done.
OTHER_TESTS_NICENESS = 10
_niced = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A worker whose lane is done (it starts a test outside the lanes: a worker gets its lane
    first, whole) stops its shared Ray, and lowers its priority once."""
    global _niced
    if not os.environ.get("PYTEST_XDIST_WORKER") or item.config.getoption("dist", None) != "loadgroup":
        return
    if lane(item.nodeid) is None:
        WORKER_RAY.release()
        if not _niced and not item.get_closest_marker("app_in_subprocess"):
            os.nice(OTHER_TESTS_NICENESS)
            _niced = True


@pytest.hookimpl(optionalhook=True)  # known only where xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` as `make test` runs it: each lane is one scope that one worker runs,
    module after module, while the other tests are spread one by one. (xdist's own loadgroup
    suffixes node ids with the group of an ``xdist_group`` mark, which pytest 9.2's node ids no
    longer take: its groups silently split.)"""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid) or nodeid

    return Lanes(config, log)


#: where each test's CPU is logged when set (JSON lines: node id, this process's CPU seconds and
#: its waited-for children's, wall seconds): what the in-process share of the suite's CPU is made of,
#: beside `python -m benchmarks.suite_cpu`'s per-process view
TEST_CPU_LOG = os.environ.get("WILLUMP_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not TEST_CPU_LOG:
        yield
        return
    import json

    before, start = os.times(), time.monotonic()
    yield
    after = os.times()
    line = {"test": item.nodeid, "cpu_s": round(after.user + after.system - before.user - before.system, 3),
            "children_cpu_s": round(after.children_user + after.children_system
                                    - before.children_user - before.children_system, 3),
            "wall_s": round(time.monotonic() - start, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with open(TEST_CPU_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


# --- one Ray per pytest worker, shared by the serving modules that use the standard cluster -----
class _WorkerRay:
    """This worker's shared Ray: 4 logical CPUs and 1 logical GPU for placement, Serve on a
    free port behind HAProxy (the front deploy() starts Ray with)."""

    port: int | None = None

    def acquire(self) -> int:
        import ray
        from ray import serve

        from serving.core.local_ray import ray_system_config
        from serving.launch.proxy import use_proxy

        if self.port is None or not ray.is_initialized():
            use_proxy("haproxy")
            # a Ray of its own even when another on this machine was started with `ray start`
            ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
                     _system_config=ray_system_config())  # deploy's worker niceness, as a Ray deploy starts
            self.port = free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        return self.port

    def clear(self) -> None:
        """Delete every app a module left (the next module starts from an empty Serve)."""
        import ray
        from ray import serve

        from serving.core.serve_apps import delete_app

        if self.port is not None and ray.is_initialized():
            for name in list(serve.status().applications):
                delete_app(name)

    def release(self) -> None:
        import ray
        from ray import serve

        from serving.launch.proxy import release_proxy_files

        if self.port is not None:
            if ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
            release_proxy_files()
            self.port = None


WORKER_RAY = _WorkerRay()


def release_worker_ray() -> None:
    """Stop this worker's shared Ray (before a module starts a cluster of another shape)."""
    WORKER_RAY.release()


@pytest.fixture(scope="session", autouse=True)
def _worker_ray_stops_at_the_end():
    yield
    WORKER_RAY.release()


@pytest.fixture(scope="module", autouse=True)
def _own_ray_modules_stop_the_shared_one(request):
    """A module that does not serve on the shared Ray (it starts a cluster of another shape, or a
    subprocess that starts its own Ray) runs with the shared one stopped: their HAProxy ports and
    environment would collide, and two Rays on two cores starve each other."""
    if _own_cluster(request.node.nodeid.split("::", 1)[0]):
        WORKER_RAY.release()
    yield


def datasets_dir() -> Path:
    """Where the real data sets live: $WILLUMP_DATASETS, else ../shared/datasets beside the repo."""
    return Path(os.environ.get("WILLUMP_DATASETS", REPO_ROOT.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The data folder; skips the test when absent, but fails it under CI=true."""
    path = datasets_dir()
    if not (path / "PROVENANCE.md").is_file():
        reason = f"real data sets not found at {path} (set WILLUMP_DATASETS to their folder)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason + "; CI=true requires them", pytrace=False)
        pytest.skip(reason)
    return path


# --- helpers every test folder shares (defined once) ----------------------------------------------
#: where tests take their apps' ports: below Linux's ephemeral range (32768+, where the kernel
#: hands out port 0 and Ray's processes in the other lanes take theirs: a port found free there
#: was once taken by one of them before Serve bound it), above Ray Serve's direct-ingress HTTP
#: ports (30000-31000, one per ingress replica) and HAProxy's side ports
#: (serving.launch.proxy.SIDE_PORTS)
TEST_PORTS = (31000, 32768)
_PORTS = random.Random()  # not seeded: the xdist workers must not walk the same ports
_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now, in ``TEST_PORTS``, never given twice
    by this process."""
    from serving.launch.proxy import free_ports

    (port,) = free_ports(1, _PORTS, TEST_PORTS, "127.0.0.1", taken=_GIVEN)
    _GIVEN.add(port)
    return port


def wait_for(check, timeout: float = 60.0, interval: float = 0.25, message: str = "condition"):
    """Poll ``check()`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message} (last: {value!r})")
        time.sleep(interval)
