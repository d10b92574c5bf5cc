"""A re-certified artifact handed to a running app under load: what clients see while Serve
replaces the replicas, with the hand-over's surge (``HANDOVER_SURGE_PERCENT``) and without it.

    python -m benchmarks.handover [--workload toxic] [--rounds 3] [--clients 4] [--cpus 1]
                                  [--layout fused] [--json PATH]

Each round deploys the workload's certified cascade (``cpus`` sized so the plan runs one replica
of each deployment, where a hand-over hurts most), starts ``clients`` closed-loop threads posting
8-row requests, deploys ``opt.recertify(X_test, y_test).pipeline()`` under the same name with the
running app's plan (what the README tells users to do), and keeps the load on until 5 s after the
later of the first answer from the new artifact and ``deploy()`` returning. The arms alternate
within a round, order swapped each round:

- ``surge``: the hand-over as deploy() makes it where the replacements fit beside the running
  app, ``max_surge_percent`` = ``HANDOVER_SURGE_PERCENT`` (Serve starts a replacement before it
  stops an old replica);
- ``stop_first``: ``max_surge_percent`` = 0, Serve's default and deploy's fallback where they do
  not fit (Serve stops an old replica, at least one, before it starts the replacement).

Reported per arm (medians over rounds, and the totals): requests failed (a non-200 answer, or a
connection closed or timed out without one), the longest time no answer came back while the
clients were waiting (the capacity gap), p99 latency over the hand-over (from the redeploy to 5 s
after the first new answer) against p99 before it, and seconds from the redeploy call to the first
answer by the new artifact.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np

from benchmarks._rounds import serving_main

ARMS = ("surge", "stop_first")
#: rows in each request the clients send
ROWS_PER_REQUEST = 8
#: seconds of load before the hand-over (the "before" latency) and after the first new answer
BEFORE_S, AFTER_S = 5.0, 5.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--cpus", type=float, default=1.0, help="CPUs each deploy plans for (1: one replica each)")
    parser.add_argument("--layout", default="fused")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.clients < 1 or not args.cpus > 0:
        parser.error(f"--rounds and --clients must be >= 1 and --cpus > 0, got {args.rounds}, {args.clients}, "
                     f"{args.cpus}")
    return args


class Clients:
    """``n`` threads posting ``body`` to ``url`` in a loop; every call's (start, end, status,
    version, error) kept, an exception counted as a failed call, never lost."""

    def __init__(self, url: str, body: dict, n: int) -> None:
        import requests

        self.calls: list[tuple[float, float, int, str | None, str | None]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

        def loop() -> None:
            session = requests.Session()
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = session.post(url, json=body, timeout=60)
                    version = r.json().get("model_version") if r.status_code == 200 else None
                    call = (t0, time.monotonic(), r.status_code, version, None)
                except Exception as exc:  # a dropped connection is a failed request
                    call = (t0, time.monotonic(), 0, None, repr(exc)[:200])
                with self._lock:
                    self.calls.append(call)

        self._threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def first_answer_by(self, version: str) -> float | None:
        with self._lock:
            return min((c[1] for c in self.calls if c[3] == version), default=None)

    def stop(self) -> list[tuple]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)
        return sorted(self.calls)


def p99_ms(calls: list[tuple]) -> float | None:
    lat = [1000.0 * (c[1] - c[0]) for c in calls]
    return float(np.percentile(lat, 99)) if lat else None


def longest_gap_s(calls: list[tuple], start: float, end: float) -> float:
    """The longest stretch inside [start, end] with no call finishing while calls were waiting."""
    ends = sorted([start] + [c[1] for c in calls if start <= c[1] <= end] + [end])
    return max(b - a for a, b in itertools.pairwise(ends))


def surge_of(app: str) -> int | None:
    """The ``max_surge_percent`` Serve holds for ``app``'s ingress deployment."""
    from ray.serve.context import _get_global_client

    deployments = _get_global_client().get_serve_details()["applications"][app]["deployments"]
    return deployments.get(f"{app}-ingress", {}).get("deployment_config", {}).get("max_surge_percent")


def one_hand_over(opt: Any, new: Any, arm: str, name: str, port: int, args: argparse.Namespace,
                  rows: list[dict]) -> dict[str, Any]:
    from serving import deploy
    from serving.core.constants import HANDOVER_SURGE_PERCENT

    # stop_first: what deploy does where the replacements do not fit beside the running app
    patch = mock.patch("serving.launch.handover.rollout_surge", return_value=(0, "the stop_first arm")) \
        if arm == "stop_first" else None
    if patch is not None:
        patch.start()
    try:
        app = deploy(opt, name=name, port=port, cpus=args.cpus, device="cpu", layout=args.layout, insitu="never",
                     calibrate="never")
        clients = Clients(app.url + "/predict", {"rows": rows}, args.clients)
        try:
            time.sleep(BEFORE_S)
            t_hand = time.monotonic()
            again = deploy(new, name=name, port=port, plan=app.plan, insitu="never", calibrate="never")
            t_returned = time.monotonic()
            deadline = time.monotonic() + 120
            while clients.first_answer_by(again.model_version) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            first_new = clients.first_answer_by(again.model_version)
            time.sleep(AFTER_S)
        finally:
            calls = clients.stop()
        surge_used = surge_of(name)
        again.shutdown(stop_ray=False)
    finally:
        if patch is not None:
            patch.stop()
    end = max(first_new or t_returned, t_returned) + AFTER_S
    expected = 0 if arm == "stop_first" else HANDOVER_SURGE_PERCENT
    if surge_used != expected:  # a silent fallback would mix the arms
        raise RuntimeError(f"the {arm} arm ran with max_surge_percent {surge_used}, not {expected}")
    during = [c for c in calls if c[1] >= t_hand and c[0] <= end]
    before = [c for c in calls if c[1] < t_hand]
    failed = [c for c in calls if c[2] != 200]
    plan = app.plan
    return {
        "arm": arm, "surge_percent_used": surge_used, "requests": len(calls), "failed": len(failed),
        "failures": sorted({c[4] or f"HTTP {c[2]}" for c in failed})[:5],
        "longest_gap_s": longest_gap_s(calls, t_hand, end),
        "p99_ms_before": p99_ms(before), "p99_ms_during": p99_ms(during),
        "redeploy_s": t_returned - t_hand,
        "first_new_answer_s": None if first_new is None else first_new - t_hand,
        "answered_by_old": sum(c[3] == app.model_version for c in calls),
        "answered_by_new": sum(c[3] == again.model_version for c in calls),
        "ingress_replicas": plan.ingress_replicas,
        "stage_replicas": {s.name: s.replicas for s in plan.stages},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    import pipelines
    from serving.core.constants import HANDOVER_SURGE_PERCENT
    from serving.launch.proxy import use_proxy
    from serving.model_app.deploy import free_port

    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    if len(opt.levels) < 2:
        raise SystemExit(f"{args.workload}: the optimizer kept the full pipeline, which has no certificate to "
                         "renew; pick a workload served as a cascade (toxic)")
    recertified = opt.recertify(workload.X_test, workload.y_test, seed=args.seed)
    if not recertified.certified:
        raise SystemExit(f"{args.workload}: the plan does not hold on its test rows; nothing to hand over")
    new = recertified.pipeline()
    rows = workload.X_test.iloc[:ROWS_PER_REQUEST].to_dict("records")
    use_proxy("haproxy")
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=2 * args.cpus + 2, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                result = one_hand_over(opt, new, arm, f"ho-{i}-{arm.replace('_', '-')}", port, args, rows)
                result["round"] = i
                print(f"round {i} {arm}: {result['failed']} of {result['requests']} failed, longest gap "
                      f"{result['longest_gap_s']:.2f} s, p99 {result['p99_ms_during']:.0f} ms during "
                      f"({result['p99_ms_before']:.0f} before)", flush=True)
                rounds.append(result)
    finally:
        serve.shutdown()
        ray.shutdown()

    def med(arm: str, key: str) -> float | None:
        values = [r[key] for r in rounds if r["arm"] == arm and r[key] is not None]
        return statistics.median(values) if values else None

    summary = {arm: {"failed_total": sum(r["failed"] for r in rounds if r["arm"] == arm),
                     "requests_total": sum(r["requests"] for r in rounds if r["arm"] == arm),
                     **{k: med(arm, k) for k in ("longest_gap_s", "p99_ms_before", "p99_ms_during", "redeploy_s",
                                                 "first_new_answer_s")}}
               for arm in ARMS}
    return {"workload": args.workload, "rounds": args.rounds, "clients": args.clients, "cpus": args.cpus,
            "layout": args.layout, "surge_percent": HANDOVER_SURGE_PERCENT, "arms": summary, "runs": rounds}


def markdown(r: dict[str, Any]) -> str:
    lines = [f"workload {r['workload']}, layout {r['layout']}, {r['cpus']:g} CPU per deploy, {r['clients']} "
             f"closed-loop clients, {r['rounds']} rounds (medians; failures summed)", "",
             "| arm | failed / requests | longest gap s | p99 ms before | p99 ms during | redeploy s | "
             "first new answer s |", "|---|---:|---:|---:|---:|---:|---:|"]

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for arm, a in r["arms"].items():
        lines.append(f"| {arm} | {a['failed_total']} / {a['requests_total']} | {f(a['longest_gap_s'], '.2f')} | "
                     f"{f(a['p99_ms_before'], '.0f')} | {f(a['p99_ms_during'], '.0f')} | {f(a['redeploy_s'], '.1f')} | "
                     f"{f(a['first_new_answer_s'], '.1f')} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return serving_main(parse_args, run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
