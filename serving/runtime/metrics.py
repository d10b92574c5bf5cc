"""Application metrics, exported the way Ray exports every replica's metrics.

Each ingress replica records into :mod:`ray.util.metrics`; Ray's metrics agent on every node
exposes them (prefixed ``ray_``) with Serve's own ``ray_serve_*`` families at the node's
metrics export port, which Prometheus scrapes through the service-discovery file Ray writes
on the head node::

    scrape_configs:
      - job_name: ray
        file_sd_configs:
          - files: ["/tmp/ray/prom_metrics_service_discovery.json"]

Latency histograms are counted per bucket in the replica and published every
``HISTOGRAM_FLUSH_S`` as three counters (``<name>_bucket`` by ``le``, ``<name>_sum``,
``<name>_count``; Ray appends ``_total``) rather than as Ray histograms: Ray's metrics agent
replays a histogram's every observation on each export (``record_histogram_aggregated_batch``
calls ``record()`` once per observation), so at half of the toxic app's peak its export burst
took 90-130 ms of CPU every 5 s and set single-row p99 (docs/benchmarks.md); a counter costs it
one value per series. The sums are exact (Ray's are bucket midpoints).

Sum ``ray_willump_*`` over the ``WorkerId`` label for app totals. The app's own ``GET
/metrics`` does that sum and rebuilds the histograms under their usual names: it reads every
alive node's endpoint (a read another replica on this machine made in the last
``METRICS_SHARE_S`` serves) and answers exact totals across ingress replicas (as of each replica's
last export, ``RAY_metrics_report_interval_ms``: 5 s in a Ray that deploy starts unless the
environment sets it, Ray's default otherwise; the histograms as of the last flush before it),
with the names unprefixed. A replica that died takes its counts with it (Prometheus sees a
counter reset).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from serving.runtime.loop_task import PeriodicTask
from serving.runtime.node_scrape import metric_nodes, read_shared

#: latency buckets in seconds, from sub-millisecond stage calls to slow cold starts
LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
#: the ``le`` label of each bucket, +Inf last
BUCKET_LABELS = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]
#: how often a replica publishes the histogram counts it gathered (seconds); /metrics lags by
#: up to this much more than Ray's export interval
HISTOGRAM_FLUSH_S = 1.0
#: prefix Ray puts before application metric names
RAY_PREFIX = "ray_"
#: the series a histogram family is published as, and the suffix Ray gives a counter
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
COUNTER_SUFFIX = "_total"
#: seconds a read of a node's endpoint that any replica on this machine made answers GET /metrics
#: (serving.runtime.node_scrape): Ray's export renews the endpoint every few seconds, so Prometheus
#: scraping several replicas, or several apps, at once costs the node's metrics agent one render
METRICS_SHARE_S = 1.0
#: the shared reads GET /metrics takes (serving.runtime.node_scrape)
SCRAPE_SLOT = "scrape"

#: name -> (kind, description, tag keys)
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "willump_requests": ("counter", "HTTP requests by route and status", ("app", "route", "status")),
    "willump_errors": ("counter", "failed requests by route and kind", ("app", "route", "kind")),
    "willump_request_latency_seconds": ("histogram", "request latency by route", ("app", "route")),
    "willump_stage_latency_seconds": ("histogram", "stage call latency seen by the ingress (hop included)",
                                      ("app", "stage")),
    "willump_stage_compute_seconds": ("histogram", "compute time reported by the stage", ("app", "stage")),
    "willump_event_loop_lag_seconds": ("histogram", "how late an ingress replica's event loop woke up from a "
                                                    "sleep (serving.runtime.loop_lag, every 0.1 s): what a ready "
                                                    "request waited, behind the loop's work or for a CPU", ("app",)),
    "willump_gc_pause_seconds": ("histogram", "how long the interpreter's garbage collections of generation 1 "
                                              "and 2 took in an ingress replica, wall time (the thread "
                                              "that set one off waits; serving.runtime.gc_pauses)", ("app", "generation")),
    "willump_rows": ("counter", "rows answered, by cascade level", ("app", "level")),
    "willump_gear_rows": ("counter", "rows answered, by the certified gear that served them (serving.runtime.gears)",
                          ("app", "gear")),
    "willump_gear_switches": ("counter", "gear changes of an adaptive ingress, by the gear switched to",
                              ("app", "gear")),
    "willump_degraded_rows": ("counter", "rows answered by the cheap level because a later stage was "
                                         "late or overloaded (degrade=True)", ("app",)),
    "willump_stage_retries": ("counter", "stage calls retried after a replica died", ("app", "stage")),
    "willump_stage_hedges": ("counter", "stage calls sent a second time after the stage's latency tail "
                                        "(hedging=True), by whether the copy answered first", ("app", "stage", "won")),
    "willump_stage_hedge_backoffs": ("counter", "changes of a stage's hedge delay factor (copies that stop winning "
                                                "lengthen the delay, serving.runtime.hedge.HedgeBackoff), by the "
                                                "factor set (1: not backed off)", ("app", "stage", "factor")),
    "willump_stage_rescues": ("counter", "stage calls copied to another replica after waiting past the bound "
                                         "on a silent replica, by whether the copy answered first",
                              ("app", "stage", "won")),
    "willump_stage_pool_calls": ("counter", "stage calls by the node pool they were sent to (deploy(pools=...): "
                                            "each where it would wait least)", ("app", "stage", "pool")),
    "willump_audit_cpu_seconds": ("counter", "CPU seconds the live audit took, in the threads that did the work, "
                                             "by part: request_path (counting and sampling a request's rows), "
                                             "worker (taking sampled rows out, counting answers), full_pipeline "
                                             "(running it on them, when it runs in this process)", ("app", "part")),
    "willump_settings_rejected": ("counter", "in-place settings (the ingress's user_config) a running replica "
                                             "refused and did not apply", ("app",)),
    "willump_deadline_exceeded": ("counter", "requests past their deadline, by the stage that was late",
                                  ("app", "stage")),
    "willump_shed_requests": ("counter", "requests refused because a queue was full", ("app", "stage")),
    "willump_audit_rows": ("counter", "rows the live audit sampled, by outcome (agree, disagree, shed; "
                           "serving.runtime.audit)", ("app", "outcome")),
    "willump_monitor_records_sent": ("counter", "serving records delivered to the monitor", ("app",)),
    "willump_monitor_records_dropped": ("counter", "serving records dropped, by reason (buffer_full, "
                                                   "send_failed at shutdown, rejected)", ("app", "reason")),
    "willump_monitor_records_retried": ("counter", "serving records sent again after a send that failed or "
                                                   "never answered (the monitor skips copies it has)", ("app",)),
}


class ServingMetrics:
    """The app's metrics as recorded by one ingress replica (ray.util.metrics).

    Counters go to Ray as they are counted. Histogram observations are counted here and reach
    Ray at :meth:`flush` (every ``flush_interval_s`` while :attr:`flusher` runs on the replica's
    event loop)."""

    def __init__(self, app: str, flush_interval_s: float = HISTOGRAM_FLUSH_S,
                 counter: Callable[..., Any] | None = None):
        """``counter(name, description, tag_keys=...)`` makes a counter (``ray.util.metrics.Counter``
        unless given)."""
        if counter is None:
            from ray.util.metrics import Counter as counter
        if not flush_interval_s > 0:  # named as the caller named it
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s!r}")
        self.app = app
        self._m: dict[str, Any] = {}
        for name, (kind, description, tags) in FAMILIES.items():
            if kind == "counter":
                self._m[name] = counter(name, description, tag_keys=tags)
            else:
                self._m[name + "_bucket"] = counter(name + "_bucket", f"{description} (observations at or under le)",
                                                    tag_keys=(*tags, "le"))
                self._m[name + "_sum"] = counter(name + "_sum", f"{description} (sum of observations)",
                                                 tag_keys=tags)
                self._m[name + "_count"] = counter(name + "_count", f"{description} (observations)",
                                                   tag_keys=tags)
        self._lock = threading.Lock()
        #: (family, tags) -> [per-bucket counts (+Inf last), sum] gathered since the last flush
        self._pending: dict[tuple[str, tuple[tuple[str, str], ...]], list] = {}
        self.flusher = PeriodicTask(self.flush, flush_interval_s, "histogram counts not published")

    def count(self, name: str, value: float = 1.0, **tags: str) -> None:
        if value > 0:
            self._m[name].inc(value, tags={"app": self.app, **tags})

    def observe(self, name: str, seconds: float, **tags: str) -> None:
        if FAMILIES[name][0] != "histogram":
            raise ValueError(f"{name} is not a histogram family")
        seconds = float(seconds)
        if not math.isfinite(seconds):  # no latency is: a stage's report gone wrong, not an observation
            return
        seconds = max(seconds, 0.0)
        key = (name, tuple(sorted(tags.items())))
        with self._lock:
            entry = self._pending.get(key)
            if entry is None:
                entry = self._pending[key] = [[0] * len(BUCKET_LABELS), 0.0]
            entry[0][bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            entry[1] += seconds

    def flush(self) -> None:
        """Publish the histogram counts gathered since the last flush: per ``le`` the number of
        observations at or under it (cumulative, as Prometheus buckets are), their sum, their count."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for (name, tags), (counts, total) in pending.items():
            labels = {"app": self.app, **dict(tags)}
            # the count first, then the buckets from +Inf down: Ray may export between two of these
            # calls, and a histogram read half-way stays one (each bucket at most the one above it)
            at_or_under = sum(counts)
            self._m[name + "_count"].inc(at_or_under, tags=labels)
            for le, n in zip(reversed(BUCKET_LABELS), reversed(counts), strict=True):
                if not at_or_under:
                    break
                self._m[name + "_bucket"].inc(at_or_under, tags={**labels, "le": le})
                at_or_under -= n
            if total > 0:  # a counter takes no 0; aggregate lists a missing sum as 0
                self._m[name + "_sum"].inc(total, tags=labels)


def _family_of(ray_family: str) -> tuple[str, str] | None:
    """(FAMILIES name, sample-name stem) of a family as Ray exports it, or None if not ours."""
    name = ray_family[len(RAY_PREFIX):] if ray_family.startswith(RAY_PREFIX) else ray_family
    if name in FAMILIES:
        return name, name
    for part in HISTOGRAM_PARTS:
        base = name[:-len(part)]
        if name.endswith(part) and FAMILIES.get(base, ("",))[0] == "histogram":
            return base, name
    return None


def aggregate(texts: list[str], app: str) -> str:
    """Sum the app's ``ray_willump_*`` samples over replicas and nodes; Prometheus text out, the
    histograms rebuilt from their published counters with every bucket listed."""
    values: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    for text in texts:
        for family in text_string_to_metric_families(text):
            found = _family_of(family.name)
            if found is None:
                continue
            name, stem = found
            keep = set(FAMILIES[name][2]) | {"le"}
            for sample in family.samples:
                if sample.labels.get("app") != app:
                    continue
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k in keep))
                sample_name = sample.name[len(RAY_PREFIX):] if sample.name.startswith(RAY_PREFIX) else sample.name
                if stem != name:  # a histogram's counter: Ray named its samples <stem>_total
                    if sample_name != stem + COUNTER_SUFFIX:
                        continue
                    sample_name = stem
                values[name][(sample_name, labels)] += sample.value
    for name, samples in values.items():
        if FAMILIES[name][0] == "histogram":
            _fill_buckets(name, samples)
    lines = []
    for name in sorted(values):
        kind, description, _ = FAMILIES[name]
        header = name + COUNTER_SUFFIX if kind == "counter" else name  # as prometheus_client writes a counter
        lines.append(f"# HELP {header} {description}")
        lines.append(f"# TYPE {header} {kind}")
        for (sample, labels), value in sorted(values[name].items(), key=lambda kv: _order(kv[0])):
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{sample}{{{text}}} {floatToGoString(value)}")
    return "\n".join(lines) + "\n"


def _fill_buckets(name: str, samples: dict[tuple, float]) -> None:
    """Add what no replica has published (a bucket none of its observations fell at or under, a
    sum of zeros: a counter takes no 0) as 0, so each series lists its count, its sum and every
    bucket as a Prometheus histogram does."""
    series = {tuple(kv for kv in labels if kv[0] != "le") for _, labels in list(samples)}
    for labels in series:
        for part in ("_count", "_sum"):
            samples.setdefault((name + part, labels), 0.0)
        for le in BUCKET_LABELS:
            samples.setdefault((name + "_bucket", tuple(sorted((*labels, ("le", le))))), 0.0)


def _order(key: tuple) -> tuple:
    sample, labels = key
    le = dict(labels).get("le")
    rest = tuple((k, v) for k, v in labels if k != "le")
    return (sample.endswith("_bucket"), rest, float(le) if le is not None else 0.0, sample)


async def exact_totals(app: str) -> str:
    """The app's metrics summed over every replica on every node (GET /metrics)."""
    nodes = await asyncio.to_thread(metric_nodes)
    fresh_after = time.time() - METRICS_SHARE_S
    reads = await asyncio.gather(*(asyncio.to_thread(read_shared, node, endpoint, fresh_after, slot=SCRAPE_SLOT)
                                   for node, endpoint in nodes))
    return aggregate([text for text, _ in reads], app)
