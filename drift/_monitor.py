"""`Monitor`: ingest serving records into panes, keep bounded state, answer queries, persist.

Why this structure: ingest is the hot path (millions of rows a second), so a batch is parsed and
encoded once, classified with vectorized comparisons, and added to its pane's summary with
`np.bincount`, sketch updates and a reservoir offer; nothing per row runs in Python. Queries
(explain, mix shift, conditional shift, drift, change points, cascade health) read the summaries
of the last `window_panes` panes and live in their own modules.

Pane life cycle (memory is bounded whatever the traffic):
  open -> closed (event time passed its end + allowed lateness; persisted)
  -> detail (left the window and the two windows before it: row sample dropped)
  -> rollup (older than `detail_panes`: merged into `rollup_panes`-long summaries)
  -> gone (older than `retention_panes`). Per-pane scalar series are kept for the retention.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from drift import _cascade, _drift, _queries, _series
from drift._classify import MAD, Classifier, Percentile
from drift._config import (
    DEFAULT_ALLOWED_LATENESS_SECONDS,
    DEFAULT_DETAIL_PANES,
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
from drift._errors import DataWarning, NoReferenceError, SchemaError, StateError
from drift._ingest import Parsed, Schema, parse, to_frame
from drift._reservoir import DEFAULT_FLAGGED_RESERVOIR_SIZE, DEFAULT_RESERVOIR_SIZE
from drift._results import CascadeHealth, ChangePoints, DriftReport, Explanation
from drift._sample import Sample
from drift._sketch import DEFAULT_MAX_BINS, DEFAULT_MIN_VALUE, DEFAULT_RELATIVE_ACCURACY
from drift._store import Store
from drift._summary import Layout, Summary

DURABILITY_MODES = ("pane", "batch")
_TIER_OPEN, _TIER_FULL, _TIER_DETAIL = -1, 0, 1
#: Windows examined by the persistence rule: the current one and the two before it.
PERSISTENCE_LOOKBACK = 3


def iso(ts: float | None) -> str | None:
    """UTC ISO-8601 text of an epoch time (None stays None)."""
    if ts is None or not math.isfinite(ts):
        return None
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).isoformat()


@dataclass(frozen=True)
class IngestReceipt:
    """What one `ingest` call did.

    panes / closed_panes: pane ids (floor(timestamp / pane_seconds)) the batch touched / that
    closed during the call. late_dropped: rows too late to merge (see Monitor.stats()).
    durable: every row of this batch is committed to disk (always True with
    durability='batch'; with durability='pane' only once the rows' panes closed).
    durable_through: every row with a timestamp before this (epoch seconds) is committed.
    """

    rows: int
    panes: tuple[int, ...]
    closed_panes: tuple[int, ...]
    late_dropped: int
    durable: bool
    durable_through: float | None


@dataclass
class _Reference:
    """A frozen, named baseline: a summary with a large row sample."""

    name: str
    summary: Summary
    info: dict[str, Any] = field(default_factory=dict)


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
        ``{"lat_mad": MAD("latency_ms")}``. Every metric also gets a two-tailed
        ``Percentile`` classifier under its own name (``ErrorFlag`` for `error_column`),
        fitted on the 'default' reference.
    level_column : attribute holding the cascade level that answered the row (added to the
        attributes when missing); enables `cascade_health` and the expensive-level series.
    cheap_level : the level value meaning "answered by the cheap model"; None = the lowest level
        value seen in the reference.
    confidence_column : metric holding the small model's confidence (added to metrics).
    error_column : metric holding a 0/1 error flag (added to metrics).
    pane_seconds, window_panes : panes of this length; queries judge the last `window_panes`.
    allowed_lateness_seconds : a pane closes once event time passes its end by this much.
    detail_panes, rollup_panes, retention_panes : history horizons (see module docstring).
    max_values : distinct values counted exactly per column per pane (heavy hitters beyond).
    max_codes : distinct values a categorical column may ever have (more map to '<other>').
    relative_accuracy : quantile sketch accuracy (relative error of quantile values).
    reservoir_size, flagged_reservoir_size : rows sampled per pane (unflagged / flagged rows).
    reference_reservoir_size : rows sampled per stratum for a reference.
    auto_reference_panes : freeze the first N closed panes as the 'default' reference.
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
        reference_reservoir_size: int = DEFAULT_REFERENCE_RESERVOIR_SIZE,
        auto_reference_panes: int | None = None,
        directory: str | os.PathLike | None = None,
        durability: str = "pane",
        fsync: bool = False,
        seed: int = 0,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, got {durability!r}")
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
        )
        self.directory = None if directory is None else os.fspath(directory)
        self.durability = durability
        self.fsync = bool(fsync)
        self._lock = threading.RLock()
        self._schema: Schema | None = None
        self._layout: Layout | None = None
        self._encoders: list[Encoder] = []
        self._full: dict[int, Summary] = {}
        self._detail: dict[int, Summary] = {}
        self._rollups: dict[int, Summary] = {}
        self._series: dict[int, dict[str, float]] = {}
        self._refs: dict[str, _Reference] = {}
        self._dirty: set[int] = set()
        self._newest: int | None = None
        self._closed_upto: int | None = None  # panes below this id are closed
        self._max_ts = -math.inf
        self._batch_seq = 0
        self._late_dropped = 0
        self._rows_seen = 0
        self._auto_panes: list[int] = []
        self._store: Store | None = None
        if all(kind is not None for kind in self.config.features.values()):
            self._resolve_schema(None)
        if self.directory is not None:
            self._store = Store(self.directory, fsync=self.fsync)
            try:
                self._open_store()
            except BaseException:
                self._store.close()
                raise

    # ================================================================ construction helpers
    @classmethod
    def open(cls, directory: str | os.PathLike, **runtime: Any) -> Monitor:
        """Reopen a monitor from its directory using the configuration stored there.

        `runtime` may set durability and fsync. Custom (non built-in) classifiers cannot be
        restored this way; construct the Monitor with the same arguments instead.
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
        from drift._classify import classifier_from_config

        classifiers = {n: classifier_from_config(c) for n, c in cfg.pop("classifiers").items()}
        feats: dict[str, str | None] | list[str] = cfg.pop("features")
        if meta.get("feature_kinds"):
            feats = dict(meta["feature_kinds"])  # kinds inferred from the first batch
        elif any(v is None for v in feats.values()):
            feats = list(feats)  # still to be inferred
        attributes, metrics = cfg.pop("attributes"), cfg.pop("metrics")
        return cls(attributes, metrics, features=feats, classifiers=classifiers,
                   directory=directory, **cfg, **runtime)

    def _resolve_schema(self, frame: pd.DataFrame | None) -> None:
        """Fix feature kinds (inferring from `frame` when needed) and build the layout."""
        kinds = dict(self.config.features)
        for name, kind in kinds.items():
            if kind is None:
                if frame is None or name not in frame.columns:
                    raise SchemaError(
                        f"batch is missing feature column {name!r} (needed to infer its kind)"
                    )
                dtype = frame[name].dtype
                numeric = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(
                    dtype
                )
                kinds[name] = "numeric" if numeric else "categorical"
        self._feature_kinds = kinds
        cfg = self.config
        schema = Schema(
            attributes=tuple(cfg.attributes),
            cat_features=tuple(k for k, v in kinds.items() if v == "categorical"),
            metrics=tuple(cfg.metrics),
            num_features=tuple(k for k, v in kinds.items() if v == "numeric"),
            timestamp=cfg.timestamp_column,
        )
        for name, clf in self._classifiers.items():
            bad = [c for c in clf.columns if c not in schema.num_columns]
            if bad:
                raise SchemaError(f"classifiers[{name!r}] uses non-numeric column(s) {bad}")
        self._schema = schema
        self._layout = Layout(
            n_cat=len(schema.cat_columns), n_num=len(schema.num_columns),
            n_clf=len(self._classifiers), max_values=cfg.max_values,
            relative_accuracy=cfg.relative_accuracy, min_value=DEFAULT_MIN_VALUE,
            max_bins=DEFAULT_MAX_BINS,
        )
        self._encoders = [Encoder(c, cfg.max_codes) for c in schema.cat_columns]

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
        return sorted(n for n, r in self._refs.items() if not r.info.get("pending"))

    @property
    def schema(self) -> Schema:
        if self._schema is None:
            raise NoReferenceError("no data yet: feature kinds are inferred from the first batch")
        return self._schema

    # ================================================================ ingest
    def ingest(self, batch: Any) -> IngestReceipt:
        """Add a batch of records (DataFrame, Arrow table, list of dicts, dict of columns).

        Records carry the attribute and metric columns and optionally `timestamp` (datetime or
        epoch seconds; the ingest time when absent). Unknown columns are ignored. Raises
        SchemaError (naming the column) before any state changes when the batch is malformed.
        """
        with self._lock:
            self._check_open()
            frame = to_frame(batch)
            if len(frame) == 0:
                return IngestReceipt(0, (), (), 0, True, self._durable_through())
            if self._schema is None:
                self._resolve_schema(frame)
                self._save_feature_kinds()
            parsed = parse(frame, self.schema, self._encoders)
            return self._ingest_parsed(parsed)

    def _ingest_parsed(self, parsed: Parsed) -> IngestReceipt:
        cfg = self.config
        flags = self._classify(parsed.num)
        prio = self._priorities(parsed.n)
        pane_ids = np.floor(parsed.ts / cfg.pane_seconds).astype(np.int64)
        lo, hi = int(pane_ids.min()), int(pane_ids.max())
        if lo == hi:
            groups: list[tuple[int, Any]] = [(lo, slice(None))]
        else:
            order = np.argsort(pane_ids, kind="stable")
            sorted_ids = pane_ids[order]
            cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
            groups = [
                (int(sorted_ids[s]), order[s:e])
                for s, e in zip(np.r_[0, cuts], np.r_[cuts, sorted_ids.size], strict=True)
            ]
        newest = hi if self._newest is None else max(self._newest, hi)
        oldest_allowed = newest - cfg.window_panes - 1
        deltas: list[tuple[int, Summary]] = []
        touched = []
        late = 0
        layout = self._layout
        assert layout is not None
        capacity = (cfg.reservoir_size, cfg.flagged_reservoir_size)
        for pane, sel in groups:
            if pane < oldest_allowed and pane not in self._full:
                late += int(parsed.n if isinstance(sel, slice) else len(sel))
                continue
            target = self._full.get(pane)
            if target is None:
                target = self._full[pane] = Summary(layout, capacity)
            ts, cat, num = parsed.ts[sel], parsed.cat[:, sel], parsed.num[:, sel]
            f, p = flags[sel], prio[sel]
            if self.durability == "batch" and self._store is not None:
                delta = Summary(layout, capacity)
                delta.add(ts, cat, num, f, p)
                assert delta.reservoir is not None and target.reservoir is not None
                delta.reservoir.compact()
                target.merge(delta)
                deltas.append((pane, delta))
            else:
                target.add(ts, cat, num, f, p)
            touched.append(pane)
            if self._closed_upto is not None and pane < self._closed_upto:
                self._dirty.add(pane)
        if late:
            self._late_dropped += late
            warnings.warn(
                f"{late} row(s) arrived for panes already rolled up (more than "
                f"{cfg.window_panes + 1} panes late) and were dropped; see Monitor.stats()",
                DataWarning, stacklevel=3,
            )
        self._rows_seen += parsed.n - late
        self._newest = newest
        self._max_ts = max(self._max_ts, float(parsed.ts.max()))
        self._batch_seq += 1
        closed = self._close_due(self._max_ts - cfg.allowed_lateness_seconds)
        durable = False
        if self._store is None:
            self._settle(closed)
        elif self.durability == "batch":
            self._commit(closed, deltas=deltas)
            durable = True
        elif closed or self._dirty:
            self._commit(closed)
        else:
            self._settle([])  # tier moves only; persisted with the next commit
        if self._store is not None and self.durability == "pane":
            through = self._durable_through()
            durable = through is not None and bool(parsed.ts.max() < through)
        return IngestReceipt(
            rows=parsed.n - late, panes=tuple(sorted(set(touched))), closed_panes=tuple(closed),
            late_dropped=late, durable=durable, durable_through=self._durable_through(),
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
        rng = np.random.default_rng([self.config.seed, self._batch_seq])
        return rng.random(n)

    # ================================================================ pane life cycle
    def _close_due(self, watermark: float) -> list[int]:
        """Close panes whose end is at or before `watermark`; returns their ids."""
        upto = math.floor(watermark / self.config.pane_seconds)  # panes < upto end <= watermark
        if self._closed_upto is not None and upto <= self._closed_upto:
            return []
        self._closed_upto = upto
        return sorted(p for p in self._full if p < upto and p not in self._series_done())

    def _series_done(self) -> set[int]:
        return set(self._series)

    def advance(self, now: float | None = None) -> list[int]:
        """Close panes up to wall-clock `now` (epoch seconds) when traffic is idle."""
        with self._lock:
            self._check_open()
            now = time.time() if now is None else float(now)
            closed = self._close_due(now - self.config.allowed_lateness_seconds)
            if self._store is not None and (closed or self._dirty):
                self._commit(closed)
            else:
                self._settle(closed)
            return closed

    def _settle(self, closed: list[int]) -> dict[str, Any]:
        """In-memory work after panes close or change: series, auto reference, tier moves.

        Returns what changed (for the store): series rows, panes to rewrite, tier moves."""
        changes: dict[str, Any] = {"series": {}, "rewrite": set(), "ref": None}
        touched = sorted(set(closed) | self._dirty)
        for p in touched:
            if p in self._full:
                self._series[p] = _series.pane_scalars(self, self._full[p])
                changes["series"][p] = self._series[p]
                changes["rewrite"].add(p)
        self._dirty.clear()
        auto = self.config.auto_reference_panes
        ref = self._refs.get("default")
        if closed and auto and (ref is None or ref.info.get("pending")):
            changes["ref"] = self._auto_reference(closed)
        changes.update(self._move_tiers())
        return changes

    def _move_tiers(self) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {"tiers": {}, "deleted": [], "rollups": {},
                               "drop_rollups_before": None, "drop_series_before": None}
        if self._newest is None or self._closed_upto is None:
            return out
        full_from = self._newest - cfg.window_panes - 1
        for p in sorted(self._full):
            if p < full_from and p < self._closed_upto:
                s = self._full.pop(p)
                s.drop_reservoir()
                self._detail[p] = s
                out["tiers"][p] = _TIER_DETAIL
        detail_from = full_from - cfg.detail_panes
        for p in sorted(self._detail):
            if p < detail_from:
                s = self._detail.pop(p)
                bucket = p // cfg.rollup_panes
                if bucket in self._rollups:
                    self._rollups[bucket].merge(s)
                else:
                    self._rollups[bucket] = s
                out["deleted"].append(p)
                out["rollups"][bucket] = True
        keep_from = self._newest - cfg.retention_panes
        old_buckets = [b for b in self._rollups if (b + 1) * cfg.rollup_panes <= keep_from]
        for b in old_buckets:
            del self._rollups[b]
            out["rollups"].pop(b, None)
        if old_buckets:
            out["drop_rollups_before"] = max(old_buckets) + 1
        old_series = [p for p in self._series if p < keep_from]
        for p in old_series:
            del self._series[p]
        if old_series:
            out["drop_series_before"] = keep_from
        return out

    def _auto_reference(self, closed: list[int]) -> str | None:
        """Merge newly closed panes into the pending 'default' reference (first N panes)."""
        cfg = self.config
        n_target = cfg.auto_reference_panes
        if not n_target:
            return None
        ref = self._refs.get("default")
        if ref is None:
            ref = self._new_reference("default", {"source": "first panes", "pending": True,
                                                  "panes": []})
            self._refs["default"] = ref
        panes = ref.info.setdefault("panes", [])
        for p in sorted(closed):
            if len(panes) >= n_target or p in panes or p not in self._full:
                continue
            ref.summary.merge(self._full[p].copy())
            panes.append(p)
        ref.info["rows"] = ref.summary.n
        if len(panes) >= n_target:
            ref.info["pending"] = False
            ref.info["start"] = iso(ref.summary.t_min)
            ref.info["end"] = iso(ref.summary.t_max)
            self._fit_classifiers(ref)
        return "default"

    def _durable_through(self) -> float | None:
        if self._store is None or self._closed_upto is None:
            return None
        return self._closed_upto * self.config.pane_seconds

    # ================================================================ persistence
    def _open_store(self) -> None:
        store = self._store
        assert store is not None
        meta = store.meta()
        if "config" not in meta:
            with store.transaction() as w:
                w.put_meta("config", self.config.to_json())
                w.put_meta("schema_version", 1)
            if self._schema is not None:
                self._save_feature_kinds()
            return
        stored = Config(**meta["config"])
        diffs = self.config.differences(stored)
        if diffs:
            raise StateError(
                f"directory {self.directory!r} holds a monitor with another configuration: "
                + "; ".join(diffs)
            )
        kinds = meta.get("feature_kinds")
        if self._schema is None and kinds is not None:
            self.config.features = dict(kinds)
            self._resolve_schema(None)
        if self._schema is None:
            return  # no data was ever stored
        layout = self._layout
        assert layout is not None
        for col, values in store.codes().items():
            enc = self._encoders[col]
            enc.extend(values)
            enc.persisted = len(values)
        for pane, tier, blob in store.panes():
            s = Summary.from_bytes(layout, blob)
            (self._detail if tier == _TIER_DETAIL else self._full)[pane] = s
        capacity = (self.config.reservoir_size, self.config.flagged_reservoir_size)
        for _seq, pane, blob in store.deltas():
            delta = Summary.from_bytes(layout, blob)
            target = self._full.get(pane)
            if target is None:
                target = self._full[pane] = Summary(layout, capacity)
            target.merge(delta)
        for bucket, blob in store.rollups():
            self._rollups[bucket] = Summary.from_bytes(layout, blob)
        self._series = store.series()
        for name, blob, info in store.refs():
            self._refs[name] = _Reference(name, Summary.from_bytes(layout, blob), info)
        state = meta.get("state", {})
        self._newest = state.get("newest")
        self._closed_upto = state.get("closed_upto")
        self._max_ts = state.get("max_ts", -math.inf) or -math.inf
        self._batch_seq = state.get("batch_seq", 0)
        self._late_dropped = state.get("late_dropped", 0)
        self._rows_seen = state.get("rows_seen", 0)
        for name, fitted in meta.get("classifier_state", {}).items():
            clf = self._classifiers.get(name)
            if clf is not None:
                _restore_fit(clf, fitted)

    def _save_feature_kinds(self) -> None:
        if self._store is None:
            return
        with self._store.transaction() as w:
            w.put_meta("feature_kinds", self._feature_kinds)

    def _state_meta(self) -> dict[str, Any]:
        return {
            "newest": self._newest,
            "closed_upto": self._closed_upto,
            "max_ts": self._max_ts if math.isfinite(self._max_ts) else None,
            "batch_seq": self._batch_seq,
            "late_dropped": self._late_dropped,
            "rows_seen": self._rows_seen,
        }

    def _commit(
        self, closed: list[int], deltas: list[tuple[int, Summary]] | None = None,
        open_panes: bool = False,
    ) -> None:
        """Apply pane-close work and write it, with `deltas` and new codes, in one transaction."""
        store = self._store
        assert store is not None
        changes = self._settle(closed)
        rewrite = changes["rewrite"]
        with store.transaction() as w:
            for col, enc in enumerate(self._encoders):
                if len(enc) > enc.persisted:
                    w.add_codes(col, enc.persisted, enc.values[enc.persisted :])
            for pane, delta in deltas or []:
                if pane not in rewrite:
                    w.add_delta(pane, delta.to_bytes())
            for p in sorted(rewrite):
                if p in self._full:
                    w.put_pane(p, _TIER_FULL, self._full[p].to_bytes())
            for p, tier in changes.get("tiers", {}).items():
                if tier == _TIER_DETAIL and p in self._detail:
                    w.put_pane(p, _TIER_DETAIL, self._detail[p].to_bytes())
            for p in changes.get("deleted", []):
                w.delete_pane(p)
            for bucket in changes.get("rollups", {}):
                if bucket in self._rollups:
                    w.put_rollup(bucket, self._rollups[bucket].to_bytes())
            if changes.get("drop_rollups_before") is not None:
                w.delete_rollups_before(changes["drop_rollups_before"])
            for p, data in changes.get("series", {}).items():
                w.put_series(p, data)
            if changes.get("drop_series_before") is not None:
                w.delete_series_before(changes["drop_series_before"])
            if changes.get("ref"):
                self._write_ref(w, changes["ref"])
            if open_panes:
                for p, s in self._full.items():
                    if self._closed_upto is None or p >= self._closed_upto:
                        w.put_pane(p, _TIER_OPEN, s.to_bytes())
            w.put_meta("state", self._state_meta())
        for enc in self._encoders:
            enc.persisted = len(enc)

    def _write_ref(self, w: Any, name: str) -> None:
        ref = self._refs[name]
        w.put_ref(name, ref.summary.to_bytes(), ref.info)
        w.put_meta("classifier_state", {n: c.describe() for n, c in self._classifiers.items()
                                        if c.needs_fit and c.fitted})

    def flush(self) -> None:
        """Make everything ingested so far durable (open panes included)."""
        with self._lock:
            self._check_open()
            if self._store is not None:
                self._commit([], open_panes=True)

    def close(self) -> None:
        """Flush and release the directory. Further calls raise."""
        with self._lock:
            if self._store is not None and not self._store.closed:
                self._commit([], open_panes=True)
                self._store.close()
            self._closed = True

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise StateError("this Monitor is closed")

    # ================================================================ references
    def _new_reference(self, name: str, info: dict[str, Any]) -> _Reference:
        layout = self._layout
        assert layout is not None
        k = self.config.reference_reservoir_size
        return _Reference(name, Summary(layout, (k, k)), {"name": name, **info})

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
            frame = to_frame(batch)
            if len(frame) == 0:
                raise ValueError("set_reference needs at least one record")
            if self._schema is None:
                self._resolve_schema(frame)
                self._save_feature_kinds()
            parsed = parse(frame, self.schema, self._encoders, argument="batch")
            ref = self._refs.get(name) if append else None
            if ref is None:
                ref = self._new_reference(name, {"source": "batch"})
            flags = self._classify(parsed.num) if name != "default" else np.zeros(
                parsed.n, dtype=np.uint32
            )
            rng = np.random.default_rng([self.config.seed, 1 << 30, len(name), self._batch_seq])
            self._batch_seq += 1
            part = Summary(ref.summary.layout, (self.config.reference_reservoir_size,) * 2)
            part.add(parsed.ts, parsed.cat, parsed.num, flags, rng.random(parsed.n))
            ref.summary.merge(part)
            ref.info.update(rows=ref.summary.n, start=iso(ref.summary.t_min),
                            end=iso(ref.summary.t_max), pending=False)
            self._refs[name] = ref
            if name == "default":
                self._fit_classifiers(ref)
            if self._store is not None:
                with self._store.transaction() as w:
                    for col, enc in enumerate(self._encoders):
                        if len(enc) > enc.persisted:
                            w.add_codes(col, enc.persisted, enc.values[enc.persisted :])
                    self._write_ref(w, name)
                    w.put_meta("state", self._state_meta())
                for enc in self._encoders:
                    enc.persisted = len(enc)
            return dict(ref.info)

    def _fit_classifiers(self, ref: _Reference) -> None:
        sample = self.reference_sample(ref.name)
        values = sample.column_values(self.schema.num_columns)
        for clf in self._classifiers.values():
            if clf.needs_fit:
                try:
                    clf.fit(values, sample.weight)
                except ValueError as exc:
                    warnings.warn(f"classifier not fitted: {exc}", DataWarning, stacklevel=3)

    def reference(self, name: str = "default") -> _Reference:
        ref = self._refs.get(name)
        if ref is None or ref.info.get("pending"):
            have = sorted(n for n, r in self._refs.items() if not r.info.get("pending"))
            raise NoReferenceError(
                f"no reference named {name!r} (have {have}); call set_reference(batch, "
                f"name={name!r}) or construct the Monitor with auto_reference_panes=N"
            )
        return ref

    def reference_sample(self, name: str = "default") -> Sample:
        ref = self._refs[name]
        assert ref.summary.reservoir is not None
        return Sample.from_reservoirs([ref.summary.reservoir], self._layout.n_cat,
                                      self._layout.n_num)

    # ================================================================ windows
    def _window_ids(self, end: int | None = None) -> list[int]:
        if self._newest is None:
            return []
        end = self._newest if end is None else end
        start = end - self.config.window_panes + 1
        return [p for p in range(start, end + 1) if p in self._full]

    def window_summary(self, end: int | None = None) -> Summary | None:
        """Counts and sketches of the window ending at pane `end` (default: newest)."""
        ids = self._window_ids(end)
        if not ids:
            return None
        out = self._full[ids[0]].copy(with_reservoir=False)
        for p in ids[1:]:
            s = self._full[p]
            res, s.reservoir = s.reservoir, None
            try:
                out.merge(s)
            finally:
                s.reservoir = res
        return out

    def window_sample(self, end: int | None = None) -> Sample:
        ids = self._window_ids(end)
        layout = self._layout
        n_cat = 0 if layout is None else layout.n_cat
        n_num = 0 if layout is None else layout.n_num
        return Sample.from_reservoirs([self._full[p].reservoir for p in ids], n_cat, n_num)

    def window_info(self, end: int | None = None) -> dict[str, Any]:
        ids = self._window_ids(end)
        if not ids:
            return {"panes": 0, "rows": 0, "start": None, "end": None}
        ps = self.config.pane_seconds
        end_id = self._newest if end is None else end
        return {
            "panes": len(ids),
            "rows": int(sum(self._full[p].n for p in ids)),
            "start": iso((end_id - self.config.window_panes + 1) * ps),
            "end": iso((end_id + 1) * ps),
        }

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
        reference: str = "default",
    ) -> Explanation:
        """Anomalies: attribute combinations over-represented among the window's outliers.

        Outliers are rows flagged by `classifier` (a registered name, a predicate string such
        as ``"latency_ms > 50"`` or a Classifier) or, by default, by `metric`'s percentile
        classifier fitted on the reference. ``ratio_metric="mean_shift"`` needs only `metric`.
        """
        with self._lock:
            self._check_open()
            return _queries.explain_anomalies(
                self, metric, classifier, ratio_metric, attributes, min_support, min_ratio,
                max_order, confidence, reference,
            )

    def mix_shift(
        self,
        reference: str = "default",
        *,
        attributes: Sequence[str] | None = None,
        direction: str = "grew",
        min_support: float = _queries.DEFAULT_MIN_SUPPORT,
        min_ratio: float = _queries.DEFAULT_MIN_RATIO,
        max_order: int = _queries.DEFAULT_MAX_ORDER,
        confidence: float = _queries.DEFAULT_CONFIDENCE,
    ) -> Explanation:
        """Mix shift: segments whose share of traffic grew (or shrank) against the reference.

        `ratio` and `risk_ratio` are share ratios: the segment's share of window rows over its
        share of reference rows; `support` is its share of window rows.
        """
        with self._lock:
            self._check_open()
            return _queries.explain_mix_shift(
                self, reference, attributes, direction, min_support, min_ratio, max_order,
                confidence,
            )

    def conditional_shift(
        self,
        reference: str = "default",
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
    ) -> DriftReport:
        """Conditional shift: per-segment drift tests inside the top segments.

        A row is `localized` when the column drifted inside the segment at least
        `localization` times more (effect size) than outside it.
        """
        with self._lock:
            self._check_open()
            return _drift.conditional_shift(
                self, reference, columns, segments, min_share, max_segments, alpha,
                numeric_effect, categorical_effect, min_samples, localization,
            )

    def drift(
        self,
        reference: str = "default",
        *,
        columns: Sequence[str] | None = None,
        alpha: float = _drift.DEFAULT_ALPHA,
        numeric_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        categorical_effect: float = _drift.DEFAULT_CATEGORICAL_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
        persistence: tuple[int, int] = _drift.DEFAULT_PERSISTENCE,
    ) -> DriftReport:
        """Per-column drift of the window against a reference.

        A column is `drifted` when, in at least persistence[0] of the last persistence[1]
        windows (ending at the newest pane and the panes before it), its BH-adjusted p-value
        is below `alpha`, its effect size minus the sketch's error bound reaches the
        threshold, and both sides hold at least `min_samples` rows.
        """
        with self._lock:
            self._check_open()
            return _drift.column_drift(
                self, reference, columns, alpha, numeric_effect, categorical_effect,
                min_samples, persistence,
            )

    def change_points(
        self,
        series: Sequence[str] | None = None,
        *,
        delta: float = _series.DEFAULT_DELTA,
        threshold: float = _series.DEFAULT_THRESHOLD,
        burn_in: int = _series.DEFAULT_BURN_IN,
    ) -> ChangePoints:
        """When did per-pane series change (p99 latency, error rate, expensive-level share)?"""
        with self._lock:
            self._check_open()
            return _series.change_points(self, series, delta, threshold, burn_in)

    def series(self, names: Sequence[str] | None = None) -> pd.DataFrame:
        """Per-pane scalar series of closed panes (index: pane start, UTC)."""
        with self._lock:
            return _series.series_frame(self, names)

    def cascade_health(
        self,
        reference: str = "default",
        *,
        min_share: float = _drift.DEFAULT_MIN_SHARE,
        max_segments: int = _drift.DEFAULT_MAX_SEGMENTS,
        alpha: float = _cascade.DEFAULT_HEALTH_ALPHA,
        min_drop: float = _cascade.DEFAULT_MIN_DROP,
        confidence_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
    ) -> CascadeHealth:
        """Is the cheap cascade level still answering as often, and as confidently, as it did
        on the reference, overall and per segment?"""
        with self._lock:
            self._check_open()
            return _cascade.cascade_health(
                self, reference, min_share, max_segments, alpha, min_drop, confidence_effect,
                min_samples,
            )

    # ================================================================ introspection
    def memory_bytes(self) -> int:
        """Bytes held by pane, rollup and reference state (numpy buffers + small overhead)."""
        with self._lock:
            total = sum(s.nbytes() for s in self._full.values())
            total += sum(s.nbytes() for s in self._detail.values())
            total += sum(s.nbytes() for s in self._rollups.values())
            total += sum(r.summary.nbytes() for r in self._refs.values())
            total += 200 * len(self._series) * max(1, len(self.config.metrics))
            total += sum(64 * len(e) for e in self._encoders)
            return int(total)

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, JSON-ready.

        rows_ingested counts rows accepted since creation (after a restart: as of the last
        commit, which with durability='pane' may include rows of an open pane that was lost);
        rows_retained counts rows in the state actually held.
        """
        with self._lock:
            nonfinite = {}
            missing = {}
            if self._schema is not None:
                for group in (self._full, self._detail, self._rollups):
                    for s in group.values():
                        for j, col in enumerate(self._schema.num_columns):
                            nonfinite[col] = nonfinite.get(col, 0) + int(s.nonfinite[j])
                            missing[col] = missing.get(col, 0) + int(s.missing[j])
            return {
                "rows_ingested": int(self._rows_seen),
                "rows_retained": int(
                    sum(s.n for g in (self._full, self._detail, self._rollups) for s in g.values())
                ),
                "late_dropped": int(self._late_dropped),
                "panes_full": len(self._full),
                "panes_detail": len(self._detail),
                "rollups": len(self._rollups),
                "series_panes": len(self._series),
                "newest_pane_start": None if self._newest is None else iso(
                    self._newest * self.config.pane_seconds),
                "durable_through": iso(self._durable_through()),
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
