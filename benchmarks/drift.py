"""Benchmark of the monitor: quality (exact and sampled regimes), speed, memory, libraries.

    python -m benchmarks.drift [--json PATH] [--quick] [--no-pin]
                          [--sections quality,sampled,requests,sequential,speed,memory,
                                      libraries]

quality   50 rows/s, nothing sampled (benchmarks._drift_quality): planted causes with an oracle on
          the raw window, null streams, always-fire and dummy-ranking baselines.
sampled   2,000 rows/s with the default reservoirs (benchmarks._drift_sampled): false explanations
          / drift alarms / change points per hour on i.i.d., seasonal, AR(1) and heavy-tailed
          nulls beside River's ADWIN, Page-Hinkley and KSWIN; top-1 recall and precision on
          planted families; interval coverage by simulation; restart after 1 s batches.
requests  serving-shaped streams, requests of 1-32 rows with Zipf clients, at 50 and 2,000
          rows/s (benchmarks._drift_requests): false alarms per hour on nulls, interval coverage
          at 1/4/8/20-row requests, request-level planted causes; each counted by requests
          (request_column) and by rows, side by side.
sequential Monitor.sequential_drift (a CUSUM per column) beside drift(): false alarms per
          hour on i.i.d., seasonal and AR(1) nulls, first-alarm delay on planted shifts
          (benchmarks._drift_sequential).
speed     ingest + classify rows/s on one pinned core (10k-row batches, 8 string attributes);
          explaining 1M rows x 8 attributes at order 3 end to end (benchmarks._drift_speed).
memory    a simulated day of 1-minute panes at 1k rows/s (--quick: 3 hours).
libraries Apache DataSketches (KLL, frequent items, VarOpt) against drift's own sketches
          (benchmarks._drift_libraries).
Timings are medians over repeats; the process pins itself to one CPU unless --no-pin. The
optional peers install with `pip install 'willump-serve[bench]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import _drift_libraries, _drift_requests, _drift_sampled, _drift_sequential
from benchmarks._drift_quality import quality
from benchmarks._drift_speed import _day_run, memory, speed

#: Targets from the issue.
TARGET_TOP1 = 0.95
TARGET_FALSE_ALARM = 0.01
TARGET_INGEST_ROWS_PER_S = 2_000_000
TARGET_EXPLAIN_SECONDS = 0.5
SECTIONS = ("quality", "sampled", "requests", "sequential", "speed", "memory", "libraries")


def _pin() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1]
    os.sched_setaffinity(0, {cpu})
    return cpu


# ====================================================================== report
def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def report(res: dict[str, Any]) -> str:
    lines = [f"benchmarks.drift  ({res['machine']['note']})"]
    q = res.get("quality")
    if q:
        lines.append("\n== quality (seeded synthetic streams) ==")
        for key in ("latency_x3_combination", "segment_share_2_to_20_percent",
                    "feature_shift_inside_segment"):
            r = q[key]
            lines.append(
                f"{key}: top1 {_fmt(r['top1_hit_rate'], True)} (target >= "
                f"{TARGET_TOP1:.0%}; exact {_fmt(r['top1_exact_rate'], True)}), top3 "
                f"{_fmt(r['top3_hit_rate'], True)}, recall {_fmt(r['recall'], True)}, "
                f"precision {_fmt(r['precision'], True)}, dummy-ranking top1 "
                f"{_fmt(r['dummy_top1_hit_rate'], True)}; windows {r['qualifying_windows']}, "
                f"delay median {_fmt(r['detection_delay_panes_median'])} panes (max "
                f"{_fmt(r['detection_delay_panes_max'])}), detected {r['detected_seeds']}/"
                f"{r['seeds']}; pre-change false alarms "
                f"{_fmt(r['pre_change_false_alarms_per_1000'])}/1000"
            )
        g = q["gradual_drift"]
        lines.append(
            f"gradual_drift: detected {g['detected_seeds']}/{g['seeds']}, delay median "
            f"{_fmt(g['detection_delay_panes_median'])} panes, newest-pane shift at detection "
            f"{_fmt(g['true_shift_std_at_detection_median'])} std (window mean "
            f"{_fmt(g['window_mean_shift_std_at_detection_median'])}); pre-change false alarms "
            f"{_fmt(g['pre_change_false_alarms_per_1000'])}/1000 (always-fire: 1000/1000)"
        )
        for key in ("null_heavy_tailed", "null_seasonal"):
            r = q[key]
            parts = [f"{k} {_fmt(v['false_alarms_per_1000'])}" for k, v in r.items()
                     if isinstance(v, dict) and "windows" in v]
            lines.append(f"{key} false alarms per 1000 windows (target <= "
                         f"{1000 * TARGET_FALSE_ALARM:.0f}; always-fire 1000): "
                         + ", ".join(parts))
        lines.append(f"quality took {q['seconds']:.0f} s")
    s = res.get("speed")
    if s:
        lines.append("\n== speed (one pinned core, shared machine) ==")
        lines.append(
            f"ingest+classify in memory: {_fmt(s['ingest_classify_in_memory']['rows_per_s_median'])}"
            f" rows/s (target >= {TARGET_INGEST_ROWS_PER_S:,}); persisted pane-durable "
            f"{_fmt(s['ingest_classify_persist_pane']['rows_per_s_median'])}, batch-durable "
            f"{_fmt(s['ingest_classify_persist_batch']['rows_per_s_median'])}; list of dicts "
            f"{_fmt(s['ingest_list_of_dicts_rows_per_s'])} rows/s"
        )
        sat = s.get("ingest_saturated_encoder")
        if sat:
            lines.append(f"ingest+classify with a saturated encoder (a unique request id per "
                         f"row, all mapped to <other>): {_fmt(sat['rows_per_s_median'])} rows/s "
                         f"(target >= 1,000,000)")
        e = s["explain_1m"]
        lines.append(
            f"explain 1M rows, 8 attrs, order 3: {e['explain_table_seconds_median']:.2f} s "
            f"end to end incl. encoding (target <= {TARGET_EXPLAIN_SECONDS} s), search only "
            f"{e['search_only_seconds_median']:.2f} s, low-cardinality worst case "
            f"{e['search_low_cardinality_seconds_median']:.2f} s; top = {e['top_explanation']}"
        )
        for key, label in (("ingest_fresh_strings_zipf", "fresh strings, one object per row"),
                           ("ingest_serving_records_zipf", "serving records, one object per "
                                                           "request")):
            f = s.get(key)
            if f:
                lines.append(
                    f"ingest+classify, {label}, 9 string attributes incl. a 5,000-level Zipf "
                    f"client: {_fmt(f['rows_rows_per_s_median'])} rows/s counting rows, "
                    f"{_fmt(f['requests_rows_per_s_median'])} rows/s with request_column "
                    f"(target >= {TARGET_INGEST_ROWS_PER_S:,})")
        w = s["monitor_explain_window_1m"]
        lines.append(f"Monitor.explain on a window of {w['window_rows']:,} rows "
                     f"({w['rows_sampled']:,} sampled): {w['seconds_median']:.2f} s")
    m = res.get("memory")
    if m and "points" in m:
        lines.append("\n== memory (1k rows/s, 1-minute panes) ==")
        base = m["baseline_rss_bytes"]
        for pt in m["points"]:
            lines.append(f"after {pt['hours']:.1f} h: monitor state {pt['state_bytes'] / 2**20:.1f}"
                         f" MiB, database {pt.get('disk_bytes', 0) / 2**20:.1f} MiB, process RSS "
                         f"{pt['rss_bytes'] / 2**20:.0f} MiB (+"
                         f"{(pt['rss_bytes'] - base) / 2**20:.0f} MiB over the "
                         f"{base / 2**20:.0f} MiB of imports and inputs)")
        lines.append(f"peak RSS {m['peak_rss_bytes'] / 2**20:.0f} MiB for {m['rows']:,} rows in "
                     f"{m['seconds']:.0f} s ({m['panes_full']} full panes, {m['panes_detail']} "
                     f"detail, {m['rollups']} rollups, {m['series_panes']} series panes); "
                     f"reservoir bound {m['reservoir_bound_bytes'] / 2**20:.1f} MiB; "
                     f"{m['stated_bound_note']}")
    elif m:
        lines.append(f"memory run failed: {m.get('error')}")
    sampled = res.get("sampled")
    if sampled:
        lines.append("\n== sampled regime (2,000 rows/s, 1-minute panes, default reservoirs) ==")
        lines += _drift_sampled.report_lines(sampled)
    req = res.get("requests")
    if req:
        lines += _drift_requests.report_lines(req)
        lines.append(f"requests took {req['seconds']:.0f} s")
    seq = res.get("sequential")
    if seq:
        lines += _drift_sequential.report_lines(seq)
        lines.append(f"sequential took {seq['seconds']:.0f} s")
    libs = res.get("libraries")
    if libs:
        lines.append("\n== Apache DataSketches vs drift's sketches ==")
        lines += _drift_libraries.report_lines(libs)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drift", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="write all results as JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer seeds, windows, repeats")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--_day", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cpu = None if args.no_pin else _pin()
    if args._day is not None:
        print(json.dumps(_day_run(args._day, 1000.0, 1.0 if args._day <= 6 else 4.0)))
        return 0
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    warnings.simplefilter("ignore")
    res: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(), "numpy": np.__version__,
            "pandas": pd.__version__, "cpus": os.cpu_count(), "pinned_cpu": cpu,
            "note": (f"pinned to CPU {cpu}" if cpu is not None else "not pinned")
            + "; 2-core machine shared with another engineer's jobs",
        },
        "quick": args.quick,
    }
    runners: dict[str, Callable[[bool], dict[str, Any]]] = {
        "quality": quality, "speed": speed, "memory": memory,
        "sampled": _drift_sampled.sampled, "libraries": _drift_libraries.libraries,
        "requests": _drift_requests.requests_section,
        "sequential": _drift_sequential.sequential_quality}
    for name in ("speed", "libraries", "memory", "sampled", "requests", "sequential", "quality"):
        if name in sections:
            res[name] = runners[name](args.quick)
            print(f"[{name} done]", file=sys.stderr, flush=True)
    print(report(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
