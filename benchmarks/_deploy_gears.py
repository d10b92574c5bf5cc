"""The gears section of :mod:`benchmarks.deploy_cluster`: a 3x burst above the planned rate, served
by ``deploy``'s own apps with load-adaptive gears (``gears="adaptive"``) and with one gear
(``gears=0``), side by side on one emulated device per stage.

One raylet whose node labels make each stage's replica an **emulated** device of a fixed speed
(``willump.io/emulated-ms-per-row-<stage>``: ``GEAR_MS_PER_ROW``, whatever this machine's cores
carry): a cheaper gear sends fewer rows to the expensive stage, so it frees device time as it
would free an accelerator. Both apps: layout "staged" (each stage a deployment), one replica per
stage, the same artifact (the workload optimized with a ladder of gears,
:func:`benchmarks._gears.geared_workload`). The planned rate keeps gear 0's bottleneck at
``PLAN_UTILIZATION`` of what the devices sustain (predicted from the device times and each
gear's unsure rows on the bench's requests, printed); the load is open loop over HTTP, the same
Poisson arrivals for both apps (:func:`benchmarks._gears.arrivals`: the planned rate, then
``BURST`` x it, then the planned rate), the apps alternating, ``--repeats`` times (median p99).
Every answer is checked against its gear's in-process prediction (``wrong``); accuracy against
the labels is set beside the full pipeline's on the same rows.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

#: each stage's emulated device: ms a row (a cheaper gear leaves fewer rows to the expensive one)
GEAR_MS_PER_ROW = {"cheap": 0.4, "expensive": 50.0}


def _predicted(opt: Any, requests: list) -> list[dict[str, Any]]:
    """Per gear: device seconds per request at each stage and the requests/s the bottleneck takes."""
    out = []
    for g in range(len(opt.gears_)):
        gear = opt.gear(g)
        cheap = expensive = 0.0
        unsure = []
        for rows in requests:
            _, level = gear.predict_with_levels(rows)
            cheap += GEAR_MS_PER_ROW["cheap"] * len(rows) / 1000.0
            expensive += GEAR_MS_PER_ROW["expensive"] * int((level > 0).sum()) / 1000.0
            unsure.append(float((level > 0).mean()))
        per = {"cheap": cheap / len(requests), "expensive": expensive / len(requests)}
        out.append({"device_s_per_request": per, "requests_per_s": 1.0 / max(per.values()),
                    "unsure_share": float(np.mean(unsure))})
    return out


def request_bodies(requests: list) -> list[bytes]:
    """Each request's frame as a ``/predict`` body (missing values as null)."""
    from serving.core.jsonsafe import clean

    return [json.dumps(clean({"rows": r.to_dict("records")})).encode() for r in requests]


async def _drive(url: str, bodies: list[bytes], times: np.ndarray) -> list[dict[str, Any]]:
    """Open loop: request i at ``times[i]`` seconds (body i modulo the bodies); per answer its
    latency, gear and probabilities (a failed request: its status)."""
    import aiohttp

    log: list[dict[str, Any]] = []

    async def one(session: aiohttp.ClientSession, i: int, at: float) -> None:
        j = i % len(bodies)
        t0 = time.perf_counter()
        try:
            async with session.post(url, data=bodies[j], headers={"Content-Type": "application/json"}) as r:
                text = await r.read()
                status = r.status
        except aiohttp.ClientError as exc:
            log.append({"i": j, "at": at, "error": type(exc).__name__})
            return
        entry: dict[str, Any] = {"i": j, "at": at, "ms": (time.perf_counter() - t0) * 1000.0, "status": status}
        if status == 200:
            answer = json.loads(text)
            entry["gear"], entry["proba"] = int(answer["gear"]), np.asarray(answer["probabilities"])
        log.append(entry)

    from benchmarks._gears import at_times

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await at_times(times, lambda i, at: one(session, i, at))
    return log


def gears(opt: Any, requests: list, labels: list, args) -> dict[str, Any]:
    from benchmarks._gears import BURST, GEAR_LADDER, PLAN_UTILIZATION
    from benchmarks.deploy_cluster import fresh_cluster
    from serving.runtime.emulated_node import MS_PER_ROW_LABEL
    from serving.runtime.gears import ladder

    if len(opt.gears_) < 2:
        return {"error": f"the optimizer certified no cheaper gear for {args.workload} (gears {GEAR_LADDER} x max_loss)"}
    capacity = _predicted(opt, requests)
    planned = PLAN_UTILIZATION * capacity[0]["requests_per_s"]
    print(f"gears: ladder {ladder(opt)}")
    print("gears: predicted requests/s per gear "
          + ", ".join(f"{g}: {c['requests_per_s']:.1f} (unsure {c['unsure_share']:.1%})" for g, c in enumerate(capacity))
          + f"; planned {planned:.1f}/s, burst {BURST * planned:.1f}/s")
    labels_here = {f"{MS_PER_ROW_LABEL}-{stage}": f"{ms:g}" for stage, ms in GEAR_MS_PER_ROW.items()}
    try:
        with fresh_cluster(labels_here, [], head_cpus=4) as (cluster, apps):
            return _measured(opt, requests, labels, args, cluster, apps, capacity, planned)
    except Exception as exc:  # one section failing leaves the others to run
        return {"error": f"{type(exc).__name__}: {exc}"}


def _measured(opt: Any, requests: list, labels: list, args, cluster: Any, apps: dict[str, Any],
              capacity: list[dict[str, Any]], planned: float) -> dict[str, Any]:
    from benchmarks._gears import BURST, BURST_S, POST_S, PRE_S, arrivals, score
    from benchmarks.deploy_cluster import median
    from serving import deploy
    from serving.launch.config import plan_offline
    from serving.runtime.gears import ladder
    from tests.conftest import free_port

    bodies = request_bodies(requests)
    for name, gear in (("single_gear", 0), ("with_gears", "adaptive")):
        plan = plan_offline(opt, cpus=4, rows_per_request=args.rows_per_request, rps=None, p99_ms=None,
                            layout="staged", monitor=None)
        plan.ingress_replicas, plan.ingress_cpus = 1, 0.5
        for stage in plan.stages:
            stage.replicas, stage.num_cpus = 1, 0.2
        apps[name] = deploy(opt, name=name, host="127.0.0.1", port=free_port(), address=cluster.address, plan=plan,
                            artifact_share="object_store", insitu="never", gears=gear,
                            gear_policy={"slo_ms": args.gear_slo_ms} if gear == "adaptive" else None,
                            deadline_ms=60_000)
    expected = {g: [opt.gear(g).predict_proba(r) for r in requests] for g in range(len(opt.gears_))}
    full = [opt.baseline.predict(r) for r in requests]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in apps}
    served = {"rows": 0, "correct": 0, "full_correct": 0, "wrong": 0, "failed": 0}
    for r in range(args.repeats):
        times = arrivals(planned, args.seed + r)
        for name in (list(apps) if r % 2 == 0 else list(reversed(apps))):
            log = asyncio.run(_drive(apps[name].url + "/predict", bodies, times))
            ok = [x for x in log if x.get("status") == 200]
            served["failed"] += len(log) - len(ok)
            ms = np.array([x["ms"] for x in ok])
            burst = np.array([x["ms"] for x in ok if PRE_S <= x["at"] < PRE_S + BURST_S])
            seconds = int(PRE_S + BURST_S + POST_S)
            row = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                   "p99_ms_burst": float(np.percentile(burst, 99)), "requests": len(log), "failed": len(log) - len(ok),
                   "gear_requests": {str(g): sum(x["gear"] == g for x in ok) for g in range(len(opt.gears_))},
                   "gear_by_second": [round(float(np.mean([x["gear"] for x in ok if s <= x["at"] < s + 1] or [np.nan])), 2)
                                      for s in range(seconds)]}
            # the answer's probabilities went through JSON (rounded to 12 digits)
            score(opt, ok, expected, labels, full, served, accuracy=name == "with_gears", atol=1e-6)
            runs[name].append(row)
            print(f"gears round {r + 1} {name:12s} p50 {row['p50_ms']:7.0f} ms p99 {row['p99_ms']:7.0f} ms (burst "
                  f"{row['p99_ms_burst']:.0f} ms), {row['failed']} failed, requests per gear {row['gear_requests']}, "
                  f"gear by second {row['gear_by_second']}")
            time.sleep(2.0)  # the queue of one app's burst is not the next one's
    med = {m: {f: median([row[f] for row in v]) for f in ("p50_ms", "p99_ms", "p99_ms_burst")} for m, v in runs.items()}
    accuracy = served["correct"] / max(served["rows"], 1)
    full_accuracy = served["full_correct"] / max(served["rows"], 1)
    worst = max(g.loss_bound for g in opt.gears_ if g.loss_bound is not None)
    out = {
        "baseline": "the same app with one gear", "emulated": True, "through": "serving.deploy",
        "slo_ms": args.gear_slo_ms,
        "p99_ms_with_gears": med["with_gears"]["p99_ms"], "p99_ms_single_gear": med["single_gear"]["p99_ms"],
        "p99_ms_burst_with_gears": med["with_gears"]["p99_ms_burst"],
        "p99_ms_burst_single_gear": med["single_gear"]["p99_ms_burst"],
        "accuracy_loss": full_accuracy - accuracy, "accuracy_served": accuracy,
        "accuracy_full_pipeline": full_accuracy, "rows_scored": served["rows"], "worst_certified_bound": worst,
        "wrong": served["wrong"], "failed": served["failed"], "ladder": ladder(opt),
        "planned_rate_per_s": planned, "burst_rate_per_s": BURST * planned, "predicted_capacity": capacity,
        "ms_per_row": GEAR_MS_PER_ROW, "runs": runs,
    }
    out["targets"] = {
        "p99 within the SLO with gears": out["p99_ms_with_gears"] <= out["slo_ms"],
        "a single gear misses the SLO": out["p99_ms_single_gear"] > out["slo_ms"],
        "accuracy loss <= worst certified bound": out["accuracy_loss"] <= worst,
    }
    return out


def summary(g: dict[str, Any]) -> str:
    return (f"gears (deploy's apps): SLO {g['slo_ms']:g} ms, p99 with gears {g['p99_ms_with_gears']:.0f} ms, one gear "
            f"{g['p99_ms_single_gear']:.0f} ms; accuracy loss {g['accuracy_loss']:.4f} (worst certified bound "
            f"{g['worst_certified_bound']:.4f}); {g['wrong']} wrong, {g['failed']} failed; targets {g['targets']} "
            f"(emulated devices; medians of {len(g['runs']['with_gears'])} rounds)")
