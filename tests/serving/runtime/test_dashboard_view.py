"""The dashboard without Ray: metric snapshots and their series, the monitor's answers from a
real drift.Monitor fed rows with a planted cause, and the page drawn from them.

Deterministic: fixed seeds, event-time panes (no clock), metric snapshots at given times.
"""

from __future__ import annotations

import asyncio
import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from drift import Monitor
from serving.core.schema import RequestError
from serving.runtime.dashboard.data import monitor_snapshot
from serving.runtime.dashboard.live import PLAN_FAMILIES, index_page, plan_metrics, serve_ui
from serving.runtime.dashboard.page import explanation_sentences, render
from serving.runtime.dashboard.timeseries import MetricRing, Snapshot, histogram_quantile
from serving.runtime.dashboard.view import model
from serving.runtime.metrics import BUCKET_LABELS, aggregate

T0 = 1_700_000_040.0  # a multiple of the pane length
PANE_S = 10.0
PLANTED = "sa"

INFO = {
    "name": "demo", "model_version": "v1", "stages": ["cheap", "expensive"], "levels": [["a"], ["a", "b"]],
    "first_stage_last_level": 0, "monitor": {"app": "demo-monitor"},
    "report": {"levels": [{"index": 0, "fraction_answered": 0.8}, {"index": 1, "fraction_answered": 0.2}]},
    "plan": {"target_p99_ms": 30.0, "layout": "fused", "max_rows_per_s": 500.0, "ingress_replicas": 1,
             "predicted": {"p50_ms": 4.0, "p99_ms": 12.0, "rate_rps": 20.0, "throughput_rows_s": 20.0},
             "stages": [{"name": "cheap", "replicas": 1, "max_batch_size": 64, "capacity_rows_s": 900.0},
                        {"name": "expensive", "replicas": 1, "max_batch_size": 16, "capacity_rows_s": 120.0}]},
}


def ray_text(i: int) -> str:
    """What Ray's metrics endpoint exports after ``i`` steps of 20 requests/s (5 s each):
    prefixed names, one replica's counts, the latency histogram as the counters an ingress
    publishes (serving.runtime.metrics): 90% of requests in (5 ms, 10 ms], the rest in (50 ms, 100 ms]."""
    rq = 100 * i
    lines = [
        "# TYPE ray_willump_rows_total counter",
        f'ray_willump_rows_total{{app="demo",level="0",WorkerId="w1"}} {80 * i}',
        f'ray_willump_rows_total{{app="demo",level="1",WorkerId="w1"}} {20 * i}',
        "# TYPE ray_willump_requests_total counter",
        f'ray_willump_requests_total{{app="demo",route="predict",status="200",WorkerId="w1"}} {rq}',
        "# TYPE ray_willump_request_latency_seconds_bucket_total counter",
    ]
    for le in BUCKET_LABELS:
        at_or_under = 0 if float(le) < 0.01 else 90 * i if float(le) < 0.1 else rq
        if at_or_under:
            lines.append(f'ray_willump_request_latency_seconds_bucket_total{{app="demo",route="predict",le="{le}",'
                         f'WorkerId="w1"}} {at_or_under}')
    lines += [
        "# TYPE ray_willump_request_latency_seconds_count_total counter",
        f'ray_willump_request_latency_seconds_count_total{{app="demo",route="predict",WorkerId="w1"}} {rq}',
        "# TYPE ray_willump_request_latency_seconds_sum_total counter",
        f'ray_willump_request_latency_seconds_sum_total{{app="demo",route="predict",WorkerId="w1"}} {rq * 0.014}',
    ]
    return "\n".join(lines) + "\n"


def make_ring(steps: int = 30) -> MetricRing:
    ring = MetricRing(history_s=300.0, sample_s=5.0)
    for i in range(steps):
        ring.add(Snapshot.parse(aggregate([ray_text(i)], "demo"), t=T0 + 5.0 * i))
    return ring


def records(n: int, seed: int, t0: float, planted: bool) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "timestamp": t0 + np.sort(rng.random(n)) * PANE_S, "model_version": "v1",
        "replica": rng.choice(["r0", "r1"], n), "level": rng.choice(["0", "1"], n, p=[0.8, 0.2]),
        "region": rng.choice(["eu", "us", "ap", PLANTED], n), "latency_ms": rng.lognormal(2.0, 0.3, n),
        "score": rng.random(n), "confidence": 0.5 + 0.5 * rng.random(n), "error": np.zeros(n),
        "a": rng.normal(0.0, 1.0, n)})
    if planted:
        frame.loc[frame.region == PLANTED, "latency_ms"] *= 6.0
        frame["a"] += 1.0
    return frame


@pytest.fixture(scope="module")
def snapshot():
    monitor = Monitor(attributes=["model_version", "replica", "level", "region"], metrics=["latency_ms", "score"],
                      features=["a"], level_column="level", cheap_level="0", confidence_column="confidence",
                      error_column="error", pane_seconds=PANE_S, window_panes=3, auto_reference_panes=3, clock=None)
    for p in range(10):
        monitor.ingest(records(600, p, T0 + PANE_S * p, planted=p >= 6))
    monitor.flush()
    return monitor_snapshot(monitor, {"slo_ms": 30.0})


def test_snapshots_of_the_apps_totals_give_rates_and_quantiles():
    ring = make_ring()
    times, rates = ring.rates("willump_rows", by="level")
    assert times.size == 29 and rates["0"][-1] == pytest.approx(16.0) and rates["1"][-1] == pytest.approx(4.0)
    # the last 60 s cover exactly 12 intervals: 20 requests/s
    assert ring.span_seconds(60.0) == pytest.approx(60.0)
    assert ring.increase("willump_requests", 60.0)["all"] / 60.0 == pytest.approx(20.0)
    p50 = ring.quantile_over("willump_request_latency_seconds", 0.5, 60.0)["all"]
    assert p50 == pytest.approx(0.005 + 0.005 * 0.5 / 0.9)  # linear inside its bucket, as Prometheus does
    _, p99 = ring.quantiles("willump_request_latency_seconds", 0.99, span_s=30.0)
    assert np.allclose(p99["all"], 0.05 + 0.05 * (0.99 - 0.9) / 0.1)  # 90% below 10 ms, the rest in (50, 100] ms


def test_a_counter_that_falls_gives_no_rate_not_a_negative_one():
    ring = MetricRing(60.0, 5.0)
    for t, value in ((0, 100), (5, 150), (10, 20), (15, 70)):  # a replica died between 5 and 10
        ring.add(Snapshot.parse(f'# TYPE willump_rows counter\nwillump_rows_total{{level="0"}} {value}\n', t=t))
    _, rates = ring.rates("willump_rows")
    assert rates["all"][0] == 10.0 and math.isnan(rates["all"][1]) and rates["all"][2] == 10.0
    assert ring.increase("willump_rows")["all"] == 100.0
    ring.add(Snapshot.parse("", t=14))  # a clock step back is ignored
    assert len(ring) == 4


def test_histogram_quantile_edges():
    bounds = np.array([0.1, 1.0, math.inf])
    assert math.isnan(histogram_quantile(0.5, bounds, np.array([0.0, 0.0, 0.0])))
    assert histogram_quantile(0.5, bounds, np.array([10.0, 10.0, 10.0])) == pytest.approx(0.05)
    assert histogram_quantile(0.99, bounds, np.array([0.0, 0.0, 10.0])) == 1.0  # +inf bucket: largest bound
    with pytest.raises(ValueError, match="sample_s"):
        MetricRing(history_s=1.0, sample_s=5.0)


def test_monitor_snapshot_names_the_planted_cause(snapshot):
    assert snapshot["errors"] == {}
    rows = snapshot["explain_latency"]["rows"]
    assert rows and rows[0]["region"] == PLANTED
    sentences = explanation_sentences(snapshot["explain_latency"], "latency outliers")
    assert f"region={PLANTED}" in sentences[0] and "as likely as the rest" in sentences[0]
    assert "counts requests" not in sentences[0]  # rows without request ids: intervals count rows
    by_request = explanation_sentences({**snapshot["explain_latency"], "unit": "requests"}, "latency outliers")
    assert "the interval counts requests, not rows" in by_request[0]
    assert {r["column"] for r in snapshot["drift"]["rows"] if r["drifted"]} == {"a", "latency_ms"}
    dist = snapshot["distributions"]["a"]
    assert dist["kind"] == "numeric" and dist["median_current"] - dist["median_reference"] == pytest.approx(1.0, abs=0.2)
    assert sum(dist["reference"]) == pytest.approx(1.0, abs=0.02)
    t = snapshot["series"]["t"]  # epoch seconds at each pane's end
    assert t[0] == T0 + PANE_S and np.all(np.diff(t) == PANE_S)
    assert set(snapshot["levels"]["levels"]) == {"0", "1"}


def plots_of(page: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, points in re.findall(r'data-plot="([^"]+)" data-points="(\d+)"', page):
        found[name] = found.get(name, 0) + int(points)
    return found


def test_page_draws_every_part_with_data(snapshot):
    view = model(INFO, make_ring(), snapshot, monitor_age_s=3.0, monitor_error=None, refresh_s=10.0,
                 now=T0 + 150.0)
    assert view["kpis"]["requests_per_s"] == pytest.approx(20.0)
    assert view["kpis"]["cheap_share"] == pytest.approx(0.8)
    cache: dict = {}
    page = render(view, root="/demo", cache=cache)
    drawn = plots_of(page)
    for name in ("traffic", "latency", "level-latency", "shares", "segments", "explanations", "distributions",
                 "series"):
        assert drawn.get(name, 0) > 0, (name, drawn)
    assert f"region={PLANTED}" in page and 'data-part="explain_latency"' in page
    assert '<meta http-equiv="refresh" content="10">' in page
    assert "computed 3 s ago" in page
    # nothing fetched from elsewhere: no scripts, no external URLs in attributes
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)
    assert cache  # the monitor's parts are kept and reused while its snapshot is the same
    again = render(view, root="/demo", cache=cache)
    assert plots_of(again) == drawn
    assert "refresh" not in render(view, refresh=False, cache={}).split("<title>")[0]


def test_page_says_plainly_when_the_monitor_is_off_or_pending():
    ring = make_ring()
    off = render(model({**INFO, "monitor": None}, ring, None, monitor_age_s=None, monitor_error=None,
                       refresh_s=10.0))
    assert 'id="monitor-off"' in off and "The monitor is off for this app" in off
    assert plots_of(off).get("traffic", 0) > 0  # the app's own figures still show
    pending = render(model(INFO, ring, None, monitor_age_s=None, monitor_error="DeadlineExceeded: monitor late",
                           refresh_s=10.0))
    assert 'id="monitor-pending"' in pending and "monitor late" in pending
    empty = render(model(INFO, MetricRing(60.0, 5.0), None, monitor_age_s=None, monitor_error=None, refresh_s=5))
    assert "No samples yet" in empty


def test_a_part_the_monitor_cannot_answer_shows_its_reason(snapshot):
    partial = {k: v for k, v in snapshot.items() if k != "drift"}
    partial["errors"] = {"drift": {"error": "reference 'default' is being collected", "retry_after_s": 12.0}}
    page = render(model(INFO, make_ring(), partial, monitor_age_s=1.0, monitor_error=None, refresh_s=10.0))
    assert "reference &#x27;default&#x27; is being collected (ready in about 12 s)" in page
    assert plots_of(page).get("explanations", 0) > 0


def test_plan_gauges_parse_and_are_declared():
    text = plan_metrics(INFO)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == set(PLAN_FAMILIES)
    slo = families["willump_slo_p99_seconds"].samples[0]
    assert slo.value == pytest.approx(0.03) and slo.labels == {"app": "demo"}
    shares = {s.labels["level"]: s.value for s in families["willump_certified_answered_share"].samples}
    assert shares == {"0": 0.8, "1": 0.2}
    assert plan_metrics({"name": "x"}) == ""


def test_index_links_to_the_dashboard():
    page = index_page("demo", "/demo", monitor=False)
    assert '<a href="/demo/ui">' in page and "/demo/explain" not in page
    assert "/demo/explain" in index_page("demo", "/demo", monitor=True)


@pytest.mark.parametrize(("query", "field"), [({"format": "pdf"}, "format"), ({"refresh": "maybe"}, "refresh"),
                                              ({"colour": "red"}, "colour")])
def test_ui_refuses_bad_parameters(query, field):
    request = SimpleNamespace(query_params=query, scope={"root_path": "/demo"})
    ingress = SimpleNamespace(info=INFO, monitor=None)
    with pytest.raises(RequestError) as err:
        asyncio.run(serve_ui(ingress, request))
    assert err.value.status == 422 and err.value.fields[0]["field"] == field


def test_an_unbounded_ratio_is_still_drawn():
    from serving.runtime.dashboard.plots import explanations_plot

    rows = [{"region": PLANTED, "ratio": "inf", "ci_low": None, "ci_high": "inf"}]
    assert plots_of(explanations_plot(rows, ["region"], "why")) == {"explanations": 1}


def test_a_tex_looking_attribute_value_is_drawn_as_text():
    """Attribute values are clients' text: "$\\foo$" in a label is drawn, not parsed as mathtext
    (which raised and made /ui answer 500)."""
    from serving.runtime.dashboard.plots import figure

    def draw(fig):
        ax = fig.add_subplot()
        ax.barh(["region=$\\foo$", "region=$x^2$"], [1.0, 2.0])
        ax.set_title("$\\foo$")
        return 2

    svg = figure("segments", "a TeX-looking value", draw)
    assert 'data-points="2"' in svg and "foo" in svg


def test_page_draws_the_live_guarantee_when_the_audit_runs(snapshot):
    """The live audit's verdict (drift.GuaranteeLedger, kept by the monitor replica) is a table
    in the cascade section: per gear the audited rows, the disagreement and its bound, the
    certified rate, the loss bound against max_loss, and the alarm."""
    from drift import GuaranteeLedger

    ledger = GuaranteeLedger([{"gear": 0, "max_loss": 0.02, "cert_rows": 4000, "cert_disagreed": 40}])
    ledger.add(0, 10_000, 8_000, 800, 60)
    view = model(INFO, make_ring(), {**snapshot, "guarantee": ledger.report()}, monitor_age_s=3.0,
                 monitor_error=None, refresh_s=10.0, now=T0 + 150.0)
    page = render(view, root="/demo", cache={})
    assert "the live guarantee" in page and "ALARM" in page and "800" in page
    quiet = render(model(INFO, make_ring(), snapshot, monitor_age_s=3.0, monitor_error=None, refresh_s=10.0,
                         now=T0 + 150.0), root="/demo", cache={})
    assert "the live guarantee" not in quiet
