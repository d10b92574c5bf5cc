"""Where a served request's CPU goes: one app under a closed loop, each process group's CPU per
request from /proc, and (``--py-spy``) a sampling profile of every replica, summed by what the
time was spent on.

    python -m benchmarks.request_profile [--workload toxic | --artifact PATH] [--layout auto] [--baseline]
                                         [--seconds 10] [--py-spy] [--top 25]

The layout is deploy's (``auto`` by default: the plan's choice); ``--baseline`` serves the
unoptimized pipeline. With ``--py-spy`` (the ``bench`` extras install it) each replica is sampled
at ``--rate`` Hz without pausing it (``--nonblocking``) while the load runs: the sampler itself
takes CPU on a small machine, so read the shares, not the rates, of that run. The shares group
the samples by the first frame that names a known cost (:data:`GROUPS`); ``--top`` lists the
functions with the most samples inside them, too.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

#: (group, what a frame's text must contain), first match wins, checked over the whole stack
GROUPS = (
    ("the pipeline's own work", "run_levels"),
    ("the pipeline's own work", "predict_proba (willump"),
    ("parse and validate the body", "parse_request"),
    ("encode the answer", "predict_answer"),
    ("monitor records", "record_columns"),
    ("metrics (ray.util.metrics)", "Metric._record"),
    ("metrics (ray.util.metrics)", "ServingMetrics."),
    ("replica watch", "running_replicas"),
    ("dashboard sampler", "read_totals"),
    ("the route's own code", "Ingress._predict"),
    ("the route's own code", "Ingress._guarded"),
    ("FastAPI", "fastapi/"),
    ("uvicorn", "uvicorn/"),
    ("Serve's replica", "serve/_private/replica.py"),
    ("gRPC", "grpc"),
    ("Serve's router", "serve/_private/router.py"),
    ("threads waking", "concurrent/futures/thread.py"),
    ("Ray's core worker loop", "Worker.main_loop"),
)


def group_of(stack: list[str]) -> str:
    for name, needle in GROUPS:
        if any(needle in frame for frame in stack):
            return name
    return "other: " + re.sub(r" \(.*", "", stack[-1]) if stack else "other"


def summarise(raw: str, top: int) -> dict[str, Any]:
    """py-spy's raw (collapsed) output as shares by group and the functions with most samples."""
    groups: collections.Counter = collections.Counter()
    inside: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack_text, count = line.rsplit(" ", 1)
        n, stack = int(count), stack_text.split(";")
        total += n
        groups[group_of(stack)] += n
        for frame in set(stack):
            inside[re.sub(r":\d+\)", ")", re.sub(r"\(.*site-packages/", "(", frame))] += n
    return {"samples": total,
            "groups": {k: v / total for k, v in groups.most_common()} if total else {},
            "functions": {k: v / total for k, v in inside.most_common(top)} if total else {}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from benchmarks.serving import load_pipeline
    from serving import deploy
    from serving.core.procstat import cpu_per_request, process_cpu, session_dir, session_processes
    from serving.launch.proxy import release_proxy_files, use_proxy
    from serving.measure.loadgen import closed_loop, payloads

    opt, X = load_pipeline(args)
    bodies, _ = payloads(X, args.rows_per_request)
    use_proxy(None, "grpc")
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    out: dict[str, Any] = {"workload": args.workload, "layout": args.layout, "baseline": args.baseline,
                           "pipeline_workers": getattr(opt, "workers", 1)}
    folder = tempfile.mkdtemp(prefix="willump-profile-")
    try:
        session = session_dir(ray.get_runtime_context().gcs_address)
        app = deploy(opt, name="profiled", port=args.port, cpus=args.cpus, baseline=args.baseline,
                     rows_per_request=args.rows_per_request, device="cpu",
                     layout="staged" if args.baseline else args.layout, calibrate="auto", insitu="never")
        out["stages"] = [s.name for s in app.plan.stages]
        # how each stage runs on its replicas: on the event loop (inline) or in threads
        out["inline"] = {p.name: {"inline": p.runs_inline, "cpu_share": round(p.cpu_share, 3)}
                         for p in app.plan.profiles or ()}
        url = app.url + "/predict"
        asyncio.run(closed_loop(url, bodies, args.rows_per_request, clients=args.clients, duration=3,
                                max_requests=10**6))
        replicas = {pid: title.split()[0].rsplit(":", 1)[-1] for pid, (title, _) in process_cpu().items()
                    if "ServeReplica:profiled:" in title}
        spies = {}
        if args.py_spy:
            # on PATH, or beside this interpreter (a virtual environment not activated)
            spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
            if spy is None:
                raise SystemExit("--py-spy: py-spy is not installed (pip install py-spy)")
            for pid, role in replicas.items():
                path = os.path.join(folder, f"{role}-{pid}.txt")
                spies[(role, pid)] = (path, subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-d", str(int(args.seconds)), "-r", str(args.rate),
                     "-f", "raw", "-o", path, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ours, before = session_processes(session), process_cpu()
        phase = asyncio.run(closed_loop(url, bodies, args.rows_per_request, clients=args.clients,
                                        duration=args.seconds, max_requests=10**6))
        out["cpu_ms_per_request"] = cpu_per_request(before, process_cpu(), phase["requests"], "profiled", ours)
        out.update({k: phase[k] for k in ("rows_per_s", "p99_ms", "errors", "requests")})
        by_role: dict[str, str] = collections.defaultdict(str)
        for (role, _), (path, proc) in spies.items():
            proc.wait(timeout=args.seconds + 60)
            if os.path.exists(path):
                with open(path) as fh:
                    by_role[role] += fh.read()
        out["profiles"] = {role: summarise(text, args.top) for role, text in by_role.items()}
        app.shutdown(stop_ray=False)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        release_proxy_files()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def report(out: dict[str, Any]) -> str:
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in out["cpu_ms_per_request"].items())
    lines = [f"{out['workload']} ({'baseline' if out['baseline'] else out['layout']}; stages {out['stages']}): "
             f"{out['rows_per_s']:.0f} rows/s, p99 {out['p99_ms']:.1f} ms, {out['errors']} failed; "
             f"CPU ms per request: {cpu}; stages inline: {out.get('inline')}; the artifact's feature-group "
             f"threads: {out.get('pipeline_workers')}"]
    for role, prof in out.get("profiles", {}).items():
        lines.append(f"{role} ({prof['samples']} samples):")
        lines += [f"  {share:6.1%}  {name}" for name, share in prof["groups"].items() if share >= 0.005]
        lines.append("  functions with the most samples inside them:")
        lines += [f"  {share:6.1%}  {name}" for name, share in prof["functions"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.request_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--artifact", help="profile a saved artifact on its sample rows instead")
    parser.add_argument("--layout", default="auto", choices=("auto", "fused", "staged", "whole"))
    parser.add_argument("--baseline", action="store_true", help="serve the unoptimized pipeline")
    parser.add_argument("--rows-per-request", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--py-spy", action="store_true", help="sample every replica with py-spy")
    parser.add_argument("--rate", type=int, default=47, help="py-spy samples per second (default %(default)s)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rows_per_request < 1 or args.clients < 1:
        parser.error("--seconds, --rows-per-request and --clients must be positive")
    print(report(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
