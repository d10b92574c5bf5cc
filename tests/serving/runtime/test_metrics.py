"""The ingress's metrics: histograms counted in the replica and published as counters (Ray's
agent replays every histogram observation on export), rebuilt by ``aggregate`` into the
Prometheus histograms ``GET /metrics``, the dashboard and Grafana read."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.runtime.metrics import BUCKET_LABELS, LATENCY_BUCKETS, ServingMetrics, aggregate


class FakeCounters:
    """Counters as Ray's agent holds them: cumulative value per (name, tags)."""

    def __init__(self):
        self.values: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))

    def __call__(self, name: str, description: str = "", tag_keys: tuple = ()):
        counters = self

        class Counter:
            def inc(self, value: float, tags: dict[str, str]) -> None:
                assert value > 0 and set(tags) == set(tag_keys)
                counters.values[name][tuple(sorted(tags.items()))] += value
        return Counter()

    def ray_text(self, worker: str) -> str:
        """The counters as Ray's metrics endpoint writes them (prefix ``ray_``, suffix ``_total``)."""
        lines = []
        for name, series in self.values.items():
            lines += [f"# HELP ray_{name}_total x", f"# TYPE ray_{name}_total counter"]
            for tags, value in series.items():
                text = ",".join(f'{k}="{v}"' for k, v in (*tags, ("WorkerId", worker)))
                lines.append(f"ray_{name}_total{{{text}}} {value}")
        return "\n".join(lines) + "\n"


def published(counters: FakeCounters, name: str, **tags: str) -> dict[str, float]:
    key = tuple(sorted({"app": "a", **tags}.items()))
    out = {le: counters.values[name + "_bucket"].get(tuple(sorted((*key, ("le", le)))), 0.0) for le in BUCKET_LABELS}
    return {**out, "count": counters.values[name + "_count"].get(key, 0.0),
            "sum": counters.values[name + "_sum"].get(key, 0.0)}


def test_observations_wait_for_the_flush_then_publish_cumulative_buckets_and_an_exact_sum():
    counters = FakeCounters()
    metrics = ServingMetrics("a", counter=counters)
    for seconds in (0.0, 0.001, 0.003, 0.003, 0.02, 30.0, -1.0):  # 0.001 sits on a bound: le is inclusive
        metrics.observe("willump_request_latency_seconds", seconds, route="predict")
    metrics.observe("willump_request_latency_seconds", float("nan"), route="predict")  # dropped, not counted
    assert not counters.values["willump_request_latency_seconds_count"]
    metrics.flush()
    got = published(counters, "willump_request_latency_seconds", route="predict")
    assert got["0.0005"] == 2 and got["0.001"] == 3 and got["0.0025"] == 3 and got["0.005"] == 5
    assert got["0.025"] == 6 and got["10.0"] == 6 and got["+Inf"] == 7 and got["count"] == 7
    assert got["sum"] == pytest.approx(0.001 + 0.006 + 0.02 + 30.0, abs=0)
    metrics.observe("willump_request_latency_seconds", 0.004, route="predict")
    metrics.flush()
    metrics.flush()  # nothing new: nothing published twice
    got = published(counters, "willump_request_latency_seconds", route="predict")
    assert got["0.0025"] == 3 and got["0.005"] == 6 and got["+Inf"] == 8 and got["count"] == 8


def test_bad_use_is_refused_by_name():
    with pytest.raises(ValueError, match="flush_interval_s"):
        ServingMetrics("a", flush_interval_s=0, counter=FakeCounters())
    with pytest.raises(ValueError, match="willump_requests is not a histogram"):
        ServingMetrics("a", counter=FakeCounters()).observe("willump_requests", 0.1)


def test_aggregate_rebuilds_each_histogram_over_replicas_with_every_bucket():
    replicas = []
    for worker, latencies in (("w1", [0.0002, 0.004, 0.004]), ("w2", [0.3])):
        counters = FakeCounters()
        metrics = ServingMetrics("a", counter=counters)
        for seconds in latencies:
            metrics.observe("willump_stage_latency_seconds", seconds, stage="cheap")
        metrics.count("willump_requests", 4, route="predict", status="200")
        metrics.flush()
        replicas.append(counters.ray_text(worker))
    other = FakeCounters()
    ServingMetrics("b", counter=other).observe("willump_stage_latency_seconds", 0.001, stage="cheap")
    text = aggregate([*replicas, other.ray_text("w3")], "a")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hist = families["willump_stage_latency_seconds"]
    assert hist.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert list(buckets) == BUCKET_LABELS  # every bucket, in order, 0 where nothing fell
    assert [buckets[le] for le in ("0.0005", "0.001", "0.005", "0.25", "0.5", "+Inf")] == [1, 1, 3, 3, 4, 4]
    values = list(buckets.values())
    assert values == sorted(values)
    (count,) = [s.value for s in hist.samples if s.name.endswith("_count")]
    (total,) = [s.value for s in hist.samples if s.name.endswith("_sum")]
    assert count == 4 and total == pytest.approx(0.3082)
    assert all(s.labels == {"app": "a", "stage": "cheap", **({"le": s.labels["le"]} if "le" in s.labels else {})}
               for s in hist.samples)
    (requests,) = families["willump_requests"].samples
    assert requests.value == 8 and requests.name == "willump_requests_total"
    assert len(LATENCY_BUCKETS) + 1 == len(BUCKET_LABELS)


async def observe_until_published(metrics: ServingMetrics, counters: FakeCounters, then=lambda: None) -> None:
    """Start the flusher, observe once, wait (on the loop) until a flush published it, call
    ``then``, stop the flusher."""
    metrics.flusher.start()
    metrics.observe("willump_event_loop_lag_seconds", 0.002)
    for _ in range(500):
        await asyncio.sleep(0.01)
        if published(counters, "willump_event_loop_lag_seconds")["count"]:
            break
    then()
    metrics.flusher.stop()


def test_the_flusher_publishes_on_the_loop_and_once_more_when_stopped():
    counters = FakeCounters()
    metrics = ServingMetrics("a", flush_interval_s=0.01, counter=counters)

    asyncio.run(observe_until_published(metrics, counters, then=lambda: metrics.observe(
        "willump_event_loop_lag_seconds", 0.002)))
    assert published(counters, "willump_event_loop_lag_seconds")["count"] == 2


def buckets_of(text: str, family: str) -> tuple[list[str], list[float], dict[str, float]]:
    (hist,) = [f for f in text_string_to_metric_families(text) if f.name == family]
    les = [s.labels["le"] for s in hist.samples if s.name.endswith("_bucket")]
    values = [s.value for s in hist.samples if s.name.endswith("_bucket")]
    rest = {s.name.rsplit("_", 1)[1]: s.value for s in hist.samples if not s.name.endswith("_bucket")}
    return les, values, rest


def test_a_histogram_read_half_way_through_a_flush_is_still_a_histogram():
    """Ray may export between two of a flush's increments: every state read in between lists
    every bucket, non-decreasing, none above the count."""
    states = []

    class Watching(FakeCounters):
        def __call__(self, name, description="", tag_keys=()):
            inner = super().__call__(name, description, tag_keys)
            outer = self

            class Counter:
                def inc(self, value, tags):
                    inner.inc(value, tags)
                    states.append(aggregate([outer.ray_text("w1")], "a"))
            return Counter()

    counters = Watching()
    metrics = ServingMetrics("a", counter=counters)
    for round_ in range(2):
        for seconds in (0.0007, 0.004, 0.004, 0.3, 12.0):
            metrics.observe("willump_stage_latency_seconds", seconds * (round_ + 1), stage="cheap")
        metrics.flush()
    assert len(states) > 10
    for text in states:
        les, values, rest = buckets_of(text, "willump_stage_latency_seconds")
        assert les == BUCKET_LABELS and values == sorted(values) and values[-1] <= rest["count"]
        assert set(rest) == {"count", "sum"}
    les, values, rest = buckets_of(states[-1], "willump_stage_latency_seconds")
    assert values[-1] == rest["count"] == 10


def test_a_histogram_of_zeros_lists_its_sum_as_zero():
    counters = FakeCounters()
    metrics = ServingMetrics("a", counter=counters)
    metrics.observe("willump_event_loop_lag_seconds", 0.0)  # a counter takes no 0: no sum published
    metrics.flush()
    _, values, rest = buckets_of(aggregate([counters.ray_text("w1")], "a"), "willump_event_loop_lag_seconds")
    assert rest == {"count": 1.0, "sum": 0.0} and values[0] == 1.0


def test_a_flush_that_fails_is_logged_and_the_next_one_publishes(caplog):
    counters = FakeCounters()
    metrics = ServingMetrics("a", flush_interval_s=0.01, counter=counters)
    real, calls = metrics.flush, []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("export refused")
        real()

    metrics.flusher.call = flaky

    asyncio.run(observe_until_published(metrics, counters))
    assert len(calls) >= 2 and published(counters, "willump_event_loop_lag_seconds")["count"] == 1
    assert "histogram counts not published" in caplog.text
