"""The willump command's surface, without Ray: --version, a --help that loads nothing heavy,
and exit codes that tell a usage error (2) from an error the message names (1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serving.cli import EXIT_ERROR, EXIT_USAGE, main, version
from serving.launch.proxy import AUTOSCALING_PUSH_S

#: starts subprocesses (a fresh interpreter, to see what --help imports): the serial scope
pytestmark = pytest.mark.starts_ray

#: what `willump --help` must not import (each takes seconds: torch, scikit-learn, Ray)
HEAVY = ("torch", "sklearn", "ray", "willump", "pandas", "scipy")


def test_version_is_the_installed_distributions():
    result = subprocess.run([sys.executable, "-m", "serving.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"willump {version()}"
    assert version()[0].isdigit()  # the package is installed (make venv installs it editable)


def test_help_loads_none_of_the_heavy_libraries():
    probe = ("import sys, serving.cli as c; c.build_parser().format_help(); "
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_named_error_exits_1_and_a_usage_error_2(tmp_path, capsys):
    assert main(["plan", str(tmp_path), "--cpus", "2"]) == EXIT_ERROR == 1
    assert "not a willump artifact" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["plan"])
    assert stop.value.code == EXIT_USAGE == 2
    with pytest.raises(SystemExit) as stop:
        main(["keygen", "--env", "1x"])
    assert stop.value.code == EXIT_USAGE
    # `willump serve` says what it can before Ray starts: a container run without its artifact
    # mounted, or without its key (the Dockerfile's command), fails at once, naming it
    import serving.launch.deploy

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the arguments were checked")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving.launch.deploy, "_ensure_ray", no_ray)
        assert main(["serve", str(tmp_path / "missing"), "--host", "0.0.0.0", "--api-key-env",
                     "NO_SUCH_KEY_VAR", "--require-key"]) == EXIT_ERROR
        assert "no such file or directory" in capsys.readouterr().err
        artifact = tmp_path / "a.willump"
        artifact.mkdir()
        assert main(["serve", str(artifact), "--host", "0.0.0.0", "--api-key-env", "NO_SUCH_KEY_VAR",
                     "--require-key"]) == EXIT_ERROR
        assert "NO_SUCH_KEY_VAR" in capsys.readouterr().err


def test_build_writes_scale_to_zero_onnx_and_a_runtime_env(synth_opt, tmp_path, capsys, monkeypatch):
    """`willump build` can say what `deploy` can: scale to zero (with the cheap stage in its own
    deployment), ONNX Runtime and the replicas' runtime_env; it says on stderr what it is doing."""
    import yaml

    monkeypatch.delenv("RAY_worker_niceness", raising=False)

    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    env_file = tmp_path / "env.yaml"
    env_file.write_text("env_vars: {OMP_NUM_THREADS: '1'}\n")
    out = tmp_path / "serve.yaml"
    assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2",
                 "--min-replicas", "0", "--max-replicas", "3", "--runtime", "onnx",
                 "--runtime-env", str(env_file)]) == 0
    err = capsys.readouterr().err
    assert "profiling the stages and the ingress on this machine" in err and "done in" in err
    app = yaml.safe_load(out.read_text())["applications"][-1]
    # the user's env_vars beside the niceness every config gives its replicas (serving.core.local_ray)
    assert app["runtime_env"] == {"env_vars": {"RAY_worker_niceness": "0", "OMP_NUM_THREADS": "1"}}
    spec = app["args"]
    assert spec["min_replicas"] == 0 and spec["max_replicas"] == 3 and spec["runtime"] == "onnx"
    assert spec["plan"]["layout"] == "staged"
    (tmp_path / "list.yaml").write_text("- not a mapping\n")
    with pytest.raises(SystemExit) as stop:
        main(["build", str(artifact), "-o", str(out), "--runtime-env", str(tmp_path / "list.yaml")])
    assert stop.value.code == EXIT_USAGE and "must hold a mapping" in capsys.readouterr().err
    assert main(["build", str(artifact), "-o", str(out), "--min-replicas", "-1"]) == EXIT_ERROR
    # the planner as Serve's autoscaler: its policy in each model stage's autoscaling_config
    assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2",
                 "--min-replicas", "0", "--max-replicas", "3", "--autoscaler", "planner"]) == 0
    app = yaml.safe_load(out.read_text())["applications"][-1]
    scaled = [d for d in app["deployments"] if "autoscaling_config" in d]
    assert scaled and all(d["autoscaling_config"]["policy"]["policy_function"] == "serving.planning.autoscale:"
                          "PlannerAutoscaler" and d["autoscaling_config"]["policy"]["policy_kwargs"]["headroom"] > 0
                          for d in scaled)
    # the load pushed every AUTOSCALING_PUSH_S (Ray reads only this field; its default is 10 s)
    assert all(d["autoscaling_config"]["metrics_interval_s"] == AUTOSCALING_PUSH_S for d in scaled)
    assert app["args"]["autoscaler"] == "planner"
    capsys.readouterr()
    assert main(["build", str(artifact), "-o", str(out), "--autoscaler", "planner"]) == EXIT_ERROR
    assert "min_replicas" in capsys.readouterr().err


def test_tracing_and_log_options_reach_the_serve_config(synth_opt, tmp_path, capsys):
    """--tracing (with a sample and an exporter) and --log-format go into the Serve config
    `willump build` writes (Serve's tracing_config and logging_config); the sample needs --tracing."""
    import yaml

    from serving.core.serve_apps import tracing_config

    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    out = tmp_path / "serve.yaml"
    assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2", "--tracing",
                 "--tracing-sample", "0.25", "--tracing-exporter", "my_otlp:processors", "--log-format", "json"]) == 0
    config = yaml.safe_load(out.read_text())
    assert config["tracing_config"] == {"enabled": True, "exporter_import_path": "my_otlp:processors",
                                        "sampling_ratio": 0.25}
    assert config["logging_config"]["encoding"] == "JSON" and config["applications"][-1]["args"]["log_format"] == "json"
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(config)  # what `serve deploy` checks
    # the plan's deployments in Serve's own section, one per deployment the app builds
    from serving.launch.graph import build_app

    deployments = {d["name"]: d for d in config["applications"][-1]["deployments"]}
    built = build_app(config["applications"][-1]["args"])
    names = {built._bound_deployment.name} | {
        a._bound_deployment.name for a in built._bound_deployment.init_args if hasattr(a, "_bound_deployment")}
    assert set(deployments) == names, (set(deployments), names)
    # a redeploy under the same name starts each replacement before it stops an old replica where
    # the plan leaves room for one on the nodes it was made for (serving.launch.handover)
    from serving.launch.handover import planned_surge
    from serving.planning.planner import Plan

    args = config["applications"][-1]["args"]
    surge = planned_surge(args["name"], Plan.from_dict(args["plan"]))
    assert args["surge_percent"] == surge
    assert all(d["max_surge_percent"] == surge for d in deployments.values()), deployments
    assert built._bound_deployment._deployment_config.max_surge_percent == surge
    assert config["applications"][0]["args"]["monitor_state"] is None  # no monitor here
    ingress = next(d for n, d in deployments.items() if n.endswith("-ingress"))
    assert ingress["num_replicas"] >= 1 and ingress["ray_actor_options"]["num_cpus"] > 0
    # the settings an operator changes in place (Serve calls the ingress's reconfigure), at the
    # values deployed, each one the ingress accepts
    from serving.runtime.live_settings import LIVE_SETTINGS, check_live_settings

    live = ingress["user_config"]
    assert set(live) == set(LIVE_SETTINGS) and live["gear"] == "auto" and live["deadline_ms"] > 0
    assert check_live_settings(live, gears=1, audited=bool(live["audit_rate"])) == live
    assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2", "--layout", "staged"]) == 0
    stages = [d for d in yaml.safe_load(out.read_text())["applications"][-1]["deployments"]
              if not d["name"].endswith("-ingress")]
    assert stages and all(d["request_router_config"]["request_router_class"] == "serving.runtime.routing:CapacityRouter"
                          and d["request_router_config"]["request_router_kwargs"] == {"lost_after_s": 2.0}
                          for d in stages), stages
    assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2", "--router", "serve",
                 "--lost-after-s", "off", "--layout", "staged"]) == 0
    config = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(config)
    assert config["applications"][-1]["args"]["lost_after_s"] is None
    assert not any("request_router_config" in d for d in config["applications"][-1]["deployments"])
    with pytest.raises(SystemExit):
        main(["build", str(artifact), "-o", str(out), "--lost-after-s", "0"])
    capsys.readouterr()
    assert main(["build", str(artifact), "-o", str(out), "--tracing-sample", "0.5"]) == EXIT_ERROR
    assert "need --tracing" in capsys.readouterr().err
    assert tracing_config(True) == {"enabled": True, "exporter_import_path": "", "sampling_ratio": 0.01}
    assert tracing_config(False) is None
    for bad, field in ((0.5, "tracing must be"), ({"sampling_ratio": 2}, "sampling_ratio"),
                       ({"exporter_import_path": "nocolon"}, "exporter_import_path"), ({"rate": 1}, "unknown key")):
        with pytest.raises(ValueError, match=field):
            tracing_config(bad)


def test_a_built_monitor_gets_a_state_token_that_an_edited_config_keeps(synth_opt, tmp_path):
    """`willump build` with a monitor draws the token of its default state folder into both
    applications' args (serve deploy of an edited config keeps it: the monitor's state carries
    over); each build draws its own."""
    import yaml

    from serving.runtime.monitor_state import TOKEN

    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    tokens = []
    for i in range(2):
        out = tmp_path / f"serve{i}.yaml"
        assert main(["build", str(artifact), "-o", str(out), "--host", "127.0.0.1", "--cpus", "2",
                     "--monitor-attributes", "region"]) == 0
        monitor_app, app = yaml.safe_load(out.read_text())["applications"]
        assert monitor_app["name"].endswith("-monitor") and monitor_app["args"]["monitor_state"] == \
            app["args"]["monitor_state"]
        tokens.append(app["args"]["monitor_state"])
    assert all(TOKEN.match(t) for t in tokens) and tokens[0] != tokens[1]


def test_pools_are_read_as_json_or_from_a_file(tmp_path, capsys):
    from serving.cli import build_parser

    pools = {"fast": {"labels": {"pool": "fast"}}, "slow": {"resources": ["slow_pool"]}}
    args = build_parser().parse_args(["serve", "artifact", "--pools", json.dumps(pools)])
    assert args.pools == pools
    path = tmp_path / "pools.json"
    path.write_text(json.dumps(pools))
    assert build_parser().parse_args(["serve", "artifact", "--pools", str(path)]).pools == pools
    for bad in ("{not json", str(tmp_path / "missing.json"), "[1, 2]"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "artifact", "--pools", bad])
        assert "--pools" in capsys.readouterr().err
