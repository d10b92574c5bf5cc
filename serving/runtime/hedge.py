"""Straggler mitigation for stage calls (FlexRR's reassignment; hedged requests as in "The
Tail at Scale"). Plain Python, so the policy is tested without Ray; the ingress of
:mod:`serving.emulation.hetero_app` applies it to its stage calls.

* :class:`LatencyWindow`: a stage's own recent call latencies; the hedge delay is its
  ``quantile``, but never less than ``floor_over_median`` times its median (a call still
  unanswered then is sent again to another replica, the first answer kept, the other
  cancelled). The floor keeps hedging off a tail that is only the ordinary spread: without
  stragglers a quantile alone still hedges 1 - quantile of all calls, whose copies load the
  replicas and raise the p99 they were meant to cut. A call cut short by its twin's answer is recorded at
  the time it had already taken (a lower bound), so hedging does not hide the tail it
  hedges against and drive the delay down.
* Hedges go only to idle capacity (``HEDGE_IDLE_ONLY``): a copy sent while every replica is
  busy waits in the same queues as the call it copies and adds to them.
* :class:`HedgeBackoff`: the delay backs off while copies stop winning. A copy that loses
  (its original answered first) was pure extra work: the tail it was sent against was not on
  the replica (a stalled event loop, Ray's own path, a queue every replica shares), and a copy
  waits in the same place. When fewer than ``min_win_share`` of the last ``outcomes`` copies
  won (a copy that neither answered by the deadline did not win), the delay is multiplied by
  ``step`` (up to ``max_factor``); when at least that share wins, divided by it again. With no
  copy sent for ``relax_s`` seconds (a long delay sends none) the factor steps back down, so
  hedging tries again. The bound on a silent replica is not backed off. Measured in deploy's
  apps before it existed (docs/benchmarks.md, 2026-12-07): 2 of 58 copies of a stage's calls
  won, and the hedged app's p99 without a straggler was above the unhedged app's in 10 of 12
  rounds.
* :class:`SlowReplicas`: per-replica latency (EWMA); a replica whose recent latency is
  ``slow_factor`` times its peers' median (same stage and device type) gets no new calls
  for ``probation_s`` seconds, then one call at a time tells whether it recovered.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from serving.core.constants import LOST_AFTER_S  # noqa: F401 - where the hedging constants are read

#: quantile of the stage's own latency distribution at which a call is hedged
HEDGE_QUANTILE = 0.95
#: a call is hedged no earlier than this many times the stage's median latency (0: no floor)
HEDGE_FLOOR_OVER_MEDIAN = 2.0
#: a hedge goes only to a replica with nothing in flight from this router: when every replica
#: is busy the tail is queueing, which a copy only lengthens (it waits behind the same queue
#: and adds work); a straggler holds one replica while its peers are idle
HEDGE_IDLE_ONLY = True
#: LOST_AFTER_S (serving.core.constants): a call unanswered this long is copied to another
#: replica whatever the hedging settings ...
#: ... and never sooner than this many times the stage's median call latency (at 20x, a stage on
#: a slow device, median 0.4 s, waited 8 s on a frozen replica before any copy; 5x is still far
#: past its p99, 1-2 s there)
LOST_OVER_MEDIAN = 5.0
#: latencies kept per stage, and how many are needed before hedging starts
WINDOW = 256
MIN_SAMPLES = 32
#: the window's quantile and median are read again once this share (1/N) of it is new
RECOMPUTE_SHARE = 32
#: the backoff (HedgeBackoff): below this share of copies winning, the delay grows (0: never backs off).
#: A copy that wins cut a call's tail; one that loses was extra work only. A quarter leaves room
#: for a tail that is partly replica-bound, where copies win often but not always
HEDGE_MIN_WIN_SHARE = 0.25
#: decided copies the share is judged over (then judged again on the next as many)
HEDGE_BACKOFF_OUTCOMES = 16
#: the delay's factor is multiplied or divided by this at each judgment ...
HEDGE_BACKOFF_STEP = 2.0
#: ... and stays within [1, this]
HEDGE_BACKOFF_MAX_FACTOR = 8.0
#: seconds without a copy sent or decided after which a backed-off factor steps down once (a
#: delay backed off past the bound sends no copy, so no outcome would ever bring it back)
HEDGE_BACKOFF_RELAX_S = 30.0
#: a replica is slow when its latency EWMA exceeds this many times its peers' median
SLOW_FACTOR = 3.0
#: EWMA weight of the newest latency per replica
EWMA_ALPHA = 0.2
#: seconds a slow replica gets no new calls before it is tried again
PROBATION_S = 2.0
#: completed calls a replica needs before it can be judged
MIN_REPLICA_SAMPLES = 5


class LatencyWindow:
    """The last ``size`` latencies (seconds) of one stage's calls."""

    def __init__(self, size: int = WINDOW, quantile: float = HEDGE_QUANTILE, min_samples: int = MIN_SAMPLES,
                 floor_over_median: float = HEDGE_FLOOR_OVER_MEDIAN):
        if size < 1 or min_samples < 1:
            raise ValueError(f"size and min_samples must be >= 1, got {size}, {min_samples}")
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
        if not (np.isfinite(floor_over_median) and floor_over_median >= 0):
            raise ValueError(f"floor_over_median must be finite and >= 0, got {floor_over_median!r}")
        self.samples: deque[float] = deque(maxlen=size)
        self.quantile, self.min_samples, self.floor = quantile, min_samples, floor_over_median
        #: latencies added so far, and at which count the cached (tail, median) was read
        self._added, self._read_at, self._cached = 0, -1, (0.0, 0.0)

    def add(self, seconds: float) -> None:
        if np.isfinite(seconds) and seconds >= 0:
            self.samples.append(float(seconds))
            self._added += 1

    def _tail_and_median(self) -> tuple[float, float]:
        """The window's quantile and median, read again once a 32nd of the window is new (every
        stage call asks for both: two sorts of 256 latencies a call were 3% of a hedging
        ingress's CPU, and a few new latencies in 256 move neither)."""
        if self._added - self._read_at >= max(1, len(self.samples) // RECOMPUTE_SHARE):
            tail, median = np.quantile(np.fromiter(self.samples, float), [self.quantile, 0.5])
            self._cached, self._read_at = (float(tail), float(median)), self._added
        return self._cached

    def delay(self) -> float | None:
        """Seconds after which to hedge, or None while too few latencies are known."""
        if len(self.samples) < self.min_samples:
            return None
        tail, median = self._tail_and_median()
        return float(max(tail, self.floor * median))

    def median(self) -> float | None:
        return self._tail_and_median()[1] if self.samples else None


class HedgeBackoff:
    """A factor on the hedge delay, grown while copies lose and shrunk while they win."""

    def __init__(self, min_win_share: float = HEDGE_MIN_WIN_SHARE, outcomes: int = HEDGE_BACKOFF_OUTCOMES,
                 step: float = HEDGE_BACKOFF_STEP, max_factor: float = HEDGE_BACKOFF_MAX_FACTOR,
                 relax_s: float = HEDGE_BACKOFF_RELAX_S, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[float], None] | None = None):
        if not 0 <= min_win_share <= 1:
            raise ValueError(f"min_win_share must be in [0, 1], got {min_win_share!r}")
        if outcomes < 1:
            raise ValueError(f"outcomes must be >= 1, got {outcomes!r}")
        if not (np.isfinite(step) and step > 1):
            raise ValueError(f"step must be finite and > 1, got {step!r}")
        if not (np.isfinite(max_factor) and max_factor >= 1):
            raise ValueError(f"max_factor must be finite and >= 1, got {max_factor!r}")
        if not relax_s > 0:
            raise ValueError(f"relax_s must be > 0, got {relax_s!r}")
        self.min_win_share, self.outcomes, self.step = float(min_win_share), int(outcomes), float(step)
        self.max_factor, self.relax_s, self.clock, self.on_change = float(max_factor), float(relax_s), clock, on_change
        self._factor, self._wins, self._decided = 1.0, 0, 0
        self._last = clock()  # the last copy sent or decided, or change of factor

    @property
    def factor(self) -> float:
        """What the delay is multiplied by now (1: not backed off): one step down for each
        ``relax_s`` without a copy sent or decided."""
        if self._factor > 1:
            steps = int((self.clock() - self._last) // self.relax_s)
            if steps > 0:
                self._wins = self._decided = 0  # the next judgment is of copies at the new delay
                self._set(self._factor / self.step ** steps)
        return self._factor

    def sent(self) -> None:
        """A copy went out (its outcome comes later, through :meth:`record`): no relaxing while
        copies are being sent."""
        self._last = self.clock()

    def record(self, won: bool) -> None:
        """A copy was decided: ``won`` when it answered before the call it copied (one that
        neither answered by the deadline did not)."""
        if self.min_win_share <= 0:
            return
        self._last = self.clock()
        self._wins += bool(won)
        self._decided += 1
        if self._decided < self.outcomes:
            return
        losing = self._wins < self.min_win_share * self._decided
        self._wins = self._decided = 0
        self._set(self._factor * self.step if losing else self._factor / self.step)

    def _set(self, factor: float) -> None:
        factor = min(max(factor, 1.0), self.max_factor)
        self._last = self.clock()
        if factor != self._factor:
            self._factor = factor
            if self.on_change is not None:
                self.on_change(factor)


class SlowReplicas:
    """Which replicas of a stage are far slower than their peers right now."""

    def __init__(self, slow_factor: float = SLOW_FACTOR, alpha: float = EWMA_ALPHA,
                 probation_s: float = PROBATION_S, min_samples: int = MIN_REPLICA_SAMPLES,
                 clock: Callable[[], float] = time.monotonic):
        if slow_factor <= 1 or not 0 < alpha <= 1 or probation_s < 0:
            raise ValueError("slow_factor must be > 1, alpha in (0, 1], probation_s >= 0")
        self.slow_factor, self.alpha, self.probation_s, self.min_samples = slow_factor, alpha, probation_s, min_samples
        self.clock = clock
        self.ewma: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self.group: dict[str, str] = {}
        self.banned_until: dict[str, float] = {}
        self.reassigned = 0

    def observe(self, replica: str, group: str, seconds: float) -> None:
        """A completed call on ``replica`` (peers share ``group``, e.g. the device type)."""
        self.group[replica] = group
        old = self.ewma.get(replica)
        self.ewma[replica] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        self.count[replica] = self.count.get(replica, 0) + 1
        peers = [self.ewma[r] for r, g in self.group.items()
                 if g == group and r != replica and self.count.get(r, 0) >= self.min_samples]
        if self.count[replica] >= self.min_samples and peers:
            if self.ewma[replica] > self.slow_factor * float(np.median(peers)):
                if self.banned_until.get(replica, 0.0) <= self.clock():
                    self.reassigned += 1
                self.banned_until[replica] = self.clock() + self.probation_s
            elif replica in self.banned_until:
                del self.banned_until[replica]

    def slow(self, replicas: Iterable[str]) -> list[str]:
        """Those of ``replicas`` on probation now (never all of them). A replica whose
        probation ended starts afresh: it is judged again on its next calls only."""
        now = self.clock()
        for r, until in list(self.banned_until.items()):
            if until <= now:
                del self.banned_until[r]
                self.ewma.pop(r, None)
                self.count.pop(r, None)
        candidates = list(replicas)
        out = [r for r in candidates if r in self.banned_until]
        return out if len(out) < len(candidates) else []
