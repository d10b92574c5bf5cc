"""Benchmark of the monitor: quality on planted causes and null streams, speed, memory.

    python -m drift.bench [--json PATH] [--quick] [--sections quality,speed,memory] [--no-pin]

Quality (seeded synthetic streams, drift._synthetic): precision / recall of planted
combinations, top-1 / top-3 hit rates on windows where the planted cause qualifies (support
>= 5% and ratio >= 3, computed by an oracle on the raw window), detection delay, and false
alarms per 1,000 windows on null streams next to an always-fire baseline (and a dummy ranking
baseline for hit rates).
Speed: ingest + classify rows/s on one core (batches of 10k rows, 8 attributes); explaining
1M rows (8 attributes, cardinality <= 100, order 3). Memory: a monitor holding a day of 1-minute
panes at 1k rows/s (simulated; --quick simulates 3 hours and shows the plateau).
Timings are medians over repeats; the process pins itself to one CPU unless --no-pin.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from drift import Monitor
from drift._apriori import Rows, mine
from drift._explain import explain
from drift._synthetic import ATTRIBUTES, Stream, monitor_kwargs
from drift._synthetic import KINDS as STREAM_KINDS

#: Targets from the issue.
TARGET_TOP1 = 0.95
TARGET_FALSE_ALARM = 0.01
TARGET_INGEST_ROWS_PER_S = 2_000_000
TARGET_EXPLAIN_SECONDS = 2.0
#: Stream and window sizes for the quality runs.
RATE = 50.0
WINDOW = 10
REFERENCE_PANES = 30
QUALIFY_SUPPORT, QUALIFY_RATIO = 0.05, 3.0

assert set(STREAM_KINDS) >= {"latency_combo", "mix_shift", "conditional", "gradual"}


# ====================================================================== helpers
def _pin() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1]
    os.sched_setaffinity(0, {cpu})
    return cpu


def _combo(row: dict[str, Any]) -> dict[str, Any]:
    return {a: row[a] for a in (*ATTRIBUTES, "level") if row.get(a) is not None}


def _contains(row: dict[str, Any], planted: dict[str, Any]) -> bool:
    combo = _combo(row)
    return all(combo.get(a) == v for a, v in planted.items())


def _rate(hits: int, total: int) -> float | None:
    return None if total == 0 else hits / total


def _monitor(**kw: Any) -> Monitor:
    return Monitor(**monitor_kwargs(auto_reference_panes=REFERENCE_PANES, window_panes=WINDOW,
                                    **kw))


def _dummy_top(outliers: pd.DataFrame) -> dict[str, Any] | None:
    """Dummy ranking baseline: the order-1/2 combination holding the most outliers."""
    best, best_count = None, -1
    for i, a in enumerate(ATTRIBUTES):
        for b in (None, *ATTRIBUTES[i + 1:]):
            cols = [a] if b is None else [a, b]
            counts = outliers.groupby(cols, observed=True).size()
            if len(counts) and int(counts.max()) > best_count:
                best_count = int(counts.max())
                key = counts.idxmax()
                key = key if isinstance(key, tuple) else (key,)
                best = dict(zip(cols, key, strict=True))
    return best


# ====================================================================== quality: planted
def planted_latency(seed: int, panes: int) -> dict[str, Any]:
    stream = Stream("latency_combo", seed, rate=RATE)
    planted = stream.planted["attributes"]
    mon = _monitor()
    frames: deque[pd.DataFrame] = deque(maxlen=WINDOW)
    out = {"qualifying": 0, "top1": 0, "top1_exact": 0, "top3": 0, "recall": 0, "rows": 0,
           "hit_rows": 0, "dummy_top1": 0, "pre_windows": 0, "pre_alarms": 0, "delay": None}
    for p in range(panes):
        frame = stream.pane(p)
        mon.ingest(frame)
        frames.append(frame)
        if p < REFERENCE_PANES + WINDOW:
            continue
        exp = mon.explain(metric="latency_ms")
        if p < stream.change_pane:
            out["pre_windows"] += 1
            out["pre_alarms"] += int(len(exp) > 0)
            continue
        clf = mon.classifiers["latency_ms"]
        window = pd.concat(frames)
        lat = window["latency_ms"].to_numpy()
        outl = (lat < clf.lower_threshold_) | (lat > clf.upper_threshold_)
        inside = stream.mask(window)
        o_g, n_g, big_o, big_n = outl[inside].sum(), inside.sum(), outl.sum(), len(window)
        support = o_g / big_o if big_o else 0.0
        rr = (o_g / n_g) / max((big_o - o_g) / (big_n - n_g), 1e-12) if n_g else 0.0
        rows = exp.rows
        if out["delay"] is None and rows and _contains(rows[0], planted):
            out["delay"] = p - stream.change_pane + 1
        if not (support >= QUALIFY_SUPPORT and rr >= QUALIFY_RATIO):
            continue
        out["qualifying"] += 1
        out["top1"] += int(bool(rows) and _contains(rows[0], planted))
        out["top1_exact"] += int(bool(rows) and _combo(rows[0]) == planted)
        out["top3"] += int(any(_contains(r, planted) for r in rows[:3]))
        out["recall"] += int(any(_contains(r, planted) for r in rows))
        out["rows"] += len(rows)
        out["hit_rows"] += sum(_contains(r, planted) for r in rows)
        dummy = _dummy_top(window[outl])
        out["dummy_top1"] += int(dummy is not None and all(dummy.get(a) == v
                                                           for a, v in planted.items()))
    return out


def planted_mix(seed: int, panes: int) -> dict[str, Any]:
    stream = Stream("mix_shift", seed, rate=RATE)
    planted = stream.planted["attributes"]
    (attr, value), = planted.items()
    mon = _monitor()
    frames: deque[pd.DataFrame] = deque(maxlen=WINDOW)
    ref_frames = []
    out = {"qualifying": 0, "top1": 0, "top1_exact": 0, "top3": 0, "recall": 0, "rows": 0,
           "hit_rows": 0, "dummy_top1": 0, "pre_windows": 0, "pre_alarms": 0, "delay": None}
    for p in range(panes):
        frame = stream.pane(p)
        mon.ingest(frame)
        frames.append(frame)
        if p < REFERENCE_PANES:
            ref_frames.append(frame)
        if p < REFERENCE_PANES + WINDOW:
            continue
        exp = mon.mix_shift()
        if p < stream.change_pane:
            out["pre_windows"] += 1
            out["pre_alarms"] += int(len(exp) > 0)
            continue
        rows = exp.rows
        if out["delay"] is None and rows and _contains(rows[0], planted):
            out["delay"] = p - stream.change_pane + 1
        window = pd.concat(frames)
        ref = pd.concat(ref_frames)
        cur_share = float((window[attr] == value).mean())
        ref_share = float((ref[attr] == value).mean())
        if not (cur_share >= QUALIFY_SUPPORT and cur_share >= QUALIFY_RATIO * ref_share):
            continue
        out["qualifying"] += 1
        out["top1"] += int(bool(rows) and _contains(rows[0], planted))
        out["top1_exact"] += int(bool(rows) and _combo(rows[0]) == planted)
        out["top3"] += int(any(_contains(r, planted) for r in rows[:3]))
        out["recall"] += int(any(_contains(r, planted) for r in rows))
        out["rows"] += len(rows)
        out["hit_rows"] += sum(_contains(r, planted) for r in rows)
        # dummy: the attribute value with the largest share of window rows
        best = max(((a, window[a].value_counts().idxmax(), window[a].value_counts().max())
                    for a in ATTRIBUTES), key=lambda t: t[2])
        out["dummy_top1"] += int(best[0] == attr and best[1] == value)
    return out


def planted_conditional(seed: int, panes: int, every: int) -> dict[str, Any]:
    stream = Stream("conditional", seed, rate=RATE)
    planted = stream.planted["attributes"]
    column = stream.planted["column"]
    mon = _monitor()
    out = {"qualifying": 0, "top1": 0, "top1_exact": 0, "top3": 0, "recall": 0, "rows": 0,
           "hit_rows": 0, "dummy_top1": 0, "pre_windows": 0, "pre_alarms": 0, "delay": None}

    def hit(r: dict[str, Any]) -> bool:
        return r["localized"] and r["column"] == column and _combo(r) == planted

    for p in range(panes):
        mon.ingest(stream.pane(p))
        if p < REFERENCE_PANES + WINDOW or (p - REFERENCE_PANES) % every:
            continue
        rep = mon.conditional_shift()
        rows = [r for r in rep.rows if r["localized"]]
        if p < stream.change_pane:
            out["pre_windows"] += 1
            out["pre_alarms"] += int(len(rows) > 0)
            continue
        if out["delay"] is None and rows and hit(rows[0]):
            out["delay"] = p - stream.change_pane + 1
        if p < stream.change_pane + WINDOW // 2:
            continue  # the window is mostly pre-change
        out["qualifying"] += 1
        out["top1"] += int(bool(rows) and hit(rows[0]))
        out["top1_exact"] += int(bool(rows) and hit(rows[0]))
        out["top3"] += int(any(hit(r) for r in rows[:3]))
        out["recall"] += int(any(hit(r) for r in rows))
        out["rows"] += len(rows)
        out["hit_rows"] += sum(hit(r) for r in rows)
        segs = rep.info.get("segments", [])
        out["dummy_top1"] += int(bool(segs) and segs[0] == planted)
    return out


def planted_gradual(seed: int, panes: int) -> dict[str, Any]:
    stream = Stream("gradual", seed, rate=RATE)
    column = stream.planted["column"]
    mon = _monitor()
    out: dict[str, Any] = {"pre_windows": 0, "pre_alarms": 0, "delay": None,
                           "shift_at_detection": None}
    for p in range(panes):
        mon.ingest(stream.pane(p))
        if p < REFERENCE_PANES + WINDOW:
            continue
        rep = mon.drift()
        if p < stream.change_pane:
            out["pre_windows"] += 1
            out["pre_alarms"] += int(bool(rep.drifted_columns))
            continue
        if out["delay"] is None and column in rep.drifted_columns:
            out["delay"] = p - stream.change_pane + 1
            # mean shift (in stds) of the newest pane and of the window when first flagged
            newest = min(1.0, (p - stream.change_pane + 1) / stream.ramp_panes)
            in_window = [min(1.0, max(0, q - stream.change_pane + 1) / stream.ramp_panes)
                         for q in range(p - WINDOW + 1, p + 1)]
            out["shift_at_detection"] = newest
            out["window_mean_shift_at_detection"] = float(np.mean(in_window))
            break
    return out


def _aggregate(results: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    def total(k: str) -> int:
        return sum(r.get(k, 0) or 0 for r in results)

    delays = [r["delay"] for r in results if r.get("delay") is not None]
    out: dict[str, Any] = {
        "seeds": len(results),
        "pre_change_windows": total("pre_windows"),
        "pre_change_false_alarms_per_1000": _per_1000(total("pre_alarms"), total("pre_windows")),
        "detected_seeds": len(delays),
        "detection_delay_panes_median": statistics.median(delays) if delays else None,
        "detection_delay_panes_max": max(delays) if delays else None,
    }
    if kind != "gradual":
        q = total("qualifying")
        out.update(
            qualifying_windows=q,
            top1_hit_rate=_rate(total("top1"), q),
            top1_exact_rate=_rate(total("top1_exact"), q),
            top3_hit_rate=_rate(total("top3"), q),
            recall=_rate(total("recall"), q),
            precision=_rate(total("hit_rows"), total("rows")),
            dummy_top1_hit_rate=_rate(total("dummy_top1"), q),
            always_fire_baseline={"recall": 1.0 if q else None, "top1_hit_rate": None,
                                  "false_alarms_per_1000": 1000.0},
        )
    else:
        shifts = [r["shift_at_detection"] for r in results if r.get("shift_at_detection")]
        wshifts = [r["window_mean_shift_at_detection"] for r in results
                   if r.get("window_mean_shift_at_detection")]
        out.update(
            true_shift_std_at_detection_median=statistics.median(shifts) if shifts else None,
            window_mean_shift_std_at_detection_median=(statistics.median(wshifts)
                                                       if wshifts else None),
            always_fire_baseline={"detection_delay_panes": 1, "false_alarms_per_1000": 1000.0},
        )
    return out


def _per_1000(alarms: int, windows: int) -> float | None:
    return None if windows == 0 else 1000.0 * alarms / windows


# ====================================================================== quality: null
def null_stream(kind: str, seed: int, windows: int, heavy_every: int) -> dict[str, Any]:
    """Alarms per detector on a stream without causes, one window per pane."""
    stream = Stream(kind, seed, rate=RATE)
    mon = _monitor()
    seasonal = kind == "null_seasonal"
    alarms: dict[str, int] = {}
    evaluated: dict[str, int] = {}
    any_alarm = 0
    seen_changes: set[tuple[str, int]] = set()

    def count(name: str, fired: bool) -> bool:
        evaluated[name] = evaluated.get(name, 0) + 1
        alarms[name] = alarms.get(name, 0) + int(fired)
        return fired

    first = REFERENCE_PANES + WINDOW
    for p in range(first + windows):
        mon.ingest(stream.pane(p))
        if p < first:
            continue
        fired = False
        fired |= count("explain_latency", len(mon.explain(metric="latency_ms")) > 0)
        fired |= count("explain_error", len(mon.explain(classifier="error")) > 0)
        rep = mon.drift()
        flagged = [c for c in rep.drifted_columns if not (seasonal and c == "latency_ms")]
        fired |= count("drift", bool(flagged))
        new = False
        for r in mon.change_points().rows:
            if seasonal and r["series"].startswith("latency_ms"):
                continue
            key = (r["series"], r["detected_pane"])
            if key not in seen_changes:
                seen_changes.add(key)
                new = True
        fired |= count("change_points", new)
        if (p - first) % heavy_every == 0:
            fired |= count("mix_shift", len(mon.mix_shift()) > 0)
            cond = mon.conditional_shift()
            fired |= count("conditional_shift", any(r["localized"] for r in cond.rows))
            fired |= count("cascade_health", not mon.cascade_health().healthy)
        any_alarm += int(fired)
    out = {
        name: {"windows": evaluated[name], "alarms": alarms[name],
               "false_alarms_per_1000": _per_1000(alarms[name], evaluated[name])}
        for name in evaluated
    }
    out["any_detector"] = {"windows": windows, "alarms": any_alarm,
                           "false_alarms_per_1000": _per_1000(any_alarm, windows)}
    out["always_fire_baseline"] = {"false_alarms_per_1000": 1000.0}
    if seasonal:
        out["note"] = ("latency_ms drift and latency change points are excluded: the seasonal "
                       "latency level is a real distribution change, not a false alarm")
    return out


def quality(quick: bool) -> dict[str, Any]:
    seeds = 5 if quick else 20
    panes = 90 if quick else 110
    t0 = time.perf_counter()
    out: dict[str, Any] = {"params": {"rate_rows_per_s": RATE, "window_panes": WINDOW,
                                      "reference_panes": REFERENCE_PANES, "seeds": seeds,
                                      "change_pane": 60}}
    out["latency_x3_combination"] = _aggregate(
        [planted_latency(s, panes) for s in range(seeds)], "latency")
    out["segment_share_2_to_20_percent"] = _aggregate(
        [planted_mix(s, panes) for s in range(seeds)], "mix")
    out["feature_shift_inside_segment"] = _aggregate(
        [planted_conditional(s, panes, every=3) for s in range(max(seeds // 2, 3))],
        "conditional")
    out["gradual_drift"] = _aggregate(
        [planted_gradual(s, 60 + 160) for s in range(max(seeds // 2, 3))], "gradual")
    windows = 150 if quick else 500
    out["null_heavy_tailed"] = null_stream("null_heavy", 1000, windows, heavy_every=5)
    out["null_seasonal"] = null_stream("null_seasonal", 1001, windows, heavy_every=5)
    out["seconds"] = time.perf_counter() - t0
    return out


# ====================================================================== speed
SPEED_CARDS = (100, 100, 50, 20, 10, 5, 100, 3)


def _speed_batches(n_batches: int, batch: int, rows_per_s: float, seed: int = 0
                   ) -> list[pd.DataFrame]:
    """10k-row batches, 8 string attributes (cardinality <= 100), 4 metrics, event time."""
    rng = np.random.default_rng(seed)
    base = []
    for _ in range(min(n_batches, 20)):
        data: dict[str, Any] = {}
        for j, card in enumerate(SPEED_CARDS):
            values = np.array([f"a{j}_{i}" for i in range(card)], dtype=object)
            data[f"a{j}"] = pd.Series(values[rng.integers(0, card, batch)], dtype="str")
        data["latency_ms"] = rng.lognormal(3.0, 0.5, batch)
        data["confidence"] = rng.beta(6.0, 2.0, batch)
        data["score"] = rng.random(batch)
        data["error"] = (rng.random(batch) < 0.01).astype(np.float64)
        base.append(pd.DataFrame(data))
    out = []
    for i in range(n_batches):
        frame = base[i % len(base)].copy(deep=False)
        frame["timestamp"] = 1_700_000_000.0 + (i * batch + np.arange(batch)) / rows_per_s
        out.append(frame)
    return out


def _speed_monitor(**kw: Any) -> Monitor:
    return Monitor([f"a{j}" for j in range(8)], ["latency_ms", "confidence", "score"],
                   error_column="error", classifiers={"slow": "latency_ms > 50"}, **kw)


def ingest_speed(batches: list[pd.DataFrame], reference: pd.DataFrame, repeats: int,
                 **kw: Any) -> dict[str, Any]:
    rates = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            extra = dict(kw)
            if extra.pop("persist", False):
                extra["directory"] = tmp
            mon = _speed_monitor(**extra)
            mon.set_reference(reference)
            rows = sum(len(b) for b in batches)
            start = time.perf_counter()
            for b in batches:
                mon.ingest(b)
            rates.append(rows / (time.perf_counter() - start))
            mon.close()
    return {"rows_per_s_median": statistics.median(rates), "rows_per_s_runs": rates,
            "rows_per_run": sum(len(b) for b in batches)}


def explain_speed(repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    n = 1_000_000
    data: dict[str, Any] = {}
    for j, card in enumerate(SPEED_CARDS):
        values = np.array([f"a{j}_{i}" for i in range(card)], dtype=object)
        data[f"a{j}"] = pd.Series(values[rng.integers(0, card, n)], dtype="str")
    latency = rng.lognormal(3.0, 0.5, n)
    planted = (data["a3"] == "a3_1").to_numpy() & (data["a5"] == "a5_2").to_numpy()
    latency[planted] *= 3.0
    data["latency_ms"] = latency
    frame = pd.DataFrame(data)
    attrs = [f"a{j}" for j in range(8)]
    frame["outlier"] = frame["latency_ms"] > np.quantile(latency[~planted], 0.99)
    end_to_end, core = [], []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = explain(frame, attrs, outlier="outlier", max_order=3)
        end_to_end.append(time.perf_counter() - start)
    codes = np.stack([pd.factorize(frame[a])[0] for a in attrs])
    rows = Rows(codes=codes, cards=[int(c.max()) + 1 for c in codes],
                target=frame["outlier"].to_numpy(dtype=np.float64))
    for _ in range(repeats):
        start = time.perf_counter()
        mine(rows, max_order=3)
        core.append(time.perf_counter() - start)
    # worst case for the search: low cardinality, so every value and pair is supported
    low = np.stack([rng.integers(0, 4, n) for _ in range(8)])
    p = np.where((low[0] == 1) & (low[1] == 1), 0.2, 0.01)
    rows_low = Rows(codes=low, cards=[4] * 8, target=(rng.random(n) < p).astype(np.float64))
    low_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mine(rows_low, max_order=3)
        low_times.append(time.perf_counter() - start)
    assert result is not None
    top = result.rows[0] if result.rows else {}
    return {
        "rows": n, "attributes": 8, "cardinalities": list(SPEED_CARDS), "max_order": 3,
        "explain_table_seconds_median": statistics.median(end_to_end),
        "explain_table_seconds_runs": end_to_end,
        "search_only_seconds_median": statistics.median(core),
        "search_low_cardinality_seconds_median": statistics.median(low_times),
        "top_explanation": {k: v for k, v in top.items() if k in attrs and v is not None},
        "planted": {"a3": "a3_1", "a5": "a5_2"},
    }


def monitor_window_explain_speed(batches: list[pd.DataFrame], reference: pd.DataFrame,
                                 repeats: int) -> dict[str, Any]:
    """Monitor.explain on a window that holds 1M rows (answered from the row samples)."""
    mon = _speed_monitor(window_panes=60)
    mon.set_reference(reference)
    for b in batches:
        mon.ingest(b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mon.explain(metric="latency_ms")
        times.append(time.perf_counter() - start)
    info = mon.window_info()
    return {"window_rows": info["rows"], "rows_sampled": mon.window_sample().size,
            "seconds_median": statistics.median(times)}


def speed(quick: bool) -> dict[str, Any]:
    repeats = 3 if quick else 5
    n_batches = 50 if quick else 100
    batches = _speed_batches(n_batches, 10_000, rows_per_s=1000.0)
    reference = _speed_batches(10, 10_000, rows_per_s=1000.0, seed=9)
    reference = pd.concat(reference).assign(timestamp=1_690_000_000.0)
    out: dict[str, Any] = {}
    out["ingest_classify_in_memory"] = ingest_speed(batches, reference, repeats)
    out["ingest_classify_persist_pane"] = ingest_speed(batches, reference, max(repeats - 2, 1),
                                                       persist=True, durability="pane")
    out["ingest_classify_persist_batch"] = ingest_speed(batches, reference,
                                                        max(repeats - 2, 1), persist=True,
                                                        durability="batch")
    records = batches[0].head(2000).to_dict("records")
    start = time.perf_counter()
    mon = _speed_monitor()
    mon.set_reference(reference)
    for _ in range(5):
        mon.ingest(records)
    out["ingest_list_of_dicts_rows_per_s"] = 10_000 / (time.perf_counter() - start)
    out["explain_1m"] = explain_speed(max(repeats - 2, 1))
    out["monitor_explain_window_1m"] = monitor_window_explain_speed(
        _speed_batches(100, 10_000, rows_per_s=1000.0), reference, repeats)
    return out


# ====================================================================== memory
def _peak_rss_bytes() -> int:
    """This process's RSS high-water mark (VmHWM). ru_maxrss is not used: on Linux it carries
    the parent's peak across fork/exec, which made a child look as large as its parent."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc; else the peak so far)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _day_run(hours: float, rows_per_s: float, report_every_h: float) -> dict[str, Any]:
    """Feed `hours` of traffic at `rows_per_s` in 10k batches; sizes at each report point.

    RSS is measured without tracemalloc (its bookkeeping would dominate RSS); the baseline is
    the RSS after imports and input generation, before the monitor exists.
    """
    batch = 10_000
    base = _speed_batches(30, batch, rows_per_s=rows_per_s)
    baseline = _rss_bytes()
    mon = _speed_monitor()
    mon.set_reference(pd.concat(base[:5]).assign(timestamp=1_690_000_000.0))
    total_batches = int(hours * 3600 * rows_per_s / batch)
    per_report = max(1, int(report_every_h * 3600 * rows_per_s / batch))
    points = []
    start = time.perf_counter()
    for i in range(total_batches):
        frame = base[i % len(base)].copy(deep=False)
        frame["timestamp"] = 1_700_000_000.0 + (i * batch + np.arange(batch)) / rows_per_s
        mon.ingest(frame)
        if (i + 1) % per_report == 0 or i + 1 == total_batches:
            points.append({"hours": (i + 1) * batch / rows_per_s / 3600,
                           "state_bytes": mon.memory_bytes(), "rss_bytes": _rss_bytes()})
    elapsed = time.perf_counter() - start
    stats = mon.stats()
    return {
        "hours": hours, "rows_per_s": rows_per_s, "rows": total_batches * batch,
        "seconds": elapsed, "points": points, "baseline_rss_bytes": baseline,
        "peak_rss_bytes": _peak_rss_bytes(),
        "panes_full": stats["panes_full"], "panes_detail": stats["panes_detail"],
        "rollups": stats["rollups"], "series_panes": stats["series_panes"],
    }


def memory(quick: bool) -> dict[str, Any]:
    hours = 3.0 if quick else 24.0
    cmd = [sys.executable, "-m", "drift.bench", "--_day", str(hours)]
    env = dict(os.environ)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the stated bound: W+2 full panes, detail panes, rollups, reference, series
    cfg = _speed_monitor().config
    n_num, n_cat = 4, 8
    row_bytes = n_cat * 4 + n_num * 8 + 4 + 8
    full = (cfg.window_panes + 2) * (cfg.reservoir_size + cfg.flagged_reservoir_size) * row_bytes
    result["stated_bound_note"] = (
        "state <= (window_panes + 2) panes x (reservoir_size + flagged_reservoir_size) rows x "
        f"{row_bytes} B + (detail_panes + retention/rollup_panes) summaries of counts and "
        "sketches + the reference sample; independent of traffic volume"
    )
    result["reservoir_bound_bytes"] = full
    return result


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
    lines = [f"drift.bench  ({res['machine']['note']})"]
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
        e = s["explain_1m"]
        lines.append(
            f"explain 1M rows, 8 attrs, order 3: {e['explain_table_seconds_median']:.2f} s "
            f"end to end incl. encoding (target <= {TARGET_EXPLAIN_SECONDS} s), search only "
            f"{e['search_only_seconds_median']:.2f} s, low-cardinality worst case "
            f"{e['search_low_cardinality_seconds_median']:.2f} s; top = {e['top_explanation']}"
        )
        w = s["monitor_explain_window_1m"]
        lines.append(f"Monitor.explain on a window of {w['window_rows']:,} rows "
                     f"({w['rows_sampled']:,} sampled): {w['seconds_median']:.2f} s")
    m = res.get("memory")
    if m and "points" in m:
        lines.append("\n== memory (1k rows/s, 1-minute panes) ==")
        base = m["baseline_rss_bytes"]
        for pt in m["points"]:
            lines.append(f"after {pt['hours']:.1f} h: monitor state {pt['state_bytes'] / 2**20:.1f}"
                         f" MiB, process RSS {pt['rss_bytes'] / 2**20:.0f} MiB (+"
                         f"{(pt['rss_bytes'] - base) / 2**20:.0f} MiB over the "
                         f"{base / 2**20:.0f} MiB of imports and inputs)")
        lines.append(f"peak RSS {m['peak_rss_bytes'] / 2**20:.0f} MiB for {m['rows']:,} rows in "
                     f"{m['seconds']:.0f} s ({m['panes_full']} full panes, {m['panes_detail']} "
                     f"detail, {m['rollups']} rollups, {m['series_panes']} series panes); "
                     f"reservoir bound {m['reservoir_bound_bytes'] / 2**20:.1f} MiB; "
                     f"{m['stated_bound_note']}")
    elif m:
        lines.append(f"memory run failed: {m.get('error')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drift.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="write all results as JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer seeds, windows, repeats")
    parser.add_argument("--sections", default="quality,speed,memory",
                        help="comma list of quality, speed, memory")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--_day", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cpu = None if args.no_pin else _pin()
    if args._day is not None:
        print(json.dumps(_day_run(args._day, 1000.0, 1.0 if args._day <= 6 else 4.0)))
        return 0
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - {"quality", "speed", "memory"}
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
        "quality": quality, "speed": speed, "memory": memory}
    for name in ("speed", "memory", "quality"):
        if name in sections:
            res[name] = runners[name](args.quick)
    print(report(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
