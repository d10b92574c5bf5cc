"""`Monitor`: the thin facade users and serving call.

Why this shape: each part has one job and is tested alone. Rows are parsed and encoded
(drift._ingest, drift._encode), classified (drift._classify) and added to their panes by the pane
log (drift._panes); every other state change is planned as a change set (drift._changes),
written by the store in one transaction (drift._store) and only then applied to memory — the
coordination lives in drift._engine. Queries run on a read-only View (drift._view) taken under
the lock in microseconds and evaluated without it; the detectors (drift._queries, drift._drift,
drift._series, drift._cascade) combine a statistic, a decision rule (drift._rules) and a window,
and all return a Result (drift._results). This class checks arguments, holds the lock and
delegates.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from drift import _cascade, _drift, _queries, _sequential, _series
from drift._changepoint import PageHinkley
from drift._classify import Classifier, classifier_from_config
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
    build_config,
)
from drift._counts import DEFAULT_MAX_VALUES
from drift._encode import DEFAULT_MAX_CODES, DEFAULT_MAX_VALUE_LENGTH, clean_text
from drift._engine import LIVE_HORIZON_SECONDS, Engine, IngestReceipt
from drift._errors import NoReferenceError, StateError
from drift._frontier import DEFAULT_FRONTIER_BATCHES
from drift._ingest import Schema
from drift._references import Reference, iso
from drift._reservoir import DEFAULT_FLAGGED_RESERVOIR_SIZE, DEFAULT_RESERVOIR_SIZE
from drift._results import (
    CascadeHealth,
    ChangePoints,
    DriftReport,
    Explanation,
    SequentialDrift,
)
from drift._rules import EffectGate, Persistence
from drift._sample import Sample
from drift._sketch import DEFAULT_RELATIVE_ACCURACY
from drift._store import Store
from drift._summary import Summary
from drift._view import View, no_data

DURABILITY_MODES = ("pane", "batch")

__all__ = ["LIVE_HORIZON_SECONDS", "IngestReceipt", "Monitor", "iso"]


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
    max_value_length : longest categorical string kept, in characters; longer ones are cut
        (ending in drift._encode.TRUNCATION_MARKER) and counted in ``stats()['truncated_values']``.
        Lone UTF-16 surrogates become U+FFFD (``stats()['invalid_unicode_values']``), so no
        value can stop the SQLite store.
    relative_accuracy : quantile sketch accuracy (relative to the distance from the column's
        centre).
    reservoir_size, flagged_reservoir_size : rows sampled per pane (unflagged / flagged rows).
    history_reservoir_size, history_flagged_reservoir_size : rows kept per pane and per rollup
        once a pane leaves the window (time-range queries on history use them).
    reference_reservoir_size : rows sampled per stratum for a reference.
    auto_reference_panes : freeze the first N closed panes as the 'default' reference.
    request_column : column holding each row's request id (serving writes ``request_id``).
        Rows of one request share its latency, client and time, so every interval and test
        then counts requests, not rows (cluster-robust design effects, drift._clusters), and
        samples keep or drop a request whole. None: rows are independent.
    max_future_seconds : rows whose pane starts further than this past the time frontier (or
        a live clock) are quarantined: held per pane (at most MAX_HELD_PANES), counted, in no
        window, and released into their panes once the frontier comes within this of them.
    frontier_batches : the time frontier (drift._frontier), which closes panes and ends the
        window, follows a batch connected to it at once; a batch starting further ahead moves
        it only when more than half of the last `frontier_batches` batches reach that far, so
        one skewed source (under half the batches) never moves it. With clock='auto' the live
        decision is the majority of the same number of batches.
    clock : 'auto' (default: the wall clock once event times are live, i.e. the medians of most
        recent batches lie within LIVE_HORIZON_SECONDS of it), None (event time only), or a
        callable returning epoch seconds. With a clock, idle time closes panes and slides the
        window.
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
        max_value_length: int = DEFAULT_MAX_VALUE_LENGTH,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        reservoir_size: int = DEFAULT_RESERVOIR_SIZE,
        flagged_reservoir_size: int = DEFAULT_FLAGGED_RESERVOIR_SIZE,
        history_reservoir_size: int = DEFAULT_HISTORY_RESERVOIR_SIZE,
        history_flagged_reservoir_size: int = DEFAULT_HISTORY_FLAGGED_RESERVOIR_SIZE,
        reference_reservoir_size: int = DEFAULT_REFERENCE_RESERVOIR_SIZE,
        auto_reference_panes: int | None = None,
        max_future_seconds: float = DEFAULT_MAX_FUTURE_SECONDS,
        request_column: str | None = None,
        frontier_batches: int = DEFAULT_FRONTIER_BATCHES,
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
            max_value_length=max_value_length,
            relative_accuracy=float(relative_accuracy), reservoir_size=reservoir_size,
            flagged_reservoir_size=flagged_reservoir_size,
            reference_reservoir_size=reference_reservoir_size,
            auto_reference_panes=auto_reference_panes, seed=seed,
            high_tail_metrics=None if high_tail_metrics is None else list(high_tail_metrics),
            history_reservoir_size=history_reservoir_size,
            history_flagged_reservoir_size=history_flagged_reservoir_size,
            max_future_seconds=max_future_seconds, request_column=request_column,
            frontier_batches=frontier_batches,
        )
        self.directory = None if directory is None else os.fspath(directory)
        self.durability = durability
        self.fsync = bool(fsync)
        self._lock = threading.RLock()
        self._engine = Engine(self.config, self._classifiers, self.directory, durability,
                              self.fsync, clock)
        self._pane_effects = _sequential.PaneEffects()  # memo only: derivable from the panes

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
        with self._lock:
            return self._engine.references

    @property
    def schema(self) -> Schema:
        if self._engine._schema is None:
            raise no_data()
        return self._engine._schema

    # parts, for tests and tools that look inside (not a stable API)
    @property
    def _encoders(self) -> list:
        return self._engine._encoders

    @property
    def _store(self) -> Store | None:
        return self._engine._store

    @property
    def _log(self) -> Any:
        return self._engine._log

    @property
    def _schema(self) -> Schema | None:
        return self._engine._schema

    # ================================================================ state changes
    def ingest(self, batch: Any, *, batch_id: str | None = None) -> IngestReceipt:
        """Add a batch of records (DataFrame, Arrow table, list of dicts, dict of columns).

        Records carry the attribute and metric columns and optionally `timestamp` (datetime or
        epoch seconds; the ingest time when absent). Unknown columns are ignored. Raises
        SchemaError (naming the column) before any state changes when the batch is malformed.

        `batch_id` (a string up to 200 characters) makes the call idempotent: a batch whose id
        is among the last 1,024 ingested is skipped (the receipt says `duplicate`, the
        `duplicate_batches` counter counts it), so a sender that never heard back may send it
        again. The ids are saved with the state, in the same commit as their rows.
        """
        with self._lock:
            return self._engine.ingest(batch, batch_id)

    def advance(self, now: float | None = None) -> list[int]:
        """Close panes up to `now` (epoch seconds; the clock's or wall-clock time when None)
        and slide the window there: idle traffic still moves time on."""
        with self._lock:
            return self._engine.advance(now)

    def set_reference(self, batch: Any, name: str = "default", *, append: bool = False) -> dict:
        """Freeze a named baseline from records shaped like `ingest` input.

        The 'default' reference also fits every classifier that needs data (percentile, MAD).
        With append=True the batch is added to an existing reference of that name (for
        training sets streamed in chunks). Returns the reference's description.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        if clean_text(name, len(name))[1]:  # it is a database key: it must be UTF-8 text
            raise ValueError(f"name {name!r} holds a lone UTF-16 surrogate (not text)")
        with self._lock:
            return self._engine.set_reference(batch, name, append=append)

    def reference(self, name: str = "default") -> Reference:
        with self._lock:
            return self._engine.reference(name)

    def flush(self) -> None:
        """Make everything ingested so far durable (open panes included)."""
        with self._lock:
            self._engine.flush()

    def close(self) -> None:
        """Flush and release the directory. Further calls raise."""
        with self._lock:
            self._engine.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ================================================================ views
    def _view(self, window: Any = None, as_of: Any = None) -> View:
        """A snapshot to query, taken under the lock; the query then runs without it."""
        with self._lock:
            return self._engine.view(window, as_of)

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
        """The value behind `code` (under the lock: ingest may be adding codes)."""
        with self._lock:
            return self._engine._encoders[column_index].label(code)

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
        min_samples: int = _drift.DEFAULT_SEGMENT_MIN_SAMPLES,
        localization: float = _drift.DEFAULT_LOCALIZATION,
        window: Any = None,
        as_of: Any = None,
    ) -> DriftReport:
        """Conditional shift: per-segment drift tests inside the top segments.

        A row is `localized` when the column drifted inside the segment at least
        `localization` times more (effect size) than outside it. Effects are in the units of
        the column's whole reference (robust W1); `min_samples` is per side of a segment
        (default DEFAULT_SEGMENT_MIN_SAMPLES: a segment is a few percent of the reference).
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

    def sequential_drift(
        self,
        reference: Any = "default",
        *,
        columns: Sequence[str] | None = None,
        false_alarms_per_day: float = _sequential.DEFAULT_FALSE_ALARMS_PER_DAY,
        burn_in: int = _sequential.DEFAULT_SEQUENTIAL_BURN_IN,
        numeric_effect: float = _drift.DEFAULT_NUMERIC_EFFECT,
        categorical_effect: float = _drift.DEFAULT_CATEGORICAL_EFFECT,
        min_samples: int = _drift.DEFAULT_MIN_SAMPLES,
        as_of: Any = None,
    ) -> SequentialDrift:
        """Per-column drift as soon as a CUSUM of per-pane effects says so (drift._sequential).

        Each closed pane's effect against `reference` (the effect `drift()` uses) is compared
        with its in-control level learned on the first `burn_in` held panes; a column is
        `drifted` once the cumulative log-likelihood ratio of "in-control + the gate" against
        "in-control" passes log(average run length), the run length set so that all columns
        together raise at most `false_alarms_per_day` false alarms. `start` / `start_pane` say
        when the change began, `detected` / `detected_pane` when it was seen. Answers from
        the panes the monitor holds (72 at the defaults), so a restart gives the same answer;
        a change older than that is `drift()`'s to report.
        """
        gate = EffectGate(_drift.DEFAULT_ALPHA, numeric_effect, categorical_effect, min_samples)
        view = self._view(None, as_of)
        return _sequential.sequential_drift(view, reference, columns, gate,
                                            float(false_alarms_per_day), burn_in,
                                            self._pane_effects)

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
        """Bytes held by pane, rollup and reference state (numpy buffers + small overhead) and
        by the categorical dictionaries (each value's own size, so long strings count)."""
        with self._lock:
            return self._engine.memory_bytes()

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, JSON-ready.

        rows_ingested counts rows accepted since creation (after a restart: as of the last
        commit, which with durability='pane' may include rows of an open pane that was lost);
        rows_retained counts rows in the state actually held.
        """
        with self._lock:
            return self._engine.stats()
