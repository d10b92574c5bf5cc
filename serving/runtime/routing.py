"""Capacity-weighted routing for a stage's replicas, as a Ray Serve request router.

Serve's default router (power of two choices) compares two replicas' queue lengths, so a
replica half as fast as its peers gets as many calls as they do whenever queues are short,
and a replica that stopped answering keeps getting calls until Ray reports it dead. Here
each caller ranks the stage's replicas by the time a new call would wait there:

* **capacity, measured where it is spent**: each stage replica reports the rows per busy
  second it sustains (:class:`BusyMeter`, through Serve's ``record_routing_stats``); a call
  sent to replica ``r`` with ``q`` calls ahead of it waits about ``(q + 1) / capacity(r)``.
  Until a replica has reported, the caller's own latency average for it stands in, and the
  peers' median before that. A replica on a faster node pool, or one a straggler slows
  down, gets a share of calls proportional to what it sustains.
* **draining on notice**: a replica on a node Ray is draining (a preemption notice,
  ``DrainNode``; Serve then starts its replacement elsewhere) is ranked last: it finishes
  what it holds and gets new calls only while no other replica has room. So is a replica on a
  node the GCS holds dead (lost without notice), before Serve takes it out of the set it routes
  to; a caller choosing among deployments (node pools) passes over one whose replicas are all
  such or suspect (:meth:`CapacityPolicy.usable`).
* **a bound on a silent replica**: a replica is suspect when it holds calls and has answered
  none for ``max(lost_after_s, lost_over_service * its usual gap between answers)`` (a busy
  replica with a long queue still answers every gap; a hung one stops), or when it has been ranked first for ``probe_silent_s`` while Serve sent
  it nothing (its queue-length probe went unanswered, or it was full) and it answered nothing. A suspect replica is ranked
  last until it answers; one that holds none of this caller's calls is tried first by one
  routing step every ``lost_after_s``. The caller copies a call that waited past the bound
  (:class:`serving.runtime.calls.StageHedge`), so a replica nobody has reported lost costs
  one bound, not a deadline. The end of a call the caller cancelled (its copy answered first)
  is no answer (:mod:`serving.runtime.cancelled_calls`).

:class:`CapacityPolicy` is plain Python (tested without Ray); :class:`CapacityRouter` is
Serve's adapter, named in a deployment's ``request_router_config``.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import FIFOMixin, RequestRouter

from serving.runtime import cancelled_calls, router_policies
from serving.runtime.hedge import LOST_AFTER_S
from serving.runtime.hedge import LOST_OVER_MEDIAN as LOST_OVER_SERVICE

#: seconds a replica may stay ranked first with no call sent to it and none answered by it
#: before it is suspect (Serve skips it when its queue-length probe, deadline 0.1 s at first,
#: goes unanswered)
PROBE_SILENT_S = 0.5
#: weight of the newest latency in a replica's average (as seen by this caller)
LATENCY_EWMA_ALPHA = 0.2
#: seconds between a caller's reads of the nodes Ray is draining
DRAINING_REFRESH_S = 1.0
#: a node's state in the GCS's node table (gcs.proto's GcsNodeInfo.GcsNodeState) while it lives
ALIVE_STATE = 0
#: seconds a caller's view of which replicas it can count on stays current (CapacityPolicy.usable)
VIEW_FRESH_S = 2.0
#: seconds between a stage replica's reports of its capacity (Serve's routing stats period)
ROUTING_STATS_PERIOD_S = 1.0
#: replicas a caller ranks per routing step (Serve probes a rank's replicas for queue room)
RANKS = 3
#: the router's import path, as a Serve config names it
ROUTER_PATH = "serving.runtime.routing:CapacityRouter"


#: seconds an ingress's reported backlog stays current without a newer one (an ingress reports
#: with every call it makes, so one that stopped calling has had nothing queued for that long)
BACKLOG_FRESH_S = 2.0
#: seconds an ingress replica that called counts as one of the stage's callers (the planner
#: autoscaler's saturation rule: every caller keeps CONCURRENT_BATCHES calls per stage replica)
CALLER_FRESH_S = 30.0


class BusyMeter:
    """A replica's measured capacity: rows computed per second during which it computed
    anything (overlapping calls count once), over the last report period; and, for the
    autoscaler, the rows the ingresses still queue for this stage (:meth:`note_backlog`).
    Calls started ``unscaled`` do work every gear gives the stage alike (the live audit's rows,
    the full pipeline while the audit holds gear 0, top-K's calls): their share of the busy time,
    counted as it accrues, is busy time for the autoscaler but not scaled by the gear demand
    factor, and neither their rows nor their time enter the rates per row (a full-pipeline row
    costs what a cascade row does not)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.active = 0
        self.busy_s = 0.0
        self.rows = 0
        self.since: float | None = None
        self.rows_per_s: float | None = None
        self.total_rows = 0
        #: the autoscaler's window (:meth:`autoscaling_stats`), kept apart from the router's period
        self.window_busy_s, self.window_rows, self.window_start = 0.0, 0, clock()
        self.window_since: float | None = None
        #: ingress replica -> (rows it still queued for this stage, when it said so: its last call),
        #: kept CALLER_FRESH_S (:meth:`ingress_callers`), its rows current BACKLOG_FRESH_S
        self.backlogs: dict[str, tuple[float, float]] = {}
        #: the window's rows, and the same rows as the deployed gear would have sent them
        #: (:meth:`note_demand`); the last window's ratio of the two, kept through a window in
        #: which no call arrived (the calls it computed arrived before it)
        self.window_called_rows, self.window_demand_rows = 0.0, 0.0
        self.demand_scale = 1.0
        #: running calls started unscaled, and the busy seconds they took in the autoscaler's
        #: window and in the router's period (shared with the calls beside them)
        self.active_unscaled = 0
        self.window_unscaled_s, self.period_unscaled_s = 0.0, 0.0
        #: of those, the running calls that can wait (the live audit's), and their busy seconds in
        #: the autoscaler's window
        self.active_deferrable, self.window_deferrable_s = 0, 0.0
        #: calls that can wait held by the replica, waiting or computing (Serve counts each as an
        #: ongoing request for its whole stay), and their call-seconds in the autoscaler's window
        self.held_deferrable, self.window_held_deferrable_s, self._held_at = 0, 0.0, clock()
        #: the cascade's calls that ended in the window and in the period: their whole shares of
        #: the busy time, a floor under the busy time left once the unscaled calls' is taken out
        #: (a call's rows count when it ends, so its time must not be left in an earlier period)
        self.window_scaled_s, self.period_scaled_s = 0.0, 0.0
        #: the running calls' shares of the busy time so far (:meth:`call_busy_s`)
        self.call_share_s, self._shared_at = 0.0, None

    def note_backlog(self, source: str, rows: float) -> None:
        """``source`` (an ingress replica), making a call, still queues ``rows`` for this stage."""
        self.backlogs[str(source)] = (max(float(rows), 0.0), self.clock())

    def ingress_callers(self) -> int:
        """The ingress replicas that called in the last CALLER_FRESH_S."""
        now = self.clock()
        self.backlogs = {k: v for k, v in self.backlogs.items() if now - v[1] < CALLER_FRESH_S}
        return len(self.backlogs)

    def note_demand(self, rows: int, scale: float) -> None:
        """A call of ``rows`` rows that the gear the replicas are sized for would have sent
        ``scale`` times as many of (serving.runtime.gears.GearDemand; 1 in that gear, above 1
        in a cheaper gear, below 1 in a more accurate one; anything but a positive finite
        number reads as 1)."""
        scale = float(scale)
        self.window_called_rows += rows
        self.window_demand_rows += rows * (scale if math.isfinite(scale) and scale > 0.0 else 1.0)

    def backlog_rows(self) -> float:
        """Rows the ingresses queue for this stage: the sum of their current reports."""
        now = self.clock()
        return sum(rows for rows, at in self.backlogs.values() if now - at < BACKLOG_FRESH_S)

    def _count_held(self) -> None:
        now = self.clock()
        self.window_held_deferrable_s += self.held_deferrable * (now - self._held_at)
        self._held_at = now

    def hold_deferrable(self, held: bool) -> None:
        """A call that can wait (the live audit's) arrived (``held``) or was answered: Serve's
        request count holds it all the while, in pieces or waiting, which the autoscaler's
        saturation rule must not read as the request path's (``deferrable_ongoing``)."""
        self._count_held()
        self.held_deferrable = max(self.held_deferrable + (1 if held else -1), 0)

    def _share_calls(self) -> None:
        """Divide the time since the last change among the calls running through it."""
        now = self.clock()
        if self.active and self._shared_at is not None:
            elapsed = now - self._shared_at
            self.call_share_s += elapsed / self.active
            if self.active_unscaled:
                unscaled = elapsed * self.active_unscaled / self.active
                self.window_unscaled_s += unscaled
                self.period_unscaled_s += unscaled
            if self.active_deferrable:
                self.window_deferrable_s += elapsed * self.active_deferrable / self.active
        self._shared_at = now

    def start(self, unscaled: bool = False, deferrable: bool = False) -> float:
        """A call starts computing (``unscaled``: work every gear gives the stage alike, class
        docstring; ``deferrable``, unscaled work no request waits on, the live audit's); returns
        its mark for :meth:`call_busy_s`."""
        self._share_calls()
        if self.active == 0:
            self.since = self.window_since = self.clock()
        self.active += 1
        self.active_unscaled += bool(unscaled or deferrable)
        self.active_deferrable += bool(deferrable)
        return self.call_share_s

    def call_busy_s(self, mark: float) -> float:
        """The busy seconds of the call that started at ``mark`` (:meth:`start`): each moment
        divided among the calls running then, so that the calls' figures add up to the replica's
        busy time (overlapping calls counted once)."""
        self._share_calls()
        return self.call_share_s - mark

    def stop(self, rows: int, unscaled: bool = False, mark: float | None = None, deferrable: bool = False) -> None:
        """A call of ``rows`` rows ended (``unscaled`` and ``deferrable`` as it started; ``mark``:
        what its :meth:`start` returned)."""
        self._share_calls()
        unscaled = unscaled or deferrable
        self.active -= 1
        self.active_unscaled -= bool(unscaled)
        self.active_deferrable -= bool(deferrable)
        if not unscaled:
            self.rows += int(rows)
            self.window_rows += int(rows)
            if mark is not None:
                self.window_scaled_s += self.call_share_s - mark
                self.period_scaled_s += self.call_share_s - mark
        self.total_rows += int(rows)
        if self.active == 0 and self.since is not None:
            now = self.clock()
            self.busy_s += now - self.since
            self.window_busy_s += now - (self.window_since if self.window_since is not None else now)
            self.since = self.window_since = None

    def autoscaling_stats(self) -> dict[str, float]:
        """What Serve's autoscaler hears from this replica (``record_autoscaling_stats``), over
        the time since it last asked: ``busy_share``, the share of that time the replica computed
        anything (the replicas' worth of work it did: serving.planning.autoscale),
        ``rows_per_s``, the cascade's rows answered per second of it, ``busy_s_per_row``, the
        busy seconds a cascade row took (0 without rows), and ``backlog_rows``, the rows the
        ingresses still queue for the stage (:meth:`note_backlog`); ``deployed_gear_busy_share``,
        the busy share scaled to what the gear the replicas are sized for would have sent here
        (:meth:`note_demand`: a cheaper gear answering a burst sends fewer rows on; the name says
        gear 0, the default), the unscaled calls' share (class docstring) left as it is; and
        ``deferrable_busy_share``, the part of it the calls that can wait took (the live audit's:
        paced to the room the request path leaves, serving.runtime.audit_pace),
        ``deferrable_ongoing``, how many such calls the replica held on average (:meth:`hold_deferrable`),
        and ``ingress_callers``, the ingress replicas that called lately (:meth:`ingress_callers`)."""
        self._share_calls()  # the unscaled calls' time up to now
        self._count_held()
        now = self.clock()
        busy = self.window_busy_s
        if self.active and self.window_since is not None:  # a call running now counts up to now
            busy += now - self.window_since
            self.window_since = now
        wall = max(now - self.window_start, 1e-9)
        share = min(busy / wall, 1.0)
        if self.window_called_rows:
            self.demand_scale = self.window_demand_rows / self.window_called_rows
        unscaled = min(self.window_unscaled_s / wall, share)
        scaled_busy = max(busy - self.window_unscaled_s, self.window_scaled_s)
        out = {"busy_share": share, "rows_per_s": self.window_rows / wall,
               "busy_s_per_row": scaled_busy / self.window_rows if self.window_rows else 0.0,
               "backlog_rows": self.backlog_rows(),
               "deployed_gear_busy_share": (share - unscaled) * self.demand_scale + unscaled,
               "deferrable_busy_share": min(self.window_deferrable_s / wall, unscaled),
               "deferrable_ongoing": self.window_held_deferrable_s / wall,
               "ingress_callers": float(self.ingress_callers())}
        self.window_held_deferrable_s = 0.0
        self.window_busy_s, self.window_rows, self.window_start = 0.0, 0, now
        self.window_called_rows, self.window_demand_rows, self.window_unscaled_s = 0.0, 0.0, 0.0
        self.window_deferrable_s = 0.0
        self.window_scaled_s = 0.0
        return out

    def report(self) -> dict[str, Any]:
        """The routing stats: ``rows_per_s`` over the period just ended (the last period's
        while this one computed nothing), the cascade's rows per second of its own busy time."""
        self._share_calls()
        busy = self.busy_s
        if self.active and self.since is not None:  # count the busy time so far, keep counting
            now = self.clock()
            busy += now - self.since
            self.since = now
        busy = max(busy - self.period_unscaled_s, self.period_scaled_s)
        if busy > 0 and self.rows > 0:
            self.rows_per_s = self.rows / busy
        self.busy_s, self.rows, self.period_unscaled_s, self.period_scaled_s = 0.0, 0, 0.0, 0.0
        return {"rows_per_s": self.rows_per_s, "rows": self.total_rows}


@dataclass
class ReplicaView:
    """What a caller knows of one replica when it routes a call."""

    id: str
    queued: int = 0
    rows_per_s: float | None = None
    draining: bool = False


class CapacityPolicy:
    """The ranking (see the module's docstring), with the caller's own bookkeeping of the
    calls it routed: their replica and send time, answered or not."""

    def __init__(self, lost_after_s: float | None = LOST_AFTER_S, lost_over_service: float = LOST_OVER_SERVICE,
                 alpha: float = LATENCY_EWMA_ALPHA, ranks: int = RANKS, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic, probe_silent_s: float = PROBE_SILENT_S):
        if lost_after_s is not None and lost_after_s <= 0:
            raise ValueError(f"lost_after_s must be > 0 (None: never suspect), got {lost_after_s}")
        #: None: no replica is ever suspect (deploy(lost_after_s=None))
        self.lost_after_s = math.inf if lost_after_s is None else float(lost_after_s)
        self.lost_over_service = float(lost_over_service)
        self.probe_silent_s = math.inf if lost_after_s is None else min(float(probe_silent_s), self.lost_after_s)
        self.alpha, self.ranks, self.clock = float(alpha), int(ranks), clock
        self.rng = random.Random(seed)
        #: replica -> send times of this caller's calls there not answered yet, oldest first (Serve
        #: tells a router of each send and each completion by replica, in its own order)
        self.sent: dict[str, deque[float]] = {}
        self.latency: dict[str, float] = {}  # replica -> EWMA of its call latency (seconds)
        #: replica -> EWMA of the time between its answers (idle spells left out): a busy replica
        #: with a long queue still answers every gap; a hung one stops
        self.gap: dict[str, float] = {}
        self.answered_at: dict[str, float] = {}
        #: replica -> (first, last) time it was ranked first with no word from it since (a gap
        #: longer than probe_silent_s between offers starts over: an idle caller asked nothing)
        self.offered_at: dict[str, tuple[float, float]] = {}
        self.tried_at: dict[str, float] = {}  # replica -> its last trial while suspect
        #: replicas a call of this caller was withdrawn from after waiting past their bound: suspect
        #: until they answer or are heard (the call left, so they no longer hold one to be silent on)
        self.muted: set[str] = set()
        #: the replicas Serve offered at the last routing step (or its last replica set) -> on a
        #: node to avoid (:meth:`usable`); None before either, and when it was seen
        self.seen: dict[str, bool] | None = None
        self.seen_at = -math.inf

    @property
    def outstanding(self) -> dict[str, int]:
        """This caller's calls not answered yet, per replica (derived from ``sent``)."""
        return {replica: len(times) for replica, times in self.sent.items()}

    def routed(self, replica: str) -> None:
        self.sent.setdefault(replica, deque()).append(self.clock())
        self.offered_at.pop(replica, None)

    def offer(self, replica: str, now: float) -> None:
        """``replica`` is ranked first now."""
        first, last = self.offered_at.get(replica, (now, now))
        self.offered_at[replica] = (now, now) if now - last > self.probe_silent_s else (first, now)

    def heard(self, replica: str) -> None:
        """The replica told its queue length (where replicas may reject calls): alive."""
        self.muted.discard(replica)
        self.offered_at.pop(replica, None)
        self.tried_at.pop(replica, None)

    def completed(self, replica: str) -> None:
        """One of this caller's calls to ``replica`` ended (answered or failed there; one the
        caller cancelled is :meth:`withdrawn`); its latency is taken from the oldest call still
        open there, and its gap between answers from the later of its last answer and that
        call's send (an idle spell is not a gap)."""
        times = self.sent.get(replica)
        if not times:
            return
        t0 = times.popleft()
        now = self.clock()
        if replica in self.answered_at:
            self.gap[replica] = self._ewma(self.gap.get(replica), now - max(self.answered_at[replica], t0))
        self.latency[replica] = self._ewma(self.latency.get(replica), now - t0)
        self.answered_at[replica] = now
        self.muted.discard(replica)
        self.offered_at.pop(replica, None)
        self.tried_at.pop(replica, None)

    def withdrawn(self, replica: str) -> None:
        """One of this caller's calls to ``replica`` ended because the caller cancelled it (a copy
        answered first, its deadline passed, its client left): it leaves the calls open there, and
        it is no answer (over Serve's gRPC transport a cancel ends the call at once, even on a
        replica that answers nothing: serving.runtime.cancelled_calls)."""
        if self.silent(replica):  # it waited past the bound there: the replica stays suspect
            self.muted.add(replica)
        times = self.sent.get(replica)
        if times:
            times.popleft()

    def _ewma(self, old: float | None, x: float) -> float:
        return x if old is None else old + self.alpha * (x - old)

    def forget(self, replica: str) -> None:
        """A replica Serve removed: its calls will not be answered."""
        for table in (self.sent, self.latency, self.gap, self.answered_at, self.offered_at,
                      self.tried_at, self.seen or {}):
            table.pop(replica, None)
        self.muted.discard(replica)

    def bound_s(self, replica: str) -> float:
        """How long ``replica`` may hold calls without answering any before it is silent: its gap
        between answers (else its call latency) times ``lost_over_service``, at least
        ``lost_after_s``."""
        usual = self.gap.get(replica, self.latency.get(replica))
        return max(self.lost_after_s, self.lost_over_service * usual) if usual is not None else self.lost_after_s

    def silent(self, replica: str) -> bool:
        """Holds calls and has answered none for longer than its bound (counted from its last
        answer, or from the oldest call it holds if that came later)."""
        times = self.sent.get(replica)
        try:  # the router's loop may empty it meanwhile (the ingress asks from its own)
            oldest = times[0] if times else None
        except IndexError:
            oldest = None
        if oldest is None:
            return False
        return self.clock() - max(oldest, self.answered_at.get(replica, -math.inf)) > self.bound_s(replica)

    def suspect(self, replica: str) -> bool:
        """Silent, offered calls for ``probe_silent_s`` without a word, or a call was withdrawn
        from it past its bound (:meth:`withdrawn`), until it answers."""
        first, last = self.offered_at.get(replica, (0.0, 0.0))
        return last - first > self.probe_silent_s or replica in self.muted or self.silent(replica)

    def any_silent(self) -> bool:
        """Some replica is silent (:meth:`silent`): a call past the bound is worth a copy."""
        return any(self.silent(r) for r in list(self.sent))

    def replicas_now(self, replicas: Mapping[str, bool]) -> None:
        """Serve's replica set changed: ``replicas`` (id -> on a draining node) are those it routes
        to now; the others are gone, the new ones count as usable until seen otherwise."""
        self.seen, self.seen_at = {r: bool(replicas[r]) for r in replicas}, self.clock()

    def usable(self) -> int | None:
        """Replicas of the last routing step (or Serve's last replica set) neither on a node to
        avoid nor suspect: what a caller choosing among deployments (serving.runtime.pools) can
        count on here; 0 when Serve routes to none. None before either, or when that view is older
        than ``VIEW_FRESH_S``: a deployment a caller stopped choosing is not routed to, so its view
        would never change; unknown, it gets a call, whose routing step looks again."""
        seen = self.seen
        if seen is None or self.clock() - self.seen_at > VIEW_FRESH_S:
            return None
        return sum(not avoid and not self.suspect(r) for r, avoid in list(seen.items()))

    def wait_s(self, view: ReplicaView, fallback_rows_per_s: float) -> float:
        """Expected wait of a new call at this replica, in units of one call's rows (relative:
        every replica of a stage sees the same mix of calls)."""
        ahead = max(view.queued, len(self.sent.get(view.id, ())))
        return (ahead + 1) / (view.rows_per_s or fallback_rows_per_s)

    def capacities(self, views: Sequence[ReplicaView]) -> dict[str, float | None]:
        """Each replica's rows per second: reported, else from this caller's latencies (relative
        to the reporting peers'), else None."""
        out: dict[str, float | None] = {v.id: v.rows_per_s for v in views}
        reported = [v for v in views if v.rows_per_s and v.id in self.latency]
        for v in views:
            if out[v.id] or v.id not in self.latency:
                continue
            if reported:  # scale the peers' reported capacity by their latency against this one's
                ref = statistics.median(r.rows_per_s * self.latency[r.id] for r in reported)
                out[v.id] = ref / max(self.latency[v.id], 1e-9)
            else:
                out[v.id] = 1.0 / max(self.latency[v.id], 1e-9)
        return out

    def rank(self, views: Sequence[ReplicaView]) -> list[list[str]]:
        """Replica ids by expected wait, one per rank, at most ``ranks`` of them; draining and
        suspect replicas in a last rank of their own (used only while the others are full)."""
        if not views:
            return []
        caps = self.capacities(views)
        known = [c for c in caps.values() if c]
        fallback = statistics.median(known) if known else 1.0
        scored = [ReplicaView(v.id, v.queued, caps[v.id], v.draining) for v in views]
        self.seen, self.seen_at = {v.id: bool(v.draining) for v in views}, self.clock()
        now = self.clock()
        healthy, demoted, trial = [], [], None
        for v in scored:
            if v.draining:
                demoted.append(v)
            elif self.suspect(v.id):
                since = self.tried_at.setdefault(v.id, now)  # suspect since, or tried last
                # a replica holding calls tells of its recovery by answering them; one holding none
                # gets one routing step first every lost_after_s (a copy of a call it holds must
                # not be such a trial: it would wait behind the original)
                if trial is None and not self.sent.get(v.id) and now - since > self.lost_after_s:
                    trial = v  # back once it answers
                    self.tried_at[v.id] = now
                else:
                    demoted.append(v)
            else:
                healthy.append(v)
        order = sorted(healthy, key=lambda v: (self.wait_s(v, fallback), self.rng.random()))
        if trial is not None:
            order.insert(0, trial)
        elif order:
            self.offer(order[0].id, now)
        ranks = [[v.id] for v in order[: self.ranks]]
        if demoted:
            ranks.append([v.id for v in sorted(demoted, key=lambda v: self.wait_s(v, fallback))])
        return ranks


def any_silent(app: str, deployment: str) -> bool | None:
    """Whether this process's capacity router for ``deployment`` has seen a replica go silent
    (None: no such router here, e.g. ``router="serve"``)."""
    policy = router_policies.POLICIES.get((app, deployment))
    return None if policy is None else policy.any_silent()


def usable_replicas(app: str, deployment: str) -> int | None:
    """:meth:`CapacityPolicy.usable` of this process's capacity router for ``deployment`` (None: no
    such router here, or it has routed nothing yet)."""
    policy = router_policies.POLICIES.get((app, deployment))
    return None if policy is None else policy.usable()


def dead_nodes() -> set[str]:
    """Node ids (hex) the GCS holds dead (an empty set where it cannot be asked). A node lost
    without notice is known dead here before Serve has taken its replicas out of the set it
    routes to; until then a call there waits out the silence bound."""
    try:
        import ray

        client = ray._private.worker.global_worker.gcs_client
        return {k.hex() for k, info in client.get_all_node_info(timeout=1).items() if info.state != ALIVE_STATE}
    except Exception:
        return set()


def nodes_to_avoid() -> set[str]:
    """Nodes a stage call should not go to: draining (a preemption notice) or dead."""
    return draining_nodes() | dead_nodes()


def draining_nodes() -> set[str]:
    """Node ids (hex) Ray is draining now (an empty set where the GCS cannot be asked)."""
    try:
        import ray

        client = ray._private.worker.global_worker.gcs_client
        return {n.hex() if isinstance(n, bytes) else str(n) for n in client.get_draining_nodes(timeout=1)}
    except Exception:
        return set()


class CapacityRouter(FIFOMixin, RequestRouter):
    """Ray Serve's request router for ``deploy``'s stage deployments: :class:`CapacityPolicy`
    over the replicas' reported capacity (``routing_stats['rows_per_s']``), the queue
    lengths Serve caches, this caller's own calls, and the nodes Ray is draining."""

    def initialize_state(self, lost_after_s: float | None = LOST_AFTER_S, lost_over_service: float = LOST_OVER_SERVICE,
                         seed: int = 0, **_: Any) -> None:
        self.policy = CapacityPolicy(lost_after_s=lost_after_s, lost_over_service=lost_over_service, seed=seed)
        # registered where the ingress looks (this module is a copy in the router Serve builds)
        router_policies.POLICIES[(self._deployment_id.app_name, self._deployment_id.name)] = self.policy
        self.draining: set[str] = set()
        self.draining_read_at = -math.inf
        self._reading: asyncio.Future | None = None

    def _policy(self) -> CapacityPolicy:
        if not hasattr(self, "policy"):  # a router built without initialize_state
            self.initialize_state()
        return self.policy

    def _refresh_draining(self) -> None:
        now = time.monotonic()
        if now - self.draining_read_at < DRAINING_REFRESH_S or (self._reading is not None and not self._reading.done()):
            return
        self.draining_read_at = now

        async def read() -> None:
            self.draining = await asyncio.to_thread(nodes_to_avoid)

        self._reading = asyncio.ensure_future(read())

    async def choose_replicas(self, candidate_replicas: list, pending_request: Any = None) -> list[list]:
        policy = self._policy()
        self._refresh_draining()
        by_id = {str(r.replica_id.unique_id): r for r in candidate_replicas}
        views = []
        for key, r in by_id.items():
            queued = self.replica_queue_len_cache.get(r.replica_id)
            stats = r.routing_stats or {}
            views.append(ReplicaView(key, int(queued or 0), stats.get("rows_per_s"),
                                     draining=r.node_id in self.draining))
        return [[by_id[k] for k in rank] for rank in policy.rank(views)]

    def on_send_request(self, replica_id: Any) -> None:
        # Serve calls this for every call it sends (on_request_routed only where replicas may
        # reject calls, which Serve's default turns off)
        super().on_send_request(replica_id)
        self._policy().routed(str(replica_id.unique_id))

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        actor = getattr(self, "actors", {}).get(replica_id)
        if actor is not None and cancelled_calls.take(internal_request_id, actor):  # no word from the replica
            self._policy().withdrawn(str(replica_id.unique_id))
        else:
            self._policy().completed(str(replica_id.unique_id))

    def on_new_queue_len_info(self, replica_id: Any, num_ongoing_requests: int) -> None:
        super().on_new_queue_len_info(replica_id, num_ongoing_requests)
        self._policy().heard(str(replica_id.unique_id))

    def on_replica_actor_died(self, replica_id: Any) -> None:
        self._policy().forget(str(replica_id.unique_id))
        super().on_replica_actor_died(replica_id)

    def update_replicas(self, replicas: list) -> None:
        super().update_replicas(replicas)
        #: replica -> its actor id in hex (a cancelled call is known by its replica's actor:
        #: serving.runtime.cancelled_calls)
        self.actors = {r.replica_id: r.actor_id.hex() for r in replicas}
        self._policy().replicas_now({str(r.replica_id.unique_id): getattr(r, "node_id", None) in self.draining
                                     for r in replicas})


def router_config(**kwargs: Any) -> dict[str, Any]:
    """A stage deployment's ``request_router_config`` (Serve's keys) using :class:`CapacityRouter`."""
    return {"request_router_class": ROUTER_PATH, "request_router_kwargs": dict(kwargs),
            "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S}
