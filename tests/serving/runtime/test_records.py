"""Serving records: built as plain columns per request, sent to the monitor in batches."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pandas as pd

from serving.runtime.records import RecordBuffer, build_records, record_columns

CONFIG = {"input_attributes": ["dest"], "buckets": {"distance": [500, 1000]},
          "request_attributes": ["region"], "features": ["distance", "dest"]}


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    distance = rng.uniform(0, 2000, n)
    distance[:4] = [np.nan, 500.0, 1000.0, 499.5][:n]
    return pd.DataFrame({"dest": rng.choice(["DEN", "ORD", None], n), "distance": distance})


def _columns(frame: pd.DataFrame, region: str | None = "eu", latency: float = 5.0) -> dict:
    n = len(frame)
    proba = np.column_stack([np.linspace(0, 1, n), 1 - np.linspace(0, 1, n)])
    return record_columns(frame, proba, np.arange(n) % 2, np.full(n, "r1", dtype=object), latency, 100.0,
                          "v1", {"region": region} if region else None, CONFIG)


def test_buckets_match_pandas_cut_and_nan_stays_missing():
    frame = _frame(50)
    records = build_records(frame, np.full((50, 2), 0.5), np.zeros(50, dtype=int), np.full(50, "r"), 1.0, 0.0,
                            "v1", None, CONFIG)
    expected = pd.cut(frame["distance"], bins=[-np.inf, 500, 1000, np.inf]).astype(str)
    assert records["distance_bucket"].isna().tolist() == expected.isna().tolist()
    present = expected.notna()
    assert records["distance_bucket"][present].tolist() == expected[present].tolist()
    assert records.loc[1, "distance_bucket"] == "(-inf, 500.0]" and records.loc[2, "distance_bucket"] == "(500.0, 1000.0]"


def test_record_columns_hold_every_configured_field():
    frame = _frame(10)
    cols = _columns(frame, region=None)
    assert set(cols) == {"timestamp", "model_version", "replica", "level", "dest", "distance_bucket", "region",
                         "latency_ms", "confidence", "score", "error", "distance", "request_id", "request_row",
                         "served_class"}
    assert all(len(v) == 10 for v in cols.values())
    # what a label fed back joins on: the row's index in its request and the class it was served
    assert cols["request_row"].tolist() == list(range(10))
    assert cols["served_class"].tolist() == (np.linspace(0, 1, 10) < 0.5).astype(int).tolist()
    assert all(v is None for v in cols["request_id"])  # no id given: each row stands alone
    with_id = record_columns(frame, np.full((10, 2), 0.5), np.zeros(10, dtype=int), np.full(10, "r"), 1.0,
                             0.0, "v1", None, CONFIG, request_id="abc")
    assert (with_id["request_id"] == "abc").all()  # one request's rows share its id
    assert (cols["region"] == "<none>").all() and (cols["level"] == np.array(["0", "1"] * 5)).all()
    np.testing.assert_allclose(cols["confidence"], np.maximum(np.linspace(0, 1, 10), 1 - np.linspace(0, 1, 10)))
    missing = frame["dest"].isna().to_numpy()
    assert missing.any() and pd.isna(cols["dest"][missing]).all()  # a missing input stays missing


class _Monitor:
    def __init__(self):
        self.batches: list[pd.DataFrame] = []

        class _Ingest:
            async def remote(_, batch, batch_id=None):
                self.batches.append(batch)
                return len(batch)

        self.ingest = _Ingest()


def test_buffer_sends_one_frame_per_flush_in_arrival_order():
    monitor = _Monitor()

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=25, flush_delay_s=0.05)
        for i in range(3):  # 30 rows: the third request forces a send
            buffer.add(_columns(_frame(10, seed=i), latency=float(i)))
        await asyncio.sleep(0.01)
        buffer.add(_columns(_frame(5, seed=9), latency=9.0))
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert [len(b) for b in monitor.batches] == [30, 5] and buffer.sent == 35 and buffer.dropped == 0
    first = monitor.batches[0]
    assert first["latency_ms"].tolist() == [0.0] * 10 + [1.0] * 10 + [2.0] * 10
    assert list(first.columns) == list(_columns(_frame(2)).keys())


class _StuckMonitor:
    """A monitor whose ingest never answers (until cancelled)."""

    def __init__(self):
        self.cancelled = 0

        class _Ingest:
            def remote(_, batch, batch_id=None):
                return _Stuck(self)

        self.ingest = _Ingest()


class _Stuck:
    def __init__(self, owner):
        self.owner = owner

    def __await__(self):
        return asyncio.sleep(3600).__await__()

    def cancel(self):
        self.owner.cancelled += 1


def test_buffer_is_bounded_and_counts_what_it_drops():
    """A monitor that never answers: the unsent batch is kept and tried again (each try
    cancelled at its timeout), new records wait behind it within max_rows and the rest are
    dropped and counted; what close() still cannot send is counted too."""
    monitor = _StuckMonitor()
    drops: dict[str, int] = {}

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=10, flush_delay_s=10.0, max_rows=30, send_timeout_s=0.05,
                              retry_first_s=0.05, retry_max_s=0.1,
                              on_drop=lambda reason, n: drops.__setitem__(reason, drops.get(reason, 0) + n))
        accepted = [buffer.add(_columns(_frame(10, seed=i))) for i in range(5)]
        assert accepted == [True, True, True, False, False]
        for _ in range(3000):  # tries time out: the batch stays, the buffer does not free
            if buffer.retried >= 30:
                break
            await asyncio.sleep(0.01)
        assert buffer.unsent_rows == 30 and buffer.retried >= 30
        assert not buffer.add(_columns(_frame(10, seed=9)))
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert buffer.rows == 0 and buffer.unsent_rows == 0 and buffer.sent == 0
    assert buffer.dropped == 60 == sum(drops.values())
    assert drops == {"buffer_full": 30, "send_failed": 30}
    assert monitor.cancelled >= 3  # a timed-out send is cancelled, not left running


class _AwayMonitor:
    """The real monitor replica (MonitorStage) behind a transport that fails its first sends:
    ``lost_answers`` of them reach the monitor but their answer never comes back (the send times
    out), then ``refused`` fail outright (no replica), then every send answers."""

    def __init__(self, lost_answers: int, refused: int):
        from serving.runtime.replicas import MonitorStage

        self.stage = MonitorStage.func_or_class({"attributes": ["region", "dest"], "metrics": ["latency_ms"]})
        self.calls: list[str] = []
        owner = self

        class _Ingest:
            async def remote(_, batch, batch_id=None):
                owner.calls.append(batch_id)
                if len(owner.calls) <= lost_answers:
                    await owner.stage.ingest(batch, batch_id)
                    await asyncio.sleep(3600)  # the answer is lost: the sender's timeout fires
                if len(owner.calls) <= lost_answers + refused:
                    raise ConnectionError("no running replica of the monitor")
                return await owner.stage.ingest(batch, batch_id)

        self.ingest = _Ingest()


def test_a_monitor_away_for_a_while_gets_every_record_once():
    """The monitor replica is replaced: sends time out after they arrived, then fail; the buffer
    keeps the batch, tries again with a growing wait, and the monitor skips the copies it
    already had (batch ids), so every record arrives exactly once and none is dropped."""
    monitor = _AwayMonitor(lost_answers=2, refused=3)
    retried: list[int] = []

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=20, flush_delay_s=0.01, send_timeout_s=0.05,
                              retry_first_s=0.01, retry_max_s=0.04, sender="ingress-a", on_retry=retried.append)
        for i in range(12):
            assert buffer.add(_columns(_frame(10, seed=i), latency=float(i)))
            await asyncio.sleep(0.02)
        for _ in range(200):  # the retries run out by themselves, without a close
            if buffer.unsent_rows == buffer.rows == 0:
                break
            await asyncio.sleep(0.02)
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert buffer.dropped == 0 and buffer.sent == 120 and sum(retried) == buffer.retried > 0
    assert monitor.stage.ingested == 120  # the two copies that arrived before their answer counted once
    # every call that reached the monitor after its batch's first is a skipped copy: the two lost
    # answers, and any send that outlived its 50 ms while the machine was busy (then sent again)
    reached = len(monitor.calls) - 3  # the three refused never reached it
    assert monitor.stage.monitor.stats()["duplicate_batches"] == reached - len(set(monitor.calls)) >= 2
    first_id = monitor.calls[0]
    assert first_id.startswith("ingress-a:") and monitor.calls[:6] == [first_id] * 6  # one batch, tried 6 times


def test_a_close_cut_short_counts_what_it_could_not_send_and_leaves_no_task():
    """The ingress gives close() a bounded time; cut short while a send hangs, every record is
    still counted (dropped) and no retry of the buffer outlives it."""
    monitor = _StuckMonitor()

    async def run() -> tuple[RecordBuffer, int]:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=10, flush_delay_s=60.0, send_timeout_s=30.0)
        buffer.add(_columns(_frame(10)))  # a send starts and hangs
        buffer.add(_columns(_frame(3, seed=2)))
        await asyncio.sleep(0.01)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(buffer.close(), 0.05)
        await asyncio.sleep(0.01)
        return buffer, sum(not t.done() for t in buffer._tasks)

    buffer, alive = asyncio.run(run())
    assert alive == 0 and buffer.dropped == 13 and buffer.sent == 0


def test_a_batch_the_monitor_fails_on_every_time_is_dropped_not_retried_forever():
    """An error the monitor raises on one batch (not its absence) is tried MAX_FAILED_TRIES
    times, then that batch is counted as dropped and the records behind it go on."""
    from serving.runtime.records import MAX_FAILED_TRIES

    tried: list[str] = []
    delivered: list[int] = []

    class _Ingest:
        async def remote(_, batch, batch_id=None):
            tried.append(batch_id)
            if batch_id.endswith(":0"):
                raise ValueError("the monitor cannot take this batch")
            delivered.append(len(batch))
            return {"rejected": 0}

    monitor = type("M", (), {"ingest": _Ingest()})()
    drops: dict[str, int] = {}

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=10, flush_delay_s=0.01, retry_first_s=0.01,
                              retry_max_s=0.02, sender="s",
                              on_drop=lambda reason, n: drops.__setitem__(reason, drops.get(reason, 0) + n))
        buffer.add(_columns(_frame(10)))
        await asyncio.sleep(0.2)
        buffer.add(_columns(_frame(7, seed=1)))
        await asyncio.sleep(0.1)
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert tried.count("s:0") == MAX_FAILED_TRIES and drops == {"send_failed": 10}
    assert delivered == [7] and buffer.sent == 7


def test_a_batch_with_a_refused_row_sent_twice_is_ingested_once():
    """A batch the monitor refuses is halved down to its bad rows, then its id is recorded
    alone: a copy is skipped whole, and the pieces add no ids (4,000 rows with every third one
    bad would have added 2,016, pushing other senders' ids out of the 1,024 remembered)."""
    from serving.runtime.replicas import MonitorStage, ingest_row_by_row_on_error

    stage = MonitorStage.func_or_class({"attributes": ["region"], "metrics": ["latency_ms"]})
    frame = pd.DataFrame({"region": ["eu", "us"] * 50, "latency_ms": [float(i) for i in range(100)]})
    frame["latency_ms"] = frame["latency_ms"].astype(object)
    frame.loc[37, "latency_ms"] = "oops"
    kept, rejected, _, duplicate = ingest_row_by_row_on_error(stage.monitor, frame, "s:0")
    assert (kept, rejected, duplicate) == (99, 1, False)
    kept, rejected, _, duplicate = ingest_row_by_row_on_error(stage.monitor, frame, "s:0")
    assert (kept, rejected) == (0, 0) and duplicate
    assert stage.monitor.stats()["rows_ingested"] == 99 and stage.monitor.stats()["duplicate_batches"] == 1
    many_bad = pd.DataFrame({"region": ["eu"] * 300, "latency_ms": [float(i) for i in range(300)]}).astype(object)
    many_bad.loc[::3, "latency_ms"] = "oops"
    stage.monitor.ingest(frame.iloc[:1].astype({"latency_ms": float}), batch_id="other:0")
    kept, rejected, _, _ = ingest_row_by_row_on_error(stage.monitor, many_bad, "s:1")
    assert (kept, rejected) == (200, 100)
    assert stage.monitor.ingest(frame.iloc[:1].astype({"latency_ms": float}), batch_id="other:0").duplicate
    assert ingest_row_by_row_on_error(stage.monitor, many_bad, "s:1")[:2] == (0, 0)


class _SlowMonitor:
    """A monitor whose ingest answers after ``delay_s``."""

    def __init__(self, delay_s: float):
        self.batches: list[pd.DataFrame] = []

        class _Ingest:
            async def remote(_, batch, batch_id=None):
                await asyncio.sleep(delay_s)
                self.batches.append(batch)
                return len(batch)

        self.ingest = _Ingest()


def test_a_client_deadline_never_cancels_the_flush_before_a_query():
    """GET /explain with X-Deadline-Ms: 1 waits on the flush through asyncio.shield: the query
    gives up, the send goes on, and every record arrives (none lost, none uncounted)."""
    monitor = _SlowMonitor(0.2)

    async def run() -> tuple[RecordBuffer, bool]:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=1000, flush_delay_s=60.0)
        buffer.add(_columns(_frame(7)))
        gave_up = False
        try:
            await asyncio.wait_for(asyncio.shield(buffer.flush_soon()), 0.001)
        except asyncio.TimeoutError:
            gave_up = True
        await buffer.close()
        return buffer, gave_up

    buffer, gave_up = asyncio.run(run())
    assert gave_up and buffer.sent == 7 and buffer.dropped == 0 and [len(b) for b in monitor.batches] == [7]


def test_records_that_come_during_a_send_wait_for_their_timer():
    """Under steady load the buffer sends a batch per flush_rows or per flush_delay_s, not one
    send after another of whatever came during the last (each send costs the monitor a call)."""
    monitor = _SlowMonitor(0.05)

    async def run() -> tuple[RecordBuffer, int]:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=25, flush_delay_s=60.0)
        for i in range(3):
            buffer.add(_columns(_frame(10, seed=i)))  # 30 rows: a send starts
        await asyncio.sleep(0.01)
        buffer.add(_columns(_frame(5, seed=9)))  # during the send
        while not monitor.batches:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        waiting = buffer.rows
        await buffer.close()  # sends what waits
        return buffer, waiting

    buffer, waiting = asyncio.run(run())
    assert waiting == 5 and [len(b) for b in monitor.batches] == [30, 5] and buffer.sent == 35


def test_a_cancelled_send_keeps_its_records_for_the_next_try():
    """A send cancelled half done may or may not have arrived: its batch is kept and sent
    again (its id makes a second arrival harmless), not dropped."""
    monitor = _SlowMonitor(0.2)

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, CONFIG, flush_rows=1000, flush_delay_s=60.0, retry_first_s=0.01)
        buffer.add(_columns(_frame(4)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(buffer.flush(), 0.01)  # not shielded: the send is cancelled
        assert buffer.unsent_rows == 4
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert buffer.dropped == 0 and buffer.sent == 4 and buffer.retried == 4
    assert [len(b) for b in monitor.batches] == [4]


def test_a_row_the_monitor_refuses_is_rejected_alone_and_counted():
    """One malformed value used to make the monitor refuse its whole batch (every record lost,
    counted as a failed send); now the batch is halved down to the bad row: the others are
    ingested and the one is counted as dropped, reason "rejected"."""
    from serving.runtime.replicas import MonitorStage, ingest_row_by_row_on_error

    stage = MonitorStage.func_or_class({"attributes": ["region"], "metrics": ["latency_ms"]})

    class _Ingest:
        async def remote(_, batch, batch_id=None):
            return await stage.ingest(batch, batch_id)

    monitor = type("M", (), {"ingest": _Ingest()})()
    drops: dict[str, int] = {}
    frame = pd.DataFrame({"region": ["eu", "us"] * 50, "latency_ms": [float(i) for i in range(100)]})
    frame["latency_ms"] = frame["latency_ms"].astype(object)
    frame.loc[37, "latency_ms"] = "oops"  # a malformed value in a monitored numeric column

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(monitor, {}, flush_rows=1000, flush_delay_s=10.0,
                              on_drop=lambda reason, n: drops.__setitem__(reason, drops.get(reason, 0) + n))
        buffer.parts, buffer.rows = [{k: frame[k].to_numpy() for k in frame}], len(frame)
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert drops == {"rejected": 1} and buffer.sent == 99 and stage.ingested == 99
    kept, rejected, why, duplicate = ingest_row_by_row_on_error(stage.monitor, frame.iloc[30:40])
    assert (kept, rejected, duplicate) == (9, 1, False) and "latency_ms" in why


def test_a_monitor_replica_of_the_previous_code_gets_every_record():
    """During a rolling update across code versions a new ingress may send to a monitor replica
    whose ingest takes no batch id: the batch goes again without it, not retried until dropped."""
    batches: list[pd.DataFrame] = []

    class _Ingest:
        async def remote(_, batch):  # the previous code's signature
            batches.append(batch)
            return {"ingested": len(batch)}

    class _Old:
        ingest = _Ingest()

    async def run() -> RecordBuffer:
        buffer = RecordBuffer(_Old(), CONFIG, flush_rows=10, flush_delay_s=0.01)
        buffer.add(_columns(_frame(10)))
        await buffer.close()
        return buffer

    buffer = asyncio.run(run())
    assert buffer.sent == 10 and buffer.dropped == 0 and [len(b) for b in batches] == [10]


class _HeldMonitor:
    """A monitor whose first ingest blocks until released, counting calls that run at once."""

    def __init__(self, monitor):
        import threading

        self.monitor, self.release, self.entered = monitor, threading.Event(), threading.Event()
        self.running = self.most_at_once = 0

    def ingest(self, records, batch_id=None):
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if not self.entered.is_set():
                self.entered.set()
                assert self.release.wait(10.0)
            return self.monitor.ingest(records, batch_id=batch_id)
        finally:
            self.running -= 1

    def __getattr__(self, name):
        return getattr(self.monitor, name)


def test_a_cancelled_ingest_keeps_the_lock_and_its_count():
    """The sender's deadline cancels an ingest whose thread is already inside the monitor: the
    call still finishes alone (the next waits for it) and its rows are counted, so the sender's
    retry, skipped as a duplicate, loses nothing from the count."""
    from serving.runtime.replicas import MonitorStage

    stage = MonitorStage.func_or_class({"attributes": ["region", "dest"], "metrics": ["latency_ms"]})
    slow = stage.monitor = _HeldMonitor(stage.monitor)
    batches = [pd.DataFrame(_columns(_frame(10, seed=i), latency=float(i))) for i in range(2)]

    async def run() -> list[dict]:
        first = asyncio.ensure_future(stage.ingest(batches[0], "b0"))
        while not slow.entered.is_set():
            await asyncio.sleep(0.005)
        first.cancel()  # the sender gave up while the monitor held the batch
        with contextlib.suppress(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(stage.ingest(batches[1], "b1"))
        await asyncio.sleep(0.05)
        assert not second.done()  # it waits for the cancelled call's thread
        slow.release.set()
        answers = [await second, await stage.ingest(batches[0], "b0")]  # the retry of the first
        return answers

    second, retry = asyncio.run(run())
    assert slow.most_at_once == 1
    assert second["ingested"] == 20 and retry == {"ingested": 20, "rejected": 0, "error": None, "duplicate": 10}
    assert stage.ingested == 20 == stage.monitor.stats()["rows_ingested"]


def test_a_monitor_call_cancelled_while_it_waits_its_turn_never_runs():
    """Calls queue for the monitor one at a time; a caller gone before its turn (a scrape or a
    query past its deadline, a sender that will try again) must not leave work queued behind a
    slow call: it never runs."""
    from serving.runtime.replicas import MonitorStage

    stage = MonitorStage.func_or_class({"attributes": ["region", "dest"], "metrics": ["latency_ms"]})
    held = stage.monitor = _HeldMonitor(stage.monitor)
    batches = [pd.DataFrame(_columns(_frame(10, seed=i), latency=float(i))) for i in range(2)]

    async def run() -> None:
        first = asyncio.ensure_future(stage.ingest(batches[0], "b0"))
        while not held.entered.is_set():
            await asyncio.sleep(0.005)
        gone = asyncio.ensure_future(stage.ingest(batches[1], "b1"))
        await asyncio.sleep(0.02)
        gone.cancel()  # still waiting for the lock
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        held.release.set()
        await first
        await stage.flush()  # the lock's next holder: anything queued before it has run

    asyncio.run(run())
    assert stage.ingested == 10 == stage.monitor.stats()["rows_ingested"]
