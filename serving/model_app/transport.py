"""Calibrate the hop between Serve deployments: a fixed cost per hop and bytes per second.

The planner's cost model charges every hop between stages ``fixed_ms + bytes /
bytes_per_s`` (:class:`serving.partition.Transport`). Here both are measured for the
transport a partitioned model really uses (Serve handle calls chained through the object
store, numpy payloads): chains of one and of two identity stages are called with
payloads of several sizes, and the second chain's extra time is one extra hop. Sizes
are measured round-robin (a load spike hits every size alike) and a Theil-Sen line
through the per-size medians gives the two numbers: one disturbed size cannot tip the
slope the way a least-squares fit lets it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from serving.partition import Transport

#: payload sizes (bytes) the hop is measured at
DEFAULT_SIZES = (1024, 128 * 1024, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, 4 * 1024 * 1024)
#: timed calls per size and chain (the median is kept)
DEFAULT_REPEATS = 15


def _identity_cls():
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0.01}, max_ongoing_requests=4)
    class Identity:
        def __call__(self, payload: Any) -> Any:
            return payload

    return Identity


def fit_transport(points: list[tuple[float, float]], source: str) -> Transport:
    """The line ``ms = fixed + bytes * slope`` through ``(bytes, ms)`` points (Theil-Sen:
    the median of pairwise slopes); a slope at or below zero (noise swamping the size
    effect) is an infinite bandwidth and the fixed cost is then the median time."""
    from scipy.stats import theilslopes

    if len({p[0] for p in points}) < 2:
        raise ValueError("a transport fit needs at least two payload sizes")
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    slope, fixed, _, _ = theilslopes(y, x, method="joint")
    if slope <= 0:
        return Transport(max(float(np.median(y)), 0.0), float("inf"), source,
                         [[float(a), float(b)] for a, b in points])
    return Transport(max(float(fixed), 0.0), 1000.0 / float(slope), source,
                     [[float(a), float(b)] for a, b in points])


class HopProbe:
    """Two small identity apps kept deployed, so the hop can be measured again right
    before each measurement it predicts (the hop's cost moves with the machine's load)."""

    def __init__(self, name: str = "willump-hop-calibration"):
        import ray
        from ray import serve

        if not ray.is_initialized():
            raise RuntimeError("measuring the Serve hop needs a running Ray (ray.init) with Serve started")
        self.name = name
        ident = _identity_cls()
        self.one = serve.run(ident.options(name=f"{name}-a").bind(), name=f"{name}-1", route_prefix=None)
        self.two = serve.run(ident.options(name=f"{name}-b").bind(), name=f"{name}-2", route_prefix=None)

    def _once(self, payload: np.ndarray, hops: int) -> float:
        t0 = time.perf_counter()
        r = self.one.remote(payload)
        if hops == 2:
            r = self.two.remote(r)
        r.result()
        return (time.perf_counter() - t0) * 1000.0

    def measure(self, sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = DEFAULT_REPEATS) -> Transport:
        if repeats < 3 or not sizes:
            raise ValueError("repeats must be >= 3 and sizes non-empty")
        payloads = [np.ones(max(size // 4, 1), dtype=np.float32) for size in sizes]
        for payload in payloads:  # warm-up
            self._once(payload, 1)
            self._once(payload, 2)
        single: list[list[float]] = [[] for _ in sizes]
        double: list[list[float]] = [[] for _ in sizes]
        for _ in range(repeats):  # round-robin over sizes and chains: a load spike hits all alike
            for k, payload in enumerate(payloads):
                single[k].append(self._once(payload, 1))
                double[k].append(self._once(payload, 2))
        points = [(float(p.nbytes), max(statistics.median(d) - statistics.median(s), 0.0))
                  for p, s, d in zip(payloads, single, double, strict=True)]
        return fit_transport(points, "serve-handle")

    def close(self) -> None:
        from ray import serve

        serve.delete(f"{self.name}-1")
        serve.delete(f"{self.name}-2")


def calibrate_transport(*, sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = DEFAULT_REPEATS,
                        name: str = "willump-hop-calibration") -> Transport:
    """Measure the Serve handle hop on the running Ray (deploys two small apps, then
    deletes them). Needs ``ray.init`` and ``serve.start`` done by the caller."""
    if repeats < 3 or not sizes:
        raise ValueError("repeats must be >= 3 and sizes non-empty")
    probe = HopProbe(name)
    try:
        return probe.measure(sizes, repeats)
    finally:
        probe.close()
