"""`make demo` smoke-tested: the demo runs end to end (optimize, deploy with the monitor, both
traffic phases, every monitor query over HTTP, shutdown) in its quick mode, on a free port."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, free_port

#: a subprocess with a Ray of its own, like the README's tour: outside the two Ray lanes (their
#: workers are busy for most of the run), started first on the worker that takes the other tests
pytestmark = [pytest.mark.app_in_subprocess, pytest.mark.slow]


def test_make_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "demo.py"), "--quick", "--no-keep",
                           "--port", str(free_port()), "--cpus", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-6000:]}"
    out = done.stdout
    for step in ("1/5", "2/5", "3/5", "4/5", "5/5", "shutting down Serve and Ray", "demo finished"):
        assert step in out, step
    assert "curl '" in out and "/explain?kind=mix" in out and "live dashboard: http://" in out
    # the live audit's verdict: audited rows on a cascade, "nothing to audit" when the full pipeline serves
    assert "/drift?kind=guarantee" in out and ("rows audited" in out or "nothing to audit" in out), out[-3000:]
    assert out.count(" 0 errors,") == 2, out[-3000:]  # both phases: every request answered
