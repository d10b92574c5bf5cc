"""Load for benchmarks of served models: closed loop (saturation) and open loop (Poisson).

Bodies are encoded once up front so the client spends little CPU per request (it shares
the machine with what it measures). Every loop is bounded in time and count and only
talks to the URL it is given (a local Serve).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import numpy as np

#: longest one request may take before it counts as an error (s)
REQUEST_TIMEOUT_S = 60.0


@dataclass
class LoadResult:
    rows_per_s: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    offered_rps: float | None = None

    def to_dict(self) -> dict:
        return dict(vars(self))


def _summary(lat: list[float], rows: int, span: float, errors: int, offered: float | None) -> LoadResult:
    if not lat:
        return LoadResult(0.0, 0, errors, float("nan"), float("nan"), float("nan"), offered)
    arr = np.asarray(lat)
    return LoadResult(rows / span if span > 0 else 0.0, len(lat), errors, float(np.percentile(arr, 50)),
                      float(np.percentile(arr, 99)), float(arr.mean()), offered)


async def _post(session, url: str, body: bytes) -> bool:
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        await r.read()
        return r.status == 200


async def closed_loop(url: str, bodies: list[bytes], rows_per_request: int, *, concurrency: int,
                      duration_s: float, warmup_s: float = 2.0, max_requests: int = 100_000) -> LoadResult:
    """``concurrency`` clients, each sending its next request when the last one returns;
    rows/s counted over ``duration_s`` after ``warmup_s``."""
    import aiohttp

    lat: list[float] = []
    errors = 0
    sent = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def client(k: int, session) -> None:
        nonlocal errors, sent
        i = k
        while time.perf_counter() < t_end and sent < max_requests:
            sent += 1
            t0 = time.perf_counter()
            try:
                ok = await _post(session, url, bodies[i % len(bodies)])
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            t1 = time.perf_counter()
            if t0 >= t_measure and t1 <= t_end:
                if ok:
                    lat.append((t1 - t0) * 1000.0)
                else:
                    errors += 1
            i += concurrency

    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*(client(k, session) for k in range(concurrency)))
    return _summary(lat, len(lat) * rows_per_request, duration_s, errors, None)


async def open_loop(url: str, bodies: list[bytes], rows_per_request: int, *, rate_rps: float,
                    duration_s: float, seed: int = 0, warmup_s: float = 2.0) -> LoadResult:
    """Poisson arrivals at ``rate_rps`` requests/s for ``warmup_s + duration_s``; latency of
    the requests sent after the warm-up."""
    import aiohttp

    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, int(rate_rps * (duration_s + warmup_s) * 1.5) + 10)
    lat: list[float] = []
    errors = 0
    done_rows = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    t_start = time.perf_counter()
    t_measure = t_start + warmup_s
    t_stop = t_measure + duration_s

    async def one(session, body: bytes, measured: bool) -> None:
        nonlocal errors, done_rows
        t0 = time.perf_counter()
        try:
            ok = await _post(session, url, body)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        if measured:
            if ok:
                lat.append((time.perf_counter() - t0) * 1000.0)
                done_rows += rows_per_request
            else:
                errors += 1

    tasks = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t_next = t_start
        for i, gap in enumerate(gaps):
            t_next += gap
            if t_next >= t_stop:
                break
            delay = t_next - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, bodies[i % len(bodies)], t_next >= t_measure)))
        await asyncio.gather(*tasks)
    span = max(time.perf_counter() - t_measure, 1e-9)
    return _summary(lat, done_rows, span, errors, rate_rps)


def median_of(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
