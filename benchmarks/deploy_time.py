"""How long a deploy takes where users wait for it: Ray and Serve starting, ``deploy()`` the
first time and again (the same artifact on the same Ray), a shutdown, and a replica process's
imports.

    python -m benchmarks.deploy_time [--workload spam] [--layouts fused,staged] [--repeats 3]
                                     [--insitu-repeats 2] [--json PATH]

Per layout, ``--repeats`` times: ``deploy(opt, insitu="never", calibrate="never")`` then
``shutdown()``; the first deploy of a process also times the stages in a Ray worker (later ones
reuse that measurement: :func:`serving.measure.stages.profile_on_cluster`). Reported: medians of
the seconds each phase took; the first deploy separately. Import seconds are measured in fresh
interpreters (``python -c "import M"``), medians of ``--repeats``, for what an ingress or stage
replica imports before it can answer (the cold start of a scaled-to-zero stage pays them).

With the in-situ probe (``insitu="always"``, what ``"auto"`` does on one machine), fused layout,
``--insitu-repeats`` times each, alternating: the probe's refined plan adopted by the running
replicas where it runs the same replicas (``adopt``, serving.core.plan_board), and the app
restarted with it whatever it holds (``restart``: the behaviour before, forced here by treating
every refined plan as different). Reported: median seconds of ``deploy()`` per arm, and how many
deploys of each arm restarted the app.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._rounds import serving_main

#: the modules a replica imports, timed in fresh interpreters
REPLICA_IMPORTS = ("serving.runtime.ingress", "serving.runtime.replicas", "torch")
#: layouts deployed by default
LAYOUTS = ("fused", "staged")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="spam")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=float, default=2.0)
    parser.add_argument("--insitu-repeats", type=int, default=2,
                        help="deploys with the in-situ probe per arm (adopt, restart); 0 skips them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.insitu_repeats < 0:
        parser.error(f"--repeats must be >= 1 and --insitu-repeats >= 0, got {args.repeats}, {args.insitu_repeats}")
    return args


def import_seconds(module: str) -> float:
    """Seconds a fresh interpreter takes to import ``module`` (its start-up subtracted)."""
    def timed(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        return time.perf_counter() - t

    return max(0.0, timed(f"import {module}") - timed("pass"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    import pipelines
    from serving import deploy
    from serving.launch.proxy import use_proxy
    from serving.model_app.deploy import free_port

    imports = {m: statistics.median(import_seconds(m) for _ in range(args.repeats)) for m in REPLICA_IMPORTS}
    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    use_proxy("haproxy")
    t = time.perf_counter()
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=args.cpus + 1, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    t_ray = time.perf_counter() - t
    port = free_port()
    t = time.perf_counter()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    t_serve = time.perf_counter() - t
    phases: dict[str, dict[str, list[float]]] = {}
    first: dict[str, float] | None = None
    try:
        for layout in args.layouts.split(","):
            for i in range(args.repeats):
                t = time.perf_counter()
                app = deploy(opt, name=f"dt-{layout}-{i}", port=port, cpus=args.cpus, device="cpu", layout=layout,
                             insitu="never", calibrate="never")
                t_deploy = time.perf_counter() - t
                t = time.perf_counter()
                app.shutdown()
                t_down = time.perf_counter() - t
                if first is None:
                    first = {"layout": layout, "deploy_s": t_deploy, "shutdown_s": t_down}
                    continue
                phases.setdefault(layout, {"deploy_s": [], "shutdown_s": []})
                phases[layout]["deploy_s"].append(t_deploy)
                phases[layout]["shutdown_s"].append(t_down)
        probed = in_situ_arms(opt, port, args)
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"in_situ": probed,
        "workload": args.workload, "repeats": args.repeats, "cpus": args.cpus, "ray_init_s": t_ray,
        "serve_start_s": t_serve, "first_deploy": first, "import_s": imports,
        "layouts": {k: {p: statistics.median(v) for p, v in d.items()} | {"n": len(d["deploy_s"])}
                    for k, d in phases.items()},
    }


def in_situ_arms(opt: Any, port: int, args: argparse.Namespace) -> dict[str, Any]:
    """``deploy(insitu="always")`` per arm (module docstring), alternating; seconds and restarts."""
    from unittest import mock

    from serving import deploy
    from serving.planning.planner import same_replicas

    compare = {"adopt": same_replicas, "restart": lambda a, b: False}
    arms: dict[str, dict[str, list]] = {"adopt": {"deploy_s": [], "restarted": []},
                                        "restart": {"deploy_s": [], "restarted": []}}
    for i in range(args.insitu_repeats):
        for arm in (("adopt", "restart") if i % 2 == 0 else ("restart", "adopt")):
            with mock.patch("serving.launch.insitu.same_replicas", compare[arm]):
                t = time.perf_counter()
                app = deploy(opt, name=f"dt-insitu-{arm}-{i}", port=port, cpus=args.cpus, device="cpu",
                             layout="fused", insitu="always", calibrate="never")
                arms[arm]["deploy_s"].append(time.perf_counter() - t)
            arms[arm]["restarted"].append(bool(app.plan.in_situ.get("replanned")))
            app.shutdown()
    return {arm: {"deploy_s": statistics.median(d["deploy_s"]) if d["deploy_s"] else None,
                  "runs": d["deploy_s"], "restarted": sum(d["restarted"]), "n": len(d["deploy_s"])}
            for arm, d in arms.items()}


def markdown(r: dict[str, Any]) -> str:
    lines = [f"workload {r['workload']}, {r['cpus']:g} CPUs; medians of {r['repeats']} (seconds)", "",
             "| phase | seconds |", "|---|---:|",
             f"| ray.init | {r['ray_init_s']:.2f} |", f"| serve.start | {r['serve_start_s']:.2f} |"]
    f = r["first_deploy"]
    lines.append(f"| first deploy ({f['layout']}, stages timed) | {f['deploy_s']:.2f} |")
    lines.append(f"| its shutdown | {f['shutdown_s']:.2f} |")
    for layout, d in r["layouts"].items():
        lines.append(f"| deploy again, {layout} (n={d['n']}) | {d['deploy_s']:.2f} |")
        lines.append(f"| shutdown, {layout} | {d['shutdown_s']:.2f} |")
    for arm, d in r["in_situ"].items():
        if d["n"]:
            lines.append(f"| deploy with the in-situ probe, {arm} (n={d['n']}, {d['restarted']} restarted) | "
                         f"{d['deploy_s']:.2f} |")
    for m, s in r["import_s"].items():
        lines.append(f"| import {m} (fresh interpreter) | {s:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return serving_main(parse_args, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
