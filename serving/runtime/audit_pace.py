"""How fast the live audit may load the stage that holds the full model: with what the request
path leaves idle of that stage's replicas, never more.

An audited row runs the full pipeline, and where the later stage is a slow device that is much
of the stage's work: on the autoscaling trace's 50 ms-a-row stage, 1% of the cheap rows is 0.12
of a replica at the base rate and 0.48 in a 4x burst, beside the request path's 0.27. Counted as
demand, the audit made the autoscaler start another replica for itself in every burst. Yet it is
the one work here that can wait: its rows are counted, not answered. So its calls are paced to
the room the request path leaves below ``AUDIT_ROOM`` of the running replicas' time (below the
autoscaler's target, the planner's HEADROOM 0.75, so the audit never reads as the reason for
another replica), in calls of about ``PACE_S`` of the stage's time each (one call of 128 rows at
50 ms a row takes the replica for 6.4 s, and the autoscaler's recent reading sees that as a
burst). Rows past the room wait in the audit's queue, audited once the burst has passed; while
the request path is busy they wait too, and they are shed, counted, only when the queue is full
(serving.runtime.audit).

The pace is a token bucket in the stage's busy seconds: it fills at the room's rate up to
``PACE_S``; a call starts once it holds what the call will cost (the rows waiting, at the
measured cost a row, ``PACE_S`` at most) and spends what the stage measured it took (a call may
leave it in debt, which the next call waits out). Until one call is timed, a call is one row, to
learn the cost. Where the room is not known (no replica count yet, the full pipeline in the
ingress itself) or the stage does not time its calls (a replica of earlier code), calls are not
paced.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

#: share of the running replicas' time the request path and the audit together may take before
#: the audit waits; below the planner's headroom (serving.planning.planner.HEADROOM, 0.75), the
#: autoscaler's target, so that replicas the request path needs stay the replicas asked for
AUDIT_ROOM = 0.7
#: the stage's busy seconds one paced call may take, about (and what the bucket holds at most)
PACE_S = 0.2
#: audited rows over which the measured busy seconds per row halve their weight
COST_HALF_LIFE_ROWS = 256.0
#: busy seconds below which the bucket reads as empty (what sums of floats leave behind)
_EMPTY_S = 1e-9


class AuditPace:
    """The live audit's token bucket (module docstring). ``room()``: the stage's busy seconds
    per second the audit may take now (None: not known, no pacing)."""

    def __init__(self, room: Callable[[], float | None], *, pace_s: float = PACE_S,
                 half_life_rows: float = COST_HALF_LIFE_ROWS, clock: Callable[[], float] = time.monotonic):
        if not pace_s > 0:
            raise ValueError(f"pace_s must be > 0, got {pace_s!r}")
        if not half_life_rows > 0:
            raise ValueError(f"half_life_rows must be > 0, got {half_life_rows!r}")
        self.room, self.pace_s, self.half_life_rows, self.clock = room, float(pace_s), float(half_life_rows), clock
        self.tokens, self.updated = float(pace_s), clock()
        self.busy_s, self.rows = 0.0, 0.0
        #: a call came back without the stage's busy seconds: the stage does not time its calls
        self.untimed = False
        #: the room at the last look (None: not known), for /metrics and tests
        self.last_room: float | None = None

    def cost_per_row(self) -> float | None:
        """The stage's busy seconds per audited row (decayed); None before a timed call."""
        return self.busy_s / self.rows if self.rows > 0 else None

    def _refill(self) -> float | None:
        now = self.clock()
        try:
            room = self.room()
        except Exception:  # cannot tell: not paced, as before pacing existed
            room = None
        room = None if room is None or not math.isfinite(room) else max(float(room), 0.0)
        if room is not None:
            self.tokens = min(self.tokens + room * max(now - self.updated, 0.0), self.pace_s)
        self.updated, self.last_room = now, room
        return room

    def _need(self, queued: int) -> float:
        """Busy seconds the bucket must hold before a call of the ``queued`` rows waiting starts:
        their cost, ``pace_s`` at most (one row's while the cost is not known)."""
        cost = self.cost_per_row()
        if cost is None:
            return _EMPTY_S
        return max(min(max(int(queued), 1) * cost, self.pace_s), _EMPTY_S)

    def rows_now(self, most: int, queued: int | None = None) -> int:
        """Rows the next call may carry now, up to ``most`` (0: wait, :meth:`wait_s`), where
        ``queued`` rows wait (``most`` where not told). The first paced call carries one row, to
        learn what a row costs."""
        room = self._refill()
        if room is None or self.untimed:
            return most
        queued = most if queued is None else queued
        if self.tokens < self._need(min(most, queued)) - _EMPTY_S or self.tokens <= 0:
            return 0
        cost = self.cost_per_row()
        if cost is None:
            return min(most, 1)
        if cost < 1e-12:  # measured as free (and no float overflow)
            return most
        return max(1, min(most, int(self.tokens / cost + 1e-9)))

    def wait_s(self, queued: int = 1) -> float | None:
        """Seconds until a call of the ``queued`` rows waiting may start (0 now); None while the
        room is 0 (look again later)."""
        room = self._refill()
        if room is None or self.untimed:
            return 0.0
        short = self._need(queued) - self.tokens
        if short <= _EMPTY_S:
            return 0.0
        return short / room if room > 0 else None

    def spent(self, rows: int, busy_s: float | None) -> None:
        """A call of ``rows`` rows took ``busy_s`` of the stage's busy seconds (None: not timed)."""
        if busy_s is None:
            self.untimed = True
            return
        try:
            busy = float(busy_s)
        except (TypeError, ValueError):
            self.untimed = True
            return
        if rows <= 0 or not math.isfinite(busy) or busy < 0:
            return
        self.untimed = False
        self._refill()
        self.tokens -= busy
        keep = 0.5 ** (rows / self.half_life_rows)
        self.busy_s, self.rows = self.busy_s * keep + busy, self.rows * keep + rows
