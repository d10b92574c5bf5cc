"""``willump plan MODEL.pt`` and ``willump serve MODEL.pt``: the same commands for a torch
model saved with :func:`serving.partition.save_model` (a file; pipeline artifacts are
folders, so the two never clash).

``plan`` captures, profiles (or reads ``--profile``, e.g. one taken on a GPU node) and
prints the partition plan; ``serve`` deploys it with :func:`serving.deploy_model` and
stays in the foreground until interrupted.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from serving import partition as sp
from serving.core.constants import EXIT_ERROR, EXIT_NO_PLAN, EXIT_OK

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40}


def parse_bytes(text: str) -> float:
    """``"2GiB"``, ``"512MiB"``, ``"1e9"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 2GiB, 512MiB or a number of bytes)")
    try:
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a size must be positive, got {text!r}")
    return value


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="file written by serving.partition.save_model(module, example, path)")
    p.add_argument("--devices", type=int, help="devices (replicas) to plan for (default: 1 for plan; "
                                              "serve: GPUs, else CPUs less one)")
    p.add_argument("--memory-per-device", type=parse_bytes, help="device memory, e.g. 16GiB (default: no limit)")
    p.add_argument("--objective", choices=sp.OBJECTIVES, default="throughput")
    p.add_argument("--rate", type=float, help="rows/s the plan must sustain (objective latency)")
    p.add_argument("--slo-ms", type=float, help="latency the plan must stay within")
    p.add_argument("--batch-sizes", type=_ints, default=(1, 4, 16, 32), help="batch sizes profiled (1,4,16,32)")
    p.add_argument("--device", choices=("cpu", "cuda", "gpu"), help="device profiled and served on (default cpu; "
                                                                     "serve --plan: the plan's)")
    p.add_argument("--profile", help="a profile JSON (serving.partition.save_profile) instead of profiling here")
    p.add_argument("--hop-ms", type=float, help="fixed cost of a hop between stages (ms)")
    p.add_argument("--hop-mb-per-s", type=float, help="bandwidth of a hop between stages (MB/s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="willump", description="Plan and serve a partitioned torch model.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the partition plan of a saved torch model")
    _common(plan)
    plan.add_argument("--calibrate", action="store_true",
                      help="start a local Ray and measure the Serve hop (else --hop-* or the profile's)")
    plan.add_argument("--save-profile", help="write the profile taken here as JSON")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    serve = sub.add_parser("serve", help="serve a saved torch model, partitioned (foreground)")
    _common(serve)
    serve.add_argument("--name", default="model", help="app name; HTTP at /NAME")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, help="HTTP port (default: a free one)")
    serve.add_argument("--address", help="join this Ray cluster instead of starting one")
    serve.add_argument("--plan", help="a plan JSON (willump plan --json) instead of planning here")
    serve.add_argument("--cpus-per-replica", type=float, default=1.0)
    serve.add_argument("--batch-wait-ms", type=float, default=2.0)
    return parser


def _transport(args: argparse.Namespace, base: sp.Transport | None) -> sp.Transport | None:
    if args.hop_ms is None and args.hop_mb_per_s is None:
        return base
    fixed = args.hop_ms if args.hop_ms is not None else (base.fixed_ms if base else 0.0)
    bw = args.hop_mb_per_s * 1e6 if args.hop_mb_per_s is not None else (base.bytes_per_s if base else float("inf"))
    if fixed < 0 or not bw > 0:
        raise ValueError("--hop-ms must be >= 0 and --hop-mb-per-s > 0")
    return sp.Transport(fixed, bw, "command line")


def _profile(args: argparse.Namespace, graph: sp.Graph, transport: sp.Transport | None) -> sp.Profile:
    if args.profile:
        prof = sp.load_profile(args.profile)
        if len(prof) != len(graph):
            raise ValueError(f"{args.profile} has {len(prof)} blocks but the model captures as {len(graph)}")
        return prof.with_transport(transport) if transport else prof
    return sp.profile(graph, batch_sizes=args.batch_sizes, device=args.device or "cpu", transport=transport)


def cmd_plan(args: argparse.Namespace) -> int:
    module, example = sp.load_model(args.model)
    graph = sp.capture(module, example)
    transport = _transport(args, None)
    if args.calibrate and transport is None:
        import ray
        from ray import serve

        from serving.core.local_ray import start_local_ray
        from serving.model_app.deploy import free_port
        from serving.model_app.transport import calibrate_transport

        start_local_ray(include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        try:
            transport = calibrate_transport()
        finally:
            serve.shutdown()
            ray.shutdown()
    prof = _profile(args, graph, transport)
    if args.save_profile:
        sp.save_profile(prof, args.save_profile)
    plan = sp.plan(prof, args.devices or 1, args.memory_per_device, args.objective, rate=args.rate,
                   slo_ms=args.slo_ms)
    if prof.transport.source == "none":
        plan.notes.append("no hop cost measured: pass --calibrate, --hop-ms/--hop-mb-per-s or a profile with one")
    if args.json:
        print(json.dumps({"plan": plan.to_dict(), "blocks": graph.names}, indent=2, default=str))
    else:
        print(f"{graph!r}")
        print(plan)
    return EXIT_OK if plan.feasible else EXIT_NO_PLAN


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.model_app.deploy import deploy_model

    module, example = sp.load_model(args.model)
    graph = sp.capture(module, example)
    kwargs: dict[str, Any] = {}
    if args.plan:
        raw = json.loads(Path(args.plan).read_text())
        the_plan: Any = sp.Plan.from_dict(raw.get("plan", raw))
    else:
        the_plan = "auto"
        transport = _transport(args, None)
        if args.profile:
            kwargs["profile"] = _profile(args, graph, transport)
        kwargs.update(transport=transport, devices=args.devices, memory_per_device=args.memory_per_device,
                      objective=args.objective, rate=args.rate, slo_ms=args.slo_ms, batch_sizes=args.batch_sizes)
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        print(f"willump: received {signal.Signals(signum).name}, shutting down", flush=True)
        stop.set()

    from serving.model_app.deploy import _ensure_ray

    # ray.init installs its own signal handlers: ours go in right after it
    started_ray = _ensure_ray(args.address, None, None)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    app = None
    try:
        app = deploy_model(module, example, name=args.name, plan=the_plan, graph=graph, device=args.device,
                           host=args.host, port=args.port, address=args.address,
                           cpus_per_replica=args.cpus_per_replica, batch_wait_ms=args.batch_wait_ms, **kwargs)
        print(app.plan, flush=True)
        print(f"willump: serving {args.model} at {app.url}/predict (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if app is not None:
            app.shutdown(stop_ray=False)
        if started_ray:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
        print("willump: stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return cmd_plan(args) if args.command == "plan" else cmd_serve(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"willump: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
