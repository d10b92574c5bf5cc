"""Speed and memory of the monitor: ingest + classify, explaining 1M rows, a day of panes.

Why separate from quality: timings need a pinned core and medians over repeats; nothing here
judges correctness (the tests and the quality sections do).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd

from drift import Monitor
from drift._apriori import Rows, mine
from drift._explain import explain

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


def saturated_ingest_speed(batches: list[pd.DataFrame], reference: pd.DataFrame,
                           repeats: int) -> dict[str, Any]:
    """Ingest + classify when one more attribute holds a unique id per row (request ids) and
    its encoder is saturated (max_codes=2,000): every row's value is unknown and maps to
    <other>, which must stay vectorized."""
    with_ids = []
    for i, b in enumerate(batches):
        frame = b.copy(deep=False)
        frame["request"] = np.char.add(f"r{i}_", np.arange(len(b)).astype(str)).astype(object)
        with_ids.append(frame)
    ref = reference.assign(request="r")
    rates = []
    for _ in range(repeats):
        mon = Monitor([*(f"a{j}" for j in range(8)), "request"],
                      ["latency_ms", "confidence", "score"], error_column="error",
                      classifiers={"slow": "latency_ms > 50"}, max_codes=2000)
        mon.set_reference(ref)
        mon.ingest(with_ids[0])  # fills the codes
        start = time.perf_counter()
        for b in with_ids[1:]:
            mon.ingest(b)
        rates.append(sum(len(b) for b in with_ids[1:]) / (time.perf_counter() - start))
        overflow = mon.stats()["overflowed_values"]["request"]
    return {"rows_per_s_median": statistics.median(rates), "rows_per_s_runs": rates,
            "rows_mapped_to_other": overflow}


#: Levels of the Zipf attribute of the fresh-strings ingest (the issue's 5,000-level client).
FRESH_LEVELS = 5_000
#: Rows per request in the serving-shaped ingest (uniform).
FRESH_REQUEST_ROWS = (1, 32)


#: Attributes a request's rows share in the serving-shaped batches (the rest vary by row).
REQUEST_LEVEL = ("a0", "a1", "a2", "a3", "client")


def _strings(prefix: str, idx: np.ndarray, owner: np.ndarray, shared: bool,
             serving: bool) -> np.ndarray:
    """New string objects: per row, or (`shared`) one value per request (`owner` maps rows to
    requests), as one object per request when `serving`, else one per row."""
    requests = int(owner[-1]) + 1
    if shared and serving:  # one object per request, repeated over its rows
        heads = np.array([f"{prefix}{k}" for k in idx[:requests].tolist()], dtype=object)
        return heads[owner]
    idx = idx[:requests][owner] if shared else idx
    return np.array([f"{prefix}{k}" for k in idx.tolist()], dtype=object)


def _fresh_batches(n_batches: int, batch: int, rows_per_s: float, seed: int = 0,
                   serving: bool = False) -> list[pd.DataFrame]:
    """Batches whose strings are all new objects (built per batch, as a JSON decoder makes
    them; the other speed batches reuse 20 base frames' strings): the 8 string attributes of
    `_speed_batches`, a 5,000-level Zipf `client` and a `request_id` shared by the rows of
    each request (1-32 rows). `serving`: as serving's records arrive, one object per request
    for the request-level attributes (REQUEST_LEVEL) and the id; otherwise one per row."""
    rng = np.random.default_rng([seed, 11])
    p = 1.0 / np.arange(1, FRESH_LEVELS + 1) ** 1.1
    p /= p.sum()
    lo, hi = FRESH_REQUEST_ROWS
    out = []
    for i in range(n_batches):
        sizes = rng.integers(lo, hi + 1, batch // lo)
        sizes = sizes[np.cumsum(sizes) <= batch]
        sizes = np.append(sizes, batch - sizes.sum()) if sizes.sum() < batch else sizes
        owner = np.repeat(np.arange(sizes.size), sizes)

        data: dict[str, Any] = {}
        for j, card in enumerate(SPEED_CARDS):
            data[f"a{j}"] = _strings(f"a{j}_", rng.integers(0, card, batch), owner,
                                     f"a{j}" in REQUEST_LEVEL, serving)
        data["client"] = _strings("client-", rng.choice(FRESH_LEVELS, batch, p=p), owner, True,
                                  serving)
        data["request_id"] = _strings(f"{seed}-{i}-", np.arange(batch), owner, True, serving)
        data["latency_ms"] = rng.lognormal(3.0, 0.5, batch)
        data["confidence"] = rng.beta(6.0, 2.0, batch)
        data["score"] = rng.random(batch)
        data["error"] = (rng.random(batch) < 0.01).astype(np.float64)
        data["timestamp"] = 1_700_000_000.0 + (i * batch + np.arange(batch)) / rows_per_s
        out.append(pd.DataFrame(data))
    return out


def fresh_ingest_speed(n_batches: int, repeats: int, serving: bool = False) -> dict[str, Any]:
    """Ingest + classify on fresh strings with a 5,000-level Zipf attribute, with and without
    the request column (its hashing is the price of counting requests); `serving`: the
    records as serving sends them (`_fresh_batches`)."""
    batches = _fresh_batches(n_batches, 10_000, rows_per_s=1000.0, serving=serving)
    reference = pd.concat(_fresh_batches(5, 10_000, 1000.0, seed=9, serving=serving)).assign(
        timestamp=1_690_000_000.0)
    out: dict[str, Any] = {"levels": FRESH_LEVELS, "request_rows": list(FRESH_REQUEST_ROWS),
                           "request_level": list(REQUEST_LEVEL) if serving else []}
    for name, request_column in (("rows", None), ("requests", "request_id")):
        rates = []
        for _ in range(repeats):
            mon = Monitor([*(f"a{j}" for j in range(8)), "client"],
                          ["latency_ms", "confidence", "score"], error_column="error",
                          classifiers={"slow": "latency_ms > 50"},
                          request_column=request_column)
            mon.set_reference(reference)
            start = time.perf_counter()
            for b in batches:
                mon.ingest(b)
            rates.append(sum(len(b) for b in batches) / (time.perf_counter() - start))
            mon.close()
        out[f"{name}_rows_per_s_median"] = statistics.median(rates)
        out[f"{name}_rows_per_s_runs"] = rates
    return out


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
    out["ingest_saturated_encoder"] = saturated_ingest_speed(batches[:30], reference, repeats)
    out["ingest_fresh_strings_zipf"] = fresh_ingest_speed(20 if quick else 50, repeats)
    out["ingest_serving_records_zipf"] = fresh_ingest_speed(20 if quick else 50, repeats,
                                                            serving=True)
    out["ingest_classify_persist_pane"] = ingest_speed(batches, reference, max(repeats - 2, 1),
                                                       persist=True, durability="pane")
    out["ingest_classify_persist_batch"] = ingest_speed(batches, reference,
                                                        max(repeats - 2, 1), persist=True,
                                                        durability="batch")
    records = batches[0].head(2000).to_dict("records")
    mon = _speed_monitor()
    mon.set_reference(reference)
    start = time.perf_counter()
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
    tmp = tempfile.TemporaryDirectory()  # persisted, pane durability: the database size too
    mon = _speed_monitor(directory=tmp.name, clock=None)
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
                           "state_bytes": mon.memory_bytes(), "rss_bytes": _rss_bytes(),
                           "disk_bytes": mon.stats()["disk_bytes"]})
    elapsed = time.perf_counter() - start
    stats = mon.stats()
    mon.close()
    tmp.cleanup()
    return {
        "hours": hours, "rows_per_s": rows_per_s, "rows": total_batches * batch,
        "seconds": elapsed, "points": points, "baseline_rss_bytes": baseline,
        "peak_rss_bytes": _peak_rss_bytes(),
        "panes_full": stats["panes_full"], "panes_detail": stats["panes_detail"],
        "rollups": stats["rollups"], "series_panes": stats["series_panes"],
    }


def memory(quick: bool) -> dict[str, Any]:
    hours = 3.0 if quick else 24.0
    cmd = [sys.executable, "-m", "benchmarks.drift", "--_day", str(hours)]
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
