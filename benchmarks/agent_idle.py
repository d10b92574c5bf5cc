"""What Ray's metrics agent spends while apps sit deployed and unwatched.

    python -m benchmarks.agent_idle [--workload toxic] [--apps 3] [--ingress-replicas 2]
                                    [--seconds 60] [--repeats 1] [--json PATH]

Deploys ``--apps`` copies of the workload's optimized app on one fresh Ray (as ``deploy``
starts one), each with ``--ingress-replicas`` ingress replicas, sends each a few requests (which
start every replica's dashboard sampler), lets them settle, and reads the agent's CPU over
``--seconds`` with nobody watching a dashboard. Every replica's sampler reads the node's whole
metrics endpoint once a sampling period unless another replica's read serves it
(``serving.runtime.node_scrape``), and every read is a burst of the agent's CPU beside the
request path. To compare two versions of the code, run this in each checkout in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchmarks.serving import METRICS_AGENT
from serving.core.procstat import group_cpu, process_cpu

#: requests each app gets before the window (the first starts its replicas' samplers)
WARM_REQUESTS = 6
#: seconds after the warm requests before the window: the samplers' first reads done, the
#: replicas' first exports in
SETTLE_S = 35.0


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return r.status


def one_run(workload: Any, opt: Any, args: argparse.Namespace) -> dict[str, Any]:
    from serving import deploy
    from serving.launch.config import plan_offline
    from serving.measure.loadgen import payloads

    bodies, _ = payloads(workload.X_test, 4, limit=WARM_REQUESTS)
    apps = []
    try:
        for i in range(args.apps):
            plan = plan_offline(opt, cpus=args.cpus, rows_per_request=32, rps=None, p99_ms=None, layout="fused",
                                monitor=None)
            plan.ingress_replicas = args.ingress_replicas
            # Ray's logical CPUs: each app's plan fits --cpus of them
            apps.append(deploy(opt, name=f"idle{i}", port=args.port, cpus=args.cpus * args.apps, plan=plan,
                               insitu="never", calibrate="never", device="cpu"))
        for app in apps:
            failed = [s for s in (_post(app.url + "/predict", b) for b in bodies) if s != 200]
            if failed:
                raise RuntimeError(f"{app.name}: warm requests answered {failed}")
        time.sleep(SETTLE_S)
        before, start = process_cpu(), time.monotonic()
        time.sleep(args.seconds)
        agent_s = group_cpu(before, process_cpu(), {"agent": lambda _, title: title.startswith(METRICS_AGENT)})["agent"]
        seconds = time.monotonic() - start
    finally:
        if apps:
            apps[0].shutdown()
    return {"apps": args.apps, "ingress_replicas": args.ingress_replicas, "seconds": seconds,
            "agent_cpu_ms_per_s": 1000.0 * agent_s / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_idle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--apps", type=int, default=3)
    parser.add_argument("--ingress-replicas", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the measured window")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cpus", type=float, default=2.0, help="logical CPUs each app is planned for")
    parser.add_argument("--port", type=int, default=8812)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every repeat and the median here")
    args = parser.parse_args(argv)
    if min(args.apps, args.ingress_replicas, args.repeats) < 1 or args.seconds <= 0:
        parser.error("--apps, --ingress-replicas, --repeats and --seconds must be positive")
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    runs = []
    for repeat in range(args.repeats):
        run = one_run(workload, opt, args)
        runs.append(run)
        print(f"repeat {repeat + 1}: {args.apps} apps of {args.ingress_replicas} ingress replicas, unwatched: "
              f"Ray's metrics agent {run['agent_cpu_ms_per_s']:.1f} ms of CPU a second", flush=True)
    median = statistics.median(r["agent_cpu_ms_per_s"] for r in runs)
    print(f"median: {median:.1f} ms a second")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "runs": runs, "agent_cpu_ms_per_s": median}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
