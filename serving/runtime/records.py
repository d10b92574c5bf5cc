"""Serving records for the monitor: one per served row, sent in batches off the request path."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from serving.runtime.calls import DeadlineExceeded, first_accepted, wait_or_cancel

#: the record column holding the request id (drift.Monitor's request_column)
REQUEST_COLUMN = "request_id"
#: the row's index in its request, and the class index it was served (labels join on them)
ROW_COLUMN, SERVED_CLASS_COLUMN = "request_row", "served_class"
#: the ``gear`` recorded for rows the full pipeline answered (a gear held by the live audit's
#: alarm, serving.runtime.hold): apart from the gear's own answers, so that its labelled accuracy
#: (drift.LabelJoin) is not made of full-pipeline answers while its guarantee is in question
FULL_PIPELINE_GEAR = -1
#: records buffered in the ingress before a send is forced
FLUSH_ROWS = 2000
#: longest a record waits in the ingress buffer (seconds)
FLUSH_DELAY_S = 0.5
#: most records buffered in the ingress; more are dropped (and counted) until a send frees room
MAX_BUFFERED_ROWS = 50_000
#: longest one send to the monitor may take (seconds) before it is tried again
SEND_TIMEOUT_S = 10.0
#: tries of a batch whose send failed for another reason than an unreachable or silent monitor
#: (an error the monitor raises on that batch every time) before it is dropped and counted
MAX_FAILED_TRIES = 3
#: longest one send may take while the ingress closes (under the 10 s a closing ingress gets)
CLOSE_SEND_TIMEOUT_S = 3.0
#: first wait (seconds) before a send that failed or never answered is tried again; it doubles
#: with each failure up to RETRY_MAX_S (a monitor replica being replaced answers again within
#: seconds to a minute)
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0

log = logging.getLogger("serving.runtime.records")


def record_columns(
    frame: pd.DataFrame,
    proba: np.ndarray,
    level: np.ndarray,
    replica: np.ndarray,
    latency_ms: float,
    timestamp: float,
    model_version: str,
    request_attributes: dict[str, Any] | None,
    config: dict[str, Any],
    error: bool = False,
    gear: int | None = None,
    request_id: str | None = None,
) -> dict[str, np.ndarray]:
    """A record per row, as columns: attributes (version, replica, level, gear, configured inputs,
    bucketed numeric inputs, client attributes), metrics (latency, confidence, score, error),
    the configured input features and the request id (``request_id``: the monitor counts
    requests, not rows, in its intervals and tests; None: each row stands alone). Plain arrays, not a DataFrame: this runs on every
    request, and building a DataFrame column by column cost more than the optimized
    pipeline itself (1.5 ms for 32 rows)."""
    n = len(frame)
    columns: dict[str, np.ndarray] = {
        "timestamp": np.full(n, timestamp, dtype=float),
        "model_version": np.full(n, model_version, dtype=object),
        "replica": np.asarray(replica).astype(str).astype(object),
        "level": np.asarray(level).astype(str).astype(object),
        REQUEST_COLUMN: np.full(n, request_id, dtype=object),
        # what a label fed back later joins on (drift.LabelJoin): the row's index in its request
        # and the class it was served
        ROW_COLUMN: np.arange(n, dtype=np.int64),
        SERVED_CLASS_COLUMN: proba.argmax(axis=1) if proba.size else np.zeros(n, dtype=np.int64),
    }
    if gear is not None:  # the certified gear that answered (serving.runtime.gears): an attribute to explain by
        columns["gear"] = np.full(n, str(gear), dtype=object)
    for column in config.get("input_attributes", ()):
        columns[column] = frame[column].astype(str).to_numpy(dtype=object)
    for column, edges in (config.get("buckets") or {}).items():
        columns[f"{column}_bucket"] = bucket_labels(frame[column].to_numpy(dtype=float), edges)
    for key in config.get("request_attributes", ()):
        value = (request_attributes or {}).get(key)
        columns[key] = np.full(n, "<none>" if value is None else str(value), dtype=object)
    columns["latency_ms"] = np.full(n, float(latency_ms))
    columns["confidence"] = proba.max(axis=1) if proba.size else np.zeros(n)
    columns["score"] = proba[:, -1].astype(float) if proba.size else np.zeros(n)
    columns["error"] = np.full(n, 1.0 if error else 0.0)
    for column in config.get("features", ()):
        values = frame[column]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        columns[column] = values.to_numpy(dtype=float) if numeric else values.astype(str).to_numpy(dtype=object)
    return columns


def bucket_labels(values: np.ndarray, edges: Any) -> np.ndarray:
    """The interval each value falls in, labelled as ``pd.cut`` labels right-closed bins
    ("(-inf, 500.0]", ...); NaN stays missing (None)."""
    edges = [float(e) for e in edges]
    labels = np.asarray([*_interval_labels(tuple(edges)), None], dtype=object)
    index = np.searchsorted(np.asarray(edges), values, side="left")
    index[np.isnan(values)] = len(labels) - 1
    return labels[index]


@functools.lru_cache(maxsize=64)
def _interval_labels(edges: tuple[float, ...]) -> list[str]:
    return [str(c) for c in pd.cut([], bins=[-np.inf, *edges, np.inf]).categories]


def build_records(*args: Any, **kwargs: Any) -> pd.DataFrame:
    """:func:`record_columns` as a DataFrame, the shape ``drift.Monitor.ingest`` takes."""
    return pd.DataFrame(record_columns(*args, **kwargs))


class RecordBuffer:
    """Collects records in the ingress and sends them to the monitor in the background.

    Bounded: at most ``max_rows`` records wait; records arriving while the buffer is full are
    dropped and counted (``dropped``, and ``on_drop(reason, n)`` for /metrics), so a slow or
    dead monitor costs records, never the ingress's memory or latency. One send at a time,
    each bounded by ``send_timeout_s``.

    Nothing is lost to a monitor that is away for a while (its replica replaced, restarting,
    or too slow to answer within the timeout): a send that fails or never answers keeps its
    batch, which is sent again after ``retry_first_s``, doubling up to ``retry_max_s``, while
    new records wait behind it within ``max_rows``. Whether such a batch arrived cannot be
    told from here, so each batch carries an id (``sender`` and a sequence number) and the
    monitor skips an id it has already ingested (drift.Monitor.ingest's ``batch_id``): sent
    twice, ingested once. Every background task is kept (none is fire-and-forget) and
    :meth:`close` sends what is left, so a graceful shutdown loses nothing a reachable
    monitor can take; what it cannot is counted as dropped (``send_failed``).
    """

    def __init__(self, monitor: Any, config: dict[str, Any], *, flush_rows: int = FLUSH_ROWS,
                 flush_delay_s: float = FLUSH_DELAY_S, max_rows: int = MAX_BUFFERED_ROWS,
                 send_timeout_s: float = SEND_TIMEOUT_S, retry_first_s: float = RETRY_FIRST_S,
                 retry_max_s: float = RETRY_MAX_S, sender: str | None = None,
                 on_drop: Callable[[str, int], None] | None = None,
                 on_sent: Callable[[int], None] | None = None,
                 on_retry: Callable[[int], None] | None = None):
        if max_rows < flush_rows:
            raise ValueError(f"max_rows ({max_rows}) must be >= flush_rows ({flush_rows})")
        if not 0 < retry_first_s <= retry_max_s:
            raise ValueError(f"retry_first_s ({retry_first_s!r}) must be > 0 and <= retry_max_s ({retry_max_s!r})")
        self.monitor = monitor
        self.config = config
        self.flush_rows = flush_rows
        self.flush_delay_s = flush_delay_s
        self.max_rows = max_rows
        self.send_timeout_s = send_timeout_s
        self.retry_first_s, self.retry_max_s = retry_first_s, retry_max_s
        #: this buffer's part of every batch id: unique per ingress replica and start
        self.sender = sender or uuid.uuid4().hex[:16]
        self.on_drop = on_drop
        self.on_sent = on_sent
        self.on_retry = on_retry
        self.parts: list[dict[str, np.ndarray]] = []
        self.rows = 0
        self.sent = 0
        self.dropped = 0
        #: records sent again after a send that failed or never answered
        self.retried = 0
        self._seq = 0
        #: the batch a send has not delivered yet, with its id; it goes before any new record
        self._unsent: tuple[pd.DataFrame, str] | None = None
        self._tries = 0  # sends of the unsent batch so far
        self._failed = 0  # of them, those that failed with an error that is not the monitor's absence
        self._wait_s = 0.0  # the wait before the next try of the unsent batch (0: none failed)
        self._retry: asyncio.Task | None = None
        self._timer: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()

    @property
    def unsent_rows(self) -> int:
        """Records of a batch sent but not delivered, waiting for its next try."""
        return 0 if self._unsent is None else len(self._unsent[0])

    def add(self, records: dict[str, np.ndarray]) -> bool:
        """Queue one request's records (:func:`record_columns`); False when dropped (buffer full)."""
        n = len(next(iter(records.values()), ()))
        if self.rows + self.unsent_rows + n > self.max_rows:
            self._drop("buffer_full", n)
            return False
        self.parts.append(records)
        self.rows += n
        if self._unsent is not None:  # the retry sends these behind the unsent batch
            return True
        if self.rows >= self.flush_rows:
            self._spawn(self.flush())
        elif self._timer is None or self._timer.done():
            self._timer = self._spawn(self._later())
        return True

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _drop(self, reason: str, n: int) -> None:
        self.dropped += n
        if self.on_drop is not None:
            self.on_drop(reason, n)

    async def _later(self) -> None:
        await asyncio.sleep(self.flush_delay_s)
        self._timer = None  # records that come during this flush get a timer of their own
        await self.flush()

    async def _try_again(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        self._retry = None  # a try that fails from here schedules the next one
        await self.flush()

    def flush_soon(self) -> asyncio.Task:
        """A flush of everything buffered that runs to its end whoever waits on it: a caller with
        a deadline (a monitor query sends what is buffered first) waits on ``asyncio.shield`` of
        this task, so a client's short deadline never cancels a send half done."""
        return self._spawn(self.flush(everything=True))

    async def flush(self, everything: bool = False) -> None:
        """Send the unsent batch, if any, then what is buffered; records that come meanwhile go
        on at once only if they fill a batch (``flush_rows``) or ``everything`` is asked (a
        close); stops at the first send that fails (its batch is kept and tried again later)."""
        async with self._lock:
            while True:
                if self._unsent is None:
                    if not self.parts:
                        return
                    parts, self.parts, self.rows = self.parts, [], 0
                    batch = pd.DataFrame({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})
                    self._unsent, self._tries, self._failed = (batch, f"{self.sender}:{self._seq}"), 0, 0
                    self._seq += 1
                elif self._tries:
                    self.retried += len(self._unsent[0])
                    if self.on_retry is not None:
                        self.on_retry(len(self._unsent[0]))
                self._tries += 1
                try:
                    delivered = await self._send(*self._unsent)
                except asyncio.CancelledError:  # kept: tried again later (or at close)
                    self._try_later()
                    raise
                if not delivered:
                    if self._failed >= MAX_FAILED_TRIES:  # not the monitor's absence: this batch fails
                        self._drop("send_failed", len(self._unsent[0]))
                        self._unsent, self._wait_s = None, 0.0
                        continue
                    self._try_later()
                    return
                self._unsent, self._wait_s = None, 0.0
                if not everything and self.rows < self.flush_rows:  # what came meanwhile waits for its timer
                    if self.parts and (self._timer is None or self._timer.done()):
                        self._timer = self._spawn(self._later())
                    return

    def _try_later(self) -> None:
        """The next try of the unsent batch, after a wait that doubles with each failure."""
        self._wait_s = min(max(2 * self._wait_s, self.retry_first_s), self.retry_max_s)
        if self._retry is None or self._retry.done():
            self._retry = self._spawn(self._try_again(self._wait_s))

    async def _send(self, batch: pd.DataFrame, batch_id: str) -> bool:
        """One send of a batch; True when the monitor answered (delivered, or already had it)."""
        try:  # a monitor replica of earlier code (a rolling update) takes no batch id
            answer = await first_accepted(
                lambda args: wait_or_cancel(self.monitor.ingest.remote(*args), self.send_timeout_s, "monitor",
                                            self.send_timeout_s), ((batch, batch_id), (batch,)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not _monitor_away(exc):
                self._failed += 1
            if not self._wait_s:  # the first failure of an outage; the retries are counted, not logged
                log.warning("monitor ingest failed for %d records (kept, sent again): %s", len(batch),
                            exc or type(exc).__name__)
            return False
        # rows the monitor refused one by one are counted as dropped, by reason
        rejected = int(answer.get("rejected", 0)) if isinstance(answer, dict) else 0
        duplicate = int(answer.get("duplicate", 0)) if isinstance(answer, dict) else 0
        if rejected:
            self._drop("rejected", rejected)
            log.warning("the monitor rejected %d of %d records: %s", rejected, len(batch), answer.get("error"))
        delivered = len(batch) - rejected  # a duplicate was delivered by an earlier try
        self.sent += delivered
        if self.on_sent is not None and delivered:
            self.on_sent(delivered)
        if duplicate:
            log.info("the monitor already had %d of %d records (an earlier try arrived)", duplicate, len(batch))
        return True

    async def close(self) -> None:
        """Send everything buffered, the unsent batch first, each with one more try whatever
        the wait (each send at most CLOSE_SEND_TIMEOUT_S); waits for sends already under way.
        What still cannot be sent is counted as dropped (``send_failed``): a closing ingress
        cannot wait for the monitor forever. No task of the buffer outlives it."""
        for timer in (self._timer, self._retry):
            if timer is not None:
                timer.cancel()
        self.send_timeout_s = min(self.send_timeout_s, CLOSE_SEND_TIMEOUT_S)
        try:
            pending = [t for t in self._tasks if t not in (self._timer, self._retry)]
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            self._wait_s, self._failed = 0.0, 0
            await self.flush(everything=True)
        finally:
            current = asyncio.current_task()
            for task in list(self._tasks):
                if task is not current:
                    task.cancel()
            lost = self.unsent_rows + self.rows
            if lost:
                self._unsent, self.parts, self.rows = None, [], 0
                self._drop("send_failed", lost)


def _monitor_away(exc: BaseException) -> bool:
    """The send failed because no monitor answered in time or its replica is gone (try again),
    not because the monitor raised on the batch."""
    if isinstance(exc, (DeadlineExceeded, asyncio.TimeoutError, ConnectionError)):
        return True
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover - the ingress always runs with Ray
        return False
    return isinstance(exc, RayActorError)
