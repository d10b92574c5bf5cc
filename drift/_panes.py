"""The pane log: panes by time, their life cycle, and the change set of every step.

Why a class of its own: the life cycle (open -> closed -> detail -> rollup -> gone) is the
part persistence must follow exactly. `plan()` computes a step (panes that close, tier moves,
rollup merges, per-pane series, retention drops) as a `ChangeSet` without touching the log;
`apply()` makes it so, after the store committed it. Rows of open panes are added in place
(the open pane is what `flush()` or pane close makes durable); a closed pane that receives late
rows is replaced by an updated copy, so snapshots handed to queries never change under them.

Life cycle (memory is bounded whatever the traffic):
  open -> closed (event time passed its end + allowed lateness)
  -> detail (left the window and the two windows of history persistence needs: row sample cut
     to `history_reservoir_size`)
  -> rollup (older than `detail_panes`: merged into `rollup_panes`-long summaries)
  -> gone (older than `retention_panes`). Per-pane scalar series are kept for the retention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from drift._changes import ChangeSet
from drift._summary import Layout, Summary


@dataclass(frozen=True)
class Horizons:
    """Pane length and tier horizons (all in panes except `pane_seconds`)."""

    pane_seconds: float
    window_panes: int
    allowed_lateness_seconds: float
    detail_panes: int
    rollup_panes: int
    retention_panes: int
    capacity: tuple[int, int]
    history_capacity: tuple[int, int]

    @property
    def full_panes(self) -> int:
        """Panes that keep their whole row sample: the window plus two panes of lateness."""
        return self.window_panes + 2


class PaneLog:
    """Panes (full, detail), rollups and per-pane series of one monitor."""

    def __init__(self, layout: Layout, horizons: Horizons) -> None:
        self.layout = layout
        self.h = horizons
        self.full: dict[int, Summary] = {}
        self.detail: dict[int, Summary] = {}
        self.rollups: dict[int, Summary] = {}
        self.series: dict[int, dict[str, float]] = {}
        self.newest: int | None = None
        self.closed_upto: int | None = None  # panes below this id are closed
        self.dirty: set[int] = set()  # closed panes that received late rows
        self._planned: tuple[Any, ...] | None = None

    # ------------------------------------------------------------------ rows
    def oldest_accepted(self, newest: int) -> int:
        """Rows for panes older than this are too late (their pane lost its row sample)."""
        return newest - self.h.full_panes + 1

    def add(
        self,
        pane_ids: np.ndarray,
        ts: np.ndarray,
        cat: np.ndarray,
        num: np.ndarray,
        flags: np.ndarray,
        prio: np.ndarray,
        deltas: bool,
        move_newest: bool = True,
    ) -> tuple[list[int], int, list[tuple[int, Summary]]]:
        """Add rows to their panes; returns (panes touched, rows too late, batch deltas).

        move_newest=False leaves `newest` (the window's end) to the planned step: the engine
        sets it from the time frontier, so rows ahead of it wait in open panes beyond the window
        (see drift._frontier)."""
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
        # late means older than what the log had already rolled out BEFORE this batch: a batch
        # spanning many panes (a backfill) keeps all its rows; they move through the tiers in
        # the next planned step
        oldest = -math.inf if self.newest is None else self.oldest_accepted(self.newest)
        touched: list[int] = []
        out_deltas: list[tuple[int, Summary]] = []
        late = 0
        for pane, sel in groups:
            if pane < oldest and pane not in self.full:
                late += int(ts.size if isinstance(sel, slice) else len(sel))
                continue
            closed = self.closed_upto is not None and pane < self.closed_upto
            target = self.full.get(pane)
            if target is None:
                target = Summary(self.layout, self.h.capacity)
                self.full[pane] = target
            elif closed:
                target = target.copy()  # copy-on-write: snapshots keep the old object
                self.full[pane] = target
            part = (ts[sel], cat[:, sel], num[:, sel], flags[sel], prio[sel])
            if deltas:
                delta = Summary(self.layout, self.h.capacity)
                delta.add(*part)
                assert delta.reservoir is not None
                delta.reservoir.compact()
                target.merge(delta)
                out_deltas.append((pane, delta))
            else:
                target.add(*part)
            touched.append(pane)
            if closed:
                self.dirty.add(pane)
        if move_newest:
            self.newest = hi if self.newest is None else max(self.newest, hi)
        return touched, late, out_deltas

    def merge_pane(self, pane: int, rows: Summary) -> bool:
        """Merge released rows (drift._engine's quarantine) into their pane, as `add` does;
        False when the pane is too late to take them (they are then dropped by the caller)."""
        oldest = -math.inf if self.newest is None else self.oldest_accepted(self.newest)
        if pane < oldest and pane not in self.full:
            return False
        closed = self.closed_upto is not None and pane < self.closed_upto
        target = self.full.get(pane)
        if target is None:
            target = Summary(self.layout, self.h.capacity)
        elif closed:
            target = target.copy()  # copy-on-write: snapshots keep the old object
        target.merge(rows)
        self.full[pane] = target
        if closed:
            self.dirty.add(pane)
        return True

    # ------------------------------------------------------------------ planning
    def plan(
        self,
        watermark: float,
        scalars: Callable[[Summary], dict[str, float]],
        now_pane: int | None = None,
        force: bool = False,
    ) -> ChangeSet:
        """The step that closes panes ending at or before `watermark` and moves tiers.

        `now_pane` (a clock's current pane) slides the window through idle time. Nothing is
        changed here; see `apply`.
        """
        cs = ChangeSet()
        h = self.h
        upto = math.floor(watermark / h.pane_seconds)
        closed_upto = self.closed_upto
        if closed_upto is None or upto > closed_upto:
            cs.closed_upto = upto
            closed_upto = upto
        newest = self.newest
        if now_pane is not None and (newest is None or now_pane > newest):
            cs.newest = now_pane
            newest = now_pane
        key = (closed_upto, newest, tuple(sorted(self.dirty)))
        if not force and key == self._planned:
            return cs  # nothing can have changed since the last planned step
        if closed_upto is None or newest is None:
            return cs
        keep_from = newest - h.retention_panes
        # panes that close now, and closed panes that took late rows: series + rewrite
        for p in sorted(self.full):
            if p < closed_upto and (p not in self.series or p in self.dirty):
                s = self.full[p]
                if s.reservoir is not None:
                    s.reservoir.compact()  # closed panes are read concurrently: no lazy work
                cs.full_put[p] = s
                cs.series_put[p] = scalars(s)
                cs.settled.add(p)
        # panes that closed without any row (idle traffic): a zero in the `rows` series, so a
        # stop is visible and detectable (retention-bounded, never before the first data)
        if self.closed_upto is not None and closed_upto > self.closed_upto:
            for p in range(max(self.closed_upto, keep_from), closed_upto):
                if p not in self.full and p not in self.series and p not in cs.series_put:
                    cs.series_put[p] = {"rows": 0.0}
        # full -> detail (row sample cut to the history size)
        full_from = newest - h.full_panes + 1
        detail = dict(self.detail)
        for p in sorted(self.full):
            if p < full_from and p < closed_upto:
                src = self.full[p]
                s = src.copy(with_reservoir=False)
                if src.reservoir is not None:
                    s.reservoir = src.reservoir.top(h.history_capacity)
                cs.full_drop.add(p)
                cs.detail_put[p] = s
                detail[p] = s
                cs.full_put.pop(p, None)
        # detail -> rollup
        detail_from = full_from - h.detail_panes
        rollups = dict(self.rollups)
        for p in sorted(detail):
            if p < detail_from:
                s = detail[p]
                bucket = p // h.rollup_panes
                if bucket in cs.rollup_put:
                    cs.rollup_put[bucket].merge(s)
                elif bucket in rollups:
                    merged = rollups[bucket].copy()
                    merged.merge(s)
                    cs.rollup_put[bucket] = merged
                else:
                    cs.rollup_put[bucket] = s.copy()
                if merged_reservoir := cs.rollup_put[bucket].reservoir:
                    merged_reservoir.downsample(h.history_capacity)
                cs.detail_drop.add(p)
                cs.detail_put.pop(p, None)
                rollups[bucket] = cs.rollup_put[bucket]
        # retention
        for b in list(rollups):
            if (b + 1) * h.rollup_panes <= keep_from:
                cs.rollup_drop.add(b)
                cs.rollup_put.pop(b, None)
        for p in list(self.series) + list(cs.series_put):
            if p < keep_from:
                cs.series_drop.add(p)
                cs.series_put.pop(p, None)
        return cs

    def apply(self, cs: ChangeSet) -> None:
        """Make a planned (and committed) step so."""
        for p, s in cs.full_put.items():
            self.full[p] = s
        for p in cs.full_drop:
            self.full.pop(p, None)
        self.detail.update(cs.detail_put)
        for p in cs.detail_drop:
            self.detail.pop(p, None)
        self.rollups.update(cs.rollup_put)
        for b in cs.rollup_drop:
            self.rollups.pop(b, None)
        self.series.update(cs.series_put)
        for p in cs.series_drop:
            self.series.pop(p, None)
        if cs.closed_upto is not None:
            self.closed_upto = cs.closed_upto
        if cs.newest is not None:
            self.newest = cs.newest
        self.dirty -= cs.settled
        self._planned = (self.closed_upto, self.newest, tuple(sorted(self.dirty)))

    # ------------------------------------------------------------------ reading
    def is_open(self, pane: int) -> bool:
        return self.closed_upto is None or pane >= self.closed_upto

    def rows_retained(self) -> int:
        return int(sum(s.n for g in (self.full, self.detail, self.rollups) for s in g.values()))

    def nbytes(self) -> int:
        total = sum(s.nbytes() for g in (self.full, self.detail, self.rollups)
                    for s in g.values())
        return int(total + 200 * len(self.series))
