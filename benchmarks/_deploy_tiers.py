"""The tiers section of :mod:`benchmarks.deploy_cluster`: a tier plan made and served by
``deploy(pools=...)`` (Proteus, EuroSys'17; Tributary, ATC'18), preempted under load.

The cluster: the head is the reliable pool (``ondemand``, price 1 a replica; every ingress runs
there), two 1-CPU workers are two preemptible pools (``spot_0`` and ``spot_1``, price 0.3, each
``"preemptible": True``). Every node emulates a device (``--pool-ms-per-row``: a replica
holds each batch that many ms a row, whatever this machine's cores carry); by default the tiers
differ in price and in whether they can vanish, not in speed, and ``--tier-spot-ratios`` makes
the spot pools' devices that many times slower per stage (the LP then weighs a spot replica by
its measured rate). **Emulated**, and said so in the JSON. Prices are simulated.

``deploy(..., pools=..., rps=--tier-rps)`` times each stage's replica on each pool and the LP
buys the cheapest replicas that cover the rate at the planner's headroom and, with any one spot
pool lost, at 0.95 of what is left (:mod:`serving.planning.pools`). Beside it: what the same
rate costs on the reliable pool alone (the LP without the spot pools), and the plan's own
prediction of the rows/s left after each loss.

Then ``--tier-rounds`` rounds under open-loop Poisson load at ``--tier-rps`` over HTTP: spot_0's
node is given a preemption notice (Ray's drain API, as a cloud's notice reaches the autoscaler)
and removed ``NOTICE_S`` later, a fresh node joins spot_0 and its replicas run again; then
spot_1's node is removed without notice and comes back the same way. Per preemption: requests
sent in the ``BEFORE_S`` before and ``AFTER_S`` after it, failed ones (not answered 200), wrong
ones (probabilities not the pipeline's in process), the p99 before, and the recovery: the end of
the last 1-second window after the loss whose p99 (a failed request counting as ``SLO_MS`` x 60)
is over ``SLO_MS``. Also how long the pool took to serve again once its node was back.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any

import numpy as np

POOL_LABEL = "willump.io/pool"
RELIABLE = "ondemand"
SPOT = ("spot_0", "spot_1")
#: simulated prices per replica-hour
PRICE_RELIABLE = 1.0
PRICE_SPOT = 0.3
#: open-loop requests/s the plan is made for and loaded with
TIER_RPS = 20.0
#: rounds (each: one preemption with notice, one without)
TIER_ROUNDS = 3
#: seconds of load before a loss and after it; seconds between a notice and the node's removal
BEFORE_S = 4.0
AFTER_S = 12.0
NOTICE_S = 3.0
#: the latency the windowed p99 must get back under (ms) and the window (s)
SLO_MS = 500.0
WINDOW_S = 1.0
#: seconds a pool's replicas may take to run again on its fresh node
RESTORE_TIMEOUT_S = 180.0
#: logical CPUs a stage replica asks
STAGE_CPUS = 0.2
#: targets (issue 25)
RECOVERY_TARGET_S = 10.0


def _labels(pool: str, ms: tuple[float, float]) -> dict[str, str]:
    from serving.runtime.emulated_node import MS_PER_ROW_LABEL

    return {POOL_LABEL: pool, f"{MS_PER_ROW_LABEL}-cheap": f"{ms[0]:g}", f"{MS_PER_ROW_LABEL}-expensive": f"{ms[1]:g}"}


def tiers(opt: Any, requests: list, args) -> dict[str, Any]:
    """The section (module docstring); a failure is recorded, not raised."""
    from benchmarks.deploy_cluster import fresh_cluster

    ms = tuple(args.pool_ms_per_row)
    spot_ms = tuple(m * r for m, r in zip(ms, args.tier_spot_ratios, strict=True))
    try:
        with fresh_cluster(_labels(RELIABLE, ms), [_labels(SPOT[0], spot_ms), _labels(SPOT[1], spot_ms)]) \
                as (cluster, apps):
            return _measured(opt, requests, args, cluster, apps, ms, spot_ms)
    except Exception as exc:  # one section failing leaves the others to run
        return {"error": f"{type(exc).__name__}: {exc}"}


def _pool_specs(spot: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {RELIABLE: {"labels": {POOL_LABEL: RELIABLE}, "price": PRICE_RELIABLE}}
    for pool in SPOT:
        out[pool] = {"labels": {POOL_LABEL: pool}, "price": PRICE_SPOT, "preemptible": spot}
    return out


def reliable_cost(entry: dict[str, Any], target_rows_s: float, scale: dict[str, float]) -> float:
    """What the same rate costs on the reliable pool alone (the LP over that pool's measured rates
    and slots, at the planner's headroom)."""
    from serving.planning.hetero import ThroughputMatrix, plan_min_cost
    from serving.planning.planner import HEADROOM
    from serving.planning.pools import MIN_VISITS

    rates = {s: {RELIABLE: r[RELIABLE]} for s, r in entry["rates"].items()}
    matrix = ThroughputMatrix.from_dict(rates, {s: max(scale.get(s, 1.0), MIN_VISITS) for s in rates})
    plan = plan_min_cost(matrix, {RELIABLE: entry["slots"][RELIABLE]}, {RELIABLE: PRICE_RELIABLE}, target_rows_s,
                         utilization=HEADROOM)
    return plan.cost


def _measured(opt: Any, requests: list, args, cluster: Any, apps: dict[str, Any], ms: tuple,
              spot_ms: tuple) -> dict[str, Any]:
    from benchmarks._deploy_gears import request_bodies
    from benchmarks._deploy_pools import _plan
    from serving import deploy
    from tests.conftest import free_port

    plan = _plan(opt, args, None)
    for stage in plan.stages:
        stage.num_cpus = STAGE_CPUS
    apps["tiers"] = deploy(opt, name="tiers", host="127.0.0.1", port=free_port(), address=cluster.address, plan=plan,
                           artifact_share="object_store", insitu="never", pools=_pool_specs(True),
                           rps=args.tier_rps)
    app = apps["tiers"]
    entry = app.plan.pools
    target_rows_s = args.tier_rps * args.rows_per_request
    scale = {p.name: p.scale for p in app.plan.profiles}
    cost = sum(PRICE_RELIABLE if pool == RELIABLE else PRICE_SPOT
               for by_pool in entry["replicas"].values() for pool in by_pool for _ in range(by_pool[pool]))
    all_reliable = reliable_cost(entry, target_rows_s, scale)
    print(f"tiers: rows/s of one replica per (stage, pool): {entry['rates']}; replicas {entry['replicas']}; "
          f"predicted {entry['predicted_rows_s']:.0f} rows/s, after a loss {entry.get('after_loss_rows_s')}; "
          f"cost {cost:.2f} against {all_reliable:.2f} on the reliable pool alone (simulated prices)")
    bodies = request_bodies(requests)
    expected = [opt.predict_proba(r) for r in requests]
    url = app.url + "/predict"
    _load(url, bodies, expected, args.tier_rps, 5.0, args.seed, None)  # warm-up
    preemptions: list[dict[str, Any]] = []
    for r in range(args.tier_rounds):
        for pool, notice in ((SPOT[0], True), (SPOT[1], False)):
            event = _preempt(cluster, pool, notice)
            phase = _load(url, bodies, expected, args.tier_rps, BEFORE_S + AFTER_S, args.seed + 10 * r, event)
            phase.update({"round": r + 1, "pool": pool, "notice": notice, "removed_after_s": event.get("removed_after_s")})
            phase["restored_s"] = _restore(cluster, app.name, pool, spot_ms)
            preemptions.append(phase)
            print(f"tiers round {r + 1}: {pool} {'with' if notice else 'without'} notice: {phase['requests']} requests, "
                  f"{phase['failed']} failed, {phase['wrong']} wrong, p99 before {phase['p99_ms_before']:.0f} ms, "
                  f"recovery {phase['recovery_s']:.0f} s (p99 ms by second after the loss "
                  f"{phase['p99_ms_by_window']}); the pool served again {phase['restored_s']:.1f} s after its node "
                  "was back", flush=True)
    with_notice = [p for p in preemptions if p["notice"]]
    without = [p for p in preemptions if not p["notice"]]
    out: dict[str, Any] = {
        "emulated": True, "through": "serving.deploy", "ms_per_row": {"cheap": ms[0], "expensive": ms[1]},
        "spot_ms_per_row": {"cheap": spot_ms[0], "expensive": spot_ms[1]},
        "rps": args.tier_rps, "slo_ms": SLO_MS, "prices_per_replica_hour": {"reliable": PRICE_RELIABLE,
                                                                            "spot": PRICE_SPOT, "simulated": True},
        "rates": entry["rates"], "replicas": entry["replicas"], "predicted_rows_s": entry["predicted_rows_s"],
        "after_loss_rows_s": entry.get("after_loss_rows_s"), "cost": cost, "all_reliable_cost": all_reliable,
        "cost_vs_reliable": cost / all_reliable if all_reliable else None, "preemptions": preemptions,
        "wrong": sum(p["wrong"] for p in preemptions), "failed_with_notice": sum(p["failed"] for p in with_notice),
        "failed_without_notice": sum(p["failed"] for p in without),
        "recovery_s_without_notice": [p["recovery_s"] for p in without],
        "restored_s": statistics.median(p["restored_s"] for p in preemptions)}
    out["targets"] = {"0 wrong": out["wrong"] == 0, "0 failed with notice": out["failed_with_notice"] == 0,
                      f"recovery <= {RECOVERY_TARGET_S:g} s in every preemption without notice":
                          all(x <= RECOVERY_TARGET_S for x in out["recovery_s_without_notice"])}
    return out


def _node_of(cluster: Any, pool: str) -> Any:
    import ray

    ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n.get("Labels", {}).get(POOL_LABEL) == pool}
    for node in cluster.worker_nodes:
        if node.node_id in ids:
            return node
    raise ValueError(f"no live node carries the pool {pool!r}")


def _preempt(cluster: Any, pool: str, notice: bool) -> dict[str, Any]:
    """What the load thread does BEFORE_S into its phase: the pool's node given a preemption notice
    (drained; removed NOTICE_S later) or removed at once. The event's time is filled in by then."""
    event: dict[str, Any] = {"pool": pool}

    def act() -> None:
        import ray
        from ray.core.generated import autoscaler_pb2

        node = _node_of(cluster, pool)
        event["t"] = time.perf_counter()
        if notice:
            client = ray._private.worker.global_worker.gcs_client
            accepted, reason = client.drain_node(node.node_id, autoscaler_pb2.DrainNodeReason.Value(
                "DRAIN_NODE_REASON_PREEMPTION"), "the tiers benchmark's preemption notice",
                int(time.time() * 1000) + int(1000 * (NOTICE_S + 60)))
            event["drain_accepted"], event["drain_refused_because"] = bool(accepted), reason or None
            time.sleep(NOTICE_S)
        cluster.remove_node(node)
        event["removed_after_s"] = time.perf_counter() - event["t"]

    event["act"] = act
    return event


def _load(url: str, bodies: list[bytes], expected: list, rps: float, seconds: float, seed: int,
          event: dict[str, Any] | None) -> dict[str, Any]:
    """Open-loop Poisson load for ``seconds``; ``event['act']`` runs BEFORE_S in (in a thread)."""
    from benchmarks._deploy_gears import _drive
    from benchmarks._gears import arrivals

    times = arrivals(rps, seed, ((seconds, 1.0),))
    start = time.perf_counter()
    actor = None
    if event is not None:
        def delayed() -> None:
            time.sleep(BEFORE_S)
            event["act"]()
        actor = threading.Thread(target=delayed, daemon=True)
        actor.start()
    log = asyncio.run(_drive(url, bodies, times))
    if actor is not None:
        actor.join()
    if event is None:
        return {"requests": len(log)}
    return phase_outcome(log, event["t"] - start, expected)


def phase_outcome(log: list[dict[str, Any]], at: float, expected: list) -> dict[str, Any]:
    """A preemption phase's requests (``_drive``'s log: send time ``at`` seconds into the phase,
    latency, status, probabilities) around the loss ``at`` seconds in: failed, wrong, the p99
    before, and the recovery (module docstring)."""
    failed = [x for x in log if x.get("status") != 200]
    wrong = [x for x in log if x.get("status") == 200 and not np.allclose(x["proba"], expected[x["i"]], atol=1e-6)]
    before = [x["ms"] for x in log if x.get("status") == 200 and x["at"] < at]
    windows: dict[int, list[float]] = {}
    for x in log:
        if x["at"] >= at:
            ms = x["ms"] if x.get("status") == 200 else SLO_MS * 60
            windows.setdefault(int((x["at"] - at) // WINDOW_S), []).append(ms)
    bad = [w for w, v in windows.items() if np.percentile(v, 99) > SLO_MS]
    by_window = [round(float(np.percentile(windows[w], 99))) if w in windows else None
                 for w in range(max(windows, default=-1) + 1)]
    return {"requests": len(log), "failed": len(failed), "wrong": len(wrong), "p99_ms_by_window": by_window,
            "failures": sorted({str(x.get("status", x.get("error"))) for x in failed}),
            "p99_ms_before": float(np.percentile(before, 99)) if before else 0.0,
            "recovery_s": 0.0 if not bad else (max(bad) + 1) * WINDOW_S}


def _restore(cluster: Any, app: str, pool: str, ms: tuple) -> float:
    """A fresh node joins the lost pool; seconds until every deployment of the pool runs its
    replicas again."""
    from ray import serve

    t0 = time.perf_counter()
    cluster.add_node(num_cpus=1, labels=_labels(pool, ms))
    cluster.wait_for_nodes()
    while True:
        deployments = serve.status().applications[app].deployments
        mine = {name: d for name, d in deployments.items() if name.endswith(f"-{pool}")}
        if mine and all(d.replica_states.get("RUNNING", 0) >= 1 and not d.replica_states.get("STARTING")
                        and not d.replica_states.get("PENDING_MIGRATION") for d in mine.values()):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > RESTORE_TIMEOUT_S:
            raise TimeoutError(f"the {pool} replicas were not running again {RESTORE_TIMEOUT_S:g} s after its node "
                               "was back")
        time.sleep(0.25)


def summary(t: dict[str, Any]) -> str:
    recov = t["recovery_s_without_notice"]
    return (f"tiers: deploy(pools=...) with two preemptible pools at {t['rps']:g} requests/s: replicas "
            f"{t['replicas']}, cost {t['cost']:.2f} against {t['all_reliable_cost']:.2f} all-reliable "
            f"({t['cost_vs_reliable']:.2f}x, simulated prices); {len(t['preemptions'])} preemptions: {t['wrong']} wrong, "
            f"{t['failed_with_notice']} failed with notice, {t['failed_without_notice']} without; recovery without "
            f"notice {recov} s; pools served again {t['restored_s']:.1f} s (median) after their node was back; "
            f"targets {t['targets']} (emulated devices)")
