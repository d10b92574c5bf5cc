"""Serving records for the monitor: one per served row, sent in batches off the request path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import numpy as np
import pandas as pd

#: records buffered in the ingress before a send is forced
FLUSH_ROWS = 2000
#: longest a record waits in the ingress buffer (seconds)
FLUSH_DELAY_S = 0.5

log = logging.getLogger("serving.records")


def build_records(
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
) -> pd.DataFrame:
    """A record per row: attributes (version, replica, level, configured inputs, bucketed
    numeric inputs, client attributes), metrics (latency, confidence, score, error) and the
    configured input features."""
    n = len(frame)
    records = pd.DataFrame({
        "timestamp": np.full(n, timestamp),
        "model_version": np.full(n, model_version, dtype=object),
        "replica": replica.astype(str),
        "level": level.astype(str),
    })
    for column in config.get("input_attributes", ()):
        records[column] = frame[column].astype(str).to_numpy()
    for column, edges in (config.get("buckets") or {}).items():
        binned = pd.cut(frame[column].astype(float), bins=[-np.inf, *edges, np.inf])
        records[f"{column}_bucket"] = binned.astype(str).to_numpy()
    for key in config.get("request_attributes", ()):
        value = (request_attributes or {}).get(key)
        records[key] = "<none>" if value is None else str(value)
    records["latency_ms"] = float(latency_ms)
    records["confidence"] = proba.max(axis=1) if proba.size else np.zeros(n)
    records["score"] = proba[:, -1] if proba.size else np.zeros(n)
    records["error"] = 1.0 if error else 0.0
    for column in config.get("features", ()):
        values = frame[column]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        records[column] = values.to_numpy(dtype=float) if numeric else values.astype(str).to_numpy()
    return records


class RecordBuffer:
    """Collects records in the ingress and sends them to the monitor in the background."""

    def __init__(self, monitor: Any, config: dict[str, Any], *, flush_rows: int = FLUSH_ROWS,
                 flush_delay_s: float = FLUSH_DELAY_S):
        self.monitor = monitor
        self.config = config
        self.flush_rows = flush_rows
        self.flush_delay_s = flush_delay_s
        self.parts: list[pd.DataFrame] = []
        self.rows = 0
        self.sent = 0
        self.failed = 0
        self._timer: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def add(self, records: pd.DataFrame) -> None:
        self.parts.append(records)
        self.rows += len(records)
        if self.rows >= self.flush_rows:
            asyncio.get_running_loop().create_task(self.flush())
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(self.flush_delay_s)
        await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            if not self.parts:
                return
            batch = pd.concat(self.parts, ignore_index=True)
            self.parts, self.rows = [], 0
            try:
                await self.monitor.ingest.remote(batch)
                self.sent += len(batch)
            except Exception as exc:
                self.failed += len(batch)
                log.warning("monitor ingest failed for %d records: %s", len(batch), exc)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        await self.flush()
