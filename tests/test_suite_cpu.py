"""benchmarks.suite_cpu: what a process is, and a short command's CPU found where it went."""

from __future__ import annotations

import sys

import pytest

from benchmarks.suite_cpu import kind, main, report, sample


@pytest.mark.parametrize("cmdline, expected", [
    ("ray::ServeReplica:toxic:toxic-ingress", "Serve replica: toxic"),
    ("ray::SERVE_REPLICA::flights#flights-ingress#abc", "Serve replica: flights"),
    ("ray::ServeController.listen_for_change", "Serve: controller"),
    ("ray::ProxyActor.ready", "Serve: proxy"),
    ("ray::IDLE", "Ray: idle worker"),
    ("ray::_Profiler.profile", "Ray actor/task: _Profiler"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=x", "Ray: GCS"),
    ("/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py "
     "--raylet-name=/tmp/ray/raylet", "Ray: worker starting"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/s/raylet "
     "--python_worker_command=/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/workers/"
     "default_worker.py --node-ip-address=127.0.0.1", "Ray: raylet"),
    ("/venv/bin/python -c import sys;exec(eval(sys.stdin.readline()))", "pytest"),
    ("/venv/bin/python -m pytest -n 3", "pytest"),
    ("/venv/bin/pytest tests", "pytest"),
    ("/venv/bin/python -m serving.cli serve /tmp/pytest-of-root/pytest-3/test_serve0/app.willump", "other: python"),
    ("/usr/sbin/haproxy -f cfg", "HAProxy"),
    ("/usr/bin/bash -c true", "other: bash"),
])
def test_kind(cmdline, expected):
    assert kind(cmdline) == expected


def test_a_short_commands_cpu_is_found_under_its_kind():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    result = sample([sys.executable, "-c", burn], interval_s=0.05)
    assert result["returncode"] == 0
    mine = sum(s for k, s in result["cpu_s"].items() if k.startswith("other: python"))
    assert mine > 0.1, result["cpu_s"]  # the burn was read at least once before it ended
    assert "CPU s" in report(result)


def test_a_bad_interval_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--interval", "0", "--", "true"])
    assert "--interval must be > 0" in capsys.readouterr().err
