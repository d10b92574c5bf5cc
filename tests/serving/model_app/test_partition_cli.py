"""``willump plan`` / ``willump serve`` on a torch model saved with serving.partition.save_model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
import torch
from torch import nn

import serving.partition as sp
from serving.model_app import cli as model_cli

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)], nn.Linear(32, 3)).eval()
    path = tmp_path_factory.mktemp("m") / "mlp.pt"
    sp.save_model(m, torch.randn(2, 32), path)
    return path, m


def test_plan_prints_a_plan_and_json(model_file, capsys):
    path, _ = model_file
    assert model_cli.main(["plan", str(path), "--devices", "3", "--hop-ms", "1", "--hop-mb-per-s", "100",
                           "--batch-sizes", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "plan for" in out and "7 blocks" in out
    assert model_cli.main(["plan", str(path), "--devices", "2", "--memory-per-device", "16KiB", "--hop-ms", "1",
                           "--batch-sizes", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    stages = d["plan"]["stages"]
    assert len(stages) >= 2 and all(s["memory_bytes"] <= 16 * 1024 for s in stages)
    assert d["plan"]["transport"]["fixed_ms"] == 1.0


def test_saved_profile_is_planned_without_profiling_again(model_file, tmp_path, capsys):
    path, _ = model_file
    prof_path = tmp_path / "p.json"
    assert model_cli.main(["plan", str(path), "--batch-sizes", "2", "--save-profile", str(prof_path)]) == 0
    out = capsys.readouterr().out
    assert "no hop cost measured" in out
    prof = sp.load_profile(prof_path)
    prof.compute_ms = [[100.0 if k == 3 else 1.0] for k in range(len(prof))]  # as if taken elsewhere
    sp.save_profile(prof, prof_path)
    assert model_cli.main(["plan", str(path), "--profile", str(prof_path), "--devices", "4",
                           "--memory-per-device", "16KiB", "--hop-ms", "0.1", "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["plan"]["stages"]
    heavy = next(s for s in stages if s["start"] <= 3 < s["end"])
    assert heavy["replicas"] >= 2  # the slow block's stage gets the spare devices


def test_errors_are_reported_not_raised(model_file, tmp_path, capsys):
    path, _ = model_file
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    assert model_cli.main(["plan", str(junk)]) == 1
    assert "save_model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        model_cli.main(["plan", str(path), "--memory-per-device", "lots"])
    assert model_cli.main(["plan", str(path), "--devices", "1", "--memory-per-device", "1KiB",
                           "--batch-sizes", "4", "--hop-ms", "1"]) == 3  # nothing fits: infeasible
    from serving.cli import is_model_command

    assert not is_model_command(["plan", str(tmp_path)])  # a folder is a pipeline artifact
    assert is_model_command(["serve", str(path)])


def test_willump_command_dispatches_model_files(model_file, capsys):
    from serving import cli

    path, _ = model_file
    assert cli.main(["plan", str(path), "--hop-ms", "2", "--batch-sizes", "1"]) == 0
    assert "plan for" in capsys.readouterr().out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_willump_serve_answers_like_the_module(model_file):
    path, module = model_file
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "serve", str(path), "--name", "mlpcli", "--port", str(port),
         "--devices", "2", "--memory-per-device", "16KiB", "--hop-ms", "1", "--batch-sizes", "4",
         "--cpus-per-replica", "0.25"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/mlpcli"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("willump serve exited early:\n" + proc.stdout.read()[-3000:])
            try:
                if requests.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:  # not up yet
                pass
            time.sleep(1.0)
        else:
            pytest.fail("willump serve did not come up within 180 s")
        plan = requests.get(url + "/plan", timeout=10).json()
        assert len(plan["stages"]) >= 2
        x = torch.randn(5, 32)
        r = requests.post(url + "/predict", json={"inputs": x.tolist()}, timeout=60)
        assert r.status_code == 200, r.text
        with torch.inference_mode():
            assert torch.allclose(torch.tensor(r.json()["outputs"]), module(x), atol=1e-5)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
