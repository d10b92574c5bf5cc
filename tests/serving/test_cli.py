"""The willump command: plan an artifact, serve it in the foreground, stop it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from .conftest import free_port

WILLUMP = [sys.executable, "-m", "serving.cli"]


def _ray_processes() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "raylet|gcs_server|ray::|ray/dashboard|ray_client_server|haproxy"],
                         capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, synth_opt):
    path = tmp_path_factory.mktemp("cli") / "synth.willump"
    synth_opt.save(path)
    return path


def test_plan_prints_a_plan(artifact):
    result = subprocess.run([*WILLUMP, "plan", str(artifact), "--cpus", "4", "--rps", "50"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cheap" in result.stdout and "expensive" in result.stdout and "feasible" in result.stdout
    result = subprocess.run([*WILLUMP, "plan", str(artifact), "--cpus", "2", "--json"],
                            capture_output=True, text=True, timeout=300)
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["plan"]["stages"]] == ["cheap", "expensive"]
    assert data["profiles"][1]["scale"] < 1


def test_plan_rejects_a_bad_artifact(tmp_path):
    result = subprocess.run([*WILLUMP, "plan", str(tmp_path), "--cpus", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "not a willump artifact" in result.stderr


@pytest.mark.slow
def test_serve_runs_until_sigterm_and_leaves_nothing_behind(artifact, request_rows):
    before = _ray_processes()
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    lines: list[str] = []
    proc = subprocess.Popen(
        [*WILLUMP, "serve", str(artifact), "--name", "cli", "--port", str(port), "--cpus", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}/cli"
        for line in proc.stdout:  # the command says when it serves
            lines.append(line)
            if "willump: serving" in line:
                break
        assert proc.poll() is None, "".join(lines)
        assert requests.get(url + "/healthz", timeout=30).status_code == 200
        r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:8].to_dict("records")},
                          timeout=60)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=120)
            output = "".join(lines) + output
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, output
    assert "shutting down" in output and "stopped" in output
    assert "via haproxy" in output, output
    time.sleep(2)
    leftover = _ray_processes() - before
    assert not leftover, f"stray Ray processes after shutdown: {leftover}"
