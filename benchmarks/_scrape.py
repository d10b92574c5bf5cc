"""A served app's /metrics read by the benchmarks: counters summed by one label's values, through
prometheus_client's own parser (one fetch, however many families are read from it)."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families


def metrics_text(base_url: str) -> str:
    """The app's ``/metrics`` (the replicas' last exports: a few seconds behind)."""
    return requests.get(base_url + "/metrics", timeout=60).text


def counter_by_label(text: str, family: str, label: str) -> dict[str, float]:
    """Counter ``family`` (its name without ``_total``) in ``text``, summed per value of ``label``
    over every other label (replicas, apps)."""
    out: dict[str, float] = {}
    for found in text_string_to_metric_families(text):
        if found.name not in (family, family + "_total"):
            continue
        for sample in found.samples:
            if sample.name in (family, family + "_total") and label in sample.labels:
                key = sample.labels[label]
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out
