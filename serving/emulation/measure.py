"""What the heterogeneity-aware planner reads, measured on the cluster: how many devices of
each type it has, each stage's calls for a sample of requests (and so its visits per
request), the throughput matrix (one replica of each stage on each device type, driven in a
closed loop), and the rate a deployed app sustains.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from serving.core.specs import StageSpec
from serving.emulation.hetero_app import DeviceEmulation, HeteroApp, deploy_hetero
from serving.planning.hetero import ThroughputMatrix
from serving.runtime.stage_runner import StageRunner

#: measure_matrix: calls kept in flight against the replica being measured, and seconds of
#: warm-up and of measurement per (stage, device type)
PROFILE_CONCURRENCY = 6
PROFILE_WARMUP_S = 1.0
PROFILE_SECONDS = 4.0
#: completed calls a measurement needs before it ends, however long past its seconds
PROFILE_MIN_CALLS = 8


def cluster_devices(device_types: Sequence[str]) -> dict[str, int]:
    """How many devices of each type the cluster has (its custom resources)."""
    import ray

    total = ray.cluster_resources()
    return {d: int(total.get(d, 0)) for d in device_types}


def stage_inputs(opt: Any, specs: Sequence[StageSpec],
                 requests: Sequence[pd.DataFrame]) -> tuple[dict[str, list[tuple[pd.DataFrame, Any]]], dict[str, float]]:
    """Each stage's calls for ``requests`` run here through the cascade (what the stage will
    see when serving), and the stage's visits per request."""

    runners = {s.name: StageRunner(opt, s) for s in specs}
    calls: dict[str, list] = {s.name: [] for s in specs}
    for rows in requests:
        frame, blocks = rows.reset_index(drop=True), None
        for spec in specs:
            calls[spec.name].append((frame, blocks))
            out = runners[spec.name].run(frame, blocks)
            if not out["unsure"].size:
                break
            frame, blocks = frame.iloc[out["unsure"]].reset_index(drop=True), out["blocks"]
    visits = {s.name: len(calls[s.name]) / max(1, len(requests)) for s in specs}
    return calls, visits


async def _drive(call, inputs: Sequence[Any], concurrency: int, warmup_s: float, seconds: float,
                 min_calls: int = 1, max_seconds: float | None = None) -> tuple[int, float]:
    """Closed loop: ``concurrency`` callers cycling through ``inputs``; the calls completed
    after the warm-up and the seconds they took. The window lasts ``seconds`` and then until
    ``min_calls`` completed in it (a replica slowed by a busy machine is measured slow, not
    at 0 calls/s), at most ``max_seconds`` (default 30x ``seconds``, at least 60 s)."""
    limit = max_seconds if max_seconds is not None else max(60.0, 30.0 * seconds)
    state: dict[str, Any] = {"i": 0, "done": 0, "stop": None}
    t_start = time.perf_counter()
    t_measure = t_start + warmup_s
    t_end, t_limit = t_measure + seconds, t_measure + max(seconds, limit)

    async def caller():
        while state["stop"] is None:
            item = inputs[state["i"] % len(inputs)]
            state["i"] += 1
            await call(item)
            now = time.perf_counter()
            if state["stop"] is not None or now < t_measure:
                continue
            state["done"] += 1
            if (now >= t_end and state["done"] >= min_calls) or now >= t_limit:
                state["stop"] = now

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    if state["done"] < min_calls:
        raise TimeoutError(f"{state['done']} of {min_calls} calls completed within {limit:.1f} s of measurement")
    return state["done"], state["stop"] - t_measure


def measure_matrix(source: Any, opt: Any, specs: Sequence[StageSpec], device_types: Sequence[str],
                   emulation: DeviceEmulation, requests: Sequence[pd.DataFrame], *, name: str = "hetero-profile",
                   concurrency: int = PROFILE_CONCURRENCY, warmup_s: float = PROFILE_WARMUP_S,
                   seconds: float = PROFILE_SECONDS, min_calls: int = PROFILE_MIN_CALLS) -> ThroughputMatrix:
    """The throughput matrix measured on this cluster: one replica of each stage on each
    device type, driven in a closed loop with the calls the stage sees when serving
    ``requests``; rates are calls/s, visits are calls per request. The stages measured on one
    device type share one device (``device_share``): they are driven one at a time. Each
    measurement runs ``seconds`` and then until ``min_calls`` calls completed in it."""
    calls, visits = stage_inputs(opt, specs, requests)
    rates = np.zeros((len(specs), len(device_types)))
    for j, device in enumerate(device_types):
        replicas = {(s.name, device): 1 for s in specs}
        app = deploy_hetero(source, specs, replicas, {s.name: {device: 1.0} for s in specs}, emulation,
                            name=f"{name}-{device}", device_share=1.0 / len(specs))
        try:
            for i, spec in enumerate(specs):
                if not calls[spec.name]:
                    continue
                handle = app.handle(spec.name, device)

                async def call(item, handle=handle):
                    return await handle.run.remote(*item)

                done, elapsed = asyncio.run(_drive(call, calls[spec.name], concurrency, warmup_s, seconds,
                                                   min_calls=min_calls))
                rates[i, j] = done / elapsed
        finally:
            app.shutdown()
    names = tuple(s.name for s in specs)
    return ThroughputMatrix(names, tuple(device_types), rates,
                            tuple(max(visits[n], 0.0) for n in names))


def measure_app(app: HeteroApp, requests: Sequence[pd.DataFrame], *, concurrency: int, warmup_s: float,
                seconds: float) -> float:
    """App requests/s the ingress sustains in a closed loop of ``concurrency`` callers."""

    async def call(rows):
        return await app.ingress.predict.remote(rows)

    done, elapsed = asyncio.run(_drive(call, requests, concurrency, warmup_s, seconds))
    return done / elapsed
