"""Shared fixtures: the real-data location and its skip-or-fail rule."""

from __future__ import annotations

import functools
import os
import socket
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
#: what marks a module that starts Ray, servers, subprocess apps or a browser (read from its
#: source: xdist's scheduler sees node ids, not marks). Such a module runs whole on one worker
#: (its module-scoped Ray is started once), and the two workers each run one such module at a
#: time, so at most two Rays run side by side; every other test is spread one by one.
#: tests/serving/test_ray_free.py checks the marks.
SERIAL_MARK = "pytest.mark.starts_ray"


@functools.cache
def _marked(path: str) -> bool:
    file = REPO_ROOT / path
    return file.is_file() and SERIAL_MARK in file.read_text()


def serial(nodeid: str) -> bool:
    """Whether a test belongs to a module that starts Ray, servers, subprocess apps or a browser."""
    return _marked(nodeid.split("::", 1)[0])


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Modules that start Ray first, those with the most tests first, then tests marked slow:
    the long ones start early, so the short tests fill both workers at the end instead of one
    long test holding the run's tail."""
    if config.getvalue("dist") != "loadgroup":
        return
    sizes: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        sizes[module] = sizes.get(module, 0) + 1
    order = {m: i for i, m in enumerate(sizes)}

    def key(item) -> tuple:
        module = item.nodeid.split("::", 1)[0]
        if serial(item.nodeid):
            return (0, -sizes[module], order[module])
        return (1 if item.get_closest_marker("slow") else 2, 0, order[module])

    items.sort(key=key)  # stable: tests keep their order inside a module


@pytest.hookimpl(optionalhook=True)  # known only where xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` as `make test` runs it: a module that starts Ray is one scope (run
    whole, on one worker), every other test a scope of its own; xdist hands a worker its next
    scope when it runs out, so both workers stay busy. (xdist's own loadgroup suffixes node ids
    with the group of an ``xdist_group`` mark, which pytest 9.2's node ids no longer take.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesThatStartRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0] if serial(nodeid) else nodeid

    return ModulesThatStartRay(config, log)


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
def free_port() -> int:
    """A TCP port on loopback nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
