"""The live audit's ingress side (serving.runtime.audit) and the monitor replica's ledger,
in this process (no Ray): sampling, batching, shedding under load, failures counted as shed,
counts merged and sent, the verdict at /drift?kind=guarantee and its survival of a restart."""

from __future__ import annotations

import asyncio
import json
import time
import types

import numpy as np
import pandas as pd
import pytest

from serving.runtime.audit import LiveAudit, check_audit_rate, resolve_audit_rate
from serving.runtime.http_support import MONITOR_ROUTES, monitor_query_parameters
from serving.runtime.replicas import MonitorStage

TWO_CLASSES = np.array([[0.9, 0.1], [0.2, 0.8]])


def _request(n: int, cheap: int, served: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """n rows, the first ``cheap`` answered by level 0 (full level: 1), every served class ``served``."""
    rows = pd.DataFrame({"x": np.arange(n, dtype=float)})
    proba = np.repeat(TWO_CLASSES[[served]], n, axis=0)
    level = np.where(np.arange(n) < cheap, 0, 1)
    return rows, proba, level


class _Sink:
    def __init__(self, fail: int = 0):
        self.entries: list[dict] = []
        self.fail = fail
        self.ids: list[str | None] = []  # every send's id, failed ones included

    async def __call__(self, entries: list[dict], batch_id: str | None = None) -> None:
        self.ids.append(batch_id)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("monitor down")
        self.entries.extend(entries)

    def total(self, key: str) -> int:
        return sum(e[key] for e in self.entries)


def _audit(full, sink, busy=lambda: False, **kw) -> LiveAudit:
    async def full_classes(rows: pd.DataFrame) -> np.ndarray:
        return full(rows)

    return LiveAudit(kw.pop("rate", 1.0), [1], full_classes, sink, busy, flush_s=0.01, **kw)


def test_every_cheap_row_is_audited_in_batches_and_disagreements_counted():
    calls: list[int] = []

    def full(rows):
        calls.append(len(rows))
        return (rows["x"].to_numpy() % 2).astype(int)  # odd rows: class 1, where the served class is 0

    async def go():
        sink = _Sink()
        audit = _audit(full, sink, batch_rows=8)
        for _ in range(3):
            audit.observe(*_request(6, cheap=4), gear=0, attributes=None)
        while audit.queue:
            await audit.audit_batch()
        await audit.flush()
        return sink

    sink = asyncio.run(go())
    assert sink.total("served") == 18 and sink.total("cheap") == 12 and sink.total("audited") == 12
    assert sink.total("disagreed") == 6  # rows 1 and 3 of each request
    assert sum(calls) == 12 and max(calls) <= 8  # the rows of several requests share a call


def test_the_audits_own_cpu_is_reported_by_part_and_the_full_pipelines_where_it_runs():
    """What benchmarks.audit_cost reads (willump_audit_cpu_seconds): the request path's and the
    worker's CPU on this thread, and the full pipeline's in the thread that ran it."""
    from types import SimpleNamespace

    from serving.runtime.hold import full_proba

    cpu: dict[str, float] = {}

    def on_cpu(part: str, seconds: float) -> None:
        assert seconds >= 0.0
        cpu[part] = cpu.get(part, 0.0) + seconds

    def burn(rows):
        end = time.thread_time() + 0.02  # 20 ms of this thread's CPU
        while time.thread_time() < end:
            pass
        return np.tile(TWO_CLASSES[0], (len(rows), 1))

    ingress = SimpleNamespace(second=None, local=True, first=SimpleNamespace(runner=SimpleNamespace(full_proba=burn)))

    async def go():
        async def full_classes(rows):
            proba = await full_proba(ingress, rows, None, on_cpu=lambda s: on_cpu("full_pipeline", s))
            return proba.argmax(axis=1)

        audit = LiveAudit(1.0, [1], full_classes, _Sink(), lambda: False, flush_s=0.01, on_cpu=on_cpu)
        audit.observe(*_request(6, cheap=4), gear=0, attributes=None)
        while audit.queue:
            await audit.audit_batch()
        await audit.flush()  # the rest is summed on the audit and handed over with each flush

    asyncio.run(go())
    assert set(cpu) == {"request_path", "worker", "full_pipeline"}
    assert 0.02 <= cpu["full_pipeline"] < 1.0  # the worker thread's CPU, not the event loop's


def test_the_sampling_rate_is_kept_and_only_cheap_rows_are_sampled():
    async def go():
        sink = _Sink()
        audit = _audit(lambda rows: np.zeros(len(rows), int), sink, rate=0.05, queue_rows=10**6)
        for _ in range(400):
            audit.observe(*_request(50, cheap=40), gear=0, attributes=None)
        queued = audit.queued
        await audit.close()
        return queued, sink

    queued, sink = asyncio.run(go())
    assert 0.04 * 16000 < queued < 0.06 * 16000
    assert sink.total("served") == 20000 and sink.total("cheap") == 16000
    assert sink.total("shed") == queued  # closed before the worker ran: every queued row counted as shed


def test_audits_are_shed_when_busy_when_the_queue_is_full_and_when_the_call_fails():
    async def go():
        busy_sink, full_sink, fail_sink = _Sink(), _Sink(), _Sink()
        busy = _audit(lambda rows: np.zeros(len(rows), int), busy_sink, busy=lambda: True)
        busy.observe(*_request(10, cheap=10), gear=0, attributes=None)
        await busy.audit_batch()
        await busy.flush()
        small = _audit(lambda rows: np.zeros(len(rows), int), full_sink, queue_rows=4)
        small.observe(*_request(10, cheap=10), gear=0, attributes=None)
        await small.flush()

        def broken(rows):
            raise RuntimeError("stage gone")

        failing = _audit(broken, fail_sink)
        failing.observe(*_request(5, cheap=5), gear=0, attributes=None)
        await failing.audit_batch()
        await failing.flush()
        return busy_sink, full_sink, fail_sink

    busy_sink, full_sink, fail_sink = asyncio.run(go())
    assert busy_sink.total("shed") == 10 and busy_sink.total("audited") == 0
    assert full_sink.total("shed") == 6  # 4 rows queued, the other 6 shed at once
    assert fail_sink.total("shed") == 5 and fail_sink.total("disagreed") == 0  # never counted as agreement


def test_counts_survive_a_monitor_that_is_down_and_segments_are_kept():
    async def go():
        sink = _Sink(fail=1)
        audit = LiveAudit(0.0, [1], None, sink, lambda: False, segments=["client"])
        audit.observe(*_request(4, cheap=3), gear=0, attributes={"client": "a"})
        audit.observe(*_request(2, cheap=2), gear=0, attributes={"client": "b"})
        await audit.flush()  # fails: kept
        audit.observe(*_request(4, cheap=0), gear=0, attributes={"client": "a"})
        await audit.flush()
        return sink

    sink = asyncio.run(go())
    served, cheap = {}, {}
    for e in sink.entries:
        client = e["segment"]["client"]
        served[client] = served.get(client, 0) + e["served"]
        cheap[client] = cheap.get(client, 0) + e["cheap"]
    assert served == {"a": 8, "b": 2} and cheap == {"a": 3, "b": 2}
    # the failed counts went again as they were, under their id (the monitor adds an id once),
    # and what gathered meanwhile under a new one
    failed, again, later = sink.ids
    assert failed == again != later and failed.startswith("audit:") and later.startswith("audit:")


def test_degraded_rows_travel_beside_the_counts_and_the_ledger_reports_them():
    """Rows an earlier level answered because a later stage was late are served outside every
    certificate: counted apart (never as served, cheap or audited rows) and reported."""
    from drift import GuaranteeLedger

    async def go():
        sink = _Sink()
        audit = LiveAudit(0.0, [1], None, sink, lambda: False, segments=["client"])
        audit.observe(*_request(4, cheap=3), gear=0, attributes={"client": "a"})
        audit.degraded(0, 5, {"client": "a"})
        audit.degraded(0, 0, {"client": "a"})
        await audit.flush()
        return sink

    entries = asyncio.run(go()).entries
    assert [(e["served"], e["cheap"], e.get("degraded", 0)) for e in entries] == [(4, 3, 5)]
    ledger = GuaranteeLedger([{"gear": 0, "max_loss": 0.01}], segments=["client"])
    ledger.add_batch(entries)
    verdict = ledger.report(segment="client")["gears"][0]
    assert (verdict["served_rows"], verdict["degraded_rows"]) == (4, 5)
    assert verdict["segments"][0]["degraded_rows"] == 5


def test_rates_are_checked_and_resolved():
    assert check_audit_rate(0) == 0.0 and check_audit_rate(0.5) == 0.5
    for bad in (-0.1, 1.5, "0.1", True, None):
        with pytest.raises(ValueError, match="audit_rate"):
            check_audit_rate(bad)
    assert resolve_audit_rate(None, monitor=True, cascade=True) == (0.01, None)
    assert resolve_audit_rate(None, monitor=False, cascade=True) == (0.0, None)
    with pytest.raises(ValueError, match="monitor"):
        resolve_audit_rate(0.1, monitor=False, cascade=True)
    rate, note = resolve_audit_rate(0.1, monitor=True, cascade=False)
    assert rate == 0.0 and "full pipeline" in note


def _stage(tmp_path=None, **terms):
    config = {"attributes": ["region"], "metrics": ["latency_ms"]}
    if tmp_path is not None:
        config["directory"] = str(tmp_path)
    guarantee = {"gears": [{"gear": 0, "max_loss": 0.02, "cert_rows": 4000, "cert_disagreed": 40}],
                 "rowwise": True, "confidence": 0.95, "segments": ["client"], **terms}
    return MonitorStage.func_or_class(config, None, guarantee)


def test_the_monitor_replica_keeps_the_ledger_answers_the_query_and_survives_a_restart(tmp_path):
    stage = _stage(tmp_path)
    entries = [{"gear": 0, "served": 10_000, "cheap": 8_000, "audited": 800, "disagreed": 60, "shed": 3,
                "segment": {"client": "a"}},
               {"gear": 0, "served": 1_000, "cheap": 900, "audited": 90, "disagreed": 1, "shed": 0,
                "segment": {"client": "b"}}]
    assert asyncio.run(stage.audit(entries)) == {"accepted": 2}
    answer = stage._query("guarantee", {})
    assert answer["status"] == 200
    gear = answer["result"]["gears"][0]
    assert gear["audited_rows"] == 890 and gear["disagreed_rows"] == 61 and gear["shed_audits"] == 3
    assert gear["alarm"]  # about 5.6% served disagreement against a certified 1%
    assert 0.0 < gear["disagreement_lower"] < gear["disagreement_rate"] < gear["loss_upper"]
    by_segment = stage._query("guarantee", {"segment": "client"})["result"]["gears"][0]["segments"]
    assert [s["value"] for s in by_segment] == ["a", "b"]
    assert stage._query("guarantee", {"segment": "nosuch"})["status"] == 422
    assert stage._query("guarantee", {"bogus": 1})["status"] == 422
    text = asyncio.run(stage.prometheus())
    assert 'drift_guarantee_alarm{gear="0"} 1.0' in text and "drift_guarantee_audited_rows_total" in text
    stage.monitor.close()

    again = _stage(tmp_path)  # a restarted monitor replica reads the saved ledger
    assert again._query("guarantee", {})["result"]["gears"][0]["audited_rows"] == 890
    json.dumps(again._query("guarantee", {"segment": "client"}))
    again.monitor.close()
    fresh = _stage(tmp_path, gears=[{"gear": 0, "max_loss": 0.05}])  # another certificate: counts start over
    assert fresh._query("guarantee", {})["result"]["gears"][0]["audited_rows"] == 0


def test_counts_sent_again_under_their_id_are_added_once_through_a_restart(tmp_path):
    """The sender did not hear the monitor's answer (a deadline passed, a connection dropped)
    and sends the same counts again under the same id: the ledger adds them once, and
    remembers the id with the counts it saved, so a restarted monitor replica skips it too."""
    entries = [{"gear": 0, "served": 100, "cheap": 90, "audited": 9, "disagreed": 1, "shed": 0,
                "segment": {"client": "a"}}]
    stage = _stage(tmp_path)
    assert asyncio.run(stage.audit(entries, "ingress-a:1")) == {"accepted": 1}
    assert asyncio.run(stage.audit(entries, "ingress-a:1")) == {"accepted": 0, "duplicate": 1}
    assert asyncio.run(stage.audit(entries, "ingress-a:2")) == {"accepted": 1}
    assert asyncio.run(stage.audit(entries)) == {"accepted": 1}  # a sender of earlier code: no id
    stage.monitor.close()
    again = _stage(tmp_path)
    assert asyncio.run(again.audit(entries, "ingress-a:2")) == {"accepted": 0, "duplicate": 1}
    assert again._query("guarantee", {})["result"]["gears"][0]["audited_rows"] == 27
    with pytest.raises(ValueError, match="batch_id"):
        asyncio.run(again.audit(entries, ""))
    again.monitor.close()


def test_an_app_without_the_audit_says_so_and_the_route_lists_the_kind():
    stage = MonitorStage.func_or_class({"attributes": ["region"], "metrics": ["latency_ms"]})
    answer = stage._query("guarantee", {})
    assert answer["status"] == 404 and "audit_rate" in answer["error"]
    assert asyncio.run(stage.audit([]))["accepted"] == 0
    assert MONITOR_ROUTES["drift"][1]["guarantee"] == "guarantee"
    params = {p["name"]: p for p in monitor_query_parameters("drift")}
    assert "guarantee" in params["kind"]["schema"]["enum"] and "kind=guarantee" in params["segment"]["description"]


def test_labels_join_served_records_through_the_monitor_replica_and_survive_a_restart(tmp_path):
    """Served records carry each row's index and served class; the monitor replica keeps them
    for the labels that follow (POST /labels), counts accepted / unknown / duplicate, answers
    /drift?kind=accuracy against the certified floor, and keeps it all through a restart."""
    from serving.runtime.records import record_columns

    def stage():
        labels = {"classes": ["neg", "pos"], "certified": [{"max_loss": 0.02, "baseline_score": 0.9}],
                  "segments": ["client"], "metric": "accuracy", "confidence": 0.95}
        return MonitorStage.func_or_class({"attributes": ["client"], "metrics": ["latency_ms"],
                                           "directory": str(tmp_path)}, None, None, labels)

    monitor = stage()
    frame = pd.DataFrame({"x": np.arange(4.0)})
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    config = {"request_attributes": ["client"]}
    for rid in ("req-a", "req-b"):
        columns = record_columns(frame, proba, np.zeros(4, int), np.full(4, "r", dtype=object), 3.0, 1e9, "v1",
                                 {"client": rid[-1]}, config, request_id=rid)
        asyncio.run(monitor.ingest(pd.DataFrame(columns)))
    answer = asyncio.run(monitor.labels({"labels": [
        {"request_id": "req-a", "row": 0, "label": "neg"},   # served neg: correct
        {"request_id": "req-a", "row": 1, "label": "neg"},   # served pos: wrong
        {"request_id": "req-a", "row": 0, "label": "pos"},   # a second label for one row
        {"request_id": "req-zz", "row": 0, "label": "pos"},  # no such request
        {"request_id": "req-b", "row": 9, "label": "pos"}]}))  # no such row
    assert answer == {"status": 200, "accepted": 2, "unknown": 2, "duplicate": 1}
    bad = asyncio.run(monitor.labels({"labels": [{"request_id": "req-a", "row": 2, "label": "maybe"}]}))
    assert bad["status"] == 422 and bad["fields"][0]["field"] == "labels[0].label"
    report = monitor._query("accuracy", {"segment": "client"})["result"]
    gear = report["gears"][0]
    assert (gear["served_rows"], gear["labelled_rows"], gear["accuracy"]) == (8, 2, 0.5)
    assert gear["certified_bound"]["floor"] == pytest.approx(0.88)
    assert gear["estimate_without_labels"] == pytest.approx(proba.max(axis=1).mean())
    assert {s["value"]: s["labelled_rows"] for s in gear["segments"]} == {"a": 2, "b": 0}
    monitor.__del__()

    again = stage()  # the served rows and the counts survive a restart
    assert again._query("accuracy", {})["result"]["gears"][0]["labelled_rows"] == 2
    late = asyncio.run(again.labels({"labels": [{"request_id": "req-b", "row": 3, "label": "pos"}]}))
    assert late["accepted"] == 1
    again.__del__()


def test_a_large_request_waits_as_its_sampled_rows_only():
    """The queue holds whole small requests (sliced later, off the request path) but only the
    sampled rows of a large one, so its memory stays bounded."""
    from serving.runtime.audit import KEEP_FRAME_ROWS

    async def go():
        audit = _audit(lambda rows: np.zeros(len(rows), int), _Sink(), rate=0.5)
        audit.observe(*_request(KEEP_FRAME_ROWS * 4, cheap=KEEP_FRAME_ROWS * 4), gear=0, attributes=None)
        audit.observe(*_request(8, cheap=8), gear=0, attributes=None)
        big, small = audit.queue
        assert len(big[0]) == len(big[1]) < KEEP_FRAME_ROWS * 4 and len(small[0]) == 8
        assert big[0]["x"].tolist() == sorted(big[0]["x"].tolist())  # the sampled rows, in order
        await audit.close()

    asyncio.run(go())


def test_the_sample_does_not_depend_on_how_rows_are_split_into_requests():
    """The sample is drawn as the gaps of one Bernoulli process over the stream of cheap rows:
    the same seed samples the same rows whether they come as one request or many, and a request
    with no sampled row draws nothing; the caller's level counts give the same counts."""
    def sampled(sizes: list[int], counted: bool) -> tuple[list[float], list[int]]:
        async def go():
            audit = _audit(lambda rows: np.zeros(len(rows), int), _Sink(), rate=0.05, queue_rows=10**6, seed=7)
            start = 0
            for size in sizes:
                rows, proba, level = _request(size, cheap=size)
                rows["x"] += start
                start += size
                audit.observe(rows, proba, level, gear=0, attributes=None,
                              level_rows=np.bincount(level, minlength=2) if counted else None)
            picked = [float(x) for frame, positions, *_ in audit.queue for x in frame["x"].to_numpy()[positions]]
            counts = audit.pending[(0, (), False)]
            audit.queue, audit.sampled_at, audit.queued = [], [], 0
            return picked, counts[:2]

        return asyncio.run(go())

    whole, counts = sampled([2000], counted=False)
    assert 60 < len(whole) < 150 and counts == [2000, 2000]
    assert sampled([1] * 2000, counted=True) == (whole, counts)
    assert sampled([7, 300, 1, 1692], counted=True) == (whole, counts)


def test_a_new_rate_starts_a_new_gap():
    async def go():
        audit = _audit(lambda rows: np.zeros(len(rows), int), _Sink(), rate=0.0, queue_rows=10**6)
        audit.observe(*_request(500, cheap=500), gear=0, attributes=None)
        assert audit.queued == 0
        audit.rate = 1.0
        audit.observe(*_request(5, cheap=3), gear=0, attributes=None)
        assert audit.queued == 3
        audit.rate = 0.0
        audit.observe(*_request(500, cheap=500), gear=0, attributes=None)
        assert audit.queued == 3
        await audit.close()

    asyncio.run(go())
    with pytest.raises(ValueError, match="audit_rate"):
        _audit(None, _Sink()).rate = 2


def test_the_worker_waits_for_a_full_batch_while_requests_are_in_flight(monkeypatch):
    """Under load a part batch waits (up to max_wait_s); an idle ingress audits it at once. The
    audit's clock is the test's: a stalled machine cannot make the part batch overdue early."""
    import serving.runtime.audit as audit_module

    calls: list[int] = []
    state = {"idle": False}
    clock = [1000.0]
    monkeypatch.setattr(audit_module, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], thread_time=time.thread_time, perf_counter=time.perf_counter))

    def full(rows):
        calls.append(len(rows))
        return np.zeros(len(rows), int)

    async def until(check) -> None:
        for _ in range(3000):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the audit's worker did not get there in 30 s")

    async def go():
        sink = _Sink()
        audit = _audit(full, sink, batch_rows=8, max_wait_s=0.3, idle=lambda: state["idle"])
        audit.observe(*_request(5, cheap=5), gear=0, attributes=None)
        await asyncio.sleep(0.1)
        assert calls == [] and audit.queued == 5  # busy ingress, part batch: waits
        audit.observe(*_request(5, cheap=5), gear=0, attributes=None)  # 10 >= 8: a batch is due
        await until(lambda: calls == [5])
        await asyncio.sleep(0.1)
        assert calls == [5] and audit.queued == 5  # whole requests only: the second waits
        clock[0] += 0.4
        await until(lambda: calls == [5, 5])  # waited max_wait_s
        audit.observe(*_request(3, cheap=3), gear=0, attributes=None)
        state["idle"] = True
        await until(lambda: calls == [5, 5, 3])  # idle: at once
        await audit.close()
        return sink

    sink = asyncio.run(go())
    assert sink.total("audited") == 13 and sink.total("shed") == 0


def test_a_failing_busy_check_sheds_and_a_worker_that_ended_starts_again():
    """A busy check that raises sheds its batch (counted, not lost); a worker that ended anyway
    is started again by the next sampled row, and its rows are audited."""
    state = {"raise": True}

    def busy() -> bool:
        if state.pop("raise", False):
            raise RuntimeError("busy check broke")
        return False

    async def go():
        sink = _Sink()
        audit = _audit(lambda rows: np.zeros(len(rows), int), sink, busy=busy)
        audit.observe(*_request(3, cheap=3), gear=0, attributes=None)
        await asyncio.sleep(0.1)
        audit._task.cancel()  # a worker that ended, whatever ended it
        with pytest.raises(asyncio.CancelledError):
            await audit._task
        audit.observe(*_request(2, cheap=2), gear=0, attributes=None)
        await asyncio.sleep(0.1)
        await audit.close()
        return sink

    sink = asyncio.run(go())
    assert sink.total("shed") == 3 and sink.total("audited") == 2


def test_closing_mid_call_sheds_the_rows_taken_and_a_cut_send_goes_again_under_its_id():
    """An app shut down while its audit waits on the full pipeline: the rows taken for the call
    are counted shed (every cheap row ends audited or shed, none lost); counts whose send was cut
    short by the close go once more under the same id."""
    started = asyncio.Event()

    async def full_classes(rows):
        started.set()
        await asyncio.sleep(3600)

    async def go():
        sink = _Sink()
        audit = LiveAudit(1.0, [1], full_classes, sink, lambda: False, flush_s=0.01)
        audit.observe(*_request(6, cheap=6), gear=0, attributes=None)
        await started.wait()
        await audit.close()
        return sink

    sink = asyncio.run(go())
    assert sink.total("cheap") == 6 == sink.total("shed") and sink.total("audited") == 0

    class _Cut(_Sink):  # the first send hangs until the close cancels it
        async def __call__(self, entries, batch_id=None):
            self.ids.append(batch_id)
            if len(self.ids) == 1:
                await asyncio.sleep(3600)
            self.entries.extend(entries)

    async def cut():
        sink = _Cut()
        audit = LiveAudit(1.0, [1], lambda rows: _classes(rows), sink, lambda: False, flush_s=0.01)
        audit.observe(*_request(4, cheap=4), gear=0, attributes=None)
        while not sink.ids:
            await asyncio.sleep(0.01)
        await audit.close()
        return sink

    async def _classes(rows):
        return np.zeros(len(rows), int)

    sink = asyncio.run(cut())
    assert len(sink.ids) == 2 and sink.ids[0] == sink.ids[1] and sink.total("cheap") == 4
    assert sink.total("audited") + sink.total("shed") == 4


def test_a_flush_under_steady_traffic_sends_at_most_twice_and_returns():
    """Requests keep counting while a send waits: a flush sends what failed before and what it
    found, then returns; what came meanwhile waits for the next flush (a flush that chased the
    counts never returned under traffic, and the worker never audited again)."""
    audit = None

    class _Busy(_Sink):
        async def __call__(self, entries, batch_id=None):
            self.ids.append(batch_id)
            audit.shadow(0, 4, 3, 0, None)  # a request counted while the send waits
            await asyncio.sleep(0.001)
            self.entries.extend(entries)

    async def go():
        nonlocal audit
        sink = _Busy()
        audit = LiveAudit(0.0, [1], None, sink, lambda: False, flush_s=3600.0)
        audit.shadow(0, 4, 3, 0, None)
        await asyncio.wait_for(audit.flush(), 30.0)
        first = len(sink.ids)
        await asyncio.wait_for(audit.flush(), 30.0)
        return sink, first

    sink, first = asyncio.run(go())
    assert first == 1 and len(sink.ids) == 2 and sink.total("served") == 8


def test_a_repeat_of_counts_whose_save_failed_is_answered_once_they_are_saved(tmp_path, monkeypatch):
    """The ledger added the counts but could not save them (a full disk): the sender hears an
    error and sends them again under their id. The repeat is a duplicate in memory, but it is
    answered only once the counts are on disk, so a restart after it loses nothing."""
    from drift import GuaranteeLedger

    entries = [{"gear": 0, "served": 100, "cheap": 90, "audited": 9, "disagreed": 1, "shed": 0,
                "segment": {"client": "a"}}]
    stage = _stage(tmp_path)
    save = GuaranteeLedger.save
    fails = [1]

    def flaky(self, path):
        if fails[0]:
            fails[0] -= 1
            raise OSError("no space left on device")
        save(self, path)

    monkeypatch.setattr(GuaranteeLedger, "save", flaky)
    with pytest.raises(OSError):
        asyncio.run(stage.audit(entries, "ingress-a:1"))
    assert asyncio.run(stage.audit(entries, "ingress-a:1")) == {"accepted": 0, "duplicate": 1}
    stage.monitor.close()
    again = _stage(tmp_path)
    assert again._query("guarantee", {})["result"]["gears"][0]["audited_rows"] == 9
    again.monitor.close()


def test_an_older_artifacts_map_is_read_with_its_gears_certification_rows():
    import types

    from serving.launch.graph import _calibration

    old = types.SimpleNamespace(calibration={"x": [0.5, 0.9], "y": [0.5, 0.9]}, cert_rows=4_000)
    assert _calibration(old)["rows"] == 4_000
    new = types.SimpleNamespace(calibration={"x": [0.5, 0.9], "y": [0.5, 0.9], "rows": 900}, cert_rows=4_000)
    assert _calibration(new)["rows"] == 900
    assert _calibration(types.SimpleNamespace(calibration=None, cert_rows=10)) is None
