"""Quality at 50 rows/s (nothing sampled): planted causes and null streams, per window.

Why kept beside the sampled regime (benchmarks._drift_sampled): it is the exact-data baseline the
sampled figures are compared with, with an oracle on the raw window, an always-fire baseline
and a dummy ranking baseline.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

import numpy as np
import pandas as pd

from drift import Monitor
from drift._synthetic import ATTRIBUTES, Stream, monitor_kwargs
from drift._synthetic import KINDS as STREAM_KINDS

#: Stream and window sizes for the quality runs.
RATE = 50.0
WINDOW = 10
REFERENCE_PANES = 30
QUALIFY_SUPPORT, QUALIFY_RATIO = 0.05, 3.0

assert set(STREAM_KINDS) >= {"latency_combo", "mix_shift", "conditional", "gradual"}


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
        outl = clf.flags({"latency_ms": lat})  # the oracle: the same classifier, raw rows
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
            if seasonal and (r["series"].startswith("latency_ms") or r["series"] == "rows"):
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
        out["note"] = ("latency_ms drift, latency and traffic change points are excluded: the seasonal "
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
