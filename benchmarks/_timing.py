"""Timing helpers of the benchmark."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def loadavg() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - platform dependent
        return None


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds taken by ``fn()`` and its result."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def side_by_side(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function, ``repeats`` rounds; the order rotates each round
    so that a slow spell on the shared machine does not always hit the same contender."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        gc.collect()
        for n in names[r % len(names):] + names[: r % len(names)]:
            out[n].append(timed(fns[n])[0])
    return out


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: float(np.median(values)) for name, values in samples.items()}


def percentile_ms(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1e3, q))
