"""The "never slower" check: the certified cascade timed side by side with the full pipeline."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ._capture import clear_row_caches
from ._rows import n_rows, take

#: held-out rows the certified cascade is timed on (batch mode), against the full pipeline
VERIFY_ROWS = 2048
#: single rows timed in row mode
VERIFY_SINGLE_ROWS = 100
#: interleaved timing rounds (medians)
VERIFY_REPEATS = 3


def measure_speedup(opt: Any, rows: Any, cost_mode: str, rng: np.random.Generator,
                    repeats: int = VERIFY_REPEATS) -> float:
    """Full pipeline time over cascade time on held-out rows, timed side by side
    (interleaved rounds, medians): whole batches in batch mode, one row per call in row mode."""
    n = n_rows(rows)
    if cost_mode == "batch":
        pick = np.sort(rng.choice(n, min(VERIFY_ROWS, n), replace=False))
        calls = [take(rows, pick)]
    else:
        pick = rng.choice(n, min(VERIFY_SINGLE_ROWS, n), replace=False)
        calls = [take(rows, np.array([i])) for i in pick]
    opt.baseline.predict_proba(calls[0])  # warm both paths
    opt.predict_proba(calls[0])
    full_times, cascade_times = [], []
    for _ in range(repeats):
        for fn, out in ((opt.baseline.predict_proba, full_times), (opt.predict_proba, cascade_times)):
            clear_row_caches()  # each round starts cold: no round serves rows an earlier one cached
            start = time.perf_counter()
            for call in calls:
                fn(call)
            out.append(time.perf_counter() - start)
    return float(np.median(full_times) / np.median(cascade_times))


#: most threads ``workers="auto"`` tries for the independent groups
MAX_AUTO_WORKERS = 8
#: how much faster the threaded run must measure before ``workers="auto"`` keeps it
MIN_WORKERS_GAIN = 1.05


def choose_workers(opt: Any, rows: Any, cost_mode: str, rng: np.random.Generator,
                   repeats: int = VERIFY_REPEATS) -> tuple[int, float]:
    """Threads for the independent groups: the pipeline timed with one thread and with one
    per top-level group (at most MAX_AUTO_WORKERS), interleaved, on held-out rows; the threaded
    run is kept when it measures MIN_WORKERS_GAIN faster. Returns (workers, measured gain)."""
    graph = opt.pipeline.graph
    threads = min(MAX_AUTO_WORKERS, len(graph.depth0))
    if not graph.concurrent or threads < 2:
        return 1, 1.0
    n = n_rows(rows)
    if cost_mode == "batch":
        calls = [take(rows, np.sort(rng.choice(n, min(VERIFY_ROWS, n), replace=False)))]
    else:
        calls = [take(rows, np.array([i])) for i in rng.choice(n, min(VERIFY_SINGLE_ROWS, n), replace=False)]
    times: dict[int, list[float]] = {1: [], threads: []}
    for _ in range(repeats + 1):  # the first round warms the pool and caches
        for workers in (1, threads):
            opt.workers = workers
            clear_row_caches()
            start = time.perf_counter()
            for call in calls:
                opt.predict_proba(call)
            times[workers].append(time.perf_counter() - start)
    gain = float(np.median(times[1][1:]) / np.median(times[threads][1:]))
    opt.workers = threads if gain >= MIN_WORKERS_GAIN else 1
    return opt.workers, gain
