"""The dashboard's content as plain data: the plan against what is measured, live series from
the metric ring, the certification, and the monitor's answers.

Pure functions of the app's ``info`` (what the ingress was built with: plan, report, stages),
a :class:`serving.runtime.dashboard.timeseries.MetricRing` and the monitor's snapshot
(:func:`serving.runtime.dashboard.data.monitor_snapshot`), so the page and ``/ui?format=json`` show
the same figures and both are tested without Ray.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from serving.core.jsonsafe import clean
from serving.core.profiles import StageProfile
from serving.runtime.dashboard.timeseries import MetricRing

#: seconds the "now" figures (rates, quantiles, shares) are computed over
RECENT_S = 60.0
#: route whose latency is compared with the SLO
PREDICT_ROUTE = "predict"


def level_stage(info: dict[str, Any]) -> dict[str, str]:
    """Cascade level -> the stage that answers it."""
    stages = list(info.get("stages") or [])
    n_levels = len(info.get("levels") or [])
    first_last = int(info.get("first_stage_last_level", n_levels - 1))
    if len(stages) <= 1:
        return {str(i): stages[0] if stages else "" for i in range(n_levels)}
    return {str(i): stages[0] if i <= first_last else stages[1] for i in range(n_levels)}


def slo_ms(info: dict[str, Any]) -> float | None:
    """The latency objective: the plan's p99 target, else the request deadline."""
    target = (info.get("plan") or {}).get("target_p99_ms")
    if target:
        return float(target)
    return None


def certified_shares(info: dict[str, Any]) -> dict[str, float | None]:
    """Level -> share of certification rows it answered (the optimizer's report)."""
    levels = (info.get("report") or {}).get("levels") or []
    return {str(lv["index"]): lv.get("fraction_answered") for lv in levels}


def _nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def _stage_rows(info: dict[str, Any], rows_by_level: dict[str, float], degraded: float) -> dict[str, float]:
    mapping = level_stage(info)
    stages = list(info.get("stages") or [])
    out = {s: 0.0 for s in stages}
    total = sum(rows_by_level.values())
    if stages:
        out[stages[0]] = total
    if len(stages) > 1:
        out[stages[1]] = sum(v for lv, v in rows_by_level.items() if mapping.get(lv) == stages[1]) + degraded
    return out


def plan_rows(info: dict[str, Any], ring: MetricRing, seconds: float = RECENT_S) -> list[dict[str, Any]]:
    """One row per deployment: what the plan set and predicted next to what is measured."""

    plan = info.get("plan") or {}
    span = ring.span_seconds(seconds)
    rows_by_level = ring.increase("willump_rows", seconds, by="level")
    degraded = ring.increase("willump_degraded_rows", seconds).get("all", 0.0)
    through = _stage_rows(info, rows_by_level, degraded)
    local = ring.mean_over("willump_stage_latency_seconds", seconds, by="stage")
    remote = ring.mean_over("willump_stage_compute_seconds", seconds, by="stage")
    profiles = {p["name"]: StageProfile.from_dict(p) for p in plan.get("profiles") or []}
    layout = plan.get("layout", "staged")
    out = [{
        "deployment": "ingress", "replicas": plan.get("ingress_replicas"), "device": "cpu",
        "num_cpus": plan.get("ingress_cpus"), "num_gpus": 0.0,
        "batch_planned": None, "batch_measured": None,
        "note": f"runs the {plan['stages'][0]['name']} stage" if layout == "fused" and plan.get("stages") else "",
    }]
    for i, stage in enumerate(plan.get("stages") or []):
        name = stage["name"]
        mean, calls = local.get(name) or remote.get(name) or (math.nan, 0.0)
        rows = through.get(name, 0.0)
        batch = rows / calls if calls else math.nan
        profile = profiles.get(name)
        predicted_call = profile.service_time(batch) if profile is not None and math.isfinite(batch) else math.nan
        measured_rate = rows / span if span > 0 else math.nan
        capacity = stage.get("capacity_rows_s")
        out.append({
            "deployment": name if not (layout == "fused" and i == 0) else f"{name} (in the ingress)",
            "replicas": plan.get("ingress_replicas") if layout == "fused" and i == 0 else stage.get("replicas"),
            "device": stage.get("device"), "num_cpus": stage.get("num_cpus"), "num_gpus": stage.get("num_gpus"),
            "batch_planned": stage.get("max_batch_size"), "batch_measured": batch,
            "wait_ms": 1e3 * float(stage.get("batch_wait_timeout_s") or 0.0),
            "capacity_rows_s": capacity, "rows_s": measured_rate,
            "utilization_planned": stage.get("utilization"),
            "utilization_measured": measured_rate / capacity if capacity and math.isfinite(measured_rate) else None,
            "call_ms_predicted": 1e3 * predicted_call, "call_ms_measured": 1e3 * mean,
            "call_ms_source": "ingress-timed" if name in local else "stage-reported compute",
            "note": "",
        })
    return clean(out)


def kpis(info: dict[str, Any], ring: MetricRing, seconds: float = RECENT_S) -> dict[str, Any]:
    """The headline figures over the last ``seconds``."""
    span = ring.span_seconds(seconds)
    per_s = (lambda v: v / span) if span > 0 else (lambda v: math.nan)
    requests = ring.increase("willump_requests", seconds, where={"route": PREDICT_ROUTE}).get("all", 0.0)
    rows = ring.increase("willump_rows", seconds, by="level")
    errors = ring.increase("willump_errors", seconds, by="kind", where={"route": PREDICT_ROUTE})
    latency = {name: ring.quantile_over("willump_request_latency_seconds", q, seconds,
                                        where={"route": PREDICT_ROUTE}).get("all")
               for name, q in (("p50", 0.5), ("p99", 0.99))}
    total_rows = sum(rows.values())
    certified = certified_shares(info)
    predicted = (info.get("plan") or {}).get("predicted") or {}
    return clean({
        "seconds": span,
        "requests_per_s": per_s(requests), "rows_per_s": per_s(total_rows),
        "p50_ms": 1e3 * _nan(latency["p50"]), "p99_ms": 1e3 * _nan(latency["p99"]),
        "slo_ms": slo_ms(info),
        "predicted_p50_ms": predicted.get("p50_ms"), "predicted_p99_ms": predicted.get("p99_ms"),
        "predicted_at_rps": predicted.get("rate_rps"), "predicted_rows_per_s": predicted.get("throughput_rows_s"),
        "cheap_share": rows.get("0", 0.0) / total_rows if total_rows else None,
        "cheap_share_certified": certified.get("0"),
        "errors_per_s": {k: per_s(v) for k, v in errors.items()},
        "degraded_rows": ring.increase("willump_degraded_rows", seconds).get("all", 0.0),
        "shed_requests": sum(ring.increase("willump_shed_requests", seconds, by="stage").values()),
        "deadline_exceeded": sum(ring.increase("willump_deadline_exceeded", seconds, by="stage").values()),
        "records_sent": ring.increase("willump_monitor_records_sent", seconds).get("all", 0.0),
        "records_dropped": ring.increase("willump_monitor_records_dropped", seconds, by="reason"),
    })


def shares(info: dict[str, Any], ring: MetricRing, seconds: float = RECENT_S) -> dict[str, Any]:
    n_levels = len(info.get("levels") or [])
    levels = [str(i) for i in range(n_levels)]
    recent = ring.increase("willump_rows", seconds, by="level")
    history = ring.increase("willump_rows", None, by="level")
    certified = certified_shares(info)

    def norm(d: dict[str, float]) -> list[float | None]:
        total = sum(d.values())
        return [d.get(lv, 0.0) / total if total else None for lv in levels]

    return clean({"levels": levels, "live": norm(recent), "history": norm(history),
                  "certified": [certified.get(lv) for lv in levels]})


def series(info: dict[str, Any], ring: MetricRing) -> dict[str, Any]:
    """Time series for the plots (times in epoch seconds)."""
    times, per_level = ring.rates("willump_rows", by="level")
    _, requests = ring.rates("willump_requests", where={"route": PREDICT_ROUTE})
    lat_t, p50 = ring.quantiles("willump_request_latency_seconds", 0.5, where={"route": PREDICT_ROUTE})
    _, p99 = ring.quantiles("willump_request_latency_seconds", 0.99, where={"route": PREDICT_ROUTE})
    stages: dict[str, dict[str, Any]] = {}
    for family in ("willump_stage_latency_seconds", "willump_stage_compute_seconds"):
        _, s50 = ring.quantiles(family, 0.5, by="stage")
        _, s99 = ring.quantiles(family, 0.99, by="stage")
        for stage in s99:
            stages.setdefault(stage, {"p50": s50[stage], "p99": s99[stage]})
    empty = np.full(times.size, np.nan)
    latency = {name: q["all"] for name, q in (("p50", p50), ("p99", p99)) if "all" in q}
    return {"t": times, "rows_per_level": per_level, "requests": requests.get("all", empty),
            "latency_t": lat_t, "latency": latency, "stages": stages}


def changes_with_times(snapshot: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The monitor's change points with their start / detection times in epoch seconds."""
    if not snapshot or "changes" not in snapshot:
        return []
    ps = float((snapshot.get("stats") or {}).get("pane_seconds") or 0.0)
    out = []
    for row in snapshot["changes"].get("rows", []):
        r = dict(row)
        if ps and r.get("start_pane") is not None:
            r["start_t"] = r["start_pane"] * ps
            r["detected_t"] = (r["detected_pane"] + 1) * ps
        out.append(r)
    return out


def model(info: dict[str, Any], ring: MetricRing, monitor: dict[str, Any] | None, *,
          monitor_age_s: float | None, monitor_error: str | None, refresh_s: float,
          now: float | None = None) -> dict[str, Any]:
    """Everything the page shows, JSON-ready except the series arrays (see :func:`to_json`)."""
    now = time.time() if now is None else now
    latest = ring.latest
    return {
        "app": info.get("name"), "model_version": info.get("model_version"), "now": now,
        "layout": (info.get("plan") or {}).get("layout"), "stages": info.get("stages"),
        "monitor_deployed": bool(info.get("monitor")), "refresh_s": refresh_s,
        "kpis": kpis(info, ring), "plan": plan_rows(info, ring), "shares": shares(info, ring),
        "series": series(info, ring), "changes": changes_with_times(monitor),
        "monitor": monitor, "monitor_age_s": monitor_age_s, "monitor_error": monitor_error,
        "sampler": {**ring.cost(), "age_s": None if latest is None else now - latest.t,
                    "history_s": ring.history_s},
        "plan_notes": (info.get("plan") or {}).get("notes") or [],
    }


def to_json(view: dict[str, Any]) -> dict[str, Any]:
    """The view with its arrays as lists (for ``/ui?format=json``)."""
    return clean(view)
