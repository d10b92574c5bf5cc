"""The pools section of :mod:`benchmarks.deploy_cluster`: a cascade's model stages placed on two
node pools by ``deploy(pools=...)`` against stock Ray Serve given the same replicas.

The cluster: the head is the fast pool (every app's ingress runs there), two 1-CPU workers the
slow pool. Every node emulates a device of a fixed speed per stage
(``willump.io/emulated-ms-per-row-<stage>``: a replica holds each batch at least that many ms a
row, one batch at a time, whatever this machine's cores carry): on the fast pool
``--pool-ms-per-row`` (2 ms a row for the cheap stage, 4 for the expensive one), on the slow
pool ``--pool-ratios`` (2 and 4) times that: pools that differ 2-4x per stage, as a GPU speeds a
deep model more than a TF-IDF level. **Emulated**, and said so in the JSON. (A device that is a
multiple of the compute time, as the routing section's, is as slow as the machine is busy: a
prediction from rates measured on an idle pool cannot hold there.)

Two apps of the same artifact and batching (layout "staged": both model stages are deployments):

* ``pools``: ``deploy(pools={"fast": ..., "slow": ...})`` with ``--fast-devices`` and
  ``--slow-devices`` replica slots (``max_replicas``): each stage's replica timed on each pool,
  the LP's replicas per (stage, pool), a deployment per (stage, pool), the ingress splitting each
  stage's calls over its pools by expected wait;
* ``stock_serve``: what a heterogeneity-agnostic planner gives stock Serve on the same devices
  (:func:`serving.planning.hetero.plan_agnostic`: replicas per stage sized on the pools' mean
  rates, over the same slots), one deployment per stage (Serve spreads the replicas over the
  nodes), ``router="serve"`` (power of two choices).

Per round (order alternating) each app alone under ``--pool-clients`` closed-loop clients for
``--seconds``: rows/s, p50, p99 and failures; medians; the LP's predicted rows/s beside the
pools app's measured rows/s.
"""

from __future__ import annotations

import asyncio
from typing import Any

POOL_LABEL = "willump.io/pool"
#: the fast pool's device: ms a row for the cheap and the expensive stage
POOL_MS_PER_ROW = (2.0, 4.0)
#: the slow pool's device time over the fast pool's, for the cheap and the expensive stage
POOL_RATIOS = (2.0, 4.0)
#: replica slots each pool offers the pools app (its devices)
FAST_DEVICES = 2
SLOW_DEVICES = 4
#: closed-loop clients: enough that calls merge into full batches and the devices, not the
#: requests in flight, bound the rate (with 8, each call carried about one request's rows)
POOL_CLIENTS = 64
#: logical CPUs a stage replica asks (both apps' replicas fit the nodes side by side)
STAGE_CPUS = 0.2
#: targets (issue 25): rows/s over stock Serve's, and measured within this share of the LP's prediction
OVER_STOCK_TARGET = 1.3
WITHIN_LP = 0.25


def _labels(ms_cheap: float, ms_expensive: float, pool: str) -> dict[str, str]:
    from serving.runtime.emulated_node import MS_PER_ROW_LABEL

    return {POOL_LABEL: pool, f"{MS_PER_ROW_LABEL}-cheap": f"{ms_cheap:g}",
            f"{MS_PER_ROW_LABEL}-expensive": f"{ms_expensive:g}"}


def _plan(opt: Any, args, replicas: dict[str, int] | None) -> Any:
    from benchmarks.deploy_cluster import INGRESS_CPUS
    from serving.launch.config import plan_offline

    plan = plan_offline(opt, cpus=4, rows_per_request=args.rows_per_request, rps=None, p99_ms=None,
                        layout="staged", monitor=None)
    plan.ingress_replicas, plan.ingress_cpus = 1, INGRESS_CPUS  # only the head holds it
    for stage in plan.stages:
        stage.num_cpus = STAGE_CPUS
        stage.replicas = replicas[stage.name] if replicas else stage.replicas
    return plan


def _placement(app: str, deployments: list[str], head: str) -> dict[str, list[str]]:
    from benchmarks.deploy_cluster import replicas_of

    return {d: sorted("fast" if a.node_id == head else "slow" for a in replicas_of(app, d)) for d in deployments}


def agnostic_replicas(entry: dict[str, Any], scale: dict[str, float]) -> dict[str, int]:
    """Replicas per stage a heterogeneity-agnostic planner sizes on the same slots (the pools'
    mean rates; serving.planning.hetero.plan_agnostic)."""
    from serving.planning.hetero import ThroughputMatrix, plan_agnostic

    matrix = ThroughputMatrix.from_dict(entry["rates"], {s: scale.get(s, 1.0) for s in entry["rates"]})
    out: dict[str, int] = {}
    for (stage, _), n in plan_agnostic(matrix, entry["slots"]).replicas.items():
        out[stage] = out.get(stage, 0) + n
    return out


def pools(opt: Any, payloads: list[bytes], args) -> dict[str, Any]:
    from benchmarks.deploy_cluster import fresh_cluster

    cheap_ms, expensive_ms = args.pool_ms_per_row
    cheap_ratio, expensive_ratio = args.pool_ratios
    try:
        with fresh_cluster(_labels(cheap_ms, expensive_ms, "fast"),
                           [_labels(cheap_ms * cheap_ratio, expensive_ms * expensive_ratio, "slow")] * 2) as (
                cluster, apps):
            return _measured(opt, payloads, args, cluster, apps)
    except Exception as exc:  # one section failing leaves the others to run
        return {"error": f"{type(exc).__name__}: {exc}"}


def _measured(opt: Any, payloads: list[bytes], args, cluster: Any, apps: dict[str, Any]) -> dict[str, Any]:
    import ray

    from benchmarks.deploy_cluster import median
    from serving import deploy
    from serving.measure.loadgen import closed_loop
    from tests.conftest import free_port

    cheap_ms, expensive_ms = args.pool_ms_per_row
    cheap_ratio, expensive_ratio = args.pool_ratios
    pool_specs = {"fast": {"labels": {POOL_LABEL: "fast"}, "max_replicas": args.fast_devices},
                  "slow": {"labels": {POOL_LABEL: "slow"}, "max_replicas": args.slow_devices}}
    apps["pools"] = deploy(opt, name="pools", host="127.0.0.1", port=free_port(), address=cluster.address,
                           plan=_plan(opt, args, None), artifact_share="object_store", insitu="never",
                           pools=pool_specs)
    entry = apps["pools"].plan.pools
    totals = agnostic_replicas(entry, {p.name: p.scale for p in apps["pools"].plan.profiles})
    apps["stock_serve"] = deploy(opt, name="stock_serve", host="127.0.0.1", port=free_port(),
                                 address=cluster.address, plan=_plan(opt, args, totals),
                                 artifact_share="object_store", insitu="never", router="serve",
                                 lost_after_s=None)
    head = ray.get_runtime_context().get_node_id()
    placed = {
        "pools": _placement("pools", [f"pools-{s}-{p}" for s, by in entry["replicas"].items() for p in by], head),
        "stock_serve": _placement("stock_serve", [f"stock_serve-{s}" for s in totals], head)}
    print(f"pools: rows/s of one replica per (stage, pool), measured there: {entry['rates']}")
    print(f"pools: LP replicas {entry['replicas']} (predicts {entry['predicted_rows_s']:.0f} rows/s); "
          f"placed {placed}")
    for app in apps.values():  # warm up: a fresh app's first seconds are not its steady state
        asyncio.run(closed_loop(app.url + "/predict", payloads, args.rows_per_request, clients=args.pool_clients,
                                duration=min(args.seconds, 5.0), max_requests=10**9))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in apps}
    for r in range(args.repeats):
        for name in (list(apps) if r % 2 == 0 else list(reversed(apps))):
            out = asyncio.run(closed_loop(apps[name].url + "/predict", payloads, args.rows_per_request,
                                          clients=args.pool_clients, duration=args.seconds, max_requests=10**9))
            out.pop("by_level", None)
            rounds[name].append(out)
            print(f"pools round {r + 1} {name:12s} {out['rows_per_s']:7.0f} rows/s p50 {out['p50_ms']:7.1f} ms "
                  f"p99 {out['p99_ms']:7.1f} ms ({out['errors']} failed)")
    result: dict[str, Any] = {
        "baseline": "stock_serve", "emulated": True, "clients": args.pool_clients,
        "fast_ms_per_row": {"cheap": cheap_ms, "expensive": expensive_ms},
        "pool_ratios": {"cheap": cheap_ratio, "expensive": expensive_ratio},
        "devices": {"fast": args.fast_devices, "slow": args.slow_devices},
        "rates": entry["rates"], "replicas": entry["replicas"], "stock_replicas": totals, "placement": placed,
        "predicted_rows_s": entry["predicted_rows_s"], "rounds": rounds}
    for name, rs in rounds.items():
        result[name] = {"rows_per_s": median([x["rows_per_s"] for x in rs]),
                        "p50_ms": median([x["p50_ms"] for x in rs]), "p99_ms": median([x["p99_ms"] for x in rs]),
                        "failed": sum(x["errors"] for x in rs)}
    ratios = [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(rounds["pools"], rounds["stock_serve"],
                                                                  strict=True)]
    result["rows_per_s_over_stock"] = median(ratios)
    result["measured_over_predicted"] = result["pools"]["rows_per_s"] / entry["predicted_rows_s"]
    result["targets"] = {
        f"over_stock_{OVER_STOCK_TARGET:g}x": result["rows_per_s_over_stock"] >= OVER_STOCK_TARGET,
        f"within_{WITHIN_LP:.0%}_of_lp": abs(result["measured_over_predicted"] - 1) <= WITHIN_LP}
    return result


def summary(p: dict[str, Any]) -> str:
    a, b = p["pools"], p["stock_serve"]
    return (f"pools: deploy(pools=...) {a['rows_per_s']:.0f} rows/s (p99 {a['p99_ms']:.1f} ms, {a['failed']} failed) "
            f"against stock Serve on the same devices {b['rows_per_s']:.0f} rows/s (p99 {b['p99_ms']:.1f} ms, "
            f"{b['failed']} failed): {p['rows_per_s_over_stock']:.2f}x; the LP predicted {p['predicted_rows_s']:.0f} "
            f"rows/s, measured {p['measured_over_predicted']:.2f}x of it; replicas {p['replicas']}; targets "
            f"{p['targets']} (emulated pools; medians of {len(p['rounds']['pools'])} rounds)")
