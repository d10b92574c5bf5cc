"""The time frontier: how far event time has got, decided across batches, not by one batch.

Why its own state: the frontier closes panes (watermark = frontier - allowed lateness) and ends
the window, so whoever moves it moves every query. It used to be the newest timestamp ever
accepted, and the live-clock decision was made from each batch alone: one row dated a day
ahead in a batch of its own switched the live clock off, closed every pane and made 60% of the
rows that followed late; a replica whose clock ran 10 minutes ahead moved the window into the
future, where it was the only replica (a fake mix shift, a fake traffic collapse).

How it moves now (monotone, never back):
- a *connected* batch (its earliest row within `max_future_seconds` of the frontier, or of a
  live clock) moves it to the top of its run of rows without a gap wider than that, so a normal
  stream, a short pause and a backfill move it at once, as before (a skew within that tolerance
  is tolerated: it moves the frontier by at most the tolerance);
- a batch that starts further ahead (a skewed client, a jump after a gap in a replay) moves it
  only when a majority of the last `frontier_batches` batches reach that far: one source
  sending under half of the batches cannot move it, while a replay that resumes after a gap
  moves it after about half of those batches. Such a batch is counted in `skewed_batches`
  while it moves nothing, and its lead over the frontier in `max_lead_seconds`;
- with clock='auto' the live decision is the majority vote of the last `frontier_batches`
  batches (is the batch's median within LIVE_HORIZON_SECONDS of the wall clock?), so an outlier
  batch does not switch it off.
Rows dated more than `max_future_seconds` ahead of max(frontier, clock) are not added: the
engine holds them, per pane, and releases them into their panes once the frontier comes within
`max_future_seconds` of them (see drift._engine). The state here is saved with every commit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Batches whose times (and live votes) decide a frontier jump: more than half must agree.
DEFAULT_FRONTIER_BATCHES = 15


class Frontier:
    """Event-time frontier, recent batch times and live votes of one monitor."""

    def __init__(self, batches: int = DEFAULT_FRONTIER_BATCHES) -> None:
        self.batches = int(batches)
        self.value = -math.inf
        self.recent: list[float] = []  # max time of the last `batches` batches
        self.votes: list[bool] = []  # live votes of the last `batches` batches (clock='auto')
        self.live = False
        self.max_lead = 0.0  # largest lead (s) of a batch that could not move the frontier

    # ------------------------------------------------------------------ decisions
    def vote(self, live: bool) -> bool:
        """Record one batch's live vote; the live state changes on a strict majority."""
        self.votes.append(bool(live))
        del self.votes[:-self.batches]
        yes = sum(self.votes)
        if 2 * yes > len(self.votes):
            self.live = True
        elif 2 * (len(self.votes) - yes) > len(self.votes):
            self.live = False
        return self.live

    def base(self, now: float | None) -> float:
        """The time rows are judged against: the frontier, or a live clock when later."""
        return self.value if now is None else max(self.value, now)

    def observe(self, ts: np.ndarray, now: float | None, slack: float,
                trusted: bool = False) -> float | None:
        """Move the frontier with one batch's times (the rows not above a gap inside the batch).

        `trusted`: the times are the monitor's own (rows without a timestamp), so they move it
        like a clock. Returns the batch's lead over the frontier (seconds) when the batch is
        ahead by more than `slack` and could not move it (a skewed or unconfirmed batch)."""
        ordered = np.sort(np.asarray(ts, dtype=np.float64))
        base = self.base(now)
        if trusted:
            base = -math.inf
        if not math.isfinite(base):
            start = 1
        else:
            start = int(np.searchsorted(ordered, base + slack, side="right"))
        if start > 0:  # connected: follow the contiguous run up from the frontier
            wide = np.flatnonzero(np.diff(ordered[start - 1:]) > slack)
            top = ordered[start - 1 + int(wide[0])] if wide.size else ordered[-1]
            self.value = max(self.value, float(top))
        self.recent.append(float(ordered[-1]))
        del self.recent[:-self.batches]
        agreed = sorted(self.recent, reverse=True)[len(self.recent) // 2]
        self.value = max(self.value, agreed)
        after = self.base(now)
        if start == 0 and float(ordered[0]) > after + slack:
            lead = float(np.median(ordered)) - after
            self.max_lead = max(self.max_lead, lead)
            return lead
        return None

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        return {"value": self.value if math.isfinite(self.value) else None,
                "recent": list(self.recent), "votes": [int(v) for v in self.votes],
                "live": self.live, "max_lead": self.max_lead}

    def restore(self, state: dict[str, Any]) -> None:
        value = state.get("value")
        self.value = -math.inf if value is None else float(value)
        self.recent = [float(t) for t in state.get("recent", [])][-self.batches:]
        self.votes = [bool(v) for v in state.get("votes", [])][-self.batches:]
        self.live = bool(state.get("live", False))
        self.max_lead = float(state.get("max_lead", 0.0))
