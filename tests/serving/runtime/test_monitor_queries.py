"""Monitor queries answer the monitor's own errors (drift.DriftError) with their status,
machine-readable reason and, when waiting helps, Retry-After, instead of a generic 4xx.
Runs the query code in this process (no Ray); test_api checks the same over HTTP."""

from __future__ import annotations

import time

from serving.runtime.http_support import monitor_error
from serving.runtime.replicas import MonitorStage


def _stage(**config):
    return MonitorStage.func_or_class({"attributes": ["region"], "metrics": ["latency_ms"], **config})


def test_drift_errors_keep_status_reason_and_retry_after():
    stage = _stage(pane_seconds=1.0, auto_reference_panes=50)
    empty = stage._query("drift", {})
    assert empty["status"] == 409 and empty["reason"] == "no_data" and "retry_after_s" not in empty

    now = time.time()
    stage.monitor.ingest([{"region": "eu", "latency_ms": float(i % 7), "ts": now} for i in range(100)])
    pending = stage._query("drift", {})
    assert pending["status"] == 409 and pending["reason"] == "reference_pending"
    assert pending["retry_after_s"] > 0 and "reference=-1h" in pending["error"]

    missing = stage._query("drift", {"reference": "nosuch"})
    assert missing["status"] == 409 and missing["reason"] == "no_reference"
    schema = stage._query("explain", {"metric": "nosuch"})  # a SchemaError is a ValueError too
    assert schema["status"] == 422 and schema["reason"] == "schema" and "nosuch" in schema["error"]

    # mistakes the monitor does not classify keep the generic answers
    assert stage._query("explain", {"bogus": 1})["status"] == 422
    assert stage._query("nosuch", {})["status"] == 404


def test_monitor_error_becomes_the_http_answer():
    err = monitor_error({"status": 409, "reason": "reference_pending", "error": "wait", "retry_after_s": 54.2,
                         "fields": []})
    assert err.status == 409 and err.headers == {"Retry-After": "55"}
    assert err.body() == {"error": "wait", "fields": [], "reason": "reference_pending", "retry_after_s": 54.2}
    soon = monitor_error({"status": 409, "reason": "reference_pending", "error": "wait", "retry_after_s": 0.2})
    assert soon.headers == {"Retry-After": "1"}
    plain = monitor_error({"status": 422, "error": "unknown query parameter(s) ['x']",
                           "fields": [{"field": "x", "error": "accepted: []"}]})
    assert plain.headers == {} and plain.body() == {"error": "unknown query parameter(s) ['x']",
                                                    "fields": [{"field": "x", "error": "accepted: []"}]}


def test_a_query_priced_beyond_its_bounds_is_refused_by_name():
    """One conditional_shift with extreme parameters used to cost ~100x the default under the
    monitor's single lock; over HTTP the cost parameters are bounded (422 naming the one)."""
    stage = _stage(pane_seconds=1.0)
    for params, field in (({"max_segments": 100_000}, "max_segments"), ({"min_share": 0.0001}, "min_share"),
                          ({"min_support": "nan"}, "min_support"), ({"max_order": 6}, "max_order"),
                          ({"min_samples": "many"}, "min_samples")):
        name = "explain" if field in ("min_support", "max_order") else "conditional_shift"
        answer = stage._query(name, dict(params))
        assert answer["status"] == 422 and answer["fields"][0]["field"] == field and "over HTTP" in answer["error"], answer
    assert stage._query("conditional_shift", {"max_segments": 20})["status"] != 422  # within: asked as usual


def test_sequential_drift_and_request_counting_reach_http():
    """`/drift?kind=sequential` runs Monitor.sequential_drift; serving's monitors count requests
    (records carry request_id), and a batch without ids still ingests (each row alone)."""
    from serving.runtime.http_support import MONITOR_ROUTES, monitor_query_parameters

    assert MONITOR_ROUTES["drift"][1]["sequential"] == "sequential_drift"
    names = {p["name"] for p in monitor_query_parameters("drift")}
    assert {"kind", "false_alarms_per_day", "burn_in"} <= names
    stage = _stage(pane_seconds=1.0, auto_reference_panes=50, request_column="request_id")
    now = time.time()
    stage.monitor.ingest([{"region": "eu", "latency_ms": float(i % 7), "ts": now, "request_id": f"r{i // 4}"}
                          for i in range(100)])
    stage.monitor.ingest([{"region": "eu", "latency_ms": 1.0, "ts": now}])
    answer = stage._query("sequential_drift", {})
    assert answer["status"] == 409 and answer["reason"] == "reference_pending"  # a monitor error, not a 404


def test_a_segment_is_passed_on_as_written_and_numbers_are_read_as_numbers(monkeypatch):
    """?segment=none names an attribute called "none" (it was read as no segment at all, and
    ?segment=true as True); the other parameters still read as the values they spell."""
    import asyncio
    import types

    import serving.runtime.monitor_calls as calls

    asked = []

    async def answer(ingress, method, args, deadline):
        asked.append(args)
        return {"ok": True}

    async def nothing(ingress, deadline):
        return None

    monkeypatch.setattr(calls, "_answer", answer)
    monkeypatch.setattr(calls, "_flush_records", nothing)
    ingress = types.SimpleNamespace(monitor=object(), records=None)
    for value in ("none", "true", "12"):
        asyncio.run(calls.monitor_query(ingress, {}, {"kind": "accuracy", "segment": value, "min_rows": "5"}, "drift"))
    assert [a[1] for a in asked] == [{"segment": v, "min_rows": 5} for v in ("none", "true", "12")]
