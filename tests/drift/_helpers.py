"""Small seeded record generators shared by the drift tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

T0 = 1_700_000_040.0  # a pane boundary (multiple of 60 s)


def records(n: int, seed: int, t0: float = T0, seconds: float = 60.0,
            planted: dict | None = None, factor: float = 3.0) -> pd.DataFrame:
    """Rows with 3 attributes and a latency metric; `planted` rows get latency x factor."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "timestamp": t0 + np.sort(rng.random(n)) * seconds,
        "region": rng.choice(["eu", "us", "ap", "sa"], n, p=[0.4, 0.3, 0.2, 0.1]),
        "version": rng.choice(["v1", "v2", "v3"], n),
        "replica": rng.choice([f"r{i}" for i in range(5)], n),
        "latency_ms": rng.lognormal(3.0, 0.4, n),
        "f1": rng.normal(0.0, 1.0, n),
    })
    if planted:
        mask = np.ones(n, dtype=bool)
        for col, value in planted.items():
            mask &= frame[col].to_numpy() == value
        frame.loc[mask, "latency_ms"] *= factor
    return frame


MONITOR_ARGS = {"attributes": ["region", "version", "replica"], "metrics": ["latency_ms"],
                "features": {"f1": "numeric"}}
