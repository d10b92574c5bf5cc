"""A change set: every state change of one step, written to the store and then to memory.

Why: persistence used to be a side effect of some code paths (tier moves made while no pane
closed were applied in memory and never written, so the database kept panes it should have
rolled up, and a restart counted rows twice). Now the pane log *plans* a step as a ChangeSet
without touching its state; the store writes the whole set in one transaction; only after the
commit does the log apply it to memory. A crash in between leaves memory and disk consistent
(the restart loads the committed state), and nothing changes that is not written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drift._summary import Summary

TIER_OPEN, TIER_FULL, TIER_DETAIL = -1, 0, 1


@dataclass
class ChangeSet:
    """What one step changes. Summaries here are new objects (never mutated in place)."""

    closed_upto: int | None = None  # new value (None: unchanged)
    newest: int | None = None  # new value (None: unchanged)
    full_put: dict[int, Summary] = field(default_factory=dict)  # closed/late-updated panes
    full_drop: set[int] = field(default_factory=set)
    detail_put: dict[int, Summary] = field(default_factory=dict)
    detail_drop: set[int] = field(default_factory=set)
    rollup_put: dict[int, Summary] = field(default_factory=dict)
    rollup_drop: set[int] = field(default_factory=set)
    series_put: dict[int, dict[str, float]] = field(default_factory=dict)
    series_drop: set[int] = field(default_factory=set)
    open_put: dict[int, Summary] = field(default_factory=dict)  # flush: open panes as they are
    deltas: list[tuple[int, Summary]] = field(default_factory=list)  # durability='batch'
    codes: dict[int, tuple[int, list[object]]] = field(default_factory=dict)
    refs_put: dict[str, tuple[Summary, dict[str, Any]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    #: quarantined rows held per pane (drift._engine) / panes released or dropped from there
    held_put: dict[int, Summary] = field(default_factory=dict)
    held_drop: set[int] = field(default_factory=set)
    #: panes whose late rows are now folded into a written summary
    settled: set[int] = field(default_factory=set)

    @property
    def structural(self) -> bool:
        """Does it change panes, tiers or series (beyond counters and codes)?"""
        return bool(self.full_put or self.full_drop or self.detail_put or self.detail_drop
                    or self.rollup_put or self.rollup_drop or self.series_put
                    or self.series_drop or self.closed_upto is not None
                    or self.newest is not None or self.refs_put or self.held_put
                    or self.held_drop)

    @property
    def empty(self) -> bool:
        return not (self.structural or self.open_put or self.deltas or self.codes
                    or self.meta)
