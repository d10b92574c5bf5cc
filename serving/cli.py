"""The ``willump`` command: ``willump serve ARTIFACT``, ``willump plan ARTIFACT``,
``willump build ARTIFACT -o serve_config.yaml`` (a Ray Serve config for production tools),
``willump recertify ARTIFACT --labels FILE`` (serving.cli_recertify) and ``willump keygen``.

Exit codes: 0 done, 1 an error the message names (a bad artifact or argument value, a plan
that cannot be placed), 2 a usage error (argparse), 3 (``plan``) no plan meets the rate, SLO or
memory asked, 4 (``recertify``) the plan does not hold on the new rows. Nothing heavy (torch, scikit-learn, Ray)
is imported until a command needs it, so ``--help`` and ``--version`` answer at once."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from serving.cli_recertify import add_parser as add_recertify_parser
from serving.cli_recertify import cmd_recertify
from serving.core.constants import (
    API_KEY_ENV,
    CALIBRATE,
    CASCADE_LAYOUTS,
    EXIT_ERROR,
    EXIT_NO_PLAN,
    EXIT_USAGE,
    INSITU,
    LOOPBACK_HOSTS,
    LOST_AFTER_S,
    REPLICAS_FOR,
)
from serving.launch.proxy import DEFAULT_PROXY, PROXIES, TRANSPORTS, release_proxy_files
from serving.runtime.keys import generate_key

__all__ = ["EXIT_ERROR", "EXIT_NO_PLAN", "EXIT_USAGE", "build_parser", "main", "version"]


def version() -> str:
    """The installed distribution's version (``willump --version``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("willump-serve")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def is_model_command(argv: list[str] | None) -> bool:
    """``willump plan|serve FILE``, where FILE is a file (an artifact is a folder): a saved torch
    model, served partitioned (:mod:`serving.model_app.cli`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return len(args) >= 2 and args[0] in ("plan", "serve") and Path(args[1]).is_file()


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rps", type=float, help="target request rate (requests/s)")
    parser.add_argument("--p99-ms", type=float, help="target p99 latency in milliseconds")
    parser.add_argument("--rows-per-request", type=int, default=32, help="rows per request (default 32)")
    parser.add_argument("--layout", choices=CASCADE_LAYOUTS, default="auto",
                        help="fused: the cheap stage runs in the ingress replicas; staged: it gets its "
                             "own deployment; whole: every level runs in the ingress replicas (no hop); "
                             "auto (default): fused or whole, whichever plans faster, staged with "
                             "--min-replicas")


@contextlib.contextmanager
def _progress(what: str):
    """Say on stderr (stdout stays the result, --json included) that a long step started, and
    how long it took."""
    start = time.monotonic()
    print(f"willump: {what} ...", file=sys.stderr, flush=True)
    yield
    print(f"willump: {what}: done in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def _mapping_file(path: str) -> dict[str, Any]:
    """A YAML or JSON file holding a mapping (argparse type: a clear usage error otherwise)."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:  # JSON is YAML: one parser reads both
        raise argparse.ArgumentTypeError(f"{path} is not YAML or JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{path} must hold a mapping, got {type(data).__name__}")
    return data


def _variable(text: str) -> str:
    if not text.isidentifier() or not text.isascii():
        raise argparse.ArgumentTypeError(f"not an environment variable name: {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="willump", description="Serve and plan optimized pipelines.",
        epilog="A saved torch model (a file, not an artifact folder) is planned and served partitioned: "
               "`willump plan MODEL.pt --help`. Exit codes: 0 done, 1 an error the message names, 2 usage, 3 (plan) no plan meets what was asked, 4 (recertify) the plan does not hold on the new rows.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    keygen = sub.add_parser("keygen", help="print a new API key (256 random bits) for --api-key-env")
    keygen.add_argument("--env", metavar="VAR", type=_variable, help=f"print it as `export VAR=KEY` (e.g. {API_KEY_ENV})")

    add_recertify_parser(sub)

    serve = sub.add_parser("serve", help="deploy an artifact on Ray Serve (foreground)")
    serve.add_argument("artifact", help="directory written by OptimizedPipeline.save")
    serve.add_argument("--name", default="willump", help="app name; HTTP at /NAME")
    serve.add_argument("--host", help="address HTTP listens on (default: loopback on one node, all "
                                       "interfaces when the cluster has several)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--address", help="join this Ray cluster instead of starting one")
    serve.add_argument("--cpus", type=float, help="CPUs for the embedded Ray (default: all)")
    serve.add_argument("--gpus", type=float, help="GPUs for the embedded Ray (default: detected)")
    serve.add_argument("--min-replicas", type=int, help="autoscale model stages down to this (0 allowed)")
    serve.add_argument("--max-replicas", type=int, help="autoscaling ceiling per stage")
    serve.add_argument("--autoscaler", choices=("serve", "planner"), default="serve",
                       help="with --min-replicas: Serve's default policy (requests held per replica) or the "
                            "planner's (rows answered over a replica's planned capacity); default %(default)s")
    serve.add_argument("--no-batching", action="store_true", help="disable @serve.batch at the stages")
    serve.add_argument("--max-batch-size", type=int, help="rows per stage batch (overrides the plan)")
    serve.add_argument("--batch-wait-ms", type=float, help="longest a stage batch waits (overrides the plan)")
    serve.add_argument("--proxy", choices=PROXIES,
                       help=f"HTTP front of the embedded Ray (default {DEFAULT_PROXY} when installed, "
                            "else serve; see serving.launch.proxy)")
    serve.add_argument("--transport", choices=TRANSPORTS, default="grpc",
                       help="how the ingress calls the stages (default %(default)s)")
    serve.add_argument("--runtime", choices=("native", "onnx"), default="native")
    serve.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    serve.add_argument("--monitor-attributes", type=_csv, help="comma-separated attribute columns")
    serve.add_argument("--monitor-features", type=_csv, default=[], help="input columns to test for drift")
    serve.add_argument("--monitor-dir", help="directory for the monitor's persistent state")
    serve.add_argument("--monitor-pane-seconds", type=float, help="monitor pane length (seconds)")
    serve.add_argument("--calibrate", choices=CALIBRATE, default="auto",
                       help="measure HTTP and hop costs for the plan (default: once per cluster, cached)")
    serve.add_argument("--insitu", choices=INSITU, default="auto",
                       help="probe the running app for a few seconds and plan again from the CPU it measures "
                            "(default: where this machine can read every process of the app)")
    serve.add_argument("--pools", type=_pools, default=None, metavar="JSON",
                       help="node pools for the model stages' replicas, as JSON or a JSON file: e.g. "
                            "'{\"fast\": {\"labels\": {\"pool\": \"fast\"}}, \"slow\": {\"resources\": "
                            "[\"slow_pool\"], \"preemptible\": true}}' (each stage is timed on each pool and placed by the "
                            "LP; a preemptible pool's loss is planned for)")
    _add_gear_arguments(serve)
    _add_request_arguments(serve)
    _add_plan_arguments(serve)

    plan = sub.add_parser("plan", help="print the stage plan for an artifact")
    plan.add_argument("artifact")
    plan.add_argument("--cpus", type=float, required=True)
    plan.add_argument("--gpus", type=float, default=0.0)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_plan_arguments(plan)

    build = sub.add_parser("build", help="write a Ray Serve config file (serve deploy / serve run / KubeRay)")
    build.add_argument("artifact", help="artifact directory; every node must read it at this path")
    build.add_argument("-o", "--output", required=True, help="where to write the YAML config")
    build.add_argument("--name", default="willump", help="app name; HTTP at /NAME")
    build.add_argument("--host", default="0.0.0.0", help="address Serve's HTTP listens on (default %(default)s)")
    build.add_argument("--port", type=int, default=8000)
    build.add_argument("--cpus", type=float, help="logical CPUs to plan for (default: this machine's cores)")
    build.add_argument("--monitor-attributes", type=_csv, help="comma-separated attribute columns")
    build.add_argument("--monitor-features", type=_csv, default=[], help="input columns to test for drift")
    build.add_argument("--monitor-dir", help="directory for the monitor's persistent state")
    build.add_argument("--monitor-pane-seconds", type=float, help="monitor pane length (seconds)")
    build.add_argument("--min-replicas", type=int, help="autoscale model stages down to this (0: scale to zero; "
                                                       "the cheap stage then gets its own deployment)")
    build.add_argument("--max-replicas", type=int, help="autoscaling ceiling per stage")
    build.add_argument("--autoscaler", choices=("serve", "planner"), default="serve",
                       help="with --min-replicas: Serve's default policy or the planner's (as for serve)")
    build.add_argument("--runtime", choices=("native", "onnx"), default="native",
                       help="run the stages' models natively or with ONNX Runtime (default %(default)s)")
    build.add_argument("--runtime-env", metavar="FILE", type=_mapping_file,
                       help="a YAML or JSON mapping: the Ray runtime_env the app's replicas run in "
                            "(pip packages, env_vars, working_dir)")
    _add_gear_arguments(build)
    _add_request_arguments(build)
    _add_plan_arguments(build)
    return parser


def _add_gear_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gears", type=_gears, default="off",
                        help="'off' (the plan), 'adaptive' (a cheaper certified gear while the queue puts the SLO, "
                             "--p99-ms, at risk; see serving.runtime.gears), or a gear index to pin")
    parser.add_argument("--gear-slo-ms", type=float, help="the SLO the adaptive gears hold (default: --p99-ms)")
    parser.add_argument("--gear-replicas-for", choices=REPLICAS_FOR, default="deployed",
                        help="with --autoscaler planner: size the later stages for the deployed gear's load while a "
                             "cheaper gear answers a burst (default), for the served gear's (fewer replicas, "
                             "the burst served in the cheaper gear), or for the cheapest gear's (replicas only "
                             "where no certified gear holds the load)")


def _gear_policy(args: argparse.Namespace) -> dict[str, Any] | None:
    policy: dict[str, Any] = {} if args.gear_slo_ms is None else {"slo_ms": args.gear_slo_ms}
    if args.gear_replicas_for != "deployed":
        policy["replicas_for"] = args.gear_replicas_for
    return policy or None


def _pools(value: str) -> dict[str, Any]:
    """``--pools``: a JSON object, or the path of a file holding one (checked by deploy)."""
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"--pools: neither a JSON object nor a readable file: {exc}") from None
    try:
        pools = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--pools: not valid JSON: {exc}") from None
    if not isinstance(pools, dict):
        raise argparse.ArgumentTypeError(f"--pools must be a JSON object of pools, got {type(pools).__name__}")
    return pools


def _lost_after(value: str) -> float | None:
    if value.strip().lower() in ("off", "none"):
        return None
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--lost-after-s must be > 0 seconds or 'off', got {value!r}")
    return seconds


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deadline-ms", type=float, help="per-request deadline (default: --p99-ms, else 30 s)")
    parser.add_argument("--degrade", action="store_true",
                        help="past the deadline, answer with the cheap level's prediction marked degraded")
    parser.add_argument("--hedging", action="store_true",
                        help="hedge stage calls: one still unanswered after the stage's latency tail is sent "
                             "again to another replica, the first answer kept")
    parser.add_argument("--router", choices=("capacity", "serve"), default="capacity",
                        help="how a stage's calls reach its replicas: by measured capacity, draining and silent "
                             "replicas last (default), or Ray Serve's power of two choices")
    parser.add_argument("--lost-after-s", type=_lost_after, default=LOST_AFTER_S, metavar="S",
                        help=f"copy a stage call unanswered this long to another replica (default {LOST_AFTER_S:g}; "
                             "'off': never)")
    parser.add_argument("--audit-rate", type=float, default=None, metavar="R",
                        help="share of the cheap level's rows also run through the full pipeline, off the request "
                             "path, to keep the live guarantee's bound (GET /NAME/drift?kind=guarantee; default "
                             "0.01 with the monitor, 0 without)")
    parser.add_argument("--tracing", action="store_true",
                        help="trace requests with OpenTelemetry (Ray Serve's tracing; spans under the Ray session's "
                             "logs/serve/spans unless --tracing-exporter says otherwise)")
    parser.add_argument("--tracing-sample", type=float, default=None, metavar="R",
                        help="share of requests traced, in [0, 1] (default 0.01)")
    parser.add_argument("--tracing-exporter", default=None, metavar="MODULE:FUNCTION",
                        help="a function returning OpenTelemetry span processors (e.g. an OTLP exporter's)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="the replicas' logs: text lines, or one JSON object a line carrying the request id "
                             "(default: text)")
    parser.add_argument("--on-alarm", choices=("alert", "step"), default="alert",
                        help="what the live audit's alarm does: 'alert' raises it (metric, route, dashboard); "
                             "'step' also holds the alarmed gear and serves a more conservative one, or the full "
                             "pipeline, until the rows audited since show it is back (default: alert)")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help=f"require the API key held in this environment variable (e.g. {API_KEY_ENV}); "
                             "`build` writes the variable's name, and each replica reads the key where it runs "
                             "(a Kubernetes Secret), so the key never enters the config")
    parser.add_argument("--require-key", action="store_true",
                        help="refuse to serve beyond loopback without an API key (otherwise a loud warning)")


def _api_key(args: argparse.Namespace) -> str | None:
    if not args.api_key_env:
        return None
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    return key


def cmd_keygen(args: argparse.Namespace) -> int:
    key = generate_key()
    print(f"export {args.env}={key}" if args.env else key, flush=True)
    return 0


def _check_exposure(host: str | None, key_env: str | None, require_key: bool) -> None:
    """Serving beyond loopback without a key: refused with --require-key, else a loud warning."""
    if host is None or host in LOOPBACK_HOSTS or key_env:
        return
    message = (f"willump: HTTP on {host} (beyond loopback) without an API key: whoever reaches the port can call "
               f"every route, /plan and the monitor's answers included; pass --api-key-env {API_KEY_ENV}")
    if require_key:
        raise ValueError(message.removeprefix("willump: ") + " (--require-key)")
    print("WARNING " + message, file=sys.stderr, flush=True)


def cmd_build(args: argparse.Namespace) -> int:
    import willump
    from serving.core.local_ray import worker_env
    from serving.launch.cluster import usable_cores
    from serving.launch.config import plan_offline, serve_config, write_serve_config
    from serving.launch.deploy import hedging_options
    from serving.runtime.audit import resolve_audit_rate
    from serving.runtime.gears import check_gears, gear_info

    opt = willump.load(args.artifact)
    check_gears(args.gears, _gear_policy(args), opt, baseline=False)  # before the minutes of profiling
    worker_env()  # a malformed RAY_worker_niceness named now, not after them
    if args.min_replicas is not None and args.min_replicas < 0:
        raise ValueError(f"--min-replicas must be >= 0, got {args.min_replicas}")
    monitor = _monitor_options(args)
    if args.layout == "whole" and args.min_replicas is not None:
        raise ValueError("--layout whole runs every level in the ingress replicas: not with --min-replicas "
                         "(the ingress does not scale to zero)")
    layout = args.layout
    if layout == "auto" and args.min_replicas is not None:
        layout = "staged"
    elif layout == "auto" and (args.degrade or args.hedging):
        layout = "fused"  # degradation and hedging act on a stage of its own
    with _progress("profiling the stages and the ingress on this machine"):
        plan = plan_offline(opt, cpus=args.cpus or usable_cores(), rows_per_request=args.rows_per_request,
                            rps=args.rps, p99_ms=args.p99_ms, layout=layout, monitor=monitor)
    if not plan.placeable:
        raise ValueError("the plan cannot be placed: " + "; ".join(plan.notes))
    gears = gear_info(args.gears, _gear_policy(args), opt, plan.target_p99_ms or args.deadline_ms)
    _check_exposure(args.host, args.api_key_env, args.require_key)
    audit_rate, audit_note = resolve_audit_rate(args.audit_rate, monitor=monitor is not None,
                                                cascade=len(opt.levels) > 1)
    if audit_note:
        print(f"willump: {audit_note}", flush=True)
    config = serve_config(args.artifact, plan, name=args.name, host=args.host, port=args.port, monitor=monitor,
                          degrade=args.degrade, deadline_ms=args.deadline_ms, api_key_env=args.api_key_env or None,
                          gears=gears, hedging=hedging_options(args.hedging), runtime=args.runtime,
                          router=args.router, lost_after_s=args.lost_after_s,
                          min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                          autoscaler=args.autoscaler, runtime_env=args.runtime_env, audit_rate=audit_rate, on_alarm=args.on_alarm,
                          log_format=args.log_format, tracing=_tracing(args))
    out = write_serve_config(config, args.output)
    print(plan, flush=True)
    print(f"willump: wrote {out} (serve run {out} / serve deploy {out})", flush=True)
    return 0


def _gears(value: str) -> str | int:
    """--gears: a mode or a gear index."""
    return int(value) if value.isdigit() else value


def _monitor_options(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.monitor_attributes is None:
        return None
    options: dict[str, Any] = {"attributes": args.monitor_attributes, "features": args.monitor_features}
    if args.monitor_dir:
        options["directory"] = args.monitor_dir
    if args.monitor_pane_seconds:
        options["pane_seconds"] = args.monitor_pane_seconds
    return options


def cmd_plan(args: argparse.Namespace) -> int:
    import willump
    from serving.launch.config import plan_offline

    opt = willump.load(args.artifact)
    with _progress("profiling the stages and the ingress on this machine"):
        plan = plan_offline(opt, cpus=args.cpus, rows_per_request=args.rows_per_request, rps=args.rps,
                            p99_ms=args.p99_ms, layout=args.layout,
                            monitor=None, gpus=args.gpus)
    if args.json:
        print(json.dumps({"plan": plan.to_dict(), "profiles": [p.to_dict() for p in plan.profiles]}, indent=2))
    else:
        print(plan)
    return 0 if plan.feasible else EXIT_NO_PLAN


#: deploy()'s long steps, announced by ``willump serve`` as they start and end
SERVE_STEPS = (("measure_costs", "measuring HTTP and hop costs on this cluster"),
               ("make_plan", "profiling the stages and planning replicas and batches"),
               ("run_spec", "starting the monitor and the app's replicas"),
               ("refine_in_situ", "probing the running app and planning again from what it measures"))


def _announce_steps() -> None:
    """Print each long step of deploy() as it starts and how long it took (the CLI only)."""
    import importlib
    import time

    module = importlib.import_module(f"{__package__}.launch.deploy")

    def wrap(fn: Any, what: str) -> Any:
        def announced(*a: Any, **kw: Any) -> Any:
            started = time.monotonic()
            print(f"willump: {what} ...", flush=True)
            out = fn(*a, **kw)
            print(f"willump: {what}: done in {time.monotonic() - started:.0f} s", flush=True)
            return out

        return announced

    for name, what in SERVE_STEPS:
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "_announced", False):
            wrapped = wrap(fn, what)
            wrapped._announced = True  # type: ignore[attr-defined]
            setattr(module, name, wrapped)


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.launch.deploy import _ensure_ray, deploy

    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        print(f"willump: received {signal.Signals(signum).name}, shutting down", flush=True)
        stop.set()

    # ray.init installs its own signal handlers; ours go in right after it, so a signal at
    # any later point (even mid-deploy) shuts Serve and Ray down in order.
    print("willump: " + (f"joining the Ray cluster at {args.address}" if args.address else "starting Ray")
          + " ...", flush=True)
    _check_exposure(args.host, args.api_key_env, args.require_key)
    # what can be checked without Ray, before it starts (a container run without its artifact
    # mounted, or without its key, says so in a second, not after Ray's start)
    if not Path(args.artifact).exists():
        raise ValueError(f"artifact {args.artifact}: no such file or directory (a directory written by "
                         "OptimizedPipeline.save)")
    _api_key(args)
    _announce_steps()
    started_ray = _ensure_ray(args.address, args.cpus, args.gpus, None if args.address else args.proxy,
                              args.transport, monitor=args.monitor_attributes is not None)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    app = None
    try:
        app = deploy(
            args.artifact, name=args.name, host=args.host, port=args.port, address=args.address,
            cpus=args.cpus, gpus=args.gpus, rps=args.rps, p99_ms=args.p99_ms,
            rows_per_request=args.rows_per_request, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, autoscaler=args.autoscaler, monitor=_monitor_options(args),
            batching=not args.no_batching, runtime=args.runtime, device=args.device,
            max_batch_size=args.max_batch_size,
            batch_wait_timeout_s=None if args.batch_wait_ms is None else args.batch_wait_ms / 1000.0,
            proxy=None if args.address else args.proxy, transport=args.transport,
            layout=args.layout, calibrate=args.calibrate, deadline_ms=args.deadline_ms, degrade=args.degrade,
            api_key=_api_key(args), gears=args.gears, gear_policy=_gear_policy(args), insitu=args.insitu,
            hedging=args.hedging, router=args.router, lost_after_s=args.lost_after_s,
            audit_rate=args.audit_rate, on_alarm=args.on_alarm,
            log_format=args.log_format, tracing=_tracing(args), pools=args.pools,
        )
        print(app.plan, flush=True)
        for note in app.notes:
            if note.startswith("tracing"):
                print(f"willump: {note}", flush=True)
        print(f"willump: serving {app.model_version} at {app.url} via {app.proxy}; dashboard at {app.url}/ui "
              "(Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if app is not None:
            app.shutdown(stop_ray=started_ray)
        elif started_ray:
            import ray

            ray.shutdown()
            release_proxy_files()
        print("willump: stopped", flush=True)
    return 0


def _tracing(args: argparse.Namespace) -> dict[str, Any] | bool:
    """``--tracing`` and its options as ``deploy(tracing=...)``."""
    if not args.tracing:
        if args.tracing_sample is not None or args.tracing_exporter:
            raise ValueError("--tracing-sample and --tracing-exporter need --tracing")
        return False
    out: dict[str, Any] = {}
    if args.tracing_sample is not None:
        out["sampling_ratio"] = args.tracing_sample
    if args.tracing_exporter:
        out["exporter_import_path"] = args.tracing_exporter
    return out or True


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if is_model_command(argv):  # a saved torch model (a file): partitioned
        from serving.model_app import cli as model_cli

        return model_cli.main(argv)
    args = build_parser().parse_args(argv)
    if args.command in ("plan", "build", "serve"):
        from willump.runtime import require

        try:
            require("ray", f"willump {args.command}")
        except ImportError as exc:
            print(f"willump: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
    try:
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "build":
            return cmd_build(args)
        if args.command == "keygen":
            return cmd_keygen(args)
        if args.command == "recertify":
            return cmd_recertify(args)
        return cmd_serve(args)
    except Exception as exc:
        from willump import ArtifactError

        if not isinstance(exc, (ArtifactError, ValueError, TypeError)):
            raise
        print(f"willump: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
