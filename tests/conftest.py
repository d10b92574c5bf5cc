"""Shared fixtures: the real-data location and its skip-or-fail rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
#: pytest-xdist group of the tests that start Ray, servers, subprocess apps or a browser: they
#: run one module after another on one worker (`make test` runs ``-n 2 --dist loadgroup``),
#: while the optimizer's, the monitor's and the workloads' tests run on the other
SERIAL_GROUP = "ray-and-servers"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        relative = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT / "tests")
        if relative.parts[0] == "serving" or relative.name == "test_readme.py":
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


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
