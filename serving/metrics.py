"""Prometheus metrics of one ingress replica (prometheus-client, its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

#: latency buckets in seconds, from sub-millisecond stage calls to slow cold starts
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServingMetrics:
    """Requests, errors, latency per route and per stage, and rows per cascade level."""

    def __init__(self, app: str):
        self.registry = CollectorRegistry()
        labels = {"registry": self.registry}
        self.requests = Counter("willump_requests", "HTTP requests by route and status",
                                ["app", "route", "status"], **labels)
        self.errors = Counter("willump_errors", "failed requests by route and kind",
                              ["app", "route", "kind"], **labels)
        self.latency = Histogram("willump_request_latency_seconds", "request latency by route",
                                 ["app", "route"], buckets=LATENCY_BUCKETS, **labels)
        self.stage_latency = Histogram("willump_stage_latency_seconds",
                                       "stage call latency seen by the ingress (hop included)",
                                       ["app", "stage"], buckets=LATENCY_BUCKETS, **labels)
        self.stage_compute = Histogram("willump_stage_compute_seconds",
                                       "compute time reported by the stage replica",
                                       ["app", "stage"], buckets=LATENCY_BUCKETS, **labels)
        self.rows = Counter("willump_rows", "rows answered, by cascade level", ["app", "level"], **labels)
        self.retries = Counter("willump_stage_retries", "stage calls retried after a replica died",
                               ["app", "stage"], **labels)
        self.app = app

    def render(self) -> bytes:
        return generate_latest(self.registry)
