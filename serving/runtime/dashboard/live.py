"""The live dashboard at ``/{name}/ui``, run inside each ingress replica, off the request path.

Three caches, each refreshed in the background:

* a sampler reads the app's totals (what ``GET /metrics`` answers: every replica on every
  node) every :data:`~serving.runtime.dashboard.timeseries.SAMPLE_S` seconds while the page is watched
  (:data:`IDLE_SAMPLE_S` otherwise), in a worker thread, into a bounded
  ring (:class:`~serving.runtime.dashboard.timeseries.MetricRing`); it measures its own cost, shown on the page;
* the monitor's answers (:func:`serving.runtime.dashboard.data.monitor_snapshot`, one call to the
  monitor replica) are fetched while someone watches the page, at most every
  :data:`MONITOR_TTL_S` seconds, and shown with their age; the monitor computes them at most
  once per :data:`MONITOR_TTL_S` for the whole app and answers every replica from that copy;
* the rendered page is reused for :data:`RENDER_TTL_S` seconds, so any number of viewers
  cost one render per period, drawn in a child process; a request waits for a drawing at most
  :data:`RENDER_WAIT_S`, then gets the page drawn before or a small "being drawn" page.

A request for the page never waits on the monitor except for its very first answer (at most
:data:`FIRST_WAIT_S`); a monitor that is off, slow or failing shows as such on the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from concurrent.futures import Executor
from typing import Any

from serving.core.schema import RequestError
from serving.runtime.calls import wait_or_cancel
from serving.runtime.dashboard.timeseries import HISTORY_S, SAMPLE_S, MetricRing, Snapshot
from serving.runtime.dashboard.view import certified_shares, model, slo_ms, to_json
from serving.runtime.metrics import aggregate
from serving.runtime.node_scrape import metric_nodes, period_start, read_shared

log = logging.getLogger("ray.serve")

#: seconds between the page's own refreshes (meta refresh)
REFRESH_S = 10.0
#: seconds the monitor's answers are reused before the sampler fetches them again
MONITOR_TTL_S = 15.0
#: seconds after the last page view during which the monitor's answers are kept fresh and the
#: totals sampled every SAMPLE_S
WATCH_S = 120.0
#: seconds between samples while nobody watches: a read makes Ray's metrics agent render its
#: whole node endpoint (about 40 ms of its CPU for one app on the project machine; every ingress
#: replica of every app on the machine shares one read a period, serving.runtime.node_scrape);
#: a view samples at once (the read of the current SAMPLE_S period) and then every SAMPLE_S again
IDLE_SAMPLE_S = 30.0
#: seconds the nodes' reads in one snapshot may lie apart (an older one is read again): each node's
#: counts are as of its own read, the snapshot's time one for all
READ_SPREAD_S = 1.0
#: seconds from a grid period's edges within which no sampler wakes (a timer that fires a little
#: early would find the period before)
GRID_LAG_S = 0.05
#: seconds the first page view waits for the monitor's first answer
FIRST_WAIT_S = 8.0
#: seconds one monitor snapshot may take before it counts as failed
MONITOR_TIMEOUT_S = 30.0
#: seconds a rendered page is served again to other viewers
RENDER_TTL_S = 3.0
#: seconds a page request waits for a drawing before it answers a "being drawn, loads again"
#: page (the drawing goes on and serves the next request): the first drawing starts a process
#: and loads matplotlib, which on a loaded machine took longer than the HTTP front waits
RENDER_WAIT_S = 20.0
#: seconds a page drawn earlier is still served (with its own time) while a newer one is drawn
STALE_PAGE_S = 60.0
#: draw the page in a child process: matplotlib holds the GIL for the whole drawing (a few
#: hundred ms), which in the ingress's own process would stall every request meanwhile
RENDER_IN_CHILD = True
#: query parameters ``GET /ui`` accepts
UI_PARAMETERS = ("format", "refresh")

#: gauges the app adds to GET /metrics: name -> (description, labels); constant for a
#: deployed app, so that Prometheus rules can compare live figures with the plan
PLAN_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "willump_slo_p99_seconds": ("the plan's p99 latency target (SLO)", ("app",)),
    "willump_certified_answered_share": ("share of certification rows each cascade level answered "
                                         "(the optimizer's report)", ("app", "level")),
    "willump_planned_rows_per_second": ("rows/s the plan's bound allows", ("app",)),
}


def read_totals(app: str, period_s: float) -> Snapshot:
    """The app's totals across replicas and nodes as a snapshot (blocking: run in a thread),
    from the first reads of the nodes' endpoints made in the current period of the grid every
    sampler of that period on this machine shares (serving.runtime.node_scrape), so a sampler's
    snapshots stay a period apart however many replicas read; the nodes' reads within
    ``READ_SPREAD_S`` of each other, the snapshot timed at the oldest."""

    started, cpu0 = time.perf_counter(), time.thread_time()
    nodes = metric_nodes()
    slot = f"dashboard-{period_s:g}"
    reads = [read_shared(node, endpoint, period_start(period_s), slot=slot) for node, endpoint in nodes]
    newest = max((at for _, at in reads), default=0.0)
    reads = [read if read[1] >= newest - READ_SPREAD_S
             else read_shared(node, endpoint, newest - READ_SPREAD_S, slot=slot)
             for (node, endpoint), read in zip(nodes, reads, strict=True)]
    snap = Snapshot.parse(aggregate([text for text, _ in reads], app), t=min((at for _, at in reads), default=None))
    snap.cost_s, snap.cpu_s = time.perf_counter() - started, time.thread_time() - cpu0
    return snap


def next_wake(period_s: float, phase: float, now: float | None = None) -> float:
    """When a sampler of phase ``phase`` next wakes (epoch seconds): ``phase`` of the way into a
    period of the shared grid, kept ``GRID_LAG_S`` from the period's edges (a timer that fires
    a little early must not find the period before), after ``now``."""
    now = time.time() if now is None else now
    lag = min(GRID_LAG_S, period_s / 10)
    at = period_start(period_s, now) + lag + phase * (period_s - 2 * lag)
    return at if at > now else at + period_s


def plan_metrics(info: dict[str, Any]) -> str:
    """The :data:`PLAN_FAMILIES` gauges as Prometheus text."""

    app = info.get("name", "")
    lines: list[str] = []

    def family(name: str, samples: list[tuple[dict[str, str], float]]) -> None:
        if not samples:
            return
        lines.append(f"# HELP {name} {PLAN_FAMILIES[name][0]}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{v}"' for k, v in {"app": app, **labels}.items())
            lines.append(f"{name}{{{text}}} {value:.6g}")

    slo = slo_ms(info)
    family("willump_slo_p99_seconds", [({}, slo / 1000.0)] if slo else [])
    family("willump_certified_answered_share",
           [({"level": lv}, share) for lv, share in certified_shares(info).items() if share is not None])
    bound = (info.get("plan") or {}).get("max_rows_per_s")
    family("willump_planned_rows_per_second", [({}, float(bound))] if bound and math.isfinite(bound) else [])
    return "\n".join(lines) + ("\n" if lines else "")


def index_page(name: str, root: str, monitor: bool) -> str:
    """``GET /{name}/``: what the app answers, with a link to the dashboard."""
    routes = [("ui", "the live dashboard"), ("docs", "the HTTP API (OpenAPI)"), ("plan", "the stage plan (JSON)"),
              ("report", "the optimizer's report (JSON)"), ("metrics", "Prometheus metrics"),
              ("healthz", "health check")]
    if monitor:
        routes += [("explain", "why outliers happen (JSON)"), ("drift", "which columns drifted (JSON)")]
    items = "".join(f'<li><a href="{root}/{r}">{root}/{r}</a>: {d}</li>' for r, d in routes)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{name} - willump</title></head>'
            f'<body style="font-family: sans-serif; max-width: 50rem; margin: 2rem auto">'
            f"<h1>{name}</h1><p>A willump pipeline served on Ray Serve. "
            f'<a href="{root}/ui"><b>Open the dashboard</b></a>.</p><ul>{items}</ul></body></html>')


class Dashboard:
    """The ingress replica's dashboard state: the metric ring, the monitor cache, the page."""

    def __init__(self, info: dict[str, Any], monitor: Any | None, *, sample_s: float = SAMPLE_S,
                 history_s: float = HISTORY_S, refresh_s: float = REFRESH_S, phase: float | None = None):
        if phase is not None and not 0.0 <= phase < 1.0:
            raise ValueError(f"phase must be in [0, 1), got {phase!r}")
        self.info = info
        #: where in each period of the shared grid this sampler wakes (a share of the period): its
        #: own, so the replicas' samplers spread their parsing over the period, while the one
        #: that wakes first in each period makes the read they all take (seeded by the process id)
        self.phase = random.Random(os.getpid()).random() if phase is None else float(phase)
        self.name = info["name"]
        self.monitor = monitor
        self.refresh_s = float(refresh_s)
        self.ring = MetricRing(history_s, sample_s)
        self.monitor_snapshot: dict[str, Any] | None = None
        self.monitor_at: float | None = None
        self.monitor_error: str | None = None
        self.last_view = -math.inf
        self._sampler: asyncio.Task | None = None
        self._viewed: asyncio.Event | None = None  # set by a page view: sample now
        self._monitor_task: asyncio.Task | None = None
        self._pages: dict[tuple[bool, str], tuple[float, str]] = {}  # (refresh, root) -> (drawn at, page)
        self._drawing: dict[tuple[bool, str], asyncio.Task] = {}
        self.render_ms: float | None = None
        self.render_cpu_ms: float | None = None
        self.render_where = "child process" if RENDER_IN_CHILD else "ingress thread"
        self._pool: Executor | None = None
        self._parts: dict[str, Any] = {}  # page parts drawn from the current monitor snapshot
        with contextlib.suppress(RuntimeError):  # no loop yet: the first request starts it
            asyncio.get_running_loop()
            self.start()

    # --- background work --------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampler (idempotent; cheap enough to call on every request)."""
        if self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())

    def stop(self) -> None:
        for task in (self._sampler, self._monitor_task, *self._drawing.values()):
            if task is not None:
                task.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _sample_forever(self) -> None:
        while True:
            try:
                # the first read on this machine in the current period serves every sampler of that period
                snap = await asyncio.to_thread(read_totals, self.name, self._period())
                self.ring.add(snap)
                if self._watched() and self._monitor_stale():
                    self.refresh_monitor()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Ray's metrics agent restarting, a node leaving: try again
                log.debug("dashboard sample failed: %s", exc)
            await self._pause()

    async def _pause(self) -> None:
        """Until this sampler's phase in the next period of the shared grid (SAMPLE_S while
        someone watches, IDLE_SAMPLE_S otherwise), cut short by a view."""
        if self._viewed is None:
            self._viewed = asyncio.Event()
        self._viewed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._viewed.wait(), next_wake(self._period(), self.phase) - time.time())

    def _period(self) -> float:
        """Seconds between samples: SAMPLE_S while watched, IDLE_SAMPLE_S otherwise."""
        return self.ring.sample_s if self._watched() else max(self.ring.sample_s, IDLE_SAMPLE_S)

    def _watched(self) -> bool:
        return time.monotonic() - self.last_view < WATCH_S

    def _monitor_stale(self) -> bool:
        return self.monitor_at is None or time.time() - self.monitor_at >= MONITOR_TTL_S

    def refresh_monitor(self) -> asyncio.Task | None:
        """Fetch the monitor's answers in the background (one fetch at a time)."""
        if self.monitor is None:
            return None
        if self._monitor_task is None or self._monitor_task.done():
            self._monitor_task = asyncio.get_running_loop().create_task(self._fetch_monitor())
        return self._monitor_task

    def monitor_options(self) -> dict[str, Any]:
        # one computation per MONITOR_TTL_S for the whole app, however many replicas ask
        return {"slo_ms": slo_ms(self.info), "max_age_s": MONITOR_TTL_S}

    async def _fetch_monitor(self) -> None:
        try:
            snap = await wait_or_cancel(self.monitor.dashboard.remote(self.monitor_options()), MONITOR_TIMEOUT_S,
                                        "monitor", MONITOR_TIMEOUT_S)
        except Exception as exc:
            self.monitor_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning("dashboard: monitor answers unavailable: %s", self.monitor_error)
            return
        # its age as the monitor measured it (a snapshot another replica asked for is shared),
        # on this process's clock: no comparison of two machines' clocks
        age = snap.get("age_s") if isinstance(snap, dict) else None
        age = float(age) if isinstance(age, (int, float)) and math.isfinite(age) and age >= 0 else 0.0
        self.monitor_snapshot, self.monitor_at, self.monitor_error = snap, time.time() - age, None

    # --- the page ---------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        age = None if self.monitor_at is None else time.time() - self.monitor_at
        view = model(self.info, self.ring, self.monitor_snapshot, monitor_age_s=age,
                     monitor_error=self.monitor_error, refresh_s=self.refresh_s)
        view["render"] = {"wall_ms": self.render_ms, "cpu_ms": self.render_cpu_ms, "where": self.render_where}
        return view

    async def _prepare(self) -> None:
        self.start()
        if not self._watched() and self._viewed is not None:
            self._viewed.set()  # the first view in a while: a fresh sample now
        self.last_view = time.monotonic()
        self._warm()
        if self.monitor is not None and self._monitor_stale():
            task = self.refresh_monitor()
            if self.monitor_snapshot is None and task is not None:  # the first view waits a little
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), FIRST_WAIT_S)

    async def page(self, root: str, refresh: bool = True) -> str:
        """The rendered page, shared by viewers for RENDER_TTL_S seconds. One drawing at a time
        per page kind; a request waits for it at most RENDER_WAIT_S, then gets the page drawn
        before (if younger than STALE_PAGE_S) or a small "being drawn" page, never an error."""
        await self._prepare()
        key = (refresh, root)
        cached = self._pages.get(key)
        if cached is not None and time.monotonic() - cached[0] < RENDER_TTL_S:
            return cached[1]
        task = self._drawing.get(key)
        if task is None or task.done():
            task = self._drawing[key] = asyncio.get_running_loop().create_task(self._draw(root, refresh))
            task.add_done_callback(_retrieved)  # a failure nobody waited for is not logged as lost
        started = time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(task), RENDER_WAIT_S)
        except asyncio.TimeoutError:
            if cached is not None and time.monotonic() - cached[0] < STALE_PAGE_S:
                return cached[1]
            from serving.runtime.dashboard.page import drawing_page

            return drawing_page(self.name, root, max(2.0, RENDER_TTL_S), time.monotonic() - started)

    async def _draw(self, root: str, refresh: bool) -> str:
        view = self.view()
        started = time.perf_counter()
        text, cpu_s = await self._render(view, refresh, root)
        self.render_ms, self.render_cpu_ms = 1e3 * (time.perf_counter() - started), 1e3 * cpu_s
        self._pages[(refresh, root)] = (time.monotonic(), text)
        return text

    def _warm(self) -> None:
        """Start the drawing process as soon as anyone looks (the page or its JSON), loading
        matplotlib there in the background: the first page then does not wait for it."""
        if not (RENDER_IN_CHILD and self.render_where == "child process") or self._pool is not None:
            return
        from serving.runtime.dashboard.page import warm

        try:
            self._pool = _child_pool()
            self._pool.submit(warm).add_done_callback(_logged)
        except (OSError, RuntimeError) as exc:  # no child: the first drawing finds out and draws here
            log.warning("dashboard: could not start the drawing process (%s)", exc)
            self._pool = None

    async def _render(self, view: dict[str, Any], refresh: bool, root: str) -> tuple[str, float]:
        """(page, CPU seconds it took): in the child process when it can be used, else here."""
        from concurrent.futures.process import BrokenProcessPool

        from serving.runtime.dashboard.page import render, render_shared

        if RENDER_IN_CHILD and self.render_where == "child process":
            try:
                if self._pool is None:
                    self._pool = _child_pool()
                return await asyncio.get_running_loop().run_in_executor(
                    self._pool, render_shared, view, refresh, root, self.name)
            except (BrokenProcessPool, OSError, RuntimeError) as exc:  # no child: draw here
                log.warning("dashboard: drawing in a child process failed (%s); drawing in the ingress", exc)
                self.render_where = "ingress thread"
                self._pool = None

        def here() -> tuple[str, float]:
            cpu0 = time.thread_time()
            return render(view, refresh=refresh, root=root, cache=self._parts), time.thread_time() - cpu0

        return await asyncio.to_thread(here)

    async def data(self) -> dict[str, Any]:
        """The page's content as JSON (``/ui?format=json``)."""

        await self._prepare()
        return to_json(self.view())


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("dashboard: drawing the page failed: %r", task.exception())


def _logged(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("dashboard: warming the drawing process failed: %r", future.exception())


def _child_pool() -> Executor:
    """One spawned worker process (not forked: the ingress runs threads and an event loop)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def dashboard_of(ingress: Any) -> Dashboard:
    """The ingress replica's dashboard, made on first use."""
    dash = getattr(ingress, "_dashboard", None)
    if dash is None:
        dash = ingress._dashboard = Dashboard(ingress.info, ingress.monitor)
    return dash


def _flag(name: str, value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise RequestError(422, f"{name} must be 1 or 0, got {value!r}", [{"field": name, "error": "1 or 0"}])


async def serve_ui(ingress: Any, request: Any) -> Any:
    """``GET /{name}/ui``: the page (``?refresh=0``: without self-refresh) or its content as
    JSON (``?format=json``)."""
    from fastapi.responses import HTMLResponse, JSONResponse

    params = dict(request.query_params)
    unknown = sorted(set(params) - set(UI_PARAMETERS))
    if unknown:
        raise RequestError(422, f"unknown query parameter(s) {unknown}; accepted: {list(UI_PARAMETERS)}",
                           [{"field": p, "error": "unknown"} for p in unknown])
    fmt = params.get("format", "html")
    if fmt not in ("html", "json"):
        raise RequestError(422, f"format must be 'html' or 'json', got {fmt!r}",
                           [{"field": "format", "error": "html or json"}])
    refresh = _flag("refresh", params.get("refresh", "1"))
    dash = dashboard_of(ingress)
    headers = {"Cache-Control": "no-store"}
    if fmt == "json":
        return JSONResponse(await dash.data(), headers=headers)
    return HTMLResponse(await dash.page(request.scope.get("root_path", ""), refresh), headers=headers)
