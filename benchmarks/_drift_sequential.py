"""Sequential column drift (`Monitor.sequential_drift`, a CUSUM of per-pane effects): false
alarms per hour on null streams, and detection delay on planted shifts beside `drift()`'s.

Why online: both detectors are queried after every pane as serving would, so a delay is what a
user would have seen (the first pane whose query flags the planted column), and a false alarm
is every distinct (column, alarm pane) any query reported on a stream with no change.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pandas as pd

from drift import Monitor
from drift._synthetic import Stream, monitor_kwargs

#: Stream shape: 50 rows/s, 1-minute panes, the first 30 panes as the reference, 10-pane window.
RATE = 50.0
WINDOW = 10
REFERENCE_PANES = 30
#: Null streams and planted shifts measured.
NULL_KINDS = ("null_iid", "null_seasonal", "null_ar1")
PLANTED_KINDS = ("step", "conditional", "gradual", "mix_shift")
#: The `step` stream: null_iid with f_num moved by this many stds from the change pane on.
STEP_STD = 1.0
#: Panes watched after the change before a detector counts as having missed it.
HORIZON = 45


def _monitor() -> Monitor:
    return Monitor(**monitor_kwargs(auto_reference_panes=REFERENCE_PANES, window_panes=WINDOW,
                                    clock=None))


def _frame(stream: Stream, p: int, step: bool) -> pd.DataFrame:
    frame = stream.pane(p)
    if step and stream.changed(p):
        frame["f_num"] = frame["f_num"] + STEP_STD
    return frame


#: Columns whose change on a null stream is real (the seasonal latency level moves against a
#: reference taken in one phase of the cycle), as in benchmarks._drift_quality: not counted.
#: Columns whose distribution the null's load really moves against the reference (seasonal:
#: the latency level's cycle; AR(1): its wandering level, several percent): alarms on them are
#: counted apart (`excluded_real_changes`), as the sampled section does for `drift()`.
REAL_CHANGES = {"null_seasonal": ("latency_ms",), "null_ar1": ("latency_ms",)}


def null_stream(kind: str, seed: int, panes: int) -> dict[str, Any]:
    """False alarms on a stream with no change: each time a column turns `drifted` (in the
    sequential detector, and in `drift()`) after a pane where it was not, as a pager sees it."""
    stream = Stream(kind, seed, rate=RATE)
    mon = _monitor()
    skip = REAL_CHANGES.get(kind, ())
    alarms = {"sequential": 0, "default": 0}
    excluded = 0
    before: dict[str, set[str]] = {"sequential": set(), "default": set()}
    first_watched = None
    last = None
    for p in range(panes):
        mon.ingest(stream.pane(p))
        if p <= REFERENCE_PANES:
            continue
        res = mon.sequential_drift()
        now = {"default": set(mon.drift().drifted_columns),
               "sequential": set(res.drifted_columns)}
        for name, cols in now.items():
            new = cols - before[name]
            excluded += len(new & set(skip)) if name == "sequential" else 0
            alarms[name] += len(new - set(skip))
        before = now
        held = res.info["panes"]
        if not res.info["calibrating"] and held["first"] is not None:
            start = held["first"] + res.info["params"]["burn_in"]
            first_watched = start if first_watched is None else min(first_watched, start)
            last = held["last"]
    watched = 0 if first_watched is None or last is None else last - first_watched + 1
    hours = watched * stream.pane_seconds / 3600.0
    return {"kind": kind, "seed": seed, "panes_watched": watched,
            "false_alarms": alarms["sequential"], "excluded_real_changes": excluded,
            "per_hour": alarms["sequential"] / hours if hours else None,
            "default_false_alarms": alarms["default"],
            "default_per_hour": alarms["default"] / hours if hours else None}


def planted(kind: str, seed: int) -> dict[str, Any]:
    """Panes from the change to the first flag of the planted column, sequential and default."""
    step = kind == "step"
    stream = Stream("null_iid" if step else kind, seed, rate=RATE)
    column = ("f_num" if kind in ("step", "conditional", "gradual")
              else next(iter(stream.planted["attributes"])))
    mon = _monitor()
    change = stream.change_pane
    out: dict[str, Any] = {"kind": kind, "seed": seed, "column": column, "sequential": None,
                           "default": None, "start_error": None, "sequential_pre_alarms": 0}
    for p in range(change + HORIZON):
        mon.ingest(_frame(stream, p, step))
        if p <= REFERENCE_PANES:
            continue
        if out["sequential"] is None:
            res = mon.sequential_drift()
            hit = next((r for r in res.rows if r["column"] == column and r["drifted"]), None)
            if hit is not None and p < change:
                out["sequential_pre_alarms"] += 1
            elif hit is not None:
                out["sequential"] = p - change + 1
                out["start_error"] = hit["start_pane"] - (change + _pane0(stream))
        if p >= change and out["default"] is None and column in mon.drift().drifted_columns:
            out["default"] = p - change + 1
        if out["sequential"] is not None and out["default"] is not None:
            break
    return out


def _pane0(stream: Stream) -> int:
    """The monitor's pane id of the stream's pane 0."""
    return int(stream.t0 // stream.pane_seconds)


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def sequential_quality(quick: bool = False) -> dict[str, Any]:
    """False alarms per hour (null streams) and delays in panes (planted shifts) of
    `Monitor.sequential_drift` at its defaults, beside the default `drift()` verdict's delays.

    quick: one seed per stream and 150-pane null streams (about a minute on one core); else
    3 seeds and 400 panes (a null_seasonal cycle and a half)."""
    t0 = time.perf_counter()
    seeds = [0] if quick else [0, 1, 2]
    null_panes = 150 if quick else 400
    nulls = [null_stream(k, s, null_panes) for k in NULL_KINDS for s in seeds]
    shifts = [planted(k, s) for k in PLANTED_KINDS for s in seeds]
    out: dict[str, Any] = {"nulls": nulls, "planted": shifts}
    for k in NULL_KINDS:
        runs = [r for r in nulls if r["kind"] == k]
        hours = sum(r["panes_watched"] for r in runs) / 60.0
        alarms = sum(r["false_alarms"] for r in runs)
        default = sum(r["default_false_alarms"] for r in runs)
        out[f"{k}_false_alarms_per_hour"] = alarms / hours if hours else None
        out[f"{k}_default_false_alarms_per_hour"] = default / hours if hours else None
        out[f"{k}_hours"] = hours
        out[f"{k}_excluded_real_changes_per_hour"] = (
            sum(r["excluded_real_changes"] for r in runs) / hours if hours else None)
    for k in PLANTED_KINDS:
        runs = [r for r in shifts if r["kind"] == k]
        out[f"{k}_sequential_delay_panes"] = _median([r["sequential"] for r in runs])
        out[f"{k}_default_delay_panes"] = _median([r["default"] for r in runs])
        out[f"{k}_missed"] = sum(r["sequential"] is None for r in runs)
    out["seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(sequential_quality("--quick" in sys.argv), indent=1, default=str))


def report_lines(res: dict[str, Any]) -> list[str]:
    lines = ["\n== sequential drift (Monitor.sequential_drift, CUSUM; 50 rows/s) =="]
    for k in NULL_KINDS:
        seq, dft = res[f"{k}_false_alarms_per_hour"], res[f"{k}_default_false_alarms_per_hour"]
        real = res.get(f"{k}_excluded_real_changes_per_hour")
        lines.append(f"{k}: false alarms {seq:.2f}/h (target 0.1/day) vs drift() {dft:.2f}/h "
                     f"over {res[f'{k}_hours']:.1f} h"
                     + (f"; latency alarms on the load's real level changes {real:.2f}/h, "
                        "counted apart" if real else ""))
    for k in PLANTED_KINDS:
        lines.append(f"{k}: first alarm after {res[f'{k}_sequential_delay_panes']} panes "
                     f"(median) vs drift() {res[f'{k}_default_delay_panes']}; missed "
                     f"{res[f'{k}_missed']}")
    return lines
