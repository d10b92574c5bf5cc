"""The willump command and the processes it leaves: plan an artifact, serve it until SIGTERM,
write a Serve config that `serve run` answers from, and leave no process behind (a clean stop,
SIGTERM, or the driver killed with SIGKILL)."""

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

from serving.core.procstat import alive, descendants, listening_sockets
from tests.serving.conftest import free_port, wait_for
from tests.serving.launch.ray_probes import open_without_token, outside_address

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

WILLUMP = [sys.executable, "-m", "serving.cli"]
SERVE = str(Path(sys.executable).with_name("serve"))
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, synth_opt):
    path = tmp_path_factory.mktemp("cli") / "synth.willump"
    synth_opt.save(path)
    return path


def test_plan_prints_a_plan(artifact):
    result = subprocess.run([*WILLUMP, "plan", str(artifact), "--cpus", "4", "--rps", "50"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    assert "feasible" in result.stdout and "ingress" in result.stdout
    # auto: planned fused and whole, the choice and both bounds in a note
    assert "note: layout: " in result.stdout and " the other way" in result.stdout, result.stdout
    result = subprocess.run([*WILLUMP, "plan", str(artifact), "--cpus", "2", "--json", "--layout", "staged"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["plan"]["stages"]] == ["cheap", "expensive"]
    assert data["profiles"][1]["scale"] < 1
    assert data["plan"]["ingress_profile"]["parse_ms"] > 0  # the ingress's own cost, measured


def test_plan_rejects_a_bad_artifact(tmp_path):
    result = subprocess.run([*WILLUMP, "plan", str(tmp_path), "--cpus", "2"],
                            capture_output=True, text=True, timeout=120, env=ENV)
    assert result.returncode == 1  # an error the message names (2 is a usage error)
    assert "not a willump artifact" in result.stderr


def _serving(proc: subprocess.Popen, lines: list[str], marker: str) -> None:
    for line in proc.stdout:  # the command says when it serves
        lines.append(line)
        if marker in line:
            return
    raise AssertionError("".join(lines))


def _span_objects(text: str) -> list[dict]:
    """The spans of a file Serve's default exporter wrote (JSON objects one after another)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        out.append(obj)
        at = end
    return out


def _tree(pid: int) -> set[int]:
    """The process and everything it started (Ray's GCS and raylet, workers, HAProxy)."""
    return descendants({pid})


def _all_gone(pids: set[int], timeout: float = 90.0) -> None:
    wait_for(lambda: not alive(pids), timeout=timeout, interval=0.5, message=f"processes {sorted(alive(pids))} to end")


def _predict(url: str, rows) -> requests.Response:
    return requests.post(url + "/predict", json={"rows": rows.iloc[:8].to_dict("records")}, timeout=60)


@pytest.mark.slow
def test_serve_runs_until_sigterm_and_leaves_nothing_behind(artifact, request_rows):
    port = free_port()
    lines: list[str] = []
    proc = subprocess.Popen(
        [*WILLUMP, "serve", str(artifact), "--name", "cli", "--port", str(port), "--cpus", "2",
         "--calibrate", "never", "--insitu", "never", "--transport", "ray", "--tracing", "--tracing-sample", "1.0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    started: set[int] = set()
    try:
        _serving(proc, lines, "willump: serving")
        assert proc.poll() is None, "".join(lines)
        url = f"http://127.0.0.1:{port}/cli"
        assert requests.get(url + "/healthz", timeout=30).status_code == 200
        assert _predict(url, request_rows).status_code == 200
        # --tracing: Serve's OpenTelemetry spans, every request (--tracing-sample 1.0), in the folder it names
        spans = Path(next(line for line in lines if "willump: tracing 100% of requests to" in line).split(" to ")[-1]
                     .strip())
        wait_for(lambda: any("replica_handle_request cli-ingress" in f.read_text() for f in spans.glob("*.json")),
                 timeout=60, message="the request's span")
        # the ingress's own spans inside the request's trace: the parse and each stage (serving.runtime.spans)
        def own_spans() -> set[str]:
            traced = [s for f in spans.glob("*.json") for s in _span_objects(f.read_text())]
            requests_ = {s["context"]["trace_id"] for s in traced if s["name"].startswith("replica_handle_request")}
            return {s["name"].split()[0] for s in traced if s["context"]["trace_id"] in requests_ and s.get("parent_id")}

        wait_for(lambda: {"willump.parse", "willump.stage", "willump.call"} <= own_spans(), timeout=60,
                 message="the ingress's spans inside the request's trace")
        started = _tree(proc.pid) - {proc.pid}
        assert any("haproxy" in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
                   for p in alive(started)), "no HAProxy among the app's processes"
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
    _all_gone(started)


#: Ray's per-node agents notice their raylet died within seconds, then spend up to 60 s trying
#: to report it to the (dead) GCS before they exit: they are checked last in this module
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
KILLED: dict[str, set[int]] = {}


def _title(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture(scope="module")
def loopback_app(artifact):
    """``willump serve`` with its defaults (HTTP on loopback, HAProxy, gRPC between stages):
    scanned, then killed with SIGKILL by the tests below (killed here if they do not run)."""
    port = free_port()
    lines: list[str] = []
    proc = subprocess.Popen(
        [*WILLUMP, "serve", str(artifact), "--name", "killed", "--port", str(port), "--cpus", "2",
         "--calibrate", "never", "--insitu", "never"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        _serving(proc, lines, "willump: serving")
        yield proc, port, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


@pytest.mark.slow
def test_a_single_machine_app_listens_on_loopback_only_and_ray_wants_its_token(loopback_app, request_rows):
    """Ray's control plane runs code (its job API) and unpickles (its gRPC servers): a served
    single-machine app must bind none of its processes' listeners beyond loopback, and none of
    Ray's or HAProxy's may do anything for a caller without Ray's token (probed through
    loopback only; no traffic goes to another address)."""
    proc, port, lines = loopback_app
    if outside_address() is None:
        pytest.skip("this machine has no address beyond loopback: nothing to scan for")
    assert _predict(f"http://127.0.0.1:{port}/killed", request_rows).status_code == 200
    listeners = listening_sockets(_tree(proc.pid))
    assert len(listeners) > 10, listeners  # the GCS, raylet, agents, workers, replicas, HAProxy
    outside = [x for x in listeners if not x.loopback]
    assert not outside, "listening beyond loopback:\n" + "\n".join(map(str, outside))
    opened = {f"{x.port} {x.title[:60]}": why for x in listeners
              if (why := open_without_token(x.port, {port})) is not None}
    assert not opened, opened
    assert not any("listen beyond loopback" in line for line in lines), "".join(lines)


@pytest.mark.slow
def test_the_app_s_replicas_run_at_deploy_s_niceness(loopback_app, request_rows):
    """A Ray that ``willump serve`` starts runs its workers, so every Serve replica, at
    serving.core.local_ray.worker_niceness() (0) above the driver's own niceness, not Ray's 15,
    below which a replica waited for the CPU behind Ray's own processes."""
    from serving.core.local_ray import worker_niceness

    proc, port, lines = loopback_app
    assert _predict(f"http://127.0.0.1:{port}/killed", request_rows).status_code == 200
    replicas = {p: _title(p) for p in _tree(proc.pid) if "ServeReplica:killed:" in _title(p)}
    assert replicas, "".join(lines)
    niceness = {f"{title.split()[0]} {p}": os.getpriority(os.PRIO_PROCESS, p) for p, title in replicas.items()}
    # Ray adds the setting to the niceness its raylet inherited from the driver (at most 19)
    expected = min(os.getpriority(os.PRIO_PROCESS, proc.pid) + worker_niceness(), 19)
    assert set(niceness.values()) == {expected}, niceness


@pytest.mark.slow
def test_a_killed_driver_leaves_no_process_behind(loopback_app, request_rows):
    """SIGKILL gives the driver no chance to stop anything: Ray's processes and HAProxy must
    end with it (kernel fate-sharing for Ray's, the HAProxy launcher's PR_SET_PDEATHSIG)."""
    proc, port, lines = loopback_app
    try:
        assert _predict(f"http://127.0.0.1:{port}/killed", request_rows).status_code == 200
        started = _tree(proc.pid) - {proc.pid}
        assert any("haproxy" in _title(p) for p in alive(started)), "".join(lines)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    agents = {p for p in started if _title(p).startswith(RAY_AGENTS)}
    KILLED["agents"] = agents
    _all_gone(started - agents, timeout=45)  # raylet, GCS, workers, HAProxy


@pytest.mark.slow
def test_build_writes_a_serve_config_that_serve_run_answers_from(artifact, tmp_path, synth_opt, request_rows):
    port = free_port()
    config = tmp_path / "serve_config.yaml"
    result = subprocess.run(
        [*WILLUMP, "build", str(artifact), "-o", str(config), "--name", "built", "--host", "127.0.0.1",
         "--port", str(port), "--cpus", "2", "--api-key-env", "BUILD_KEY"],
        capture_output=True, text=True, timeout=300, env={**ENV, "BUILD_KEY": "k3y"})
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(config.read_text())
    app = data["applications"][-1]
    assert app["import_path"] == "serving.launch.graph:app_builder" and app["route_prefix"] == "/built"
    assert app["args"]["artifact"]["path"] == str(artifact.resolve())
    # the key never enters the config: its variable's name does, and each replica reads the key
    # where it runs (the KubeRay example injects it from a Secret)
    assert "k3y" not in config.read_text() and app["args"]["api_key_env"] == "BUILD_KEY"
    lines: list[str] = []
    # --address local: a Ray of its own, never one another test (another xdist worker) started
    # SIGINT at its default in the child: a pytest-xdist worker may ignore SIGINT, and a Python
    # started with SIGINT ignored never raises KeyboardInterrupt, so `serve run` never stopped
    proc = subprocess.Popen([SERVE, "run", "--address", "local", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**ENV, "BUILD_KEY": "k3y"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: set[int] = set()
    try:
        url = f"http://127.0.0.1:{port}/built"

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError("serve run exited:\n" + proc.stdout.read())
            try:
                return requests.get(url + "/healthz", timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_for(healthy, timeout=240, interval=1.0, message="serve run to answer")
        r = requests.post(url + "/predict", json={"rows": request_rows.iloc[:16].to_dict("records")},
                          headers={"Authorization": "Bearer k3y"}, timeout=60)
        assert r.status_code == 200, r.text
        import numpy as np

        np.testing.assert_allclose(np.array(r.json()["probabilities"]),
                                   synth_opt.predict_proba(request_rows.iloc[:16]), atol=1e-9)
        started = _tree(proc.pid) - {proc.pid}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            # Ray's `serve run` drains and stops every replica on SIGINT: on a loaded 2-core
            # machine that took over 120 s twice in make test (under 60 s alone)
            out, _ = proc.communicate(timeout=300)
            lines.append(out)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            tail = (exc.output or b"")[-3000:]
            raise AssertionError(f"serve run did not stop 300 s after SIGINT; its last output:\n"
                                 f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}") from None
    _all_gone(started)


@pytest.mark.slow
def test_the_killed_drivers_ray_agents_ended_too():
    if "agents" not in KILLED:
        pytest.skip("the killed-driver test did not run")
    _all_gone(KILLED["agents"], timeout=120)
