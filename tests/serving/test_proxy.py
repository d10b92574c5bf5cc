"""The HTTP front choice and deploy's argument checks (no Ray needed)."""

from __future__ import annotations

import os

import pytest

from serving import deploy
from serving.proxy import (
    INGRESS_DRAIN_S,
    SIDE_PORTS,
    haproxy_binary,
    proxy_environment,
    release_proxy_files,
    use_proxy,
)


def test_haproxy_environment_is_private_to_one_ray():
    a, b = proxy_environment("haproxy"), proxy_environment("haproxy")
    try:
        assert a["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert float(a["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]) == INGRESS_DRAIN_S
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
        del os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]


def test_serve_proxy_environment_turns_haproxy_off():
    assert proxy_environment("serve") == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}


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
