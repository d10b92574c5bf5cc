"""Serving records for the monitor: one per served row, sent in batches off the request path."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import numpy as np
import pandas as pd

#: records buffered in the ingress before a send is forced
FLUSH_ROWS = 2000
#: longest a record waits in the ingress buffer (seconds)
FLUSH_DELAY_S = 0.5

log = logging.getLogger("serving.records")


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
) -> dict[str, np.ndarray]:
    """A record per row, as columns: attributes (version, replica, level, configured inputs,
    bucketed numeric inputs, client attributes), metrics (latency, confidence, score, error)
    and the configured input features. Plain arrays, not a DataFrame: this runs on every
    request, and building a DataFrame column by column cost more than the optimized
    pipeline itself (1.5 ms for 32 rows)."""
    n = len(frame)
    columns: dict[str, np.ndarray] = {
        "timestamp": np.full(n, timestamp, dtype=float),
        "model_version": np.full(n, model_version, dtype=object),
        "replica": np.asarray(replica).astype(str).astype(object),
        "level": np.asarray(level).astype(str).astype(object),
    }
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

    def add(self, records: dict[str, np.ndarray]) -> None:
        """Queue one request's records (:func:`record_columns`); a send follows in the background."""
        self.parts.append(records)
        self.rows += len(next(iter(records.values()), ()))
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
            parts, self.parts, self.rows = self.parts, [], 0
            batch = pd.DataFrame({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})
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
