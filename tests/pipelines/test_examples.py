"""The examples run as a newcomer would run them."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORKLOAD_EXAMPLES = ["toxic.py", "toxic3.py", "spam.py", "flights.py", "credit.py", "adult.py"]


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})},
                          cwd=EXAMPLES.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("script", WORKLOAD_EXAMPLES)
def test_example_compiles(script, tmp_path):
    py_compile.compile(str(EXAMPLES / script), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_flights_example_runs_without_shared_data(tmp_path):
    out = _run("flights.py", "--rows", "5000", env={"WILLUMP_DATASETS": str(tmp_path)})
    assert "willump report: pipeline 'flight_delays'" in out
    assert "held-out rows: 1250" in out and "speedup" in out and "precision@100" in out
