"""Serving test modules that start Ray, a server, a subprocess or a browser carry the
``starts_ray`` mark (`make test` runs them in two lanes, each on one worker, module after module:
those on the worker's shared Ray, and those that start Rays of their own), or, for a whole app
with a Ray of its own in a subprocess, ``app_in_subprocess``; the others carry none and are
spread over the workers. A change that makes a module start something must mark it."""

from __future__ import annotations

import re

from tests.conftest import (
    OWN_RAY_LANE,
    REPO_ROOT,
    SERIAL_MARK,
    SHARED_RAY_LANE,
    lane,
    serial,
)

#: the other way to be marked: a whole app in a subprocess of its own, with a Ray of its own
#: (tests/conftest.py runs those outside the lanes, first, on the third worker)
APP_MARK = "pytest.mark.app_in_subprocess"
#: what a module that starts Ray, a server, a subprocess or a browser uses
STARTS = re.compile(r"ray_cluster|emulated_cluster|ray\.init|\bdeploy\(|deploy_hetero|serve\.(run|start)|"
                    r"subprocess|Popen|chromium|uvicorn|HTTPServer")


def test_modules_that_start_something_are_marked_and_only_they():
    folder = REPO_ROOT / "tests" / "serving"
    modules = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("test_*.py") if p.name != "test_ray_free.py"}
    unmarked = {name: STARTS.findall(text) for name, text in modules.items()
                if SERIAL_MARK not in text and APP_MARK not in text}
    assert not {k: v for k, v in unmarked.items() if v}, unmarked
    marked_idle = [name for name, text in modules.items() if SERIAL_MARK in text and not STARTS.search(text)]
    assert not marked_idle, marked_idle


def test_serial_group():
    assert serial("tests/serving/launch/test_api.py::test_static_routes")
    assert not serial("tests/serving/planning/test_planner.py::test_x")
    assert not serial("tests/willump/test_optimize.py::test_x") and not serial("tests/test_readme.py::test_the_tour_runs")


def test_lanes():
    assert lane("tests/serving/launch/test_api.py::test_static_routes") == SHARED_RAY_LANE
    assert lane("tests/serving/launch/test_cli.py::test_plan_prints_a_plan") == OWN_RAY_LANE
    assert lane("tests/serving/launch/test_multinode.py::test_x") == OWN_RAY_LANE
    assert lane("tests/serving/runtime/test_faults.py::test_x") == OWN_RAY_LANE  # a guest (GUEST_MARK)
    assert lane("tests/serving/planning/test_planner.py::test_x") is None
