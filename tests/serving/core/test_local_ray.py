"""A Ray started here keeps its control plane on this machine: the listener scan reads /proc
right, the worker hook rebinds every-interface gRPC addresses, the token is private, and an
explicit opt-out of token authentication is loud (serving.core.local_ray, serving.core.procstat)."""

from __future__ import annotations

import os
import socket
import stat
import sys

import pytest

from serving.core import local_ray
from serving.core.procstat import Listener, _hex_address, listening_sockets

linux = pytest.mark.skipif(not os.path.isdir("/proc/net"), reason="reads Linux's /proc")


def test_proc_net_addresses_decode_in_host_byte_order():
    assert _hex_address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _hex_address("00000000:0050") == ("0.0.0.0", 80)
    assert _hex_address("00000000000000000000000001000000:01BB") == ("::1", 443)
    assert _hex_address("0000000000000000FFFF00000100007F:0016") == ("::ffff:7f00:1", 22)  # IPv4-mapped 127.0.0.1


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("192.0.2.2", False), ("::ffff:192.0.2.2", False)])
def test_loopback_means_reachable_from_this_machine_only(address, loopback):
    assert Listener(1, "x", address, 1).loopback is loopback


@linux
def test_the_scan_finds_this_process_listening_where_it_bound():
    with socket.socket() as local, socket.socket() as everywhere, socket.socket(socket.AF_INET6) as v6:
        local.bind(("127.0.0.1", 0))
        everywhere.bind(("0.0.0.0", 0))
        v6.bind(("::", 0))
        for s in (local, everywhere, v6):
            s.listen()
        found = {(x.address, x.port) for x in listening_sockets({os.getpid()})}
        assert ("127.0.0.1", local.getsockname()[1]) in found
        assert ("0.0.0.0", everywhere.getsockname()[1]) in found
        assert ("::", v6.getsockname()[1]) in found
        exposed = {x.port for x in local_ray.exposed_listeners()}
        assert everywhere.getsockname()[1] in exposed and v6.getsockname()[1] in exposed
        assert local.getsockname()[1] not in exposed
        # the app's own HTTP port may be public on purpose: not reported
        note = local_ray.exposure_note("0.0.0.0", everywhere.getsockname()[1])
        assert note is not None and str(v6.getsockname()[1]) in note
        assert str(everywhere.getsockname()[1]) not in note.split("on ", 1)[1].split(":")[0]


def test_the_hook_rebinds_every_interface_to_loopback_in_single_machine_mode(monkeypatch):
    from ray._common import tls_utils

    bound = []
    monkeypatch.setattr(tls_utils, "add_port_to_grpc_server", lambda server, address: bound.append(address) or 1)
    monkeypatch.delitem(sys.modules, "ray.serve._private.replica", raising=False)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    local_ray.loopback_grpc_hook()
    local_ray.loopback_grpc_hook()  # twice: wrapped once
    for address in ("[::]:0", "0.0.0.0:5", "10.0.0.7:6", "127.0.0.1:7"):
        tls_utils.add_port_to_grpc_server(None, address)
    assert bound == ["127.0.0.1:0", "127.0.0.1:5", "10.0.0.7:6", "127.0.0.1:7"]


def test_the_hook_leaves_a_cluster_worker_alone(monkeypatch):
    from ray._common import tls_utils

    original = tls_utils.add_port_to_grpc_server
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    local_ray.loopback_grpc_hook()
    assert tls_utils.add_port_to_grpc_server is original


def test_a_token_is_generated_private_and_a_readable_one_tightened(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    path = tmp_path / "ray" / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert local_ray.ensure_private_token() == path
    token = path.read_text()
    assert len(bytes.fromhex(token)) == local_ray.TOKEN_BYTES  # 256 random bits
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    assert local_ray.ensure_private_token() == path and path.read_text() == token  # kept, tightened
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-environment")
    assert local_ray.ensure_private_token() is None  # nothing on disk to protect


def test_closing_sets_single_machine_mode_and_token_auth(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    import ray._private.ray_constants as constants

    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    local_ray.close_control_plane()
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert constants.ENABLE_RAY_CLUSTER is False  # Ray read the environment at import
    assert (tmp_path / "t").exists()


def test_an_explicit_opt_out_of_token_auth_is_kept_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    import ray._private.ray_constants as constants

    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    with pytest.warns(UserWarning, match="without a token"):
        local_ray.close_control_plane()
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and not (tmp_path / "t").exists()


def test_workers_run_at_deploy_s_niceness_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(local_ray.WORKER_NICENESS_ENV, raising=False)
    assert local_ray.worker_niceness() == local_ray.WORKER_NICENESS == 0
    assert local_ray.ray_system_config() == {"worker_niceness": 0}
    assert local_ray.worker_env() == {"RAY_worker_niceness": "0"}
    monkeypatch.setenv(local_ray.WORKER_NICENESS_ENV, "15")  # Ray's own default, asked for
    assert local_ray.ray_system_config() == {"worker_niceness": 15}
    assert local_ray.worker_env() == {"RAY_worker_niceness": "15"}
    monkeypatch.setenv(local_ray.WORKER_NICENESS_ENV, "low")
    with pytest.raises(ValueError, match="RAY_worker_niceness must be an integer, got 'low'"):
        local_ray.worker_niceness()


def test_a_ray_started_here_gets_the_niceness_in_its_system_config(monkeypatch, tmp_path):
    """start_local_ray gives Ray ray_system_config(), with a caller's own _system_config keys on top."""
    import ray
    import ray._private.ray_constants as constants

    seen: dict = {}
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.delenv(local_ray.WORKER_NICENESS_ENV, raising=False)
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    with pytest.warns(UserWarning, match="without a token"):
        local_ray.start_local_ray(num_cpus=1, _system_config={"metrics_report_interval_ms": 5000})
    assert seen["_system_config"] == {"worker_niceness": 0, "metrics_report_interval_ms": 5000}
    assert seen["address"] == "local" and seen["num_cpus"] == 1


def test_a_submitted_job_s_own_niceness_stands(monkeypatch):
    """Inside a Ray job whose runtime_env names RAY_worker_niceness, joining adds no env var of
    that name (Ray refuses a driver naming a variable its job names); elsewhere it does."""
    import json

    monkeypatch.delenv(local_ray.WORKER_NICENESS_ENV, raising=False)
    job = {"runtime_env": {"env_vars": {"RAY_worker_niceness": "0", "OTHER": "1"}}}
    monkeypatch.setenv(local_ray.JOB_CONFIG_ENV, json.dumps(job))
    assert local_ray.worker_env() == {}
    monkeypatch.setenv(local_ray.JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {"OTHER": "1"}}}))
    assert local_ray.worker_env() == {"RAY_worker_niceness": "0"}
    monkeypatch.setenv(local_ray.JOB_CONFIG_ENV, "not json")
    assert local_ray.worker_env() == {"RAY_worker_niceness": "0"}


@pytest.mark.parametrize("module", ["serving.launch.deploy", "serving.model_app.deploy"])
def test_joining_a_cluster_asks_for_the_niceness_in_the_job_s_runtime_env(monkeypatch, module):
    import importlib

    import ray

    d = importlib.import_module(module)
    seen: dict = {}
    monkeypatch.delenv(local_ray.WORKER_NICENESS_ENV, raising=False)
    monkeypatch.delenv(local_ray.JOB_CONFIG_ENV, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    assert d._ensure_ray("10.0.0.1:6379", None, None) is False
    assert seen["address"] == "10.0.0.1:6379"
    assert seen["runtime_env"]["env_vars"] == {"RAY_worker_niceness": "0"}
