"""The shared-cluster mechanisms in the apps ``serving.deploy`` builds, against stock Ray Serve,
on three raylets of this machine.

    python -m benchmarks.deploy_cluster [--sections routing,hedging,autoscaling,pools,gears,autoscaling_gears,tiers]
                                        [--workload toxic]
                                        [--repeats 3]
                                        [--json PATH]

**routing**: the cluster (``ray.cluster_utils.Cluster``): the head (3 logical CPUs; every app's
ingress runs there) is the fast pool, two workers (1 CPU each) the slow pool. Every node carries
the label ``willump.io/emulated-slowdown``, an **emulated** device (this machine has one kind
of core): a stage replica holds each batch that many times its compute time, one batch at a
time; ``--fast-slowdown`` on the head (default 20: the stages' devices, not this machine's two
shared cores, bound the app, as accelerators would) and ``--pool-ratio`` times that on the workers
(default 3). Two apps of the same artifact
and the same plan (``--replicas`` replicas of each model stage, Serve spreading them over
the nodes), deployed by ``serving.deploy`` side by side:

* ``capacity``: ``router="capacity"`` (serving.runtime.routing.CapacityRouter) and the bound
  on a silent replica (``lost_after_s``, default 2 s);
* ``stock_serve``: ``router="serve"`` (Ray Serve's power of two choices) and no bound.

Per round, the order of the apps alternating, each app alone under load; every round's
``steady`` phase first, then every round's ``silent`` one, each followed by ``SETTLE_S``:

* ``steady``: ``--clients`` closed-loop clients for ``--seconds``: rows/s, p50, p99.
* ``silent``: the same load; 2 s in, the cheap stage's replica on the head is frozen
  (SIGSTOP: Ray still sees it alive, it answers nothing) for ``--freeze-s`` seconds, then
  resumed: failures, p99 and the slowest request of the phase.

Medians over rounds and the ratios capacity / stock_serve are printed and written; the
placement of each app's replicas (pool per replica) is recorded.

**hedging** (:mod:`benchmarks._deploy_hedging`): every node the same emulated device (``--hedge-slowdown``, 4x), one
worker also a straggler (``--straggle-factor`` x on ``--straggle-share`` of its batches); two
apps, ``hedging=True`` and no copies at all; per round, alternating, open-loop Poisson load at
``--hedge-rate`` for ``--hedge-requests`` requests per phase, the straggler off and on: p99s,
and the extra work hedging costs (rows computed per request answered, over the unhedged app's).

**pools** (:mod:`benchmarks._deploy_pools`): the model stages on two emulated node pools that
differ 2-4x per stage, placed by ``deploy(pools=...)`` (the LP's replicas per (stage, pool), a
deployment per pool) against stock Serve given the same replicas per stage: rows/s, and the LP's
prediction beside the measured rate.

**gears** (:mod:`benchmarks._deploy_gears`): a 3x burst served by a ``gears="adaptive"`` app
and by the same app with one gear, each stage an emulated device of a fixed speed: p99 against
the SLO, accuracy against the worst certified bound.

**autoscaling** (:mod:`benchmarks._deploy_autoscale`): the planner as Serve's autoscaler against
Serve's default policy on a bursty trace (x1 -> x4 -> x1), one emulated device of a fixed speed:
SLO violations and replica-seconds.

**autoscaling_gears** (:mod:`benchmarks._deploy_autoscale_gears`): a gear step as the first
answer to a burst and the replicas for the deployed gear as the lasting one (the planner with
``gears="adaptive"``), against the planner with one gear and Serve's default policy, on the same
bursty trace, the expensive stage the bottleneck: SLO violations, replica-seconds, requests per
gear and the accuracy given up.

**tiers** (:mod:`benchmarks._deploy_tiers`): a tier plan made and served by ``deploy(pools=...)``
on a reliable pool and two preemptible ones (emulated devices, of one speed unless
``--tier-spot-ratios`` slows the spot pools' down; simulated prices),
each spot pool's node preempted under load with notice and without: its cost against the
reliable pool alone, wrong and failed requests, the windowed p99's recovery.

Rates here are this machine's, all processes sharing its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

ROUTING_APPS = {"capacity": {"router": "capacity"}, "stock_serve": {"router": "serve", "lost_after_s": None}}
#: the head's emulated device time over compute time: large enough that the stages' devices, not
#: this machine's two shared cores (ingress, HTTP, Ray), bound the app (at 4x the cheap stage's
#: replicas could take about 4x the rows the machine's CPUs let through, so no routing mattered)
FAST_SLOWDOWN = 20.0
POOL_RATIO = 3.0
SLOW_NODES = 2
REPLICAS = 3
CLIENTS = 8
SECONDS = 10.0
FREEZE_S = 8.0
ROWS_PER_REQUEST = 32
#: seconds after a silent phase before the next phase starts (stock Serve's stuck calls end at
#: the 30 s default deadline)
SETTLE_S = 35.0
#: seconds into the silent phase when the replica is frozen
FREEZE_AFTER_S = 2.0
SECTIONS = ("routing", "hedging", "autoscaling", "pools", "gears", "autoscaling_gears", "tiers")
#: logical CPUs of the head (the workers have 1): every app's ingress asks INGRESS_CPUS, more
#: than a worker has, so each app's ingress runs on the head, not wherever Serve puts it first
HEAD_CPUS = 3
INGRESS_CPUS = 1.1
#: logical CPUs of each model-stage replica deploy_apps places
STAGE_CPUS = 0.2


def start_cluster(head_labels: dict[str, str], worker_labels: list[dict[str, str]], head_cpus: float = HEAD_CPUS):
    """A head (``head_cpus`` logical CPUs) and 1-CPU workers on this machine, with these node
    labels; Ray joined."""
    import ray
    from ray.cluster_utils import Cluster

    from tests.conftest import free_port

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from serving.core.local_ray import ray_system_config

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "include_dashboard": True, "dashboard_port": free_port(), "labels": head_labels,
        "_system_config": ray_system_config()})
    for labels in worker_labels:
        cluster.add_node(num_cpus=1, labels=labels)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def deploy_apps(opt: Any, cluster: Any, apps: dict[str, dict[str, Any]], args, *, replicas: int | None = None,
                stage_cpus: float = STAGE_CPUS) -> dict[str, Any]:
    """Each app: the same artifact and plan (``replicas``, default ``--replicas``, replicas of
    every model stage at ``stage_cpus`` logical CPUs, one ingress), with its own deploy options;
    with ``--audit-rate`` above 0, the monitor (no attributes) and that live audit, as a user's
    app with the monitor runs (the audit's full-pipeline calls load the stage that holds it)."""
    from serving import deploy
    from serving.launch.config import plan_offline
    from tests.conftest import free_port

    out = {}
    for name, options in apps.items():
        plan = plan_offline(opt, cpus=4, rows_per_request=args.rows_per_request, rps=None, p99_ms=None,
                            layout="staged", monitor=None)
        plan.ingress_replicas, plan.ingress_cpus = 1, INGRESS_CPUS  # only the head holds it: the same for every app
        for stage in plan.stages:
            stage.replicas, stage.num_cpus = args.replicas if replicas is None else replicas, stage_cpus
        audited = dict(monitor=dict(attributes=[], pane_seconds=5.0), audit_rate=args.audit_rate) \
            if getattr(args, "audit_rate", 0.0) else {}
        out[name] = deploy(opt, name=name, host="127.0.0.1", port=free_port(), address=cluster.address, plan=plan,
                           artifact_share="object_store", insitu="never", **audited, **options)
    return out


@contextlib.contextmanager
def fresh_cluster(head_labels: dict[str, str], worker_labels: list[dict[str, str]],
                  head_cpus: float = HEAD_CPUS) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A fresh cluster (:func:`start_cluster`) and a dict for the apps deployed on it: they, Serve,
    Ray and the cluster are shut down on the way out."""
    import ray
    from ray import serve

    cluster = start_cluster(head_labels, worker_labels, head_cpus)
    deployed: dict[str, Any] = {}
    try:
        yield cluster, deployed
    finally:
        for app in deployed.values():
            try:
                app.shutdown(stop_ray=False)
            except Exception as exc:  # the cluster goes anyway
                print(f"shutdown: {exc}")
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def with_cluster(head_labels: dict[str, str], worker_labels: list[dict[str, str]], opt: Any,
                 apps: dict[str, dict[str, Any]], args, run: Callable[[dict[str, Any]], dict[str, Any]],
                 head_cpus: float = HEAD_CPUS, **deploy_kw: Any) -> dict:
    """``run(apps)`` on a fresh cluster (the apps deployed by :func:`deploy_apps`, given
    ``deploy_kw``); a failure is recorded (with its cause), not raised."""
    try:
        with fresh_cluster(head_labels, worker_labels, head_cpus) as (cluster, deployed):
            deployed.update(deploy_apps(opt, cluster, apps, args, **deploy_kw))
            return run(deployed)
    except Exception as exc:  # one section failing leaves the others to run
        return {"error": f"{type(exc).__name__}: {exc}"}


def replicas_of(app: str, deployment: str) -> list[Any]:
    """Alive replica actors of one deployment (Ray's state API)."""
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    return [a for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000, detail=True)
            if a.class_name == f"ServeReplica:{app}:{deployment}"]


def placement(app: str, head: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stage in ("ingress", "cheap", "expensive"):
        out[stage] = sorted("fast" if a.node_id == head else "slow" for a in replicas_of(app, f"{app}-{stage}"))
    return out


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


async def _silent(url: str, payloads: list[bytes], app: str, head: str, args) -> dict[str, Any]:
    from serving.measure.loadgen import closed_loop

    frozen = next((a for a in replicas_of(app, f"{app}-cheap") if a.node_id == head), None)
    if frozen is None:
        return {"error": "no cheap replica on the head node"}

    async def freeze() -> None:
        await asyncio.sleep(FREEZE_AFTER_S)
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(args.freeze_s)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)

    load = closed_loop(url, payloads, args.rows_per_request, clients=args.clients, duration=args.seconds,
                       max_requests=10**9)
    out, _ = await asyncio.gather(load, freeze())
    return out


def routing(opt: Any, payloads: list[bytes], args) -> dict[str, Any]:
    from serving.measure.loadgen import closed_loop
    from serving.runtime.emulated_node import SLOWDOWN_LABEL

    def run(apps: dict[str, Any]) -> dict[str, Any]:
        import ray

        head = ray.get_runtime_context().get_node_id()
        result: dict[str, Any] = {"baseline": "stock_serve", "emulated": True,
                                  "fast_slowdown": args.fast_slowdown, "pool_ratio": args.pool_ratio,
                                  "placement": {name: placement(name, head) for name in apps}}
        print(f"routing: placement {result['placement']}")
        # every steady phase first, then every silent one: a replica frozen in a silent phase
        # leaves calls to time out for tens of seconds afterwards under stock Serve, which would
        # count against whichever steady phase came next
        rounds: dict[str, list] = {name: [] for name in apps}
        for r in range(args.repeats):
            for name in (list(apps) if r % 2 == 0 else list(reversed(apps))):
                steady = asyncio.run(closed_loop(apps[name].url + "/predict", payloads, args.rows_per_request,
                                                 clients=args.clients, duration=args.seconds, max_requests=10**9))
                rounds[name].append({"steady": steady})
                print(f"routing round {r + 1} {name:12s} steady {steady['rows_per_s']:7.0f} rows/s p99 "
                      f"{steady['p99_ms']:7.1f} ms ({steady['errors']} failed)")
        for r in range(args.repeats):
            for name in (list(apps) if r % 2 == 0 else list(reversed(apps))):
                silent = asyncio.run(_silent(apps[name].url + "/predict", payloads, name, head, args))
                time.sleep(SETTLE_S)  # calls a frozen replica held end (answered or timed out) first
                rounds[name][r]["silent"] = silent
                print(f"routing round {r + 1} {name:12s} silent replica: {silent.get('errors')} failed "
                      f"{silent.get('error_kinds')}, p99 {silent.get('p99_ms') or float('nan'):7.1f} ms, slowest "
                      f"{silent.get('max_ms') or float('nan'):7.1f} ms")
        result["rounds"] = rounds
        for name, rs in rounds.items():
            result[name] = {
                "rows_per_s": median([x["steady"]["rows_per_s"] for x in rs]),
                "p50_ms": median([x["steady"]["p50_ms"] for x in rs]),
                "p99_ms": median([x["steady"]["p99_ms"] for x in rs]),
                "silent_failed": sum(x["silent"].get("errors", 0) for x in rs),
                "silent_p99_ms": median([x["silent"].get("p99_ms") for x in rs]),
                "silent_max_ms": median([x["silent"].get("max_ms") for x in rs]),
            }
        cap, base = result["capacity"], result["stock_serve"]
        result["rows_per_s_over_stock"] = cap["rows_per_s"] / base["rows_per_s"]
        result["silent_p99_over_stock"] = cap["silent_p99_ms"] / base["silent_p99_ms"]
        return result

    slow = args.fast_slowdown * args.pool_ratio
    return with_cluster({SLOWDOWN_LABEL: f"{args.fast_slowdown:g}"},
                        [{SLOWDOWN_LABEL: f"{slow:g}"}] * SLOW_NODES, opt, ROUTING_APPS, args, run)


def _pair(value: str) -> tuple[float, float]:
    """CHEAP,EXPENSIVE: two positive numbers."""
    try:
        cheap, expensive = (float(x) for x in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"two numbers, CHEAP,EXPENSIVE, got {value!r}") from None
    if not min(cheap, expensive) > 0:
        raise argparse.ArgumentTypeError(f"two numbers > 0, got {value!r}")
    return cheap, expensive


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks._deploy_autoscale import (
        AUTOSCALE_MAX,
        AUTOSCALE_MS_PER_ROW,
        AUTOSCALE_PHASE_S,
        AUTOSCALE_RATE,
        SLO_MS,
        autoscaling,
    )
    from benchmarks._deploy_hedging import (
        HEDGE_MS_PER_ROW,
        HEDGE_RATE,
        HEDGE_REQUESTS,
        HEDGE_SLOWDOWN,
        STRAGGLE_FACTOR,
        STRAGGLE_SHARE,
        hedging,
    )
    from benchmarks._deploy_pools import (
        FAST_DEVICES,
        POOL_CLIENTS,
        POOL_MS_PER_ROW,
        POOL_RATIOS,
        SLOW_DEVICES,
        pools,
    )
    from benchmarks._deploy_tiers import TIER_ROUNDS, TIER_RPS
    from benchmarks._gears import GEAR_SLO_MS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {SECTIONS}")
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--n-rows", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows-per-request", type=int, default=ROWS_PER_REQUEST)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--freeze-s", type=float, default=FREEZE_S)
    parser.add_argument("--fast-slowdown", type=float, default=FAST_SLOWDOWN)
    parser.add_argument("--pool-ratio", type=float, default=POOL_RATIO)
    parser.add_argument("--replicas", type=int, default=REPLICAS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hedge-rate", type=float, default=HEDGE_RATE, help="open-loop requests/s")
    parser.add_argument("--hedge-slowdown", type=float, default=HEDGE_SLOWDOWN,
                        help="every node's emulated device time over compute time in the hedging section, at least")
    parser.add_argument("--hedge-ms-per-row", type=_pair, default=HEDGE_MS_PER_ROW, metavar="CHEAP,EXPENSIVE",
                        help="every node's emulated device milliseconds a row per stage in the hedging section")
    parser.add_argument("--hedge-requests", type=int, default=HEDGE_REQUESTS, help="requests per hedging phase")
    parser.add_argument("--hedge-compare-backoff", action="store_true",
                        help="a third app in the hedging section, hedged with the delay's backoff off")
    parser.add_argument("--straggle-factor", type=float, default=STRAGGLE_FACTOR)
    parser.add_argument("--straggle-share", type=float, default=STRAGGLE_SHARE)
    parser.add_argument("--autoscale-rate", type=float, default=AUTOSCALE_RATE,
                        help="the bursty trace's base rate (requests/s); the burst is 4x")
    parser.add_argument("--autoscale-phase-s", type=float, default=AUTOSCALE_PHASE_S, help="seconds per trace phase")
    parser.add_argument("--autoscale-ms-per-row", type=float, default=AUTOSCALE_MS_PER_ROW,
                        help="the autoscaling section's emulated device: ms a row, whatever the machine")
    parser.add_argument("--autoscale-max", type=int, default=AUTOSCALE_MAX, help="most replicas per model stage")
    parser.add_argument("--autoscale-rounds", type=int, default=2, help="traces per app (order alternating)")
    parser.add_argument("--slo-ms", type=float, default=SLO_MS, help="the autoscaling section's latency SLO")
    parser.add_argument("--autoscale-gears-apps", default="planner_gears,planner_served_gear,planner_cheapest_gear,planner,default",
                        help="the autoscaling_gears section's apps, comma-separated (default %(default)s)")
    parser.add_argument("--pool-ratios", type=_pair, default=POOL_RATIOS, metavar="CHEAP,EXPENSIVE",
                        help="the pools section's slow pool: device time over the fast pool's, per stage")
    parser.add_argument("--pool-ms-per-row", type=_pair, default=POOL_MS_PER_ROW, metavar="CHEAP,EXPENSIVE",
                        help="the pools section's fast pool: its emulated device's ms a row, per stage")
    parser.add_argument("--pool-clients", type=int, default=POOL_CLIENTS, help="closed-loop clients, pools section")
    parser.add_argument("--fast-devices", type=int, default=FAST_DEVICES, help="replica slots of the fast pool")
    parser.add_argument("--slow-devices", type=int, default=SLOW_DEVICES, help="replica slots of the slow pool")
    parser.add_argument("--gear-slo-ms", type=float, default=GEAR_SLO_MS, help="the p99 target the gears hold")
    parser.add_argument("--tier-rps", type=float, default=TIER_RPS,
                        help="the tiers section's rate: what the tier plan is made for and loaded with (requests/s)")
    parser.add_argument("--tier-rounds", type=int, default=TIER_ROUNDS,
                        help="the tiers section's rounds (each: a preemption with notice and one without)")
    parser.add_argument("--tier-spot-ratios", type=_pair, default=(1.0, 1.0), metavar="CHEAP,EXPENSIVE",
                        help="the tiers section's spot pools: device time over the reliable pool's, per stage "
                             "(default: the same devices)")
    parser.add_argument("--audit-rate", type=float, default=0.0,
                        help="deploy every app with the monitor and this live audit rate (0: no monitor)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or set(sections) - set(SECTIONS):
        parser.error(f"--sections: a comma-separated list of {SECTIONS}, got {args.sections!r}")
    from benchmarks._deploy_autoscale_gears import APPS as GEARED_APPS

    geared_apps = [a.strip() for a in args.autoscale_gears_apps.split(",") if a.strip()]
    if not geared_apps or set(geared_apps) - set(GEARED_APPS):
        parser.error(f"--autoscale-gears-apps: a comma-separated list of {list(GEARED_APPS)}, got "
                     f"{args.autoscale_gears_apps!r}")
    if min(args.rows_per_request, args.clients, args.seconds, args.freeze_s, args.replicas, args.repeats,
           args.hedge_rate, args.hedge_requests, args.autoscale_rate, args.autoscale_phase_s, args.autoscale_max,
           args.autoscale_rounds, args.slo_ms, args.autoscale_ms_per_row, args.fast_devices,
           args.slow_devices, args.pool_clients, args.gear_slo_ms, args.tier_rps, args.tier_rounds) <= 0 \
            or min(args.fast_slowdown, args.pool_ratio, args.straggle_factor, args.hedge_slowdown,
                   *args.pool_ratios, *args.tier_spot_ratios) < 1 \
            or not 0 < args.straggle_share <= 1:
        parser.error("counts, rates and durations must be positive; --fast-slowdown, --pool-ratio(s), "
                     "--tier-spot-ratios and --straggle-factor >= 1; --straggle-share in (0, 1]")
    sys.stdout.reconfigure(line_buffering=True)

    import pipelines
    from serving.measure.loadgen import payloads as make_payloads

    t0 = time.perf_counter()
    workload = pipelines.build(args.workload, seed=args.seed, n_rows=args.n_rows)
    opt = workload.optimize(verbose=False)
    payloads, _ = make_payloads(workload.X_test, args.rows_per_request, limit=200)
    print(f"benchmarks.deploy_cluster: optimized {args.workload} in {time.perf_counter() - t0:.1f}s; "
          f"{len(payloads)} requests of {args.rows_per_request} rows; load {os.getloadavg()[0]:.2f}")
    result: dict[str, Any] = {"baseline": "stock_serve", "workload": args.workload, "clients": args.clients,
                              "seconds": args.seconds, "freeze_s": args.freeze_s, "repeats": args.repeats,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": os.getloadavg()[0]}
    if "routing" in sections:
        result["routing"] = routing(opt, payloads, args)
    if "hedging" in sections:
        result["hedging"] = hedging(opt, payloads, args)
    if "autoscaling" in sections:
        result["autoscaling"] = autoscaling(opt, payloads, args)
    if "pools" in sections:
        result["pools"] = pools(opt, payloads, args)
    if "gears" in sections or "autoscaling_gears" in sections:
        from benchmarks._deploy_autoscale_gears import autoscaling_gears
        from benchmarks._deploy_gears import gears
        from benchmarks._gears import geared_workload

        geared, X, y = geared_workload(args)
        rpr = args.rows_per_request
        count = min(len(X) // rpr, 200)
        requests = [X.iloc[i * rpr:(i + 1) * rpr].reset_index(drop=True) for i in range(count)]
        labels = [y[i * rpr:(i + 1) * rpr] for i in range(count)]
        if "gears" in sections:
            result["gears"] = gears(geared, requests, labels, args)
        if "autoscaling_gears" in sections:
            result["autoscaling_gears"] = autoscaling_gears(geared, requests, labels, args)
    if "tiers" in sections:
        from benchmarks._deploy_tiers import tiers

        rpr = args.rows_per_request
        frames = [workload.X_test.iloc[i * rpr:(i + 1) * rpr].reset_index(drop=True)
                  for i in range(min(len(workload.X_test) // rpr, 200))]
        result["tiers"] = tiers(opt, frames, args)
    result["load_after"] = os.getloadavg()[0]
    r = result.get("routing", {})
    if "capacity" in r:
        for name in ROUTING_APPS:
            m = r[name]
            print(f"routing {name:12s}: {m['rows_per_s']:.0f} rows/s, p50 {m['p50_ms']:.1f} ms, p99 {m['p99_ms']:.1f} "
                  f"ms; a replica frozen {args.freeze_s:g} s: {m['silent_failed']} failed, p99 "
                  f"{m['silent_p99_ms']:.1f} ms, slowest {m['silent_max_ms']:.1f} ms (medians of {args.repeats})")
        print(f"routing: capacity over stock Serve {r['rows_per_s_over_stock']:.2f}x rows/s; silent-replica p99 "
              f"{r['silent_p99_over_stock']:.2f}x (emulated pools: {args.fast_slowdown:g}x and "
              f"{args.fast_slowdown * args.pool_ratio:g}x compute time)")
    elif r:
        print(f"routing failed: {r.get('error')}")
    import importlib

    # section -> (its module, a field only a finished run has)
    for section, (module, done) in {"hedging": ("_deploy_hedging", "p99_ms_jitter_hedged"),
                                    "autoscaling": ("_deploy_autoscale", "replica_seconds"),
                                    "gears": ("_deploy_gears", "targets"),
                                    "autoscaling_gears": ("_deploy_autoscale_gears", "rounds"),
                                    "pools": ("_deploy_pools", "rows_per_s_over_stock"),
                                    "tiers": ("_deploy_tiers", "targets")}.items():
        out = result.get(section, {})
        if done in out:
            print(importlib.import_module(f"benchmarks.{module}").summary(out))
        elif out:
            print(f"{section} failed: {out.get('error')}")
    print(f"load average {result['load_before']:.2f} before, {result['load_after']:.2f} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=float)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
