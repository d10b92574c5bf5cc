"""A running app changed through Serve's own path (`willump build`'s config and `serve deploy`),
on a private cluster:

- the ingress's in-place settings: `serve deploy` of an edited user_config changes them on the
  running replicas (the same replica actors before and after), and a bad edit is refused by the
  running replicas, which keep serving (raising there made Serve stop one of two replicas);
- a re-certified artifact: `willump recertify --config` points the config at it, and
  `serve deploy` hands it to the running app under load without a failed request."""

from __future__ import annotations

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
from tests.serving.conftest import free_port, handed_over, wait_for

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
    """What `serve status` prints, read from the dashboard's REST route it reads (polled every
    second or two while an app starts: a CLI process per poll cost about 1.5 s of CPU)."""
    r = requests.get(f"{dashboard}/api/serve/applications/", timeout=60)
    r.raise_for_status()
    return r.json()


def _ingress_replicas(dashboard: str) -> set[str]:
    """Ray's alive actors of the ingress deployment (`ray list actors`, through its SDK)."""
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000, raise_on_missing_output=True)
    return {a.actor_id for a in actors if a.class_name.endswith("-ingress")}


def _edited(source: Path, target: Path, **settings) -> Path:
    config = yaml.safe_load(source.read_text())
    ingress = next(d for d in config["applications"][-1]["deployments"] if d["name"].endswith("-ingress"))
    ingress["user_config"].update(settings)
    target.write_text(yaml.safe_dump(config))
    return target


@pytest.fixture(scope="module")
def http_port() -> int:
    """The private cluster's HTTP port: Serve keeps the port of the first config it was deployed
    with (a later config's http_options are ignored), so every config here names this one."""
    return free_port()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """A private Ray with its dashboard (what `serve deploy` talks to): its address."""
    dash_port = free_port()
    log = tmp_path_factory.mktemp("driver") / "driver.log"  # a file, not a pipe nobody drains
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
        yield f"http://127.0.0.1:{dash_port}"
    finally:
        started |= descendants({driver.pid})
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=120)
        except subprocess.TimeoutExpired:
            driver.kill()
    wait_for(lambda: not alive(started), timeout=120, interval=0.5,
             message=f"the private cluster's processes {sorted(alive(started))} to end")


def _running(dashboard: str, name: str) -> bool:
    return _status(dashboard).get("applications", {}).get(name, {}).get("status") == "RUNNING"


def _build(artifact: Path, config: Path, name: str, port: int) -> dict:
    assert main(["build", str(artifact), "-o", str(config), "--name", name, "--host", "127.0.0.1", "--port",
                 str(port), "--cpus", "2"]) == 0
    return next(d for d in yaml.safe_load(config.read_text())["applications"][-1]["deployments"]
                if d["name"].endswith("-ingress"))


def test_serve_deploy_changes_the_settings_in_place_and_a_bad_edit_is_refused(dashboard, http_port, synth_opt,
                                                                                   tmp_path, request_rows):
    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    port = http_port
    first = tmp_path / "serve.yaml"
    deployed = _build(artifact, first, "inp", port)["user_config"]
    url = f"http://127.0.0.1:{port}/inp"
    _deploy(dashboard, first)

    def running() -> bool:
        return _running(dashboard, "inp")

    wait_for(running, timeout=240, interval=2.0, message="the app to run")

    def plan() -> dict:
        return requests.get(url + "/plan", timeout=30).json()

    assert plan()["live_settings"] == deployed and plan()["live_settings_rejected"] is None
    replicas = _ingress_replicas(dashboard)
    assert len(replicas) >= 1

    # a good edit: applied by the running replicas (a deadline longer than the default, so the
    # requests after it answer on a loaded machine too: 777 ms once expired in a suite run)
    _deploy(dashboard, _edited(first, tmp_path / "good.yaml", deadline_ms=45_000.0, max_in_flight=5))
    wait_for(lambda: plan()["live_settings"]["deadline_ms"] == 45_000.0, timeout=120, interval=1.0,
             message="the new deadline to apply")
    wait_for(running, timeout=120, interval=2.0, message="the update to complete")
    assert plan()["live_settings"] == {**deployed, "deadline_ms": 45_000.0, "max_in_flight": 5}
    r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:8].to_dict("records")}, timeout=60)
    assert r.status_code == 200, r.text

    # a bad edit: refused by the running replicas, which keep their settings and keep serving
    _deploy(dashboard, _edited(tmp_path / "good.yaml", tmp_path / "bad.yaml", gear=99, deadline_ms=50.0))
    def refusal() -> dict | None:  # one answer read whole: each ingress replica refuses on its own
        answer = plan()
        return answer if answer["live_settings_rejected"] is not None else None

    refused = wait_for(refusal, timeout=120, interval=1.0, message="the bad edit to be refused")
    assert "gear" in refused["live_settings_rejected"]["error"]
    assert refused["live_settings"]["deadline_ms"] == 45_000.0
    wait_for(running, timeout=120, interval=2.0, message="Serve to count the update done")
    assert _ingress_replicas(dashboard) == replicas  # the same replica actors throughout
    r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:8].to_dict("records")}, timeout=60)
    assert r.status_code == 200, r.text


def test_recertify_config_hands_the_new_artifact_to_the_running_app(dashboard, http_port, synth_opt, tmp_path,
                                                                   request_rows):
    """`willump recertify ART --labels FILE -o NEW --config SERVE_CONFIG`, then `serve deploy`:
    Serve rolls the app over to the re-certified artifact while clients send requests; every
    one is answered, first by the old artifact, then by the new, whose certificate /report shows."""
    from tests.willump import synth
    from tests.willump.synth import make_rows

    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    port = http_port
    config = tmp_path / "serve.yaml"
    _build(artifact, config, "rc", port)
    url = f"http://127.0.0.1:{port}/rc"
    _deploy(dashboard, config)  # (this config holds only "rc": Serve removes the other test's app)
    wait_for(lambda: _running(dashboard, "rc"), timeout=240, interval=2.0, message="the app to run")
    old_version = requests.get(url + "/readyz", timeout=60).json()["model_version"]

    X, y = make_rows(3000, seed=77)
    labels = tmp_path / "labels.csv"
    X.assign(label=y).to_csv(labels, index=False)
    new = tmp_path / "recertified.willump"
    synth.SLEEPING = False
    try:
        assert main(["recertify", str(artifact), "--labels", str(labels), "-o", str(new),
                     "--config", str(config)]) == 0
    finally:
        synth.SLEEPING = True
    app = yaml.safe_load(config.read_text())["applications"][-1]
    assert app["args"]["artifact"]["path"] == str(new.resolve())

    body = {"rows": request_rows.iloc[:8].to_dict("records")}
    handed_over(url + "/predict", body, lambda: _deploy(dashboard, config), old_version)
    report = requests.get(url + "/report", timeout=30).json()
    assert report["cert_rows"] == 3000
