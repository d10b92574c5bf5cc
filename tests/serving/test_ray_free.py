"""The serving modules that `make test` spreads over both xdist workers (tests.conftest.RAY_FREE)
start no Ray, server, subprocess or browser: a change that makes one start something must move
it back into the serial group, or two Rays would run side by side on the CI's two cores."""

from __future__ import annotations

import re

from tests.conftest import RAY_FREE, REPO_ROOT, serial

#: what a module that starts Ray, a server, a subprocess or a browser uses
STARTS = re.compile(r"ray_cluster|emulated_cluster|ray\.init|\bdeploy\(|deploy_hetero|serve\.(run|start)|"
                    r"subprocess|Popen|chromium|uvicorn|HTTPServer")


def test_ray_free_modules_start_nothing():
    folder = REPO_ROOT / "tests" / "serving"
    assert RAY_FREE <= {p.name for p in folder.glob("test_*.py")}, "RAY_FREE names a module that is gone"
    starting = {name: STARTS.findall((folder / name).read_text()) for name in RAY_FREE - {"test_ray_free.py"}}
    assert not {k: v for k, v in starting.items() if v}, starting


def test_serial_group():
    assert serial("tests/serving/test_api.py::test_static_routes")
    assert not serial("tests/serving/test_planner.py::test_x")
    assert not serial("tests/willump/test_optimize.py::test_x") and not serial("tests/test_readme.py::test_the_tour_runs")
