"""`Monitor`: a thin facade over the monitor's parts.

Why this shape: each part has one job and is tested alone. Rows are parsed and encoded
(drift._ingest, drift._encode), classified (drift._classify) and added to their panes by the pane
log (drift._panes). Every other state change (panes closing, tier moves, rollups, series,
retention, an automatic reference) is *planned* by the log as a change set (drift._changes),
written by the store in one transaction (drift._store), and only then applied to memory, so a
restart always sees what memory saw. Queries run on a read-only View (drift._view) taken under
the lock in microseconds and evaluated without it; the detectors (drift._queries, drift._drift,
drift._series, drift._cascade) combine a statistic, a decision rule (drift._rules) and a window,
and all return a Result (drift._results).
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from drift import _cascade, _drift, _queries, _references, _schema, _series
from drift._changepoint import PageHinkley
from drift._changes import TIER_DETAIL, ChangeSet
from drift._classify import MAD, Classifier, Percentile, classifier_from_config
from drift._config import (
    DEFAULT_ALLOWED_LATENESS_SECONDS,
    DEFAULT_DETAIL_PANES,
    DEFAULT_HISTORY_FLAGGED_RESERVOIR_SIZE,
    DEFAULT_HISTORY_RESERVOIR_SIZE,
    DEFAULT_MAX_FUTURE_SECONDS,
    DEFAULT_PANE_SECONDS,
    DEFAULT_REFERENCE_RESERVOIR_SIZE,
    DEFAULT_RETENTION_PANES,
    DEFAULT_ROLLUP_PANES,
    DEFAULT_WINDOW_PANES,
    Config,
    build_config,
)
from drift._counts import DEFAULT_MAX_VALUES
from drift._encode import DEFAULT_MAX_CODES, Encoder
from drift._errors import DataWarning, NoReferenceError, StateError
from drift._ingest import Parsed, Schema, parse, to_frame
from drift._panes import Horizons, PaneLog
from drift._references import Reference, iso
from drift._reservoir import DEFAULT_FLAGGED_RESERVOIR_SIZE, DEFAULT_RESERVOIR_SIZE
from drift._results import CascadeHealth, ChangePoints, DriftReport, Explanation
from drift._rules import EffectGate, Persistence
from drift._sample import Sample
from drift._sketch import DEFAULT_RELATIVE_ACCURACY
from drift._store import Store
from drift._summary import Layout, Summary
from drift._view import Labels, View, cheap_code, no_data

DURABILITY_MODES = ("pane", "batch")
#: A batch whose median event time is within this many seconds of the wall clock marks the
#: stream live for clock='auto' (replays of older data never are).
LIVE_HORIZON_SECONDS = 300.0

__all__ = ["IngestReceipt", "Monitor", "iso"]


@dataclass(frozen=True)
class IngestReceipt:
    """What one `ingest` call did.

    panes / closed_panes: pane ids (floor(timestamp / pane_seconds)) the batch touched / that
    closed during the call. late_dropped: rows too late to merge; quarantined: rows dated too
    far in the future (see Monitor.stats()). durable: every row of this batch is committed to
    disk (always True with durability='batch'; with durability='pane' once the rows' panes
    closed). durable_through: every row with a timestamp before this (epoch seconds) is
    committed.
    """

    rows: int
    panes: tuple[int, ...]
    closed_panes: tuple[int, ...]
    late_dropped: int
    durable: bool
    durable_through: float | None
    quarantined: int = 0


class Monitor:
    """MacroBase-style anomaly explanation and drift monitoring over serving records.

    Parameters
    ----------
    attributes : categorical columns that explanations are made of (model_version, replica,
        region, bucketed inputs ...).
    metrics : numeric columns to classify and test (latency_ms, confidence, score, error ...).
    features : extra input columns to test for drift; a list (kind inferred from the first
        batch: numeric dtypes are numeric, anything else categorical) or a dict
        name -> 'numeric' | 'categorical'.
    classifiers : named extra classifiers, e.g. ``{"slow": "latency_ms > 50"}`` or
        ``{"lat_mad": MAD("latency_ms")}``. Every metric also gets a ``Percentile`` classifier
        under its own name, fitted on the 'default' reference (``ErrorFlag`` for
        `error_column`): the high tail (top 1%) for latency-, duration-, size- and error-like
        names (or those in `high_tail_metrics`), both tails (0.5% each) otherwise.
    high_tail_metrics : metrics whose default classifier is the high tail (overrides names).
    level_column : attribute holding the cascade level that answered the row (added to the
        attributes when missing); enables `cascade_health` and the expensive-level series.
    cheap_level : the level value meaning "answered by the cheap model"; None = the lowest level
        value seen in the reference.
    confidence_column : metric holding the small model's confidence (added to metrics).
    error_column : metric holding a 0/1 error flag (added to metrics).
    pane_seconds, window_panes : panes of this length; queries judge the last `window_panes`.
    allowed_lateness_seconds : a pane closes once event time passes its end by this much.
    detail_panes, rollup_panes, retention_panes : history horizons (see drift._panes).
    max_values : distinct values counted exactly per column per pane (heavy hitters beyond).
    max_codes : distinct values a categorical column may ever have (see drift._encode).
    relative_accuracy : quantile sketch accuracy (relative to the distance from the column's
        centre).
    reservoir_size, flagged_reservoir_size : rows sampled per pane (unflagged / flagged rows).
    history_reservoir_size, history_flagged_reservoir_size : rows kept per pane and per rollup
        once a pane leaves the window (time-range queries on history use them).
    reference_reservoir_size : rows sampled per stratum for a reference.
    auto_reference_panes : freeze the first N closed panes as the 'default' reference.
    max_future_seconds : rows dated further than this past their batch's median time (or past
        a live clock) are quarantined, not allowed to close every pane.
    clock : 'auto' (default: the wall clock once event times are live, i.e. within
        LIVE_HORIZON_SECONDS of it), None (event time only), or a callable returning epoch
        seconds. With a clock, idle time closes panes and slides the window.
    directory : persist state in SQLite here and recover it on construction.
    durability : 'pane' (rows are durable when their pane closes, or after `flush()`) or
        'batch' (every `ingest` commits before returning).
    fsync : also survive power loss (SQLite synchronous=FULL); process crashes are always
        survived.
    seed : seeds the row sampling; equal inputs and seed give equal state and answers.
    """

    def __init__(
        self,
        attributes: Sequence[str],
        metrics: Sequence[str],
        *,
        features: Sequence[str] | Mapping[str, str] = (),
        classifiers: Mapping[str, Classifier | str] | None = None,
        high_tail_metrics: Sequence[str] | None = None,
        level_column: str | None = None,
        cheap_level: Any = None,
        confidence_column: str | None = None,
        error_column: str | None = None,
        timestamp_column: str = "timestamp",
        pane_seconds: float = DEFAULT_PANE_SECONDS,
        window_panes: int = DEFAULT_WINDOW_PANES,
        allowed_lateness_seconds: float = DEFAULT_ALLOWED_LATENESS_SECONDS,
        detail_panes: int = DEFAULT_DETAIL_PANES,
        rollup_panes: int = DEFAULT_ROLLUP_PANES,
        retention_panes: int = DEFAULT_RETENTION_PANES,
        max_values: int = DEFAULT_MAX_VALUES,
        max_codes: int = DEFAULT_MAX_CODES,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        reservoir_size: int = DEFAULT_RESERVOIR_SIZE,
        flagged_reservoir_size: int = DEFAULT_FLAGGED_RESERVOIR_SIZE,
        history_reservoir_size: int = DEFAULT_HISTORY_RESERVOIR_SIZE,
        history_flagged_reservoir_size: int = DEFAULT_HISTORY_FLAGGED_RESERVOIR_SIZE,
        reference_reservoir_size: int = DEFAULT_REFERENCE_RESERVOIR_SIZE,
        auto_reference_panes: int | None = None,
        max_future_seconds: float = DEFAULT_MAX_FUTURE_SECONDS,
        clock: str | Callable[[], float] | None = "auto",
        directory: str | os.PathLike | None = None,
        durability: str = "pane",
        fsync: bool = False,
        seed: int = 0,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, got {durability!r}")
        if not (clock is None or clock == "auto" or callable(clock)):
            raise ValueError(f"clock must be 'auto', None or a callable, got {clock!r}")
        self.config, self._classifiers = build_config(
            attributes, metrics, features, classifiers, level_column, cheap_level,
            confidence_column, error_column,
            timestamp_column=timestamp_column, pane_seconds=float(pane_seconds),
            window_panes=window_panes, allowed_lateness_seconds=float(allowed_lateness_seconds),
            detail_panes=detail_panes, rollup_panes=rollup_panes,
            retention_panes=retention_panes, max_values=max_values, max_codes=max_codes,
            relative_accuracy=float(relative_accuracy), reservoir_size=reservoir_size,
            flagged_reservoir_size=flagged_reservoir_size,
            reference_reservoir_size=reference_reservoir_size,
            auto_reference_panes=auto_reference_panes, seed=seed,
            high_tail_metrics=None if high_tail_metrics is None else list(high_tail_metrics),
            history_reservoir_size=history_reservoir_size,
            history_flagged_reservoir_size=history_flagged_reservoir_size,
            max_future_seconds=max_future_seconds,
        )
        self.directory = None if directory is None else os.fspath(directory)
        self.durability = durability
        self.fsync = bool(fsync)
        self._clock = clock
        self._live = False
        self._lock = threading.RLock()
        self._kinds: dict[str, str] | None = None
        self._schema: Schema | None = None
        self._layout: Layout | None = None
        self._layout_saved = False
        self._encoders: list[Encoder] = []
        self._log: PaneLog | None = None
        self._refs: dict[str, Reference] = {}
        self._counters = {"rows_seen": 0, "late_dropped": 0, "quarantined": 0, "batch_seq": 0}
        self._closed = False
        self._broken: BaseException | None = None
        self._fitted_pending: dict[str, Classifier] | None = None
        self._store: Store | None = None
        if all(kind is not None for kind in self.config.features.values()):
            self._set_schema(_schema.infer_kinds(self.config, None))
        if self.directory is not None:
            self._store = Store(self.directory, fsync=self.fsync)
            try:
                self._load()
            except BaseException:
                self._store.close()
                raise

    # ================================================================ construction helpers
    @classmethod
    def open(cls, directory: str | os.PathLike, **runtime: Any) -> Monitor:
        """Reopen a monitor from its directory using the configuration stored there.

        `runtime` may set durability, fsync and clock. Custom (non built-in) classifiers cannot
        be restored this way; construct the Monitor with the same arguments instead.
        """
        probe = Store(directory)
        try:
            meta = probe.meta()
        finally:
            probe.close()
        if "config" not in meta:
            raise StateError(f"no monitor state in {os.fspath(directory)!r}")
        cfg = dict(meta["config"])
        builtin = {"percentile", "mad", "error", "predicate"}
        if any(c.get("kind") not in builtin for c in cfg["classifiers"].values()):
            raise StateError("stored monitor uses custom classifiers; construct it explicitly")
        stored = {n: classifier_from_config(c) for n, c in cfg.pop("classifiers").items()}
        feats: dict[str, str | None] | list[str] = cfg.pop("features")
        if meta.get("feature_kinds"):
            feats = dict(meta["feature_kinds"])  # kinds inferred from the first batch
        elif any(v is None for v in feats.values()):
            feats = list(feats)  # still to be inferred
        attributes, metrics = cfg.pop("attributes"), cfg.pop("metrics")
        return cls(attributes, metrics, features=feats, classifiers=stored,
                   directory=directory, **cfg, **runtime)

    def _set_schema(self, kinds: dict[str, str]) -> None:
        self._kinds = kinds
        self._schema = _schema.build_schema(self.config, kinds, self._classifiers)
        self._encoders = _schema.build_encoders(self.config, self._schema)

    def _set_layout(self, offsets: Sequence[float]) -> None:
        assert self._schema is not None
        cfg = self.config
        self._layout = _schema.build_layout(cfg, self._schema, len(self._classifiers), offsets)
        self._log = PaneLog(self._layout, Horizons(
            pane_seconds=cfg.pane_seconds, window_panes=cfg.window_panes,
            allowed_lateness_seconds=cfg.allowed_lateness_seconds,
            detail_panes=cfg.detail_panes, rollup_panes=cfg.rollup_panes,
            retention_panes=cfg.retention_panes,
            capacity=(cfg.reservoir_size, cfg.flagged_reservoir_size),
            history_capacity=(cfg.history_reservoir_size, cfg.history_flagged_reservoir_size),
        ))

    def _prepare(self, batch: Any, argument: str) -> Parsed | None:
        """Validate and encode a batch; fixes schema and layout on the first one."""
        frame = to_frame(batch, argument)
        if len(frame) == 0:
            return None
        if self._schema is None:
            self._set_schema(_schema.infer_kinds(self.config, frame))
        parsed = parse(frame, self._schema, self._encoders, argument=argument)
        if self._layout is None:
            self._set_layout(_schema.centres(parsed.num))
        return parsed

    # ================================================================ properties
    @property
    def attributes(self) -> list[str]:
        return list(self.config.attributes)

    @property
    def metrics(self) -> list[str]:
        return list(self.config.metrics)

    @property
    def classifiers(self) -> dict[str, Classifier]:
        """Name -> classifier run at ingest (fitted ones only flag rows)."""
        return dict(self._classifiers)

    @property
    def references(self) -> list[str]:
        """Names of usable references (an auto reference still filling is not listed)."""
        return sorted(n for n, r in self._refs.items() if not r.pending)

    @property
    def schema(self) -> Schema:
        if self._schema is None:
            raise no_data()
        return self._schema

    # ================================================================ clock
    def _now(self) -> float | None:
        """The clock's time, when this monitor follows one."""
        if self._clock is None:
            return None
        if self._clock == "auto":
            return time.time() if self._live else None
        return float(self._clock())  # type: ignore[operator]

    # ================================================================ ingest
    def ingest(self, batch: Any) -> IngestReceipt:
        """Add a batch of records (DataFrame, Arrow table, list of dicts, dict of columns).

        Records carry the attribute and metric columns and optionally `timestamp` (datetime or
        epoch seconds; the ingest time when absent). Unknown columns are ignored. Raises
        SchemaError (naming the column) before any state changes when the batch is malformed.
        """
        with self._lock:
            self._check_open()
            parsed = self._prepare(batch, "batch")
            if parsed is None:
                return IngestReceipt(0, (), (), 0, True, self._durable_through())
            parsed, quarantined = self._quarantine(parsed)
            return self._ingest_parsed(parsed, quarantined)

    def _quarantine(self, parsed: Parsed) -> tuple[Parsed, int]:
        """Drop (and count) rows dated too far ahead of their batch or of a live clock.

        Ahead of the batch means above a gap of more than `max_future_seconds` in the batch's
        sorted times, above its median: a skewed client's rows form such a cluster, while a
        backfill spanning hours has no gap and keeps every row."""
        ts = parsed.ts
        future = self.config.max_future_seconds
        lo, hi = float(ts.min()), float(ts.max())
        if self._clock == "auto":
            mid = float(np.median(ts)) if hi - lo > future else 0.5 * (lo + hi)
            self._live = abs(mid - time.time()) <= LIVE_HORIZON_SECONDS
        limit = math.inf
        if hi - lo > future:
            order = np.sort(ts)
            half = order.size // 2
            gaps = np.flatnonzero(np.diff(order[half:]) > future)
            if gaps.size:
                limit = float(order[half + gaps[0]])
        now = self._now()
        if now is not None:
            limit = min(limit, now + future)
        if hi <= limit:
            return parsed, 0
        keep = ts <= limit
        bad = int(ts.size - np.count_nonzero(keep))
        if not bad:
            return parsed, 0
        self._counters["quarantined"] += bad
        warnings.warn(
            f"{bad} row(s) dated more than {self.config.max_future_seconds:.0f} s ahead of their "
            "batch (or of the clock) were quarantined (skewed client clock?); see "
            "Monitor.stats()['quarantined']", DataWarning, stacklevel=4)
        return Parsed(n=int(keep.sum()), ts=ts[keep], cat=parsed.cat[:, keep],
                      num=parsed.num[:, keep]), bad

    def _ingest_parsed(self, parsed: Parsed, quarantined: int) -> IngestReceipt:
        cfg = self.config
        log = self._log
        assert log is not None
        if parsed.n == 0:
            return IngestReceipt(0, (), (), 0, True, self._durable_through(), quarantined)
        flags = self._classify(parsed.num)
        prio = self._priorities(parsed.n)
        pane_ids = np.floor(parsed.ts / cfg.pane_seconds).astype(np.int64)
        batch_deltas = self.durability == "batch" and self._store is not None
        touched, late, deltas = log.add(pane_ids, parsed.ts, parsed.cat, parsed.num, flags,
                                        prio, batch_deltas)
        if late:
            self._counters["late_dropped"] += late
            warnings.warn(
                f"{late} row(s) arrived for panes already rolled up (more than "
                f"{cfg.window_panes + 1} panes late) and were dropped; see Monitor.stats()",
                DataWarning, stacklevel=3,
            )
        self._counters["rows_seen"] += parsed.n - late
        self._counters["batch_seq"] += 1
        cs = self._plan()
        cs.deltas = deltas
        closed = sorted(p for p in cs.series_put if p in log.full)
        self._commit(cs, force=batch_deltas)
        through = self._durable_through()
        if self._store is None:
            durable = False
        elif self.durability == "batch":
            durable = True
        else:
            durable = through is not None and bool(parsed.ts.max() < through)
        return IngestReceipt(
            rows=parsed.n - late, panes=tuple(sorted(set(touched))), closed_panes=tuple(closed),
            late_dropped=late, durable=durable, durable_through=through, quarantined=quarantined,
        )

    def _classify(self, num: np.ndarray) -> np.ndarray:
        n = num.shape[1]
        flags = np.zeros(n, dtype=np.uint32)
        values = None
        for bit, clf in enumerate(self._classifiers.values()):
            if not clf.fitted:
                continue
            if values is None:
                values = dict(zip(self.schema.num_columns, num, strict=True))
            mask = clf.flags(values)
            if mask.any():
                flags |= mask.astype(np.uint32) << np.uint32(bit)
        return flags

    def _priorities(self, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.config.seed, self._counters["batch_seq"]])
        return rng.random(n)

    # ================================================================ planning and commits
    def _plan(self, now: float | None = None, force: bool = False) -> ChangeSet:
        """The next step as a change set: pane closes, tier moves, auto reference, codes, meta."""
        cfg = self.config
        log = self._log
        assert log is not None and self._schema is not None
        now = self._now() if now is None else now
        frontier = log.max_ts if now is None else max(log.max_ts, now)
        watermark = frontier - cfg.allowed_lateness_seconds
        now_pane = None if now is None else math.floor(now / cfg.pane_seconds)
        labels = self._labels()
        cheap = cheap_code(cfg, self._schema, labels, self._refs.get("default"))
        classifiers = self._classifiers

        def scalars(s: Summary) -> dict[str, float]:
            return _series.pane_scalars(cfg, self._schema, classifiers, cheap, s)

        cs = log.plan(watermark, scalars, now_pane, force=force) if math.isfinite(
            watermark) else ChangeSet()
        if cfg.auto_reference_panes:
            closing = {p: log.full[p] for p in cs.series_put if p in log.full}
            ref = _references.auto_step(self._refs.get("default"), self._layout,
                                        cfg.reference_reservoir_size, cfg.auto_reference_panes,
                                        closing)
            if ref is not None:
                cs.refs_put["default"] = (ref.summary, ref.info)
                if not ref.pending:
                    cs.meta["classifier_state"] = self._fit_on(ref)
        self._add_bookkeeping(cs)
        return cs

    def _add_bookkeeping(self, cs: ChangeSet) -> None:
        """New codes, layout (once) and counters ride along with every commit."""
        for col, enc in enumerate(self._encoders):
            if len(enc) > enc.persisted:
                cs.codes[col] = (enc.persisted, list(enc.values[enc.persisted:]))
        if not self._layout_saved and self._layout is not None and self._kinds is not None:
            cs.meta.update(_schema.layout_meta(self._kinds, self._layout))
        log = self._log
        closed_upto = cs.closed_upto if cs.closed_upto is not None else (
            None if log is None else log.closed_upto)
        newest = cs.newest if cs.newest is not None else (None if log is None else log.newest)
        max_ts = -math.inf if log is None else log.max_ts
        cs.meta["state"] = {"newest": newest, "closed_upto": closed_upto,
                            "max_ts": max_ts if math.isfinite(max_ts) else None,
                            **self._counters}

    def _commit(self, cs: ChangeSet, force: bool = False) -> None:
        """Write `cs` (when it changes anything durable), then apply it to memory."""
        if self._store is not None and (force or cs.structural or cs.open_put):
            try:
                self._store.apply(cs)
            except BaseException as exc:
                self._broken = exc
                raise StateError(
                    f"writing the monitor's state failed ({exc}); memory may now be ahead of "
                    "disk, so this Monitor refuses further calls: reopen it from its directory"
                ) from exc
            for enc in self._encoders:
                enc.persisted = len(enc)
            self._layout_saved = True
        if self._log is not None:
            self._log.apply(cs)
        for name, (summary, info) in cs.refs_put.items():
            self._refs[name] = Reference(name, summary, info)
        fitted = self._fitted_pending
        if fitted:
            self._classifiers.update(fitted)
            self._fitted_pending = None

    def _fit_on(self, ref: Reference) -> dict[str, Any]:
        """Fit copies of the data-fitted classifiers on `ref`; they replace the running ones
        once the change set commits. Returns their saved state."""
        assert self._schema is not None
        res = ref.summary.reservoir
        sample = Sample.from_reservoirs([] if res is None else [res], len(
            self._schema.cat_columns), len(self._schema.num_columns))
        values = sample.column_values(self._schema.num_columns)
        fitted: dict[str, Classifier] = {}
        for name, clf in self._classifiers.items():
            if clf.needs_fit:
                new = clf.clone()
                try:
                    new.fit(values, sample.weight)
                except ValueError as exc:
                    warnings.warn(f"classifier {name!r} not fitted: {exc}", DataWarning,
                                  stacklevel=4)
                    continue
                fitted[name] = new
        self._fitted_pending = fitted
        return {n: c.describe() for n, c in {**self._classifiers, **fitted}.items()
                if c.needs_fit and c.fitted}

    def _labels(self) -> Labels:
        return Labels(list(self._encoders), [len(e) for e in self._encoders])

    def advance(self, now: float | None = None) -> list[int]:
        """Close panes up to `now` (epoch seconds; the clock's or wall-clock time when None)
        and slide the window there: idle traffic still moves time on."""
        with self._lock:
            self._check_open()
            if self._log is None:
                return []
            if now is None:
                now = self._now()
                if now is None:
                    now = time.time()
            cs = self._plan(now=float(now))
            closed = sorted(p for p in cs.series_put if p in self._log.full)
            self._commit(cs)
            return closed

    def _durable_through(self) -> float | None:
        if self._store is None or self._log is None or self._log.closed_upto is None:
            return None
        return self._log.closed_upto * self.config.pane_seconds

    # ================================================================ persistence
    def _load(self) -> None:
        store = self._store
        assert store is not None
        meta = store.meta()
        if "config" not in meta:
            with store.transaction() as w:
                w.put_meta("config", self.config.to_json())
                w.put_meta("schema_version", 2)
            return
        stored = Config(**meta["config"])
        diffs = self.config.differences(stored)
        if diffs:
            raise StateError(
                f"directory {self.directory!r} holds a monitor with another configuration: "
                + "; ".join(diffs)
            )
        if stored.to_json() != self.config.to_json():  # adopted knobs (see Config.ADOPTABLE)
            with store.transaction() as w:
                w.put_meta("config", self.config.to_json())
        kinds = meta.get("feature_kinds")
        if self._schema is None and kinds is not None:
            self._set_schema(dict(kinds))
        if self._schema is None:
            return  # no data was ever stored
        offsets = meta.get("offsets")
        panes = store.panes()
        if offsets is None and not (panes or store.refs()):
            return
        self._set_layout(offsets if offsets is not None else [0.0] * len(
            self._schema.num_columns))
        self._layout_saved = True
        layout, log = self._layout, self._log
        assert layout is not None and log is not None
        for col, values in store.codes().items():
            enc = self._encoders[col]
            enc.extend(values)
            enc.persisted = len(values)
        for pane, tier, blob in panes:
            s = Summary.from_bytes(layout, blob)
            (log.detail if tier == TIER_DETAIL else log.full)[pane] = s
        capacity = (self.config.reservoir_size, self.config.flagged_reservoir_size)
        for _seq, pane, blob in store.deltas():
            target = log.full.get(pane)
            if target is None:
                target = log.full[pane] = Summary(layout, capacity)
            target.merge(Summary.from_bytes(layout, blob))
        for bucket, blob in store.rollups():
            log.rollups[bucket] = Summary.from_bytes(layout, blob)
        log.series = store.series()
        for name, blob, info in store.refs():
            self._refs[name] = Reference(name, Summary.from_bytes(layout, blob), info)
        state = meta.get("state", {})
        log.newest = state.get("newest")
        log.closed_upto = state.get("closed_upto")
        log.max_ts = state.get("max_ts") or -math.inf
        for key in self._counters:
            self._counters[key] = int(state.get(key, 0) or 0)
        for name, fitted in meta.get("classifier_state", {}).items():
            clf = self._classifiers.get(name)
            if clf is not None:
                _restore_fit(clf, fitted)

    def flush(self) -> None:
        """Make everything ingested so far durable (open panes included)."""
        with self._lock:
            self._check_open()
            self._flush()

    def _flush(self) -> None:
        if self._store is None or self._log is None:
            return
        cs = self._plan()
        log = self._log
        for p, s in log.full.items():
            if log.is_open(p) and p not in cs.full_drop:
                cs.open_put[p] = s
        self._commit(cs, force=True)

    def close(self) -> None:
        """Flush and release the directory. Further calls raise."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._store is not None and not self._store.closed and self._broken is None:
                    self._flush()
            finally:
                if self._store is not None:
                    self._store.close()
                self._closed = True

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StateError("this Monitor is closed")
        if self._broken is not None:
            raise StateError(f"a write to the monitor's database failed ({self._broken}); "
                             "reopen the monitor from its directory")

    # ================================================================ references
    def set_reference(self, batch: Any, name: str = "default", *, append: bool = False) -> dict:
        """Freeze a named baseline from records shaped like `ingest` input.

        The 'default' reference also fits every classifier that needs data (percentile, MAD).
        With append=True the batch is added to an existing reference of that name (for
        training sets streamed in chunks). Returns the reference's description.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        with self._lock:
            self._check_open()
            parsed = self._prepare(batch, "batch")
            if parsed is None:
                raise ValueError("set_reference needs at least one record")
            assert self._layout is not None
            flags = self._classify(parsed.num) if name != "default" else np.zeros(
                parsed.n, dtype=np.uint32)
            rng = np.random.default_rng([self.config.seed, 1 << 30, len(name),
                                         self._counters["batch_seq"]])
            self._counters["batch_seq"] += 1
            base = self._refs.get(name) if append else None
            ref = _references.from_rows(
                None if base is None or base.pending else base, self._layout, name,
                self.config.reference_reservoir_size,
                (parsed.ts, parsed.cat, parsed.num, flags, rng.random(parsed.n)))
            cs = ChangeSet()
            cs.refs_put[name] = (ref.summary, ref.info)
            if name == "default":
                cs.meta["classifier_state"] = self._fit_on(ref)
            self._add_bookkeeping(cs)
            self._commit(cs, force=True)
            return dict(ref.info)

    def reference(self, name: str = "default") -> Reference:
        ref = self._refs.get(name)
        if ref is None or ref.pending:
            return self._view().reference(name)  # raises the explanatory error
        return ref

    # ================================================================ views
    def _view(self, window: Any = None, as_of: Any = None) -> View:
        """A snapshot to query, taken under the lock (closes idle panes first)."""
        with self._lock:
            self._check_open()
            if self._schema is None or self._log is None:
                raise no_data()
            if self._now() is not None:
                self._commit(self._plan())
            log = self._log
            full = {p: (s.copy() if log.is_open(p) else s) for p, s in log.full.items()}
            cfg = self.config
            pending = _references.pending_status(
                self._refs.get("default"), cfg.auto_reference_panes, cfg.pane_seconds,
                cfg.allowed_lateness_seconds)
            view = View(cfg, self._schema, self._classifiers, self._labels(), full, log.detail,
                        log.rollups, log.series, log.closed_upto, log.newest, self._refs,
                        pending, self._counters)
        return view.select(window, as_of)

    def window_summary(self, end: int | None = None) -> Summary | None:
        """Counts and sketches of the window ending at pane `end` (default: newest)."""
        view = self._view()
        if end is None:
            return view.window_summary()
        w = self.config.window_panes
        return view.window_summary((end - w + 1, end))

    def window_sample(self, window: Any = None, as_of: Any = None) -> Sample:
        return self._view(window, as_of).window_sample()

    def window_info(self, window: Any = None, as_of: Any = None) -> dict[str, Any]:
        return self._view(window, as_of).window_info()

    def label(self, column_index: int, code: int) -> Any:
        return self._encoders[column_index].label(code)

    # ================================================================ queries
    def explain(
        self,
        metric: str | None = None,
        *,
        classifier: Classifier | str | None = None,
        ratio_metric: str = "risk_ratio",
        attributes: Sequence[str] | None = None,
        min_support: float = _queries.DEFAULT_MIN_SUPPORT,
        min_ratio: float = _queries.DEFAULT_MIN_RATIO,
        max_order: int = _queries.DEFAULT_MAX_ORDER,
        confidence: float = _queries.DEFAULT_CONFIDENCE,
        reference: Any = "default",
        window: Any = None,
        as_of: Any = None,
    ) -> Explanation:
        """Anomalies: attribute combinations over-represented among the window's outliers.

        Outliers are rows flagged by `classifier` (a registered name, a predicate string such
        as ``"latency_ms > 50"`` or a Classifier) or, by default, by `metric`'s percentile
        classifier fitted on the reference; with no reference yet, on the window itself
        (MacroBase's default; `info['classifier']['fitted_on']` says which).
        ``ratio_metric="mean_shift"`` needs only `metric`. `window` / `as_of` pick a time range
        (see `Monitor.drift`).
        """
        view = self._view(window, as_of)
        return _queries.explain_anomalies(
            view, metric, classifier, ratio_metric, attributes, min_support, min_ratio,
            max_order, confidence, reference,
        )

    def mix_shift(
        self,
        reference: Any = "default",
        *,
        attributes: Sequence[str] | None = None,
        direction: str = "grew",
        min_support: float = _queries.DEFAULT_MIN_SUPPORT,
        min_ratio: float = _queries.DEFAULT_MIN_RATIO,
        max_order: int = _queries.DEFAULT_MAX_ORDER,
        confidence: float = _queries.DEFAULT_CONFIDENCE,
        window: Any = None,
        as_of: Any = None,
    ) -> Explanation:
        """Mix shift: segments whose share of traffic grew (or shrank) against the reference.

        `ratio` and `risk_ratio` are share ratios: the segment's share of window rows over its
        share of reference rows; `support` is its share of window rows. `reference` may also be
        a time range of this monitor's history: ``(start, end)``, ``"start/end"`` or a shift
        such as ``"-1d"`` (the same window a day earlier).
        """
        view = self._view(window, as_of)
        return _queries.explain_difference(
            view, reference, attributes, direction, "share_ratio", min_support, min_ratio,
            max_order, confidence)

    def diff(
        self,
        reference: Any,
        *,
        window: Any = None,
        as_of: Any = None,
        attributes: Sequence[str] | None = None,
        ratio_metric: str = "share_ratio",
        min_support: float = _queries.DEFAULT_MIN_SUPPORT,
        min_ratio: float = _queries.DEFAULT_MIN_RATIO,
        max_order: int = _queries.DEFAULT_MAX_ORDER,
        confidence: float = _queries.DEFAULT_CONFIDENCE,
    ) -> Explanation:
        """What distinguishes the window (or `window=` range) from `reference` (a name, a time
        range or a shift such as ``"-1d"``): MacroBase's two-relation DIFF on the monitor's
        own history. ``share_ratio`` (default) compares a combination's share of the two
        ranges' rows; ``risk_ratio`` is MacroBase's, which cannot exceed about 1 / (window's
        share of the union) and so suits a window much smaller than its reference."""
        view = self._view(window, as_of)
        return _queries.explain_difference(
            view, reference, attributes, "grew", ratio_metric, min_support, min_ratio,
            max_order, confidence, kind="diff")

    def conditional_shift(
        self,
        reference: Any = "default",
        *,
        columns: Sequence[str] | None = None,
        segments: Sequence[Mapping[str, Any]] | None = None,
        min_share: float = _drift.DEFAULT_MIN_SHARE,
        max_segments: int = _drift.DEFAULT_MAX_SEGMENTS,
        alpha: float = _drift.DEFAULT_ALPHA,
        numeric_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        categorical_effect: float = _drift.DEFAULT_CATEGORICAL_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
        localization: float = _drift.DEFAULT_LOCALIZATION,
        window: Any = None,
        as_of: Any = None,
    ) -> DriftReport:
        """Conditional shift: per-segment drift tests inside the top segments.

        A row is `localized` when the column drifted inside the segment at least
        `localization` times more (effect size) than outside it.
        """
        gate = EffectGate(alpha, numeric_effect, categorical_effect, min_samples)
        view = self._view(window, as_of)
        return _drift.conditional_shift(view, reference, columns, segments, min_share,
                                        max_segments, gate, localization)

    def drift(
        self,
        reference: Any = "default",
        *,
        columns: Sequence[str] | None = None,
        alpha: float = _drift.DEFAULT_ALPHA,
        numeric_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        categorical_effect: float = _drift.DEFAULT_CATEGORICAL_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
        persistence: tuple[int, int] | Persistence = _drift.DEFAULT_PERSISTENCE,
        gate: EffectGate | None = None,
        window: Any = None,
        as_of: Any = None,
    ) -> DriftReport:
        """Per-column drift of the window against a reference.

        A column is `drifted` when, in at least persistence[0] of the last persistence[1]
        disjoint windows (the window, the one before it, ...), its BH-adjusted p-value is below
        `alpha`, its effect size minus the sketch's error bound reaches the threshold, and both
        sides hold at least `min_samples` rows. `gate` replaces the four gate arguments.
        `window`: a duration ('10m') or a (start, end) pair of times; `as_of`: the window's
        end time; `reference`: a name, a (start, end) range or a shift such as '-1d'.
        """
        if gate is None:
            gate = EffectGate(alpha, numeric_effect, categorical_effect, min_samples)
        rule = Persistence.of(persistence)
        view = self._view(window, as_of)
        return _drift.column_drift(view, reference, columns, gate, rule)

    def change_points(
        self,
        series: Sequence[str] | None = None,
        *,
        delta: float = _series.DEFAULT_DELTA,
        threshold: float = _series.DEFAULT_THRESHOLD,
        burn_in: int = _series.DEFAULT_BURN_IN,
    ) -> ChangePoints:
        """When did per-pane series change (traffic, p99 latency, error rate, expensive-level
        share)?"""
        detector = PageHinkley(delta=delta, threshold=threshold, burn_in=burn_in)
        return _series.change_points(self._view(), series, detector)

    def series(self, names: Sequence[str] | None = None) -> pd.DataFrame:
        """Per-pane scalar series of closed panes (index: pane start, UTC)."""
        try:
            view = self._view()
        except NoReferenceError:
            return pd.DataFrame(columns=list(names or []))
        return _series.series_frame(view, names)

    def cascade_health(
        self,
        reference: Any = "default",
        *,
        min_share: float = _drift.DEFAULT_MIN_SHARE,
        max_segments: int = _drift.DEFAULT_MAX_SEGMENTS,
        alpha: float = _cascade.DEFAULT_HEALTH_ALPHA,
        min_drop: float = _cascade.DEFAULT_MIN_DROP,
        confidence_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
        window: Any = None,
        as_of: Any = None,
    ) -> CascadeHealth:
        """Is the cheap cascade level still answering as often, and as confidently, as it did
        on the reference, overall and per segment?"""
        return _cascade.cascade_health(
            self._view(window, as_of), reference, min_share, max_segments, alpha, min_drop,
            confidence_effect, min_samples,
        )

    # ================================================================ introspection
    def memory_bytes(self) -> int:
        """Bytes held by pane, rollup and reference state (numpy buffers + small overhead)."""
        with self._lock:
            total = 0 if self._log is None else self._log.nbytes()
            total += sum(r.summary.nbytes() for r in self._refs.values())
            total += sum(64 * len(e) for e in self._encoders)
            return int(total)

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, JSON-ready.

        rows_ingested counts rows accepted since creation (after a restart: as of the last
        commit, which with durability='pane' may include rows of an open pane that was lost);
        rows_retained counts rows in the state actually held.
        """
        with self._lock:
            log = self._log
            nonfinite: dict[str, int] = {}
            missing: dict[str, int] = {}
            if self._schema is not None and log is not None:
                for group in (log.full, log.detail, log.rollups):
                    for s in group.values():
                        for j, col in enumerate(self._schema.num_columns):
                            nonfinite[col] = nonfinite.get(col, 0) + int(s.nonfinite[j])
                            missing[col] = missing.get(col, 0) + int(s.missing[j])
            newest = None if log is None else log.newest
            return {
                "rows_ingested": int(self._counters["rows_seen"]),
                "rows_retained": 0 if log is None else log.rows_retained(),
                "late_dropped": int(self._counters["late_dropped"]),
                "quarantined": int(self._counters["quarantined"]),
                "panes_full": 0 if log is None else len(log.full),
                "panes_detail": 0 if log is None else len(log.detail),
                "rollups": 0 if log is None else len(log.rollups),
                "series_panes": 0 if log is None else len(log.series),
                "newest_pane_start": None if newest is None else iso(
                    newest * self.config.pane_seconds),
                "durable_through": iso(self._durable_through()),
                "clock": "live" if self._now() is not None else "event time",
                "missing_values": missing,
                "non_finite_values": nonfinite,
                "distinct_values": {e.column: len(e) for e in self._encoders},
                "overflowed_values": {e.column: e.overflow for e in self._encoders},
                "references": {n: r.info for n, r in self._refs.items()},
                "memory_bytes": self.memory_bytes(),
                "disk_bytes": None if self._store is None else self._store.size_bytes(),
            }


def _restore_fit(clf: Classifier, fitted: Mapping[str, Any]) -> None:
    """Put saved thresholds back on a built-in classifier."""
    if isinstance(clf, Percentile):
        clf.set_thresholds(fitted.get("lower_threshold"), fitted.get("upper_threshold"))
    elif isinstance(clf, MAD):
        clf.median_, clf.scale_ = fitted.get("median"), fitted.get("scale")
