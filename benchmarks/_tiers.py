"""The tiers section of ``python -m benchmarks.cluster`` (``--only preemption``): the tier
planner's cost against all-reliable (Proteus / Tributary) on the heterogeneity section's
measured rates, and its plan deployed on transient pools (one per slow node), preempted under
open-loop load with notice (drained first) and without; wrong and failed requests, the windowed
p99's recovery under the SLO, and how long a lost pool takes to come back. Prices are simulated.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from serving.emulation.hetero_app import DeviceEmulation, deploy_hetero, key_deployment
from serving.measure.loadgen import poisson_calls

#: tiers (planner only): simulated prices per device-hour, transient pools (the two slow nodes)
#: and the target as a share of the aware plan's predicted rate
PRICE_RELIABLE = 1.0
PRICE_TRANSIENT = 0.3
PRICES = {"reliable": PRICE_RELIABLE, "transient": PRICE_TRANSIENT, "simulated": True}
TIER_TARGET_SHARE = 0.5
#: preemption under load: open-loop rate (requests/s), seconds of load before and after each
#: node removal, the SLO the windowed p99 must get back under, the window (s), request timeout
PREEMPT_RATE = 15.0
#: a transient pool holds its node's devices at this share each (so 1/PREEMPT_SHARE replicas per device)
PREEMPT_SHARE = 0.5
PREEMPT_BEFORE_S = 4.0
PREEMPT_AFTER_S = 12.0
SLO_MS = 500.0
RECOVERY_WINDOW_S = 1.0
REQUEST_TIMEOUT_S = 30.0


def tiers_plan(het: dict[str, Any], slow_devices: int) -> dict[str, Any]:
    """The tier planner on the heterogeneity section's measured rates of the slow device type
    (reliable and transient devices alike), the two slow nodes as transient pools, the target
    half the aware plan's prediction: the cost against all-reliable at that scale. The
    preemption section deploys a plan of its own and fills the outcome fields."""
    from serving.planning.tiers import plan_tiers

    matrix = het["matrix_calls_per_s"]
    rates = {s: r["dev_slow"] for s, r in matrix["rates"].items()}
    target = TIER_TARGET_SHARE * het["aware_plan"]["predicted_rate"]
    plan = plan_tiers(rates, matrix["visits"], target, price_reliable=PRICE_RELIABLE,
                      price_transient=PRICE_TRANSIENT, pools={"node2": slow_devices, "node3": slow_devices})
    return {"cost_vs_reliable": plan.cost_vs_reliable, "target_requests_per_s": target, "plan": plan.to_dict(),
            "prices_per_device_hour": PRICES,
            "wrong": None, "failed_with_notice": None, "failed_without_notice": None, "recovery_s": None}


def _preempt_phase(app, cluster, node, keys, notice: bool, requests, expected, rate: float, seed: int):
    """Open-loop load; after PREEMPT_BEFORE_S the node goes (drained first with notice)."""
    import asyncio
    import threading

    log: list[tuple[float, float, str]] = []  # send time, latency ms, outcome
    event: dict[str, float] = {}
    errors: dict[str, int] = {}  # failed requests by exception

    async def one(i: int, t: float):
        t0 = time.perf_counter()
        j = i % len(requests)
        try:
            out = await asyncio.wait_for(app.ingress.predict.remote(requests[j]), REQUEST_TIMEOUT_S)
            outcome = "ok" if np.allclose(out["proba"], expected[j], atol=1e-9) else "wrong"
        except Exception as exc:
            outcome = "failed"
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
        log.append((t0, (time.perf_counter() - t0) * 1000.0, outcome))

    async def run():
        await poisson_calls(rate, PREEMPT_BEFORE_S + PREEMPT_AFTER_S, one, seed)

    start = app.stats()
    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    time.sleep(PREEMPT_BEFORE_S)
    event["t"] = time.perf_counter()
    if notice:
        event["drain_s"] = app.drain(keys)
    cluster.remove_node(node)
    event["removed_s"] = time.perf_counter() - event["t"]
    thread.join()
    after = [(t - event["t"], ms, o) for t, ms, o in log if t >= event["t"]]
    windows: dict[int, list[float]] = {}
    for dt, ms, o in after:
        windows.setdefault(int(dt // RECOVERY_WINDOW_S), []).append(ms if o == "ok" else REQUEST_TIMEOUT_S * 1000)
    bad = [w for w, v in windows.items() if np.percentile(v, 99) > SLO_MS]
    recovery = 0.0 if not bad else (max(bad) + 1) * RECOVERY_WINDOW_S
    end = app.stats()
    return {"requests": len(log), "wrong": sum(o == "wrong" for _, _, o in log),
            "failed": sum(o == "failed" for _, _, o in log), "recovery_s": recovery,
            "p99_ms_before": float(np.percentile([ms for t, ms, o in log if t < event["t"]] or [0.0], 99)),
            "drain_s": event.get("drain_s"), "retried": end["retried"], "errors": errors,
            "out_of_routing_at_start": start["unavailable"], "out_of_routing_at_end": end["unavailable"],
            "lost_seen": end["lost_seen"], "calls_per_replica": {k: end["picks"].get(k, 0) - start["picks"].get(k, 0)
                                                                 for k in end["picks"]}}


def preemption(opt, source, requests, cluster, args, emulation: DeviceEmulation, slow_devices: int) -> dict[str, Any]:
    """The tier planner's plan, deployed and preempted under load. Rates are measured here
    (one replica per stage on a transient device); each slow node is a transient pool of
    ``slow_devices / PREEMPT_SHARE`` replicas; the target is ``--preempt-rate``. The first pool's node is
    removed with notice (drained, then removed), its capacity comes back (a new node with the
    same pool: Serve starts the lost replicas there, the ingress routes to them again), then
    the second pool's node is removed without notice."""
    from serving.core.specs import stage_specs
    from serving.emulation.measure import measure_matrix
    from serving.planning.tiers import deployment_of, plan_tiers

    specs = stage_specs(opt)
    pools = [f"spot_{i}" for i in range(len(cluster.worker_nodes))]
    matrix = measure_matrix(source, opt, specs, [pools[0]], emulation, requests, name="tier-profile")
    rates = {s: float(matrix.rates[i, 0]) for i, s in enumerate(matrix.stages)}
    visits = {s: float(matrix.visits[i]) for i, s in enumerate(matrix.stages)}
    plan = plan_tiers(rates, visits, args.preempt_rate, price_reliable=PRICE_RELIABLE,
                      price_transient=PRICE_TRANSIENT, pools=dict.fromkeys(pools, int(slow_devices / PREEMPT_SHARE)))
    replicas, weights = deployment_of(plan, "dev_fast")
    print(f"  tier plan for {args.preempt_rate:g} requests/s on measured rates {rates}: {plan.to_dict()}")
    app = deploy_hetero(source, specs, replicas, weights, emulation, name="tiers", device_share=PREEMPT_SHARE,
                        ingress_resources={"head": 0.01}, hedging=args.preempt_hedging)
    expected = [opt.predict_proba(r) for r in requests]
    out: dict[str, Any] = {}
    try:
        for pool, notice in ((pools[0], True), (pools[-1], False)):
            keys = [f"{s}@{d}/{k}" for (s, d), n in replicas.items() if d == pool for k in range(n)]
            node = _pool_node(cluster, pool)
            phase = _preempt_phase(app, cluster, node, keys, notice, requests, expected, args.preempt_rate,
                                   args.seed)
            phase["replicas_lost"] = len(keys)
            if notice and pool != pools[-1]:  # the pool's capacity comes back before the next loss
                phase["restored_s"] = _restore_pool(app, cluster, pool, keys, slow_devices)
            out["with_notice" if notice else "without_notice"] = phase
            print(f"  {'with' if notice else 'without'} notice: {phase}")
    finally:
        app.shutdown()
    return {"wrong": out["with_notice"]["wrong"] + out["without_notice"]["wrong"],
            "failed_with_notice": out["with_notice"]["failed"],
            "failed_without_notice": out["without_notice"]["failed"],
            "recovery_s": max(out["with_notice"]["recovery_s"], out["without_notice"]["recovery_s"]),
            "restored_s": out["with_notice"].get("restored_s"),
            "deployed_plan": plan.to_dict(), "deployed_cost_vs_reliable": plan.cost_vs_reliable,
            "measured_calls_per_s": rates, "visits": visits,
            "prices_per_device_hour": PRICES,
            "slo_ms": SLO_MS, "rate_per_s": args.preempt_rate, "phases": out}


def _pool_node(cluster, pool: str):
    """The (alive) worker node carrying a transient pool's resource."""
    import ray

    ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and pool in n["Resources"]}
    for node in cluster.worker_nodes:
        if node.node_id in ids:
            return node
    raise ValueError(f"no node carries the pool {pool!r}")


def _restore_pool(app, cluster, pool: str, keys: list[str], slow_devices: int, timeout_s: float = 120.0) -> float:
    """A new node with the lost pool's devices; once Serve runs the pool's replicas there
    again, the ingress routes to them. Returns the seconds from the node's start."""
    from ray import serve

    t0 = time.perf_counter()
    cluster.add_node(num_cpus=1, resources={"dev_slow": slow_devices, pool: slow_devices})
    cluster.wait_for_nodes()
    wanted = {key_deployment(app.name, key) for key in keys}
    while True:
        deployments = serve.status().applications[app.name].deployments
        if all(deployments[d].replica_states.get("RUNNING", 0) >= 1 for d in wanted):
            break
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"the {pool} replicas were not running again after {timeout_s:g} s")
        time.sleep(0.25)
    app.restore(keys)
    return time.perf_counter() - t0
