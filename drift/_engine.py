"""The monitor's coordinator: one step at a time, planned, committed, then applied.

Why separate from the `Monitor` facade: this is the part persistence must follow exactly. Each
step (an ingest, an idle tick, a reference, a flush) adds rows to their open panes, asks the pane
log to plan what closes and moves (a `ChangeSet`), adds the automatic reference, new codes and
counters to the plan, has the store write it in one transaction, and only then applies it to
memory. Queries get a `View` snapshot (`view()`); the facade holds the lock around every call.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from drift import _references, _schema, _series
from drift._batch_ids import RecentBatchIds, check_batch_id
from drift._changes import TIER_DETAIL, ChangeSet
from drift._classify import MAD, Classifier, Percentile
from drift._clusters import request_priorities
from drift._config import (
    Config,
)
from drift._encode import Encoder
from drift._errors import DataWarning, StateError
from drift._frontier import Frontier
from drift._ingest import Parsed, Schema, parse, to_frame
from drift._panes import Horizons, PaneLog
from drift._references import Reference, iso
from drift._sample import Sample
from drift._store import Store
from drift._summary import Layout, Summary
from drift._view import Labels, View, cheap_code, no_data

#: A batch whose median event time is within this many seconds of the wall clock votes the
#: stream live for clock='auto' (replays of older data never do); the majority of the last
#: `frontier_batches` votes decides (drift._frontier).
LIVE_HORIZON_SECONDS = 300.0
#: Most panes of quarantined rows held at once; beyond, the panes furthest ahead are dropped
#: (counted in stats()['quarantine_dropped']).
MAX_HELD_PANES = 64

__all__ = ["LIVE_HORIZON_SECONDS", "MAX_HELD_PANES", "Engine", "IngestReceipt"]


def wall_time() -> float:
    """The wall clock clock='auto' follows (a seam for tests to set explicit times)."""
    return time.time()


@dataclass(frozen=True)
class IngestReceipt:
    """What one `ingest` call did.

    panes / closed_panes: pane ids (floor(timestamp / pane_seconds)) the batch touched / that
    closed during the call. late_dropped: rows too late to merge; quarantined: rows dated too
    far ahead of the time frontier, held until it reaches them (see Monitor.stats()). durable: every row of this batch is committed to
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
    #: the batch's id was ingested before (drift._batch_ids): nothing was added this time, and
    #: ``durable`` says whether the first copy's rows are surely committed (durability='batch')
    duplicate: bool = False


class Engine:
    """Schema, encoders, pane log, references, counters and the store of one monitor."""

    def __init__(self, config: Config, classifiers: dict[str, Classifier],
                 directory: str | None, durability: str, fsync: bool,
                 clock: str | Callable[[], float] | None) -> None:
        self.config = config
        self._classifiers = classifiers
        self.directory = directory
        self.durability = durability
        self.fsync = fsync
        self._clock = clock
        self._frontier = Frontier(config.frontier_batches)
        self._held: dict[int, Summary] = {}  # quarantined rows per pane, not yet released
        self._kinds: dict[str, str] | None = None
        self._schema: Schema | None = None
        self._layout: Layout | None = None
        self._layout_saved = False
        self._encoders: list[Encoder] = []
        self._log: PaneLog | None = None
        self._refs: dict[str, Reference] = {}
        self._counters = {"rows_seen": 0, "late_dropped": 0, "quarantined": 0, "batch_seq": 0,
                          "released": 0, "quarantine_dropped": 0, "skewed_batches": 0,
                          "duplicate_batches": 0}
        self._batch_ids = RecentBatchIds()
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

    # ================================================================ clock
    def _now(self) -> float | None:
        """The clock's time, when this monitor follows one."""
        if self._clock is None:
            return None
        if self._clock == "auto":
            return wall_time() if self._frontier.live else None
        return float(self._clock())  # type: ignore[operator]

    # ================================================================ ingest
    def ingest(self, batch: Any, batch_id: str | None = None) -> IngestReceipt:
        self.check_open()
        batch_id = check_batch_id(batch_id)
        if batch_id is not None and batch_id in self._batch_ids:
            self._counters["duplicate_batches"] += 1
            # the first copy's rows are committed with it under durability='batch'; under 'pane' they
            # may still sit in an open pane (durable_through says how far the saved state reaches)
            durable = self._store is not None and self.durability == "batch"
            return IngestReceipt(0, (), (), 0, durable, self._durable_through(), duplicate=True)
        parsed = self._prepare(batch, "batch")
        if batch_id is not None:  # before the commit below, which saves it with the rows
            self._batch_ids.add(batch_id)
        if parsed is None:  # an empty batch: its id alone (saved with the next commit)
            return IngestReceipt(0, (), (), 0, True, self._durable_through())
        return self._ingest_parsed(parsed, self._screen(parsed))

    def _screen(self, parsed: Parsed) -> np.ndarray:
        """Move the time frontier with this batch; the mask of rows to hold (quarantine).

        The frontier moves on the rows below any gap of more than `max_future_seconds` above
        the batch median (a skewed client's cluster inside a mixed batch), and only as
        drift._frontier allows. Rows whose pane starts more than `max_future_seconds` past the
        frontier (or a live clock) are held, whichever batch they came in."""
        cfg = self.config
        ts = parsed.ts
        future = cfg.max_future_seconds
        lo, hi = float(ts.min()), float(ts.max())
        frontier = self._frontier
        if self._clock == "auto":
            mid = float(np.median(ts)) if hi - lo > future else 0.5 * (lo + hi)
            frontier.vote(abs(mid - wall_time()) <= LIVE_HORIZON_SECONDS)
        body = ts
        if hi - lo > future:
            order = np.sort(ts)
            half = order.size // 2
            gaps = np.flatnonzero(np.diff(order[half:]) > future)
            if gaps.size:
                body = order[: half + int(gaps[0]) + 1]
        now = self._now()
        if frontier.observe(body, now, future, trusted=parsed.stamped) is not None:
            self._counters["skewed_batches"] += 1
        limit = self._hold_limit(now)
        hold = np.floor(ts / cfg.pane_seconds) > limit
        return hold

    def _hold_limit(self, now: float | None) -> float:
        """Panes after this one are held: they start over `max_future_seconds` past the
        frontier (or the clock)."""
        base = self._frontier.base(now)
        if not math.isfinite(base):
            return math.inf
        return float(math.floor((base + self.config.max_future_seconds)
                                / self.config.pane_seconds))

    def _hold(self, pane_ids: np.ndarray, part: tuple[np.ndarray, ...],
              cs: ChangeSet) -> None:
        """Add quarantined rows to their held panes (bounded by MAX_HELD_PANES)."""
        capacity = (self.config.reservoir_size, self.config.flagged_reservoir_size)
        for pane in np.unique(pane_ids):
            sel = pane_ids == pane
            target = self._held.get(int(pane))
            if target is None:
                target = self._held[int(pane)] = Summary(self._layout, capacity)
            target.add(*(a[..., sel] for a in part))
            cs.held_put[int(pane)] = target
        while len(self._held) > MAX_HELD_PANES:
            far = max(self._held)
            self._counters["quarantine_dropped"] += int(self._held.pop(far).n)
            cs.held_put.pop(far, None)
            cs.held_drop.add(far)

    def _release(self, now: float | None, cs: ChangeSet) -> None:
        """Merge held panes the frontier has come within `max_future_seconds` of into the log."""
        if not self._held:
            return
        limit = self._hold_limit(now)
        log = self._log
        assert log is not None
        late = 0
        for pane in sorted(p for p in self._held if p <= limit):
            rows = self._held.pop(pane)
            cs.held_drop.add(pane)
            cs.held_put.pop(pane, None)
            if not log.merge_pane(pane, rows):
                late += int(rows.n)
                continue
            self._counters["released"] += int(rows.n)
            self._counters["rows_seen"] += int(rows.n)
            if log.is_open(pane):
                cs.open_put[pane] = log.full[pane]  # held rows were durable: stay so
        if late:
            self._counters["late_dropped"] += late
            warnings.warn(f"{late} quarantined row(s) were released after their pane had "
                          "rolled up and were dropped; see Monitor.stats()", DataWarning,
                          stacklevel=4)

    def _ingest_parsed(self, parsed: Parsed, hold: np.ndarray) -> IngestReceipt:
        cfg = self.config
        log = self._log
        assert log is not None
        flags = self._classify(parsed.num)
        prio = self._priorities(parsed.n, parsed.request)
        pane_ids = np.floor(parsed.ts / cfg.pane_seconds).astype(np.int64)
        held = int(np.count_nonzero(hold))
        held_cs = ChangeSet()
        if held:
            self._hold(pane_ids[hold], (parsed.ts[hold], parsed.cat[:, hold],
                                        parsed.num[:, hold], flags[hold], prio[hold]), held_cs)
            self._counters["quarantined"] += held
            warnings.warn(
                f"{held} row(s) dated more than {cfg.max_future_seconds:.0f} s ahead of the time "
                "frontier (or of the clock) were quarantined (skewed client clock?): held, not "
                "in any window, released when time reaches them; see "
                "Monitor.stats()['quarantined']", DataWarning, stacklevel=3)
            keep = ~hold
            parsed = parsed.take(keep)
            flags, prio, pane_ids = flags[keep], prio[keep], pane_ids[keep]
        batch_deltas = self.durability == "batch" and self._store is not None
        touched: list[int] = []
        late, deltas = 0, []
        if parsed.n:
            touched, late, deltas = log.add(pane_ids, parsed.ts, parsed.cat, parsed.num, flags,
                                            prio, batch_deltas, move_newest=False)
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
        for p, s in held_cs.held_put.items():
            if p in self._held:
                cs.held_put[p] = s
        cs.held_drop |= held_cs.held_drop
        closed = sorted(p for p in cs.series_put if p in log.full)
        self._commit(cs, force=batch_deltas)
        through = self._durable_through()
        if self._store is None:
            durable = False
        elif self.durability == "batch":
            durable = True
        else:
            durable = parsed.n == 0 or (
                through is not None and bool(parsed.ts.max() < through))
        return IngestReceipt(
            rows=parsed.n - late, panes=tuple(sorted(set(touched))), closed_panes=tuple(closed),
            late_dropped=late, durable=durable, durable_through=through, quarantined=held,
        )

    def _classify(self, num: np.ndarray) -> np.ndarray:
        n = num.shape[1]
        flags = np.zeros(n, dtype=np.uint32)
        values = None
        for bit, clf in enumerate(self._classifiers.values()):
            if not clf.fitted:
                continue
            if values is None:
                values = dict(zip(self._schema.num_columns, num, strict=True))
            mask = clf.flags(values)
            if mask.any():
                flags |= mask.astype(np.uint32) << np.uint32(bit)
        return flags

    def _priorities(self, n: int, request: np.ndarray | None = None) -> np.ndarray:
        """Uniform sampling priorities; with request keys, one per request (a hash of its key
        and the seed), so reservoirs keep or drop a request whole and a sample's priorities
        identify its requests (drift._clusters)."""
        if request is not None:
            return request_priorities(request, self.config.seed)
        rng = np.random.default_rng([self.config.seed, self._counters["batch_seq"]])
        return rng.random(n)

    # ================================================================ planning and commits
    def _plan(self, now: float | None = None, force: bool = False) -> ChangeSet:
        """The next step as a change set: pane closes, tier moves, auto reference, codes, meta."""
        cfg = self.config
        log = self._log
        assert log is not None and self._schema is not None
        now = self._now() if now is None else now
        released = ChangeSet()
        self._release(now, released)
        frontier = self._frontier.base(now)
        watermark = frontier - cfg.allowed_lateness_seconds
        # the window ends at the frontier's pane: rows ahead of it wait beyond the window
        now_pane = math.floor(frontier / cfg.pane_seconds) if math.isfinite(frontier) else None
        labels = self._labels()
        cheap = cheap_code(cfg, self._schema, labels, self._refs.get("default"))
        classifiers = self._classifiers

        def scalars(s: Summary) -> dict[str, float]:
            return _series.pane_scalars(cfg, self._schema, classifiers, cheap, s)

        cs = log.plan(watermark, scalars, now_pane, force=force) if math.isfinite(
            watermark) else ChangeSet()
        cs.held_put.update(released.held_put)
        cs.held_drop |= released.held_drop
        for p, s in released.open_put.items():
            if p not in cs.full_put and p not in cs.full_drop:
                cs.open_put[p] = s
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
        cs.meta["state"] = {"newest": newest, "closed_upto": closed_upto,
                            "frontier": self._frontier.to_json(), **self._counters,
                            "batch_ids": self._batch_ids.to_json()}

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
        self.check_open()
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
        if "frontier" in state:
            self._frontier.restore(state["frontier"])
        elif state.get("max_ts") is not None:  # state written before the frontier existed
            self._frontier.value = float(state["max_ts"])
        self._held = {pane: Summary.from_bytes(layout, blob) for pane, blob in store.held()}
        for key in self._counters:
            self._counters[key] = int(state.get(key, 0) or 0)
        self._batch_ids = RecentBatchIds(ids=state.get("batch_ids", ()))
        for name, fitted in meta.get("classifier_state", {}).items():
            clf = self._classifiers.get(name)
            if clf is not None:
                _restore_fit(clf, fitted)

    def flush(self) -> None:
        """Commit everything ingested so far, open panes included."""
        self.check_open()
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
        if self._closed:
            return
        try:
            if self._store is not None and not self._store.closed and self._broken is None:
                self._flush()
        finally:
            if self._store is not None:
                self._store.close()
            self._closed = True

    def check_open(self) -> None:
        if self._closed:
            raise StateError("this Monitor is closed")
        if self._broken is not None:
            raise StateError(f"a write to the monitor's database failed ({self._broken}); "
                             "reopen the monitor from its directory")

    # ================================================================ references
    def set_reference(self, batch: Any, name: str = "default", *, append: bool = False) -> dict:
        self.check_open()
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
            return self.view().reference(name)  # raises the explanatory error
        return ref

    @property
    def references(self) -> list[str]:
        return sorted(n for n, r in self._refs.items() if not r.pending)

    # ================================================================ views
    def view(self, window: Any = None, as_of: Any = None) -> View:
        """A snapshot to query (closes idle panes first); the caller holds the lock."""
        self.check_open()
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


    # ================================================================ introspection
    def memory_bytes(self) -> int:
        total = 0 if self._log is None else self._log.nbytes()
        total += sum(s.nbytes() for s in self._held.values())
        total += sum(r.summary.nbytes() for r in self._refs.values())
        total += sum(e.nbytes() for e in self._encoders)
        return int(total)

    def stats(self) -> dict[str, Any]:
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
            "quarantine_held": int(sum(s.n for s in self._held.values())),
            "quarantine_released": int(self._counters["released"]),
            "quarantine_dropped": int(self._counters["quarantine_dropped"]),
            "skewed_batches": int(self._counters["skewed_batches"]),
            "duplicate_batches": int(self._counters["duplicate_batches"]),
            "max_lead_seconds": float(self._frontier.max_lead),
            "frontier": iso(self._frontier.value) if math.isfinite(
                self._frontier.value) else None,
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
            "invalid_unicode_values": {e.column: e.invalid_unicode for e in self._encoders},
            "truncated_values": {e.column: e.truncated for e in self._encoders},
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
