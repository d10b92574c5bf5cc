"""The HTTP front choice and deploy's argument checks (no Ray needed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from serving import deploy
from serving.launch.proxy import (
    INGRESS_DRAIN_S,
    METRICS_INTERVAL_ENV,
    METRICS_REPORT_INTERVAL_MS,
    SIDE_PORTS,
    haproxy_binary,
    metrics_interval_s,
    proxy_environment,
    release_proxy_files,
    use_proxy,
)

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray


def test_haproxy_environment_is_private_to_one_ray():
    a, b = proxy_environment("haproxy"), proxy_environment("haproxy")
    try:
        assert a["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert float(a["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]) == INGRESS_DRAIN_S
        # Serve's HTTP request metrics come from the replicas, not a syslog line per request
        assert a["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "0"
        # a request whose ingress replica died without answering is replayed on another
        # (tests/serving/runtime/test_faults.py kills one under load)
        assert {"conn-failure", "empty-response", "junk-response"} <= set(a["RAY_SERVE_HAPROXY_RETRY_ON"].split())
        ports = [int(v) for k, v in a.items() if k.endswith("_PORT")]
        assert len(ports) == 4 and len(set(ports)) == 4
        assert all(SIDE_PORTS[0] <= p < SIDE_PORTS[1] for p in ports)
        assert a["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] != b["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]
        # HAProxy refuses socket paths over 97 characters; Ray puts a 56-character node directory
        # between the base and the file name.
        for key in ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"):
            assert len(a[key]) + 57 <= 97, a[key]
    finally:
        for env in (a, b):
            os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]
            release_proxy_files()
            assert not os.path.exists(env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"])
            assert "RAY_SERVE_HAPROXY_SERVER_STATE_BASE" not in os.environ  # nothing points at them


def test_serve_proxy_environment_turns_haproxy_off():
    env = proxy_environment("serve", "ray")
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and "RAY_SERVE_THROUGHPUT_OPTIMIZED" not in env
    grpc = proxy_environment("serve", "grpc")
    # Serve's documented throughput mode, keeping Serve's proxy actor as the front
    assert grpc["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" and grpc["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"


def _launcher_for(tmp_path, real: str) -> str:
    from serving.launch.proxy import _launcher

    return _launcher(str(tmp_path), real)


def test_haproxy_launcher_binds_admin_ports_to_loopback(tmp_path):
    """Ray's template binds HAProxy's stats page and exporter on all interfaces; the launcher
    hands HAProxy a copy of the config with both on loopback, the rest unchanged."""
    real = tmp_path / "fake-haproxy"
    real.write_text('#!/bin/sh\ncat "$2"\n')  # prints the config it was given
    real.chmod(0o755)
    config = tmp_path / "haproxy.cfg"
    config.write_text("frontend prometheus\n    bind :9101\n    mode http\n"
                      "frontend http_frontend\n    bind 0.0.0.0:8000\n"
                      "listen stats\n  bind *:8404\n  stats enable\n")
    out = subprocess.run([_launcher_for(tmp_path, str(real)), "-f", str(config), "-db"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "bind 127.0.0.1:9101" in out.stdout and "bind 127.0.0.1:8404" in out.stdout
    assert "bind 0.0.0.0:8000" in out.stdout  # the serving port is Serve's choice (http_options)


def test_haproxy_launcher_dies_with_its_parent(tmp_path):
    """HAProxy is Serve's child; when that parent dies abruptly HAProxy must not live on."""
    launcher = _launcher_for(tmp_path, shutil.which("sleep"))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
                               f"p = subprocess.Popen([{launcher!r}, '600'])\n"
                               "print(p.pid, flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the launched process outlived its parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    from serving.core.procstat import alive

    return bool(alive({pid}))


@pytest.fixture
def saved_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_default_front_falls_back_without_an_haproxy_binary(saved_environ, tmp_path):
    assert haproxy_binary() is not None  # ray[serve] ships it on Linux
    os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(tmp_path / "missing-haproxy")
    assert haproxy_binary() is None
    with pytest.warns(UserWarning, match="no HAProxy binary"):
        assert use_proxy(None) == "serve"
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    with pytest.raises(ValueError, match="needs an HAProxy binary"):
        use_proxy("haproxy")


def test_unknown_proxy_is_refused():
    with pytest.raises(ValueError, match="proxy must be one of"):
        proxy_environment("nginx")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"proxy": "nginx"}, ValueError, "proxy must be one of"),
    ({"transport": "http"}, ValueError, "transport must be one of"),
    ({"monitor": 5}, TypeError, "monitor must be a dict"),
    ({"layout": "tiled"}, ValueError, "layout must be"),
    ({"device": "tpu"}, ValueError, "device must be"),
])
def test_deploy_names_the_bad_argument(synth_opt, kwargs, error, match):
    with pytest.raises(error, match=match):
        deploy(synth_opt, name="bad", **kwargs)


def test_the_metrics_export_interval_is_ours_unless_the_environment_sets_it(monkeypatch):
    monkeypatch.delenv(METRICS_INTERVAL_ENV, raising=False)
    assert proxy_environment("serve", "ray")[METRICS_INTERVAL_ENV] == str(METRICS_REPORT_INTERVAL_MS)
    monkeypatch.setenv(METRICS_INTERVAL_ENV, "1000")  # a user who wants fresher totals keeps them
    assert proxy_environment("serve", "ray")[METRICS_INTERVAL_ENV] == "1000"
    assert metrics_interval_s() == 1.0
    monkeypatch.delenv(METRICS_INTERVAL_ENV)
    assert metrics_interval_s() == METRICS_REPORT_INTERVAL_MS / 1000
