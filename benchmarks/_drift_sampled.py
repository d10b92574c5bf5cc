"""The sampled regime: streams at 2,000 rows/s with the default reservoir sizes.

Why a regime of its own: at 50 rows/s nothing is ever sampled, and every defect of issue 13
lived where production traffic goes (120k rows a 1-minute pane, 20k + 10k rows kept; a
reference of 1.2M rows kept at 100k per stratum). Reported here:

- null streams (i.i.d., seasonal, AR(1)-correlated load, heavy-tailed): false explanations per
  hour (windows with any explanation, evaluated every pane, and episodes: runs of consecutive
  such windows), false drift alarms and false change points per hour; beside them River's
  ADWIN and Page-Hinkley on the same per-pane series and River's KSWIN on a row subsample of
  the same feature (peer detectors no one here wrote);
- planted families (nested attributes, two simultaneous causes, x1.5 latency, a 50k-level
  client attribute, a confounded mix shift, a skewed clock, idle periods, x3 latency): top-1
  recall and precision, plus what the family is about (quarantined rows, the stop detected);
- interval coverage at nominal 95% by simulation at the default sizes;
- restart after 1 s batches with pane durability: every answer equal, rows exact.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from typing import Any

import numpy as np
import pandas as pd

from drift import Monitor
from drift._changepoint import DEFAULT_BURN_IN
from drift._simulate import risk_ratio_coverage, share_ratio_coverage
from drift._synthetic import ATTRIBUTES, NULL_KINDS, Stream, monitor_kwargs

RATE = 2000.0
REFERENCE_PANES = 10
WINDOW = 10
#: Heavy detectors (mix shift, conditional shift, cascade health) run every this many panes.
HEAVY_EVERY = 5
#: River's KSWIN sees one row in this many (its update is one Python call per value).
KSWIN_SUBSAMPLE = 600
#: Planted families and what counts as a hit.
FAMILIES = ("latency_combo", "nested", "two_causes", "latency_x1_5", "client_50k",
            "confounded_mix", "skewed_clock", "idle")
#: Rows of one replica dated this far ahead in the skewed-clock family.
SKEW_SECONDS = 600.0
SKEW_SHARE = 0.02
#: Idle family: traffic stops for this many panes.
IDLE_PANES = 15


class StreamClock:
    """Stream time for the monitor (event times are synthetic, so the wall clock is not)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _monitor(**kw: Any) -> Monitor:
    return Monitor(**monitor_kwargs(auto_reference_panes=REFERENCE_PANES, window_panes=WINDOW,
                                    **kw))


def _combo(row: dict[str, Any]) -> dict[str, Any]:
    return {a: row[a] for a in (*ATTRIBUTES, "level") if row.get(a) is not None}


def _matches(row: dict[str, Any], causes: list[dict[str, Any]]) -> bool:
    combo = _combo(row)
    return any(all(combo.get(a) == v for a, v in c.items()) for c in causes)


def _episodes(flags: list[bool]) -> int:
    return sum(1 for i, f in enumerate(flags) if f and (i == 0 or not flags[i - 1]))


# ====================================================================== null streams
def null_stream(kind: str, seed: int, hours: float) -> dict[str, Any]:
    from river import drift as river_drift

    stream = Stream(kind, seed, rate=RATE)
    clock = StreamClock(stream.t0)
    mon = _monitor(clock=clock)
    first = REFERENCE_PANES + WINDOW
    panes = first + int(hours * 60)
    seasonal = kind == "null_seasonal"
    load_moves_latency = kind in ("null_seasonal", "null_ar1")
    latency_drift = 0
    expl: list[bool] = []
    expl_err: list[bool] = []
    drift_flags: list[bool] = []
    heavy = {"mix_shift": 0, "conditional_shift": 0, "cascade_health": 0, "evaluated": 0}
    seen_cp: set[tuple[str, int]] = set()
    cp_new = 0
    watched = ["latency_ms.p99", "error_rate", "rows"]
    peers = {f"river_{name}_{s}": cls() for s in watched
             for name, cls in (("adwin", river_drift.ADWIN),
                               ("page_hinkley", river_drift.PageHinkley))}
    peer_alarms = dict.fromkeys(peers, 0)
    kswin = river_drift.KSWIN(alpha=0.005, seed=seed)
    kswin_alarms = 0
    series_seen = 0
    for p in range(panes):
        frame = stream.pane(p)
        clock.t = stream.t0 + (p + 1) * stream.pane_seconds
        mon.ingest(frame)
        if p < first:
            continue
        expl.append(len(mon.explain(metric="latency_ms")) > 0)
        expl_err.append(len(mon.explain(classifier="error")) > 0)
        rep = mon.drift()
        drift_flags.append(any(c != "latency_ms" or not load_moves_latency
                               for c in rep.drifted_columns))
        latency_drift += int("latency_ms" in rep.drifted_columns)
        for r in mon.change_points().rows:
            if seasonal and (r["series"].startswith("latency_ms") or r["series"] == "rows"):
                continue
            key = (r["series"], r["detected_pane"])
            if key not in seen_cp:
                seen_cp.add(key)
                cp_new += 1
        # peers: the same per-pane series, as each pane closes
        series = mon.series()
        for _, row in series.iloc[series_seen:].iterrows():
            for name, det in peers.items():
                col = next(c for c in watched if name.endswith(c))
                if seasonal and col in ("latency_ms.p99", "rows"):
                    continue
                value = row.get(col)
                if value is not None and np.isfinite(value):
                    det.update(float(value))
                    peer_alarms[name] += int(det.drift_detected)
        series_seen = len(series)
        hit = False
        for v in frame["f_num"].to_numpy()[::KSWIN_SUBSAMPLE]:
            kswin.update(float(v))
            hit |= kswin.drift_detected
        kswin_alarms += int(hit)
        if (p - first) % HEAVY_EVERY == 0:
            heavy["evaluated"] += 1
            heavy["mix_shift"] += int(len(mon.mix_shift()) > 0)
            heavy["conditional_shift"] += int(any(r["localized"]
                                                  for r in mon.conditional_shift().rows))
            heavy["cascade_health"] += int(not mon.cascade_health().healthy)
    h = len(expl) / 60.0
    peer_by_kind: dict[str, float] = {}
    for name, count in peer_alarms.items():
        kind_name = "river_adwin" if "adwin" in name else "river_page_hinkley"
        peer_by_kind[kind_name] = peer_by_kind.get(kind_name, 0) + count / h
    return {
        "hours": h,
        "windows": len(expl),
        "false_explanation_windows_per_hour": (sum(expl) + sum(expl_err)) / h,
        "false_explanation_episodes_per_hour": (_episodes(expl) + _episodes(expl_err)) / h,
        "false_drift_windows_per_hour": sum(drift_flags) / h,
        "false_drift_episodes_per_hour": _episodes(drift_flags) / h,
        "false_change_points_per_hour": cp_new / h,
        "latency_drift_windows_per_hour": latency_drift / h,
        "heavy_detectors_per_hour": {k: v / (heavy["evaluated"] / 60 * HEAVY_EVERY)
                                     for k, v in heavy.items() if k != "evaluated"},
        "peer_change_points_per_hour": peer_by_kind,
        "peer_river_kswin_f_num_alarms_per_hour": kswin_alarms / h,
        "rows_per_pane": float(RATE * 60),
        "note": ("seasonal: latency drift, latency and traffic change points excluded (the "
                 "load cycle is a real change)") if seasonal else (
                     "AR(1): latency drift excluded (the load moves latency's level by several "
                     "percent against the reference: a real, benign shift)")
        if kind == "null_ar1" else None,
    }


# ====================================================================== planted families
def planted(family: str, seed: int) -> dict[str, Any]:
    base = {"skewed_clock": "latency_combo", "idle": "null_iid"}.get(family, family)
    change = REFERENCE_PANES + WINDOW + 2
    if family == "idle":  # after the change-point detector's burn-in (30 panes)
        change = DEFAULT_BURN_IN + 10
    stream = Stream(base, seed, rate=RATE, change_pane=change)
    clock = StreamClock(stream.t0)
    mon = _monitor(clock=clock)
    causes = stream.planted.get("causes") or [stream.planted.get("attributes", {})]
    out: dict[str, Any] = {"windows": 0, "top1": 0, "rows": 0, "hit_rows": 0,
                           "pre_windows": 0, "pre_false": 0, "both_causes_top3": 0}
    end = change + WINDOW + 6
    idle = range(change, change + IDLE_PANES) if family == "idle" else range(0)
    stop_found = None
    for p in range(end + (IDLE_PANES if family == "idle" else 0)):
        clock.t = stream.t0 + (p + 1) * stream.pane_seconds
        if p in idle:
            info = mon.window_info()
            if p == idle[-1]:
                out["window_rows_at_end_of_idle"] = info["rows"]
                cps = [r for r in mon.change_points(series=["rows"]).rows
                       if r["direction"] == "down"]
                first_pane = int(pd.Timestamp(mon.series().index[0]).timestamp() // 60)
                if cps:
                    stop_found = cps[-1]["detected_pane"] - (first_pane + change)
            continue
        frame = stream.pane(p)
        if family == "skewed_clock":
            rng = np.random.default_rng([seed, p, 77])
            skew = (frame["replica"].to_numpy() == "replica_0") & (
                rng.random(len(frame)) < SKEW_SHARE * 8)
            frame.loc[skew, "timestamp"] += SKEW_SECONDS
            out["skewed_rows"] = out.get("skewed_rows", 0) + int(skew.sum())
        mon.ingest(frame)
        if p < REFERENCE_PANES + WINDOW:
            continue
        if family == "idle":
            out["pre_windows"] += 1
            out["pre_false"] += int(len(mon.explain(metric="latency_ms")) > 0)
            continue
        if family == "confounded_mix":
            rows = mon.mix_shift().rows if p >= change + WINDOW // 2 else []
            exp_rows = mon.explain(metric="latency_ms").rows
        else:
            exp_rows = mon.explain(metric="latency_ms").rows
            rows = exp_rows
        if p < change:
            out["pre_windows"] += 1
            out["pre_false"] += int(len(exp_rows) > 0 and family != "confounded_mix")
            continue
        if p < change + WINDOW // 2:
            continue  # the window is still mostly before the change
        out["windows"] += 1
        out["top1"] += int(bool(rows) and _matches(rows[0], causes))
        out["rows"] += len(rows)
        out["hit_rows"] += sum(_matches(r, causes) for r in rows)
        if family == "confounded_mix":
            out["explain_top1"] = out.get("explain_top1", 0) + int(
                bool(exp_rows) and _matches(exp_rows[0], causes))
        if family == "two_causes":
            top3 = rows[:3]
            out["both_causes_top3"] += int(all(any(_matches(r, [c]) for r in top3)
                                               for c in causes))
    stats = mon.stats()
    out["quarantined"] = stats["quarantined"]
    out["late_dropped"] = stats["late_dropped"]
    if family == "idle":
        out["stop_detected_after_panes"] = stop_found
    return out


def _family_summary(family: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def total(k: str) -> float:
        return float(sum(r.get(k, 0) or 0 for r in runs))

    windows = total("windows")
    out: dict[str, Any] = {"seeds": len(runs), "windows": int(windows),
                           "top1_recall": total("top1") / windows if windows else None,
                           "precision": (total("hit_rows") / total("rows")
                                         if total("rows") else None),
                           "pre_change_false_windows": int(total("pre_false")),
                           "pre_change_windows": int(total("pre_windows"))}
    if family == "two_causes":
        out["both_causes_in_top3"] = total("both_causes_top3") / windows if windows else None
    if family == "confounded_mix":
        out["explain_top1_recall"] = total("explain_top1") / windows if windows else None
        out["note"] = "top1/precision: mix_shift; explain_top1_recall: explain(latency)"
    if family == "skewed_clock":
        out["skewed_rows"] = int(total("skewed_rows"))
        out["quarantined"] = int(total("quarantined"))
        out["late_dropped"] = int(total("late_dropped"))
    if family == "idle":
        delays = [r["stop_detected_after_panes"] for r in runs]
        out.update(top1_recall=None, precision=None,
                   stop_detected=sum(d is not None for d in delays),
                   stop_detected_after_panes=delays,
                   window_rows_at_end_of_idle=[r.get("window_rows_at_end_of_idle")
                                               for r in runs])
    return out


# ====================================================================== restart
def restart_check(minutes: int = 15) -> dict[str, Any]:
    """1 s batches at RATE with pane durability, flush, restart: answers and rows equal."""
    stream = Stream("latency_combo", 5, rate=RATE, change_pane=minutes // 2)
    kw = monitor_kwargs(window_panes=5, auto_reference_panes=3)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(**kw, directory=tmp)
        rows = 0
        start = time.perf_counter()
        for p in range(minutes):
            frame = stream.pane(p)
            cuts = np.searchsorted(frame["timestamp"].to_numpy(),
                                   stream.t0 + p * 60 + np.arange(1, 60))
            for part in np.split(np.arange(len(frame)), cuts):
                mon.ingest(frame.iloc[part])
            rows += len(frame)
        seconds = time.perf_counter() - start
        mon.flush()

        def answers(m: Monitor) -> list:
            return [m.explain(metric="latency_ms").to_dict(), m.drift().to_dict(),
                    m.mix_shift().to_dict(), m.change_points().to_dict(),
                    m.series().to_json(date_format="iso"), m.stats()["rows_retained"]]

        before = answers(mon)
        mon.close()
        again = Monitor(**kw, directory=tmp)
        equal = answers(again) == before
        retained = again.stats()["rows_retained"]
        again.close()
    return {"minutes": minutes, "rows": rows, "batches": minutes * 60,
            "rows_retained_after_restart": retained, "answers_equal_after_restart": equal,
            "ingest_rows_per_s_with_1s_batches": rows / seconds}


# ====================================================================== entry point
def sampled(quick: bool) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    hours = 1.0 if quick else 3.0
    seeds = 2 if quick else 4
    reps = 150 if quick else 400
    out: dict[str, Any] = {"params": {"rows_per_s": RATE, "pane_seconds": 60,
                                      "window_panes": WINDOW,
                                      "reference_panes": REFERENCE_PANES,
                                      "reservoir": [20_000, 10_000], "seeds": seeds,
                                      "null_hours_per_kind": hours}}
    out["null"] = {kind: null_stream(kind, 100 + i, hours) for i, kind in enumerate(NULL_KINDS)}
    out["planted"] = {f: _family_summary(f, [planted(f, s) for s in range(seeds)])
                      for f in FAMILIES}
    out["coverage"] = {
        "risk_ratio_flagged_outliers": risk_ratio_coverage(repetitions=reps).to_dict(),
        "risk_ratio_sampled_outliers": risk_ratio_coverage(repetitions=reps, seed=1,
                                                           flag_outliers=False).to_dict(),
        "share_ratio_sampled_both": share_ratio_coverage(repetitions=reps // 2).to_dict(),
    }
    out["restart"] = restart_check(10 if quick else 20)
    out["seconds"] = time.perf_counter() - t0
    return out


def report_lines(res: dict[str, Any]) -> list[str]:
    def f(v: Any, pct: bool = False) -> str:
        if v is None:
            return "n/a"
        return f"{100 * v:.1f}%" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))

    lines = []
    for kind, r in res["null"].items():
        heavy = ", ".join(f"{k} {v:.2f}" for k, v in r["heavy_detectors_per_hour"].items())
        peers = ", ".join(f"{k} {v:.1f}" for k, v in r["peer_change_points_per_hour"].items())
        lines.append(
            f"{kind} ({r['hours']:.1f} h, {r['rows_per_pane']:,.0f} rows/pane): false "
            f"explanations {f(r['false_explanation_windows_per_hour'])}/h windows "
            f"({f(r['false_explanation_episodes_per_hour'])}/h episodes; target <= 1/h), drift "
            f"{f(r['false_drift_windows_per_hour'])}/h windows, change points "
            f"{f(r['false_change_points_per_hour'])}/h"
            + (f" (latency drift from load, not counted: {f(r['latency_drift_windows_per_hour'])}"
               "/h windows)" if kind in ("null_seasonal", "null_ar1") else "")
            + f"; {heavy} (per hour of windows); peers: "
            f"{peers} change points/h, KSWIN(f_num) {r['peer_river_kswin_f_num_alarms_per_hour']:.1f}"
            f" alarms/h")
    for fam, r in res["planted"].items():
        extra = ""
        if fam == "two_causes":
            extra = f", both causes in top 3 {f(r['both_causes_in_top3'], True)}"
        if fam == "confounded_mix":
            extra = f", explain(latency) top1 {f(r['explain_top1_recall'], True)}"
        if fam == "skewed_clock":
            extra = (f", skewed rows {r['skewed_rows']:,} quarantined {r['quarantined']:,}, late "
                     f"{r['late_dropped']}")
        if fam == "idle":
            lines.append(f"idle: stop detected in {r['stop_detected']}/{r['seeds']} runs, after "
                         f"{r['stop_detected_after_panes']} panes; window rows at the end of the "
                         f"gap {r['window_rows_at_end_of_idle']}; false explanations before "
                         f"{r['pre_change_false_windows']}/{r['pre_change_windows']} windows")
            continue
        lines.append(f"{fam}: top1 recall {f(r['top1_recall'], True)} (target >= 95%), "
                     f"precision {f(r['precision'], True)}, {r['windows']} windows x "
                     f"{r['seeds']} seeds; pre-change false {r['pre_change_false_windows']}/"
                     f"{r['pre_change_windows']}{extra}")
    for name, c in res["coverage"].items():
        lines.append(f"coverage {name}: {f(c['covered'], True)} at nominal 95% (target >= 94%; "
                     f"{c['repetitions']} simulations, missed low {f(c['missed_low'], True)} / "
                     f"high {f(c['missed_high'], True)}, median upper/lower {c['median_width']:.2f})")
    r = res["restart"]
    lines.append(f"restart after {r['batches']} one-second batches ({r['rows']:,} rows, pane "
                 f"durability, flush): answers equal {r['answers_equal_after_restart']}, rows "
                 f"retained {r['rows_retained_after_restart']:,}; ingest with 1 s batches "
                 f"{r['ingest_rows_per_s_with_1s_batches']:,.0f} rows/s")
    lines.append(f"sampled regime took {res['seconds']:.0f} s")
    return lines
