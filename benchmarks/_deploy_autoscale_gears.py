"""The ``autoscaling_gears`` section of :mod:`benchmarks.deploy_cluster`: a gear step as the first
answer to a burst and replicas as the lasting one, against the planner without gears and Ray
Serve's default autoscaling, on the bursty trace of the autoscaling section.

One raylet whose node labels make each stage's replica an **emulated** device of a fixed speed
(``willump.io/emulated-ms-per-row-<stage>``, the gears section's :data:`GEAR_MS_PER_ROW`): the
expensive stage is the bottleneck, as gears are for (a cheaper gear sends fewer rows to it). The
workload optimized with a ladder of gears (:func:`benchmarks._gears.geared_workload`); every app
the same artifact and plan, layout "staged", every model stage autoscaled from 1 to
``--autoscale-max`` replicas with the same delays; they differ in policy only:

* ``planner_gears``: ``autoscaler="planner"``, ``gears="adaptive"`` (SLO ``--slo-ms``): the
  ingress steps to a cheaper gear when its queue puts the SLO at risk, the stage replicas report
  the work the deployed gear (0) would give them (serving.runtime.gears.GearDemand), and the
  planner asks for those replicas; the gear steps back once the queue is calm.
* ``planner_served_gear``: the same with ``gear_policy={"replicas_for": "served"}``: the stages
  sized for the gear being served (the burst answered in a cheaper gear for as long as it lasts).
* ``planner_cheapest_gear``: the same with ``gear_policy={"replicas_for": "cheapest"}``: the
  stages sized for the cheapest gear's load (replicas only where no certified gear holds it; the
  gears' shares known from the artifact's sample rows before the burst).
* ``planner``: ``autoscaler="planner"``, one gear.
* ``default``: ``autoscaler="serve"`` (Serve's policy with deploy's target), one gear.

The base rate keeps gear 0's expensive stage at ``BASE_UTILIZATION`` of one replica (predicted
from the devices and gear 0's unsure rows on the bench's requests, printed); open-loop Poisson
arrivals, x1 -> x4 -> x1, ``--autoscale-phase-s`` each, the same for every app; apps in turn, each
alone, the order reversed every other round. Measured per app: SLO violations (slower than ``--slo-ms`` or
failed), model-stage replica-seconds (sampled every second), requests per gear and the accuracy
given up (answers against the labels, beside the full pipeline's on the same rows: in all, per
gear beside that gear's certified bound, and over the one-gear planner app's on the same trace);
every answer is checked against its gear's in-process prediction (``wrong``).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import Any

import numpy as np

#: the apps (module docstring); ``--autoscale-gears-apps`` picks some
APPS = {"planner_gears": {"autoscaler": "planner", "gears": "adaptive"},
        "planner_served_gear": {"autoscaler": "planner", "gears": "adaptive", "replicas_for": "served"},
        "planner_cheapest_gear": {"autoscaler": "planner", "gears": "adaptive", "replicas_for": "cheapest"},
        "planner": {"autoscaler": "planner"}, "default": {"autoscaler": "serve"}}
#: the base rate keeps gear 0's expensive stage at this share of one replica's capacity
BASE_UTILIZATION = 0.4
#: seconds of the gear timeline's bins
GEAR_BIN_S = 5.0


def autoscaling_gears(opt: Any, requests: list, labels: list, args) -> dict[str, Any]:
    """The section (module docstring); a failure is recorded, not raised."""
    from benchmarks._deploy_autoscale import DOWNSCALE_S, STAGE_CPUS
    from benchmarks._deploy_gears import GEAR_MS_PER_ROW, _predicted, request_bodies
    from benchmarks._gears import GEAR_LADDER
    from benchmarks.deploy_cluster import INGRESS_CPUS, with_cluster
    from serving.runtime.emulated_node import MS_PER_ROW_LABEL
    from serving.runtime.gears import ladder

    if len(opt.gears_) < 2:
        return {"error": f"the optimizer certified no cheaper gear for {args.workload} (gears {GEAR_LADDER} x max_loss)"}
    names = [n.strip() for n in args.autoscale_gears_apps.split(",") if n.strip()]
    capacity = _predicted(opt, requests)
    rate = BASE_UTILIZATION * capacity[0]["requests_per_s"]
    print(f"autoscaling_gears: ladder {ladder(opt)}; one replica each takes "
          + ", ".join(f"gear {g}: {c['requests_per_s']:.1f} requests/s (unsure {c['unsure_share']:.1%})"
                      for g, c in enumerate(capacity))
          + f"; base rate {rate:.1f}/s, burst {4 * rate:.1f}/s")
    apps = {}
    for name in names:
        options = dict(APPS[name])
        replicas_for = options.pop("replicas_for", "deployed")
        if options.get("gears") == "adaptive":
            options["gear_policy"] = {"slo_ms": args.slo_ms, "replicas_for": replicas_for}
        apps[name] = {**options, "min_replicas": 1, "max_replicas": args.autoscale_max,
                      "downscale_to_zero_s": DOWNSCALE_S}
    head_cpus = math.ceil(len(apps) * (INGRESS_CPUS + 2 * args.autoscale_max * STAGE_CPUS) + 1.0)
    bodies = request_bodies(requests)

    def run(deployed: dict[str, Any]) -> dict[str, Any]:
        return _rounds(opt, deployed, bodies, requests, labels, rate, args)

    out = with_cluster({f"{MS_PER_ROW_LABEL}-{stage}": f"{ms:g}" for stage, ms in GEAR_MS_PER_ROW.items()}, [],
                       opt, apps, args, run, head_cpus=head_cpus, replicas=1, stage_cpus=STAGE_CPUS)
    out.update({"rate": rate, "audit_rate": getattr(args, "audit_rate", 0.0), "burst": 4.0, "phase_s": args.autoscale_phase_s, "slo_ms": args.slo_ms,
                "ms_per_row": GEAR_MS_PER_ROW, "predicted_capacity": capacity, "ladder": ladder(opt),
                "emulated": True, "through": "serving.deploy"})
    return out


def _rounds(opt: Any, apps: dict[str, Any], bodies: list[bytes], requests: list, labels: list, rate: float,
            args) -> dict[str, Any]:
    from benchmarks._deploy_autoscale import REST_S, WARMUP_S, policy_asks, policy_starts
    from benchmarks._deploy_gears import _drive
    from benchmarks._gears import arrivals, score

    expected = {g: [opt.gear(g).predict_proba(r) for r in requests] for g in range(len(opt.gears_))}
    full = [opt.baseline.predict(r) for r in requests]
    phases = ((args.autoscale_phase_s, 1.0), (args.autoscale_phase_s, 4.0), (args.autoscale_phase_s, 1.0))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in apps}
    served = {name: {"wrong": 0} for name in apps}
    #: per app and gear: rows answered, rows right, rows the full pipeline gets right
    by_gear: dict[str, dict[int, list[int]]] = {name: {} for name in apps}
    names = list(apps)
    for r in range(args.autoscale_rounds):
        times = arrivals(rate, args.seed + r, phases)
        for name in (names if r % 2 == 0 else names[::-1]):
            url = apps[name].url + "/predict"
            audits = audit_rows(apps[name].url)
            asyncio.run(_drive(url, bodies, arrivals(rate, 99, ((WARMUP_S, 1.0),))))
            out = _trace(url, name, bodies, times, args)
            ok = [x for x in out.pop("log") if x.get("status") == 200]
            score(opt, ok, expected, labels, full, served[name], accuracy=False, atol=1e-6)
            for x in ok:
                y, counts = labels[x["i"]], by_gear[name].setdefault(x["gear"], [0, 0, 0])
                counts[0] += len(y)
                counts[1] += int((opt.classes_[x["proba"].argmax(axis=1)] == y).sum())
                counts[2] += int((full[x["i"]] == y).sum())
            rounds[name].append(out)
            print(f"  autoscaling_gears round {r + 1} {name}: {out['slo_violation_share']:.2%} over {args.slo_ms:g} ms "
                  f"or failed ({out['failed']} failed of {out['requests']}), {out['replica_seconds']:.0f} "
                  f"replica-seconds, up to {out['max_replicas_seen']} replicas; p99 by phase "
                  f"{[round(p) for p in out['p99_ms'] if p is not None]} ms; requests per gear "
                  f"{out['gear_requests']}; mean gear by {GEAR_BIN_S:g} s {out['gear_timeline']}", flush=True)
            time.sleep(REST_S)
            if getattr(args, "audit_rate", 0.0):  # the rows it audited and shed, the warm-up's and the rest's too
                after = audit_rows(apps[name].url)
                out["audit_rows"] = {k: after.get(k, 0.0) - audits.get(k, 0.0) for k in sorted(set(after) | set(audits))}
                print(f"  autoscaling_gears round {r + 1} {name}: live audit rows {out['audit_rows']}", flush=True)
    result: dict[str, Any] = {"apps": names, "rounds": rounds}
    for name, runs in rounds.items():
        counts = np.array(list(by_gear[name].values()) or [[0, 0, 0]]).sum(axis=0)
        result[name] = {"slo_violation_share": statistics.median(x["slo_violation_share"] for x in runs),
                        "replica_seconds": statistics.median(x["replica_seconds"] for x in runs),
                        "share_in_cheaper_gears": statistics.median(x["share_in_cheaper_gears"] for x in runs),
                        # against the full pipeline on the same rows, over every round
                        "accuracy_loss": float(counts[2] - counts[1]) / max(int(counts[0]), 1),
                        "accuracy_loss_by_gear": {str(g): {"rows": c[0], "loss": (c[2] - c[1]) / max(c[0], 1),
                                                           "certified_bound": opt.gears_[g].loss_bound}
                                                  for g, c in sorted(by_gear[name].items())},
                        "wrong": served[name]["wrong"], "failed": sum(x["failed"] for x in runs),
                        # a replica's start: the planner's own measurement (what it drains the
                        # ingresses' queues within) beside Serve's status sampled once a second
                        "policy_replica_starts_s": policy_starts(name),
                        # each ask for more replicas than ran, with what the policy read
                        "policy_asks": policy_asks(name),
                        "start_s_status": _median([x["start_s_status"] for x in runs])}
        if any("audit_rows" in x for x in runs):  # summed over rounds
            outcomes = sorted({k for x in runs for k in x.get("audit_rows", {})})
            result[name]["audit_rows"] = {k: sum(x.get("audit_rows", {}).get(k, 0.0) for x in runs) for k in outcomes}
    if "planner" in rounds:  # what the gears gave up beyond the one-gear app's loss on the same trace
        for name in rounds:
            result[name]["accuracy_loss_over_one_gear"] = result[name]["accuracy_loss"] - result["planner"]["accuracy_loss"]
    if "default" in rounds:
        for name in rounds:
            if name != "default":
                result[name]["default_over_this_replica_seconds"] = (
                    result["default"]["replica_seconds"] / max(result[name]["replica_seconds"], 1e-9))
    worst = max(g.loss_bound for g in opt.gears_ if g.loss_bound is not None)
    result["worst_certified_bound"] = worst
    result["targets"] = {}
    for name in ("planner_gears", "planner_served_gear", "planner_cheapest_gear"):
        if name in rounds:
            mine = result[name]
            result["targets"][name] = {"SLO violations <= 1%": mine["slo_violation_share"] <= 0.01,
                                       "accuracy loss <= worst certified bound": mine["accuracy_loss"] <= worst}
            if "default" in rounds:
                result["targets"][name][">= 1.5x fewer replica-seconds than Serve's default"] = (
                    mine["default_over_this_replica_seconds"] >= 1.5)
    return result


def audit_rows(base_url: str) -> dict[str, float]:
    """The app's live audit rows so far by outcome (agree, disagree, shed), from its /metrics;
    {} where it cannot be read."""
    import requests

    from benchmarks._scrape import counter_by_label, metrics_text

    try:
        return counter_by_label(metrics_text(base_url), "willump_audit_rows", "outcome")
    except requests.RequestException:
        return {}


def _trace(url: str, app: str, bodies: list[bytes], times: np.ndarray, args) -> dict[str, Any]:
    """The trace on one app, its replicas sampled meanwhile; the answers' log kept for scoring."""
    from benchmarks._deploy_autoscale import mean_start_s, replica_seconds, replicas_sampled
    from benchmarks._deploy_gears import _drive

    starting: list[tuple[float, int]] = []
    with replicas_sampled(app, starting) as samples:
        log = asyncio.run(_drive(url, bodies, times))
    ok = [x for x in log if x.get("status") == 200]
    failed = len(log) - len(ok)
    slow = sum(x["ms"] > args.slo_ms for x in ok)
    span = args.autoscale_phase_s
    p99 = []
    for k in range(3):
        ms = [x["ms"] for x in ok if k * span <= x["at"] < (k + 1) * span]
        p99.append(float(np.percentile(ms, 99)) if ms else None)
    bins = math.ceil(3 * span / GEAR_BIN_S)
    timeline = [round(float(np.mean([x["gear"] for x in ok if b * GEAR_BIN_S <= x["at"] < (b + 1) * GEAR_BIN_S]
                                    or [np.nan])), 2) for b in range(bins)]
    gears = sorted({x["gear"] for x in ok})
    return {"slo_violation_share": (slow + failed) / max(len(log), 1),
            "replica_seconds": replica_seconds(samples),
            "requests": len(log), "failed": failed, "over_slo": int(slow),
            "max_replicas_seen": max((n for _, n in samples), default=0), "p99_ms": p99,
            "start_s_status": mean_start_s(samples, starting),
            "gear_requests": {str(g): sum(x["gear"] == g for x in ok) for g in gears},
            "share_in_cheaper_gears": sum(x["gear"] > 0 for x in ok) / max(len(ok), 1),
            "gear_timeline": timeline, "replicas": [n for _, n in samples], "log": log}


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _starts(entry: dict[str, Any]) -> str:
    logged, status = entry.get("policy_replica_starts_s") or [], entry.get("start_s_status")
    if not logged and status is None:
        return ""
    return (f", replica start: the policy measured {statistics.median(logged):.1f} s (median of {len(logged)})"
            if logged else ", replica start: none measured by the policy") + (
        f", Serve's status {status:.1f} s" if status is not None else "")


def summary(a: dict[str, Any]) -> str:
    parts = [f"{name}: {a[name]['slo_violation_share']:.2%} over {a['slo_ms']:g} ms or failed, "
             f"{a[name]['replica_seconds']:.0f} replica-seconds, {a[name]['share_in_cheaper_gears']:.1%} of requests "
             f"in cheaper gears, accuracy loss {a[name]['accuracy_loss']:.4f}"
             + (f" ({a[name]['accuracy_loss_over_one_gear']:+.4f} over one gear)"
                if "accuracy_loss_over_one_gear" in a[name] else "") + f", {a[name]['wrong']} wrong" + _starts(a[name])
             + (f", live audit rows {a[name]['audit_rows']}" if "audit_rows" in a[name] else "")
             for name in a["apps"]]
    return (f"autoscaling_gears (emulated devices {a['ms_per_row']}, x1 -> x4 -> x1 at {a['rate']:.1f} req/s, "
            f"{a['phase_s']:g} s each; worst certified bound {a['worst_certified_bound']:.4f}): " + "; ".join(parts)
            + f"; targets {a.get('targets')}")
