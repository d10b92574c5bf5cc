"""The ingress's in-place settings through Serve's own path: `willump build` writes them as the
ingress's user_config, `serve deploy` of an edited config changes them on the running replicas
(the same replica actors before and after), and a bad edit is refused by the running replicas,
which keep serving (raising there made Serve stop one of the app's two ingress replicas)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from serving.cli import main
from serving.core.procstat import alive, descendants
from tests.serving.conftest import free_port, wait_for

#: a Ray of its own in a subprocess driver (with the dashboard, which `serve deploy` talks to):
#: outside the two Ray lanes, like the demo
pytestmark = [pytest.mark.app_in_subprocess, pytest.mark.slow]

BIN = Path(sys.executable).parent
#: Ray's CLIs refuse a cluster without token auth when a token file exists (~/.ray/auth_token):
#: this private local cluster runs without one
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
#: the driver holding the cluster: it starts a Ray of its own (address="local": never one of the
#: suite's other Rays) with the dashboard, and waits for SIGTERM
DRIVER = """
import signal, sys, ray
ray.init(address="local", include_dashboard=True, dashboard_port=int(sys.argv[1]), num_cpus=2,
         log_to_driver=False)
print("ready", flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
ray.shutdown()
"""


def _deploy(dashboard: str, config: Path) -> None:
    done = subprocess.run([str(BIN / "serve"), "deploy", "-a", dashboard, str(config)], capture_output=True,
                          text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr


def _status(dashboard: str) -> dict:
    done = subprocess.run([str(BIN / "serve"), "status", "-a", dashboard], capture_output=True, text=True,
                          timeout=120, env=ENV)
    return yaml.safe_load(done.stdout) or {}


def _ingress_replicas(dashboard: str) -> set[str]:
    done = subprocess.run([str(BIN / "ray"), "list", "actors", "--filter", "state=ALIVE", "--format", "json",
                           "--limit", "1000"], capture_output=True, text=True, timeout=120,
                          env={**ENV, "RAY_ADDRESS": dashboard})
    return {a["actor_id"] for a in json.loads(done.stdout) if a["class_name"].endswith("-ingress")}


def _edited(source: Path, target: Path, **settings) -> Path:
    config = yaml.safe_load(source.read_text())
    ingress = next(d for d in config["applications"][-1]["deployments"] if d["name"].endswith("-ingress"))
    ingress["user_config"].update(settings)
    target.write_text(yaml.safe_dump(config))
    return target


def test_serve_deploy_changes_the_settings_in_place_and_a_bad_edit_is_refused(synth_opt, tmp_path, request_rows):
    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    port = free_port()
    first = tmp_path / "serve.yaml"
    assert main(["build", str(artifact), "-o", str(first), "--name", "inp", "--host", "127.0.0.1", "--port",
                 str(port), "--cpus", "2"]) == 0
    deployed = next(d for d in yaml.safe_load(first.read_text())["applications"][-1]["deployments"]
                    if d["name"].endswith("-ingress"))["user_config"]
    url = f"http://127.0.0.1:{port}/inp"
    dash_port = free_port()
    dashboard = f"http://127.0.0.1:{dash_port}"
    log = tmp_path / "driver.log"  # a file, not a pipe nobody drains
    with log.open("w") as out:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(dash_port)], stdout=out,
                                  stderr=subprocess.STDOUT, text=True, env=ENV,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: set[int] = set()
    try:
        def ready() -> bool:
            if driver.poll() is not None:
                raise AssertionError("the driver ended before its cluster was ready:\n" + log.read_text())
            return "ready\n" in log.read_text()

        wait_for(ready, timeout=120, interval=0.5, message="the private cluster to start")
        started = descendants({driver.pid})
        _deploy(dashboard, first)

        def running() -> bool:
            app = _status(dashboard).get("applications", {}).get("inp", {})
            return app.get("status") == "RUNNING"

        wait_for(running, timeout=240, interval=2.0, message="the app to run")

        def plan() -> dict:
            return requests.get(url + "/plan", timeout=30).json()

        assert plan()["live_settings"] == deployed and plan()["live_settings_rejected"] is None
        replicas = _ingress_replicas(dashboard)
        assert len(replicas) >= 1

        # a good edit: applied by the running replicas
        _deploy(dashboard, _edited(first, tmp_path / "good.yaml", deadline_ms=777.0, max_in_flight=5))
        wait_for(lambda: plan()["live_settings"]["deadline_ms"] == 777.0, timeout=120, interval=1.0,
                 message="the new deadline to apply")
        wait_for(running, timeout=120, interval=2.0, message="the update to complete")
        assert plan()["live_settings"] == {**deployed, "deadline_ms": 777.0, "max_in_flight": 5}
        r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:8].to_dict("records")}, timeout=60)
        assert r.status_code == 200, r.text

        # a bad edit: refused by the running replicas, which keep their settings and keep serving
        _deploy(dashboard, _edited(tmp_path / "good.yaml", tmp_path / "bad.yaml", gear=99, deadline_ms=50.0))
        wait_for(lambda: plan()["live_settings_rejected"] is not None, timeout=120, interval=1.0,
                 message="the bad edit to be refused")
        refused = plan()
        assert "gear" in refused["live_settings_rejected"]["error"]
        assert refused["live_settings"]["deadline_ms"] == 777.0
        wait_for(running, timeout=120, interval=2.0, message="Serve to count the update done")
        assert _ingress_replicas(dashboard) == replicas  # the same replica actors throughout
        r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:8].to_dict("records")}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        started |= descendants({driver.pid})
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=120)
        except subprocess.TimeoutExpired:
            driver.kill()
    wait_for(lambda: not alive(started), timeout=120, interval=0.5,
             message=f"the private cluster's processes {sorted(alive(started))} to end")
