"""The "never slower" check: the certified cascade timed side by side with the full pipeline."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

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
            start = time.perf_counter()
            for call in calls:
                fn(call)
            out.append(time.perf_counter() - start)
    return float(np.median(full_times) / np.median(cascade_times))
