"""The dashboard under load: the per-level latency plot under sparse, bursty and late traffic (a
fake clock), time plots with values at one time, and a page request while the page is drawn.

What broke under load (issue 12): the plot covered the 30 closed panes before the newest one,
so bursts of traffic further apart than 30 panes (the browser test's reloads under a CPU hog)
left it empty, or with one point per level; and a time plot with one point got an x axis years
wide (matplotlib widens a degenerate range by 5% of the epoch value), drawn with ~27,000 tick
labels: a minute or more per plot and a 20 MB page. Deterministic: a fake clock, seeded rows,
and sizes of what is drawn (never its speed).
"""

from __future__ import annotations

import asyncio
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from drift import Monitor
from serving.runtime.dashboard import live as dashboard_module
from serving.runtime.dashboard import plots as plots
from serving.runtime.dashboard.data import LEVEL_POINTS, level_latency, monitor_snapshot
from serving.runtime.dashboard.page import render
from serving.runtime.dashboard.view import model
from tests.serving.runtime.test_dashboard_view import INFO, T0, make_ring

BURST_EVERY_S = 40.0  # further apart than the old 30-pane horizon of one-second panes
BURSTS = 5


def bursty_monitor(lag_s: float, ingest_delay_s: float = 0.0) -> Monitor:
    """One-second panes; a burst of 12 rows (both levels) every BURST_EVERY_S, each ingested
    `ingest_delay_s` after its rows' time (records wait in the ingress, the monitor is busy);
    the clock then stands `lag_s` after the last burst."""
    now = [T0]
    monitor = Monitor(attributes=["level", "region"], metrics=["latency_ms"], level_column="level", cheap_level="0",
                      pane_seconds=1.0, window_panes=600, auto_reference_panes=3, clock=lambda: now[0])
    rng = np.random.default_rng(3)
    for k in range(BURSTS):
        t = T0 + BURST_EVERY_S * k
        now[0] = t + ingest_delay_s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            monitor.ingest(pd.DataFrame({"timestamp": t + 0.2 * rng.random(12), "level": ["0", "1"] * 6,
                                         "region": "eu", "latency_ms": rng.lognormal(2.0, 0.3, 12)}))
    now[0] = T0 + BURST_EVERY_S * (BURSTS - 1) + max(lag_s, ingest_delay_s)
    return monitor


def finite(values) -> int:
    return int(np.isfinite(np.asarray(values, dtype=float)).sum())


@pytest.mark.parametrize("lag_s", [0.2, 5.0, 45.0])
@pytest.mark.parametrize("ingest_delay_s", [0.0, 3.0])
def test_per_level_latency_shows_every_burst_in_its_span(lag_s, ingest_delay_s):
    # lag 0.2: the last burst is still in the open newest pane; 45: the last burst is older than
    # the old 30-pane horizon (which then showed nothing at all)
    levels = monitor_snapshot(bursty_monitor(lag_s, ingest_delay_s))["levels"]
    assert set(levels["levels"]) == {"0", "1"}
    for series in levels["levels"].values():
        assert finite(series["p99"]) == BURSTS and finite(series["p50"]) == BURSTS
        assert np.nansum(np.asarray(series["rows"], dtype=float)) == 6 * BURSTS  # every row, exactly
    t, width = np.asarray(levels["t"]), levels["bin_seconds"]
    assert t.size <= LEVEL_POINTS and np.all(np.diff(t) == width)
    assert t[0] - width <= T0 < t[0]  # from the first pane with rows (the whole span is longer)
    assert t[-1] >= T0 + BURST_EVERY_S * (BURSTS - 1) + max(lag_s, ingest_delay_s)  # to the newest pane


def test_the_span_is_bounded_by_span_s():
    levels = level_latency(bursty_monitor(5.0), span_s=60.0)
    t, width = np.asarray(levels["t"]), levels["bin_seconds"]
    assert t[-1] - t[0] + width == pytest.approx(60.0) and width == 2.0  # 60 panes in 30 bins of 2
    assert all(finite(s["p99"]) == 2 for s in levels["levels"].values())  # the last two bursts


def test_long_panes_give_one_point_per_pane():
    monitor = Monitor(attributes=["level"], metrics=["latency_ms"], level_column="level", pane_seconds=60.0,
                      window_panes=10, clock=None)
    monitor.ingest(pd.DataFrame({"timestamp": T0 + 60.0 * np.arange(40), "level": "0", "latency_ms": 5.0}))
    levels = level_latency(monitor)
    assert levels["bin_seconds"] == 60.0 and len(levels["t"]) == 30  # LEVEL_MIN_PANES panes, one bin each
    assert finite(levels["levels"]["0"]["p99"]) == 30


def ticks(svg: str) -> int:
    return len(re.findall(r'id="xtick_\d+"', svg))


def test_a_time_plot_with_values_at_one_time_stays_small():
    """One pane with rows (or a ring of two snapshots: one rate) must not give a years-wide axis."""
    t = [T0 + 15.0 * k for k in range(LEVEL_POINTS)]
    one = [np.nan] * (LEVEL_POINTS - 1) + [12.0]
    svg = plots.level_latency_plot({"t": t, "bin_seconds": 15.0, "levels": {"0": {"p50": one, "p99": one}}}, [], 250.0)
    assert 'data-points="2"' in svg and len(svg) < 100_000 and 2 <= ticks(svg) <= 10
    alone = plots.level_latency_plot({"t": [T0], "bin_seconds": 1.0, "levels": {"0": {"p50": [3.0], "p99": [9.0]}}},
                                     [], None)
    assert len(alone) < 100_000 and 2 <= ticks(alone) <= 10
    traffic = plots.traffic_plot([T0], {"0": [4.0], "1": [1.0]}, [1.0])
    assert len(traffic) < 100_000 and 2 <= ticks(traffic) <= 10


def test_a_replicas_first_page_with_two_snapshots_is_drawn_small():
    """A ring of two metric snapshots (a replica's first seconds) has one rate per plot: the page
    used to take minutes to draw (past the front's 150 s timeout: HAProxy answered 500)."""
    view = model(INFO, make_ring(2), None, monitor_age_s=None, monitor_error=None, refresh_s=10.0, now=T0 + 10.0)
    page = render(view, root="/demo", cache={})
    assert 'data-plot="traffic"' in page and len(page) < 1_000_000
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        assert ticks(svg) <= 10


def test_a_page_request_answers_while_the_page_is_still_being_drawn(monkeypatch):
    """The first drawing (a child process starting, matplotlib loading, a loaded machine) may take
    longer than the front waits: the request gets a "being drawn" page, the drawing goes on and
    serves the next request. Deterministic: the drawing waits for an event the test sets."""
    monkeypatch.setattr(dashboard_module, "RENDER_WAIT_S", 0.05)
    monkeypatch.setattr(dashboard_module, "RENDER_IN_CHILD", False)  # no process to start here
    dash = dashboard_module.Dashboard(INFO, None)
    dash.ring = make_ring(30)

    async def scenario() -> tuple[str, str, str, int]:
        dash._sampler = asyncio.get_running_loop().create_future()  # no sampler: no Ray here
        release = asyncio.Event()
        calls = 0

        async def slow_render(view, refresh, root):
            nonlocal calls
            calls += 1
            await release.wait()
            return f"<html>drawn {calls}</html>", 0.01

        dash._render = slow_render
        first = await dash.page("/demo")
        second = await dash.page("/demo")  # joins the drawing in progress, does not start another
        release.set()
        await asyncio.sleep(0)
        third = await dash.page("/demo")
        return first, second, third, calls

    first, second, third, calls = asyncio.run(scenario())
    assert 'id="drawing"' in first and 'http-equiv="refresh"' in first and "/demo/ui?format=json" in first
    assert 'id="drawing"' in second and calls == 1
    assert third == "<html>drawn 1</html>"


def test_the_monitor_computes_the_dashboard_once_for_every_replica_that_asks():
    """Each ingress replica refreshes its copy of the monitor's answers; the monitor answers them
    from one computation per max_age_s (its query load does not grow with the replicas)."""
    monitor = bursty_monitor(5.0)
    first = monitor_snapshot(monitor, {"slo_ms": 30.0, "max_age_s": 3600.0})
    second = monitor_snapshot(monitor, {"slo_ms": 30.0, "max_age_s": 3600.0})  # another replica asking
    assert not first["shared"] and second["shared"] and second["taken_at"] == first["taken_at"]
    assert second["age_s"] >= first["age_s"] >= 0.0 and second["levels"] == first["levels"]
    other = monitor_snapshot(monitor, {"slo_ms": 50.0, "max_age_s": 3600.0})  # other options: their own
    fresh = monitor_snapshot(monitor, {"slo_ms": 30.0})  # no max_age_s: always computed
    assert not other["shared"] and not fresh["shared"] and fresh["taken_at"] > first["taken_at"]


def test_the_drawing_process_is_warmed_when_anyone_looks(monkeypatch):
    """The JSON view (or the page) starts the drawing process and loads matplotlib there in the
    background; the first page is then drawn by that same process. A thread pool stands in for
    the spawned process (the same Executor interface)."""
    from concurrent.futures import ThreadPoolExecutor

    pools: list[ThreadPoolExecutor] = []

    def pool() -> ThreadPoolExecutor:
        pools.append(ThreadPoolExecutor(max_workers=1))
        return pools[-1]

    monkeypatch.setattr(dashboard_module, "_child_pool", pool)
    dash = dashboard_module.Dashboard(INFO, None)
    dash.ring = make_ring(30)

    async def scenario() -> str:
        dash._sampler = asyncio.get_running_loop().create_future()  # no sampler: no Ray here
        await dash.data()
        assert len(pools) == 1  # started by the JSON view, before any page was asked for
        return await dash.page("/demo")

    try:
        page = asyncio.run(scenario())
    finally:
        for p in pools:
            p.shutdown(wait=True)
    assert len(pools) == 1 and 'data-plot="traffic"' in page and dash.render_where == "child process"


def test_the_sampler_waits_longer_while_nobody_watches_and_a_view_wakes_it(monkeypatch):
    """A sample makes Ray's metrics agent render its whole endpoint: while nobody watches, the
    sampler waits IDLE_SAMPLE_S (here an hour), and the first view in a while samples at once;
    a watched page is sampled every SAMPLE_S."""
    monkeypatch.setattr(dashboard_module, "IDLE_SAMPLE_S", 3600.0)
    samples = []

    def fake_totals(app, max_age_s):
        samples.append(max_age_s)  # how old a read another replica made may be: this one's period
        return make_ring(2).latest()

    monkeypatch.setattr(dashboard_module, "read_totals", fake_totals)
    dash = dashboard_module.Dashboard(INFO, None, sample_s=0.01)

    async def scenario() -> tuple[int, int]:
        dash.start()
        for _ in range(200):  # the first sample, then the idle wait
            await asyncio.sleep(0.005)
            if samples and dash._viewed is not None:
                break
        await asyncio.sleep(0.1)
        idle = len(samples)
        await dash._prepare()  # a view: sample now, then every sample_s while watched
        for _ in range(400):
            await asyncio.sleep(0.005)
            if len(samples) >= idle + 3:
                break
        watched = len(samples)
        dash.stop()
        return idle, watched

    idle, watched = asyncio.run(scenario())
    assert idle == 1  # ten sample periods passed unwatched: no second sample
    assert watched >= idle + 3
    assert samples[0] == 3600.0 and set(samples[1:]) == {0.01}
