"""What a later stage would be busy with in a given gear: the load an adaptive app's calm queue
reads before it steps back to a more accurate gear (serving.runtime.gears.GearSwitch.
predicted_fits), measured at the ingress from the stage's own answers."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: seconds of arriving rows the step back reads the rate from
LOAD_WINDOW_S = 5.0
#: rows sent on over which a later stage's measured busy seconds per row halves its weight
COST_HALF_LIFE_ROWS = 1024
#: rows arriving over which the live audit's busy seconds per arriving row halve their weight:
#: an audit call comes every few seconds (serving.runtime.audit: a batch of up to 128 sampled
#: rows, at most AUDIT_MAX_WAIT_S apart while requests are in flight), so its load is averaged
#: over several calls, about 16 s at 250 rows a second
AUDIT_HALF_LIFE_ROWS = 4096


def _seconds(value: Any) -> float | None:
    """``value`` as busy seconds: a finite number >= 0, else None."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class _WindowSums:
    """Busy seconds per stage, each with the time it was counted, summed over a sliding window."""

    def __init__(self):
        self.calls: dict[str, deque] = {}  # stage -> (time, busy seconds)
        self.sums: dict[str, float] = {}  # stage -> their sum

    def add(self, stage: str, now: float, busy: float) -> None:
        self.calls.setdefault(stage, deque()).append((now, busy))
        self.sums[stage] = self.sums.get(stage, 0.0) + busy

    def trim(self, cutoff: float) -> None:
        """Drop what was counted before ``cutoff``."""
        for stage, calls in self.calls.items():
            while calls and calls[0][0] < cutoff:
                self.sums[stage] -= calls.popleft()[1]
            if not calls:  # no rounding left behind
                self.sums[stage] = 0.0

    def total(self, stage: str) -> float:
        return max(self.sums.get(stage, 0.0), 0.0)


class StageLoad:
    """What a later stage would be busy with in a given gear, in replicas' worth: the rows
    arriving at this ingress per second (over the last ``window_s``), times the share of rows
    the gear sends on (GearDemand), times the busy seconds a row sent on costs the stage (decayed
    over its answers' rows, ``half_life_rows``; each answer's ``busy_s`` is its share of the
    replica's busy time, overlapping calls counted once), times the ``ingresses`` that share the
    traffic evenly. Every factor stays known while the served gear sends nothing on (a quiet
    stage is not an idle one), and each is kept as a running figure: a request costs a few
    operations. The rate is taken over the traffic since it last resumed (a pause longer than
    the window starts it afresh), so a burst after a lull is not read as the lull. Work a stage
    has whatever the gear that requests wait on (top-K's calls, the full pipeline while the live
    audit holds gear 0: :meth:`extra`) adds its busy seconds per second over the same window. The
    live audit's calls (:meth:`audited`) come a batch every few seconds, so their busy seconds are
    kept per row arriving here, decayed over ``audit_half_life_rows``, and count at the arrival
    rate. The ingress feeds the stage after the first (stage_specs makes at most two); the
    busy seconds of every stage's cascade calls also make the request path's own load there
    (:meth:`request_busy_per_s`), the room the live audit's pace leaves it
    (serving.runtime.audit_pace)."""

    def __init__(self, window_s: float = LOAD_WINDOW_S, ingresses: int = 1,
                 half_life_rows: float = COST_HALF_LIFE_ROWS, clock: Callable[[], float] = time.monotonic,
                 audit_half_life_rows: float = AUDIT_HALF_LIFE_ROWS):
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if isinstance(ingresses, bool) or not isinstance(ingresses, int) or ingresses < 1:
            raise ValueError(f"ingresses must be an integer >= 1, got {ingresses!r}")
        for name, value in (("half_life_rows", half_life_rows), ("audit_half_life_rows", audit_half_life_rows)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.window_s, self.ingresses, self.clock = float(window_s), ingresses, clock
        self.half_life_rows, self.audit_half_life_rows = float(half_life_rows), float(audit_half_life_rows)
        self._arrivals: deque = deque()
        self._arrived = 0
        self._since: float | None = None
        self._cost: dict[str, list[float]] = {}  # stage -> [decayed busy seconds, decayed rows]
        self._extra = _WindowSums()  # work no gear changes, over the window
        self._served = _WindowSums()  # the cascade's calls, over the window
        self._audit: dict[str, float] = {}  # stage -> the audit's decayed busy seconds
        self._audit_rows = 0.0  # rows arrived, decayed alike

    def arrived(self, rows: int) -> None:
        """A request of ``rows`` rows entered the first stage here."""
        now = self.clock()
        self._trim(now)
        if self._since is None or not self._arrivals:  # the first traffic, or traffic after a pause
            self._since = now
        self._arrivals.append((now, int(rows)))
        self._arrived += int(rows)
        keep = 0.5 ** (max(int(rows), 0) / self.audit_half_life_rows)
        self._audit_rows = self._audit_rows * keep + max(int(rows), 0)
        for stage in self._audit:
            self._audit[stage] *= keep

    def _trim(self, now: float) -> None:
        while self._arrivals and self._arrivals[0][0] < now - self.window_s:
            self._arrived -= self._arrivals.popleft()[1]
        self._extra.trim(now - self.window_s)
        self._served.trim(now - self.window_s)

    def answered(self, stage: str, busy_s: Any, rows: int, per_row: bool = True, scale: float = 1.0) -> None:
        """``stage`` answered a cascade call of ``rows`` rows, busy ``busy_s`` seconds on it
        (ignored unless a number >= 0, with rows): the request path's load there
        (:meth:`request_busy_per_s`, at ``scale`` times the busy seconds where the stage's
        autoscaler reads the call so, serving.runtime.gears.GearSwitch.demand_scale: the larger
        of the two, so that the load fits the device and the autoscaler's reading of it) and,
        with ``per_row``, what a row sent on costs it."""
        busy = _seconds(busy_s)
        if busy is None or rows <= 0:
            return
        now = self.clock()
        self._trim(now)
        try:
            factor = max(float(scale), 1.0) if math.isfinite(float(scale)) else 1.0
        except (TypeError, ValueError):
            factor = 1.0
        self._served.add(stage, now, busy * factor)
        if not per_row:
            return
        cost = self._cost.setdefault(stage, [0.0, 0.0])
        keep = 0.5 ** (rows / self.half_life_rows)
        cost[0], cost[1] = cost[0] * keep + busy, cost[1] * keep + rows

    def extra(self, stage: str, busy_s: Any) -> None:
        """``stage`` was busy ``busy_s`` seconds on a call every gear makes alike that a request
        waited on (ignored unless a number >= 0)."""
        busy = _seconds(busy_s)
        if busy is None:
            return
        now = self.clock()
        self._trim(now)
        self._extra.add(stage, now, busy)

    def audited(self, stage: str, busy_s: Any) -> None:
        """``stage`` was busy ``busy_s`` seconds on a live audit call (ignored unless a number >= 0)."""
        busy = _seconds(busy_s)
        if busy is not None:
            self._audit[stage] = self._audit.get(stage, 0.0) + busy

    def audit_busy_per_row(self, stage: str) -> float:
        """The audit's busy seconds on ``stage`` per row arriving here (0 before any)."""
        return self._audit.get(stage, 0.0) / self._audit_rows if self._audit_rows > 0 else 0.0

    def _window(self, now: float) -> float | None:
        """Seconds the figures are taken over: the window, or the time since the traffic
        (re)started; None until half a window has passed."""
        if self._since is None or now - self._since < self.window_s / 2:
            return None
        return min(self.window_s, now - self._since)

    def rows_per_s(self) -> float | None:
        """Rows arriving here per second; None until half a window has passed since the traffic
        (re)started."""
        now = self.clock()
        window = self._window(now)
        if window is None:
            return None
        self._trim(now)
        return self._arrived / window

    def extra_busy_per_s(self, stage: str) -> float:
        """Busy seconds per second ``stage`` spent on calls every gear makes alike (:meth:`extra`),
        over the window (0 before half a window of traffic)."""
        now = self.clock()
        window = self._window(now)
        if window is None:
            return 0.0
        self._trim(now)
        return self._extra.total(stage) / window

    def request_busy_per_s(self, stage: str) -> float:
        """Busy seconds per second ``stage`` spent on the calls of this ingress's requests (the
        cascade's, scaled as :meth:`answered` says, and :meth:`extra`'s; the audit's not), over
        the window, or over the time since the traffic (re)started, half a window at least (0
        before any call)."""
        now = self.clock()
        self._trim(now)
        busy = self._served.total(stage) + self._extra.total(stage)
        if busy <= 0:
            return 0.0
        window = self._window(now)
        if window is None:  # under half a window of traffic: over half a window, not less
            window = self.window_s / 2
        return busy / window

    def busy_per_row(self, stage: str) -> float | None:
        """Busy seconds a row costs ``stage`` (None before its first answer with rows)."""
        cost = self._cost.get(stage)
        return None if cost is None or cost[1] <= 0 else cost[0] / cost[1]

    def busy_replicas(self, stage: str, share: float | None) -> float | None:
        """Replicas' worth of work ``stage`` has from every ingress where a gear sends ``share``
        of rows on (class docstring); None where a factor is not known yet."""
        rate, per_row = self.rows_per_s(), self.busy_per_row(stage)
        if rate is None or per_row is None or share is None:
            return None
        return (rate * (share * per_row + self.audit_busy_per_row(stage)) + self.extra_busy_per_s(stage)) \
            * self.ingresses
