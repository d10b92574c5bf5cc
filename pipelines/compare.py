"""A quick side-by-side of an optimized pipeline and its baseline, for the examples.

The benchmark (``python -m benchmarks.workloads``) measures more carefully (repeats,
latency percentiles, load average); this is the one-screen version.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import willump

from .workload import score

#: timed calls per pipeline (the median is shown)
COMPARE_REPEATS = 3


def _median_seconds(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def compare(opt: willump.OptimizedPipeline, X: Any, y: Any, metric: str, *, k: int = 100,
            label: Any = None, repeats: int = COMPARE_REPEATS) -> str:
    """Throughput, metric and top-K of baseline vs optimized on held-out rows, as text."""
    y = np.asarray(y)
    classes = np.asarray(opt.classes_)
    base_s = _median_seconds(lambda: opt.baseline.predict_proba(X), repeats)
    opt_s = _median_seconds(lambda: opt.predict_proba(X), repeats)
    proba, level = opt.predict_with_levels(X)
    fractions = np.bincount(level, minlength=len(opt.levels)) / len(level)
    base_score = score(metric, y, opt.baseline.predict_proba(X), classes)
    opt_score = score(metric, y, proba, classes)
    k = min(k, len(y))
    exact = opt.baseline.top_k(X, k, label=label)
    approx = opt.top_k(X, k, label=label)
    precision = len(set(exact.indices.tolist()) & set(approx.indices.tolist())) / k
    topk_base = _median_seconds(lambda: opt.baseline.top_k(X, k, label=label), repeats)
    topk_opt = _median_seconds(lambda: opt.top_k(X, k, label=label), repeats)
    return "\n".join([
        f"held-out rows: {len(y)}",
        f"  baseline  {len(y) / base_s:>10,.0f} rows/s   {metric} {base_score:.4f}",
        f"  optimized {len(y) / opt_s:>10,.0f} rows/s   {metric} {opt_score:.4f}   "
        f"speedup {base_s / opt_s:.2f}x (expected {opt.report().expected_speedup:.2f}x)",
        "  answered per level: " + " / ".join(f"{f:.1%}" for f in fractions),
        f"  top-{k}: {topk_base / topk_opt:.2f}x faster, precision@{k} {precision:.2f}",
    ])
