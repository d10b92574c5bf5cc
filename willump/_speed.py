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


def choose_serving(opt: Any, rows: Any, cost_mode: str, rng: np.random.Generator,
                   repeats: int = VERIFY_REPEATS, timer: Any = time.perf_counter) -> tuple[int, bool, float]:
    """How the optimized pipeline serves: one thread or one per top-level group (at most
    MAX_AUTO_WORKERS), with or without the declared row caches. Each option is timed on
    held-out rows, interleaved, every round starting with cold caches; the fastest is kept
    when it measures MIN_WORKERS_GAIN faster than one thread without caches. Sets
    ``opt.workers`` and ``opt.use_cache``; returns (workers, use_cache, measured gain)."""
    graph = opt.pipeline.graph
    threads = min(MAX_AUTO_WORKERS, len(graph.depth0))
    options = [(1, False)]
    if graph.cacheable:
        options.append((1, True))
    if graph.concurrent and threads >= 2:
        options += [(threads, False)] + ([(threads, True)] if graph.cacheable else [])
    if len(options) == 1:
        opt.workers, opt.use_cache = 1, False
        return 1, False, 1.0
    n = n_rows(rows)
    if cost_mode == "batch":
        calls = [take(rows, np.sort(rng.choice(n, min(VERIFY_ROWS, n), replace=False)))]
    else:
        calls = [take(rows, np.array([i])) for i in rng.choice(n, min(VERIFY_SINGLE_ROWS, n), replace=False)]
    times: dict[tuple[int, bool], list[float]] = {o: [] for o in options}
    for _ in range(repeats + 1):  # the first round warms the pool and lazy imports
        for workers, cache in options:
            opt.workers, opt.use_cache = workers, cache
            clear_row_caches()
            start = timer()
            for call in calls:
                opt.predict_proba(call)
            times[(workers, cache)].append(timer() - start)
    median = {o: float(np.median(t[1:])) for o, t in times.items()}
    best = min(median, key=median.get)
    gain = median[(1, False)] / median[best]
    opt.workers, opt.use_cache = best if gain >= MIN_WORKERS_GAIN else (1, False)
    return opt.workers, opt.use_cache, gain
