"""HTTP load for serving benchmarks: closed-loop and open-loop aiohttp clients, the HTTP
floor (a route that touches no stage), and the optimized pipeline called in-process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import numpy as np

from serving.core.jsonsafe import clean

_settled = 0


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Keep the measuring process's own heap out of its full garbage collections while it times.

    The process that sends the load also holds the workload, the optimized pipeline and Ray's
    driver: hundreds of thousands of long-lived objects. A full (oldest-generation) collection
    walks them all, 150-270 ms on the project machine with the GIL held, and every request in
    flight then reads that pause as latency: it was the single-row phase's p99 (one such pause
    in a 10 s phase put p99 at 181-231 ms where the app's own histogram had no request over
    100 ms). Collected once and frozen before the timed window (``gc.freeze``), those objects are
    skipped; what the load itself allocates is still collected. Re-entrant."""
    global _settled
    if _settled == 0:
        gc.collect()
        gc.freeze()
    _settled += 1
    try:
        yield
    finally:
        _settled -= 1
        if _settled == 0:
            gc.unfreeze()


def timed_on_a_settled_heap(fn: Callable) -> Callable:
    """Run ``fn`` (a load phase; a coroutine function or not) inside :func:`settled_heap`, the
    collection done before its clock starts."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with settled_heap():
                return await fn(*args, **kwargs)
        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with settled_heap():
            return fn(*args, **kwargs)
    return run


def _summary(latencies: Sequence[float], rows: int, seconds: float, errors: Counter[str]) -> dict[str, Any]:
    lat = np.asarray(latencies) * 1000.0
    return {
        "requests": len(latencies),
        "errors": sum(errors.values()),
        # what failed: "HTTP 503", or the client's exception ("ServerDisconnectedError", ...)
        "error_kinds": dict(sorted(errors.items())),
        "rows_per_s": rows / seconds if seconds > 0 else 0.0,
        "requests_per_s": len(latencies) / seconds if seconds > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "max_ms": float(lat.max()) if lat.size else None,
        "seconds": seconds,
    }


def server_timing(header: str | None, metric: str = "app") -> float:
    """The ``dur`` (ms) of ``metric`` in a W3C ``Server-Timing`` header; NaN where absent."""
    for entry in (header or "").split(","):
        name, _, params = entry.strip().partition(";")
        if name == metric:
            for param in params.split(";"):
                key, _, value = param.strip().partition("=")
                if key == "dur":
                    try:
                        return float(value)
                    except ValueError:
                        break
    return float("nan")


def tail_split(latencies_ms: np.ndarray, server_ms: np.ndarray, quantile: float = 99.0) -> dict[str, Any] | None:
    """Where the slowest requests spent their time: the route's own time (``Server-Timing``)
    against the rest (client, HTTP front, the replica's HTTP server, the kernel), for the
    requests at or above the client-side ``quantile``; None where no answer carried the header."""
    known = ~np.isnan(server_ms)
    if not known.any():
        return None
    lat, srv = latencies_ms[known], server_ms[known]
    slow = lat >= np.percentile(lat, quantile)
    return {"server_p50_ms": float(np.percentile(srv, 50)), "server_p99_ms": float(np.percentile(srv, 99)),
            "outside_p50_ms": float(np.percentile(lat - srv, 50)),
            "outside_p99_ms": float(np.percentile(lat - srv, 99)),
            "slowest": {"requests": int(slow.sum()), "client_ms": float(np.median(lat[slow])),
                        "server_ms": float(np.median(srv[slow]))}}


@timed_on_a_settled_heap
async def closed_loop(url: str, payloads: Sequence[bytes], rows_each: int, *, clients: int,
                      duration: float, max_requests: int,
                      headers: dict[str, str] | None = None) -> dict[str, Any]:
    """``clients`` workers each send the next payload as soon as their last one answered
    (``headers`` added to every request)."""
    import aiohttp

    latencies: list[float] = []
    errors: Counter[str] = Counter()
    sent = 0
    stop_at = time.perf_counter() + duration
    headers = {"Content-Type": "application/json", **(headers or {})}

    async def worker(session: aiohttp.ClientSession, offset: int) -> None:
        nonlocal sent
        i = offset
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            start = time.perf_counter()
            try:
                async with session.post(url, data=payloads[i % len(payloads)], headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        latencies.append(time.perf_counter() - start)
                    else:
                        errors[f"HTTP {r.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # refused, reset, timed out: a failure
                errors[type(exc).__name__] += 1
            i += clients

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session, c) for c in range(clients)))
        elapsed = time.perf_counter() - start
    return _summary(latencies, len(latencies) * rows_each, elapsed, errors)


async def poisson_calls(rate: float, seconds: float, call: Callable[[int, float], Awaitable[Any]],
                        seed: int = 0) -> None:
    """Open-loop load: ``call(i, t)`` starts, each on its own task, at the Poisson arrival times
    ``t`` (seconds from the start, rate ``rate``/s) below ``seconds``; returns when all ended."""
    rng = np.random.default_rng(seed)
    tasks = []
    start = time.perf_counter()
    t, i = 0.0, 0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= seconds:
            break
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(call(i, t)))
        i += 1
    await asyncio.gather(*tasks)


@timed_on_a_settled_heap
async def open_loop(url: str, payloads: Sequence[bytes], *, rate: float, duration: float,
                    seed: int = 0, slo_ms: float | None = None) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` requests/s, each answered on its own task; with ``slo_ms``,
    ``over_slo`` counts the answers slower than it (failed requests are in ``errors``)."""
    import aiohttp

    latencies: list[float] = []
    levels: list[int] = []
    server_ms: list[float] = []
    errors: Counter[str] = Counter()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(payload: bytes) -> None:
            start = time.perf_counter()
            try:
                async with session.post(url, data=payload, headers=headers) as r:
                    body = await r.read()
                    if r.status == 200:
                        latencies.append(time.perf_counter() - start)
                        levels.append(max(json.loads(body)["level"]))
                        server_ms.append(server_timing(r.headers.get("Server-Timing")))
                    else:
                        errors[f"HTTP {r.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                errors[type(exc).__name__] += 1

        start = time.perf_counter()
        await poisson_calls(rate, duration, lambda i, t: one(payloads[i % len(payloads)]), seed)
        elapsed = time.perf_counter() - start
    out = _summary(latencies, len(latencies), elapsed, errors)
    out["offered_rps"] = rate
    if slo_ms is not None:
        out["over_slo"] = int(np.count_nonzero(np.asarray(latencies) * 1000.0 > slo_ms))
    # the cascade's two paths: rows the cheap level answers vs rows that reach a later level
    lat, lev = np.asarray(latencies) * 1000.0, np.asarray(levels)
    out["by_level"] = {
        int(k): {"share": float(np.mean(lev == k)), "p50_ms": float(np.percentile(lat[lev == k], 50)),
                 "p99_ms": float(np.percentile(lat[lev == k], 99))}
        for k in np.unique(lev)
    }
    out["tail"] = tail_split(lat, np.asarray(server_ms, dtype=float))
    return out


@timed_on_a_settled_heap
async def http_floor(url: str, *, clients: int, duration: float) -> dict[str, Any]:
    """Closed-loop GETs of a route that touches no stage: the proxy + ingress ceiling."""
    import aiohttp

    latencies: list[float] = []
    stop_at = time.perf_counter() + duration
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                async with session.get(url) as r:
                    await r.read()
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return _summary(latencies, len(latencies), elapsed, Counter())


@timed_on_a_settled_heap
def in_process(opt: Any, frames: Sequence[Any], rows_each: int, *, duration: float,
               max_requests: int, predict: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """The optimized pipeline (or ``predict``) called directly on the same requests, one after
    another; ``cpu_ms_per_request``: this process's CPU per request (the pipeline's own work,
    what a served request costs beyond it is the serving path's)."""
    predict = opt.predict_proba if predict is None else predict
    latencies = []
    stop_at = time.perf_counter() + duration
    start, cpu0 = time.perf_counter(), time.process_time()
    i = 0
    while time.perf_counter() < stop_at and i < max_requests:
        t0 = time.perf_counter()
        predict(frames[i % len(frames)])
        latencies.append(time.perf_counter() - t0)
        i += 1
    cpu = time.process_time() - cpu0
    out = _summary(latencies, len(latencies) * rows_each, time.perf_counter() - start, Counter())
    out["cpu_ms_per_request"] = 1000.0 * cpu / max(len(latencies), 1)
    return out


def payloads(X: Any, rows_each: int, limit: int = 400) -> tuple[list[bytes], list[Any]]:
    """JSON bodies of ``rows_each`` consecutive rows of X, and the same rows as frames. A missing
    value is sent as ``null``, as a client sends it (``NaN`` is not JSON: the app refuses it)."""
    out, frames = [], []
    for start in range(0, min(len(X), rows_each * limit), rows_each):
        frame = X.iloc[start:start + rows_each]
        if len(frame) < rows_each:
            break
        out.append(json.dumps(clean({"rows": frame.to_dict("records")})).encode())
        frames.append(frame.reset_index(drop=True))
    return out, frames
