"""Load-adaptive gears (CascadeServe): the served app switches to a cheaper certified plan
when its queue says the SLO is at risk, and back when the queue drains.

``willump.optimize(..., gears=(0.01, 0.02))`` certifies a ladder of plans jointly (see
``willump._gears``): gear 0 is the plan, gear i > 0 a cheaper one certified at a looser
``max_loss``. A cheaper gear answers more rows at the cheap level, so fewer rows pay for the
expensive stage: under a burst, the app keeps its latency by spending certified accuracy,
and every answer says which gear (and so which certificate) produced it.

Three parts, each testable without Ray:

* :class:`GearPolicy`: when to switch. Its signal is the queueing the ingress sees: the age
  of the oldest request still in flight, or a quantile of the latencies completed in the
  last ``window_s``, whichever is larger (the first reacts before any request finishes late,
  the second remembers a queue that just drained). Above ``up_at`` x SLO it steps one gear
  cheaper (at most one step per ``up_interval_s``, so the cheaper gear has time to act);
  only after the signal stays below ``down_at`` x SLO for ``down_after_s`` (counted from the
  last time it was seen above, or from the last switch: no arrival means nothing queued) does
  it step one gear back. The gap between the two thresholds and the dwell are the hysteresis: without
  them a queue at the edge flips gears on every request.
* :class:`GearSwitch`: the ingress's side: requests in flight, the policy, or a pinned gear.
* :class:`GearRunners`: a stage replica's side: one :class:`serving.runtime.stage_runner.StageRunner`
  per gear, over the same stage boundaries (cheap level; every later level).
* :class:`GearDemand`: what a later stage would carry in the gear the app is deployed to serve.
  A gear step is the first answer to a burst; the replicas are the lasting one
  (serving.planning.autoscale). But a cheaper gear sends fewer rows on, so a later stage's
  replicas measure less work there, and an autoscaler reading them would keep the app in the
  cheaper gear for good: the replicas bought for the cheaper gear's load are never enough for
  the deployed one, and its accuracy is spent for as long as the load lasts. Each call to a
  later stage therefore says how many times its rows the deployed gear would have sent
  (the gears' shares of rows sent on, measured here, starting from each gear's share of the
  artifact's sample rows), and the stage's autoscaler sizes for that. An app may size for the
  cheapest gear instead (``replicas_for="cheapest"``): its calls then say how many times fewer
  rows that gear would send, and replicas are bought only where no certified gear holds the load.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.core.constants import REPLICAS_FOR
from serving.core.specs import StageSpec
from serving.runtime.stage_load import StageLoad
from serving.runtime.stage_runner import StageRunner

#: share of the SLO above which the signal steps one gear cheaper: half the SLO is left for
#: the request's own work once it leaves the queue
UP_AT = 0.5
#: share of the SLO the signal must stay below (for DOWN_AFTER_S) before stepping one gear
#: back; under UP_AT so that a queue at the edge does not flip gears back and forth, but above
#: the latency an app has at its planned rate (at 0.2 the bench's app, whose p90 at the
#: planned rate was 0.26-0.42 of its SLO, never came back to gear 0 after a burst)
DOWN_AT = 0.35
#: least seconds between two steps up: a cheaper gear needs a moment to drain the queue
#: before the signal can tell whether it was enough
UP_INTERVAL_S = 0.25
#: seconds the signal must stay calm before one step back to a more accurate gear
DOWN_AFTER_S = 2.0
#: seconds of completed request latencies the signal looks at
WINDOW_S = 1.0
#: quantile of those latencies that counts (the tail the SLO is about, without one outlier)
SIGNAL_QUANTILE = 0.9
#: the values ``deploy(gears=...)`` takes besides a gear index
GEAR_MODES = ("off", "adaptive")
#: share of the running replicas' time the more accurate gear's predicted load may fill before the
#: gear steps back to it: a step back into a load the replicas cannot hold only steps up again.
#: Above the planner's headroom (serving.planning.planner.HEADROOM, 0.75, the autoscaler's
#: target): replicas sized at it must read as holding the load through the ingress's own,
#: noisier reading of it, or the app would stay in the cheaper gear with no more replicas coming
STEP_BACK_LOAD = 0.85
#: rows over which a gear's measured share of rows sent on halves its weight (about a second or
#: two of a loaded app's rows: recent enough to follow the traffic, enough rows to measure a share
#: of a few percent)
DEMAND_HALF_LIFE_ROWS = 4096
#: rows a gear must have served before its share counts (until then a call's scale is 1)
DEMAND_MIN_ROWS = 256
#: the most a call's scale may be: a gear that sends on almost nothing cannot claim unbounded work
MAX_DEMAND_SCALE = 50.0


@dataclass
class GearPolicy:
    """Which gear to serve, from a queueing signal in ms (see the module docstring).

    Deterministic: time comes in as ``now`` (seconds, any monotonic clock), so a test drives
    it with a fake clock and synthetic signals."""

    gears: int
    slo_ms: float
    up_at: float = UP_AT
    down_at: float = DOWN_AT
    up_interval_s: float = UP_INTERVAL_S
    down_after_s: float = DOWN_AFTER_S
    window_s: float = WINDOW_S
    quantile: float = SIGNAL_QUANTILE
    replicas_for: str = "deployed"
    gear: int = 0
    switches: int = 0
    _changed_at: float = field(default=-math.inf, repr=False)
    _calm_since: float | None = field(default=None, repr=False)
    _last_hot: float = field(default=-math.inf, repr=False)
    _latencies: deque = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.gears, bool) or not isinstance(self.gears, int) or self.gears < 1:
            raise ValueError(f"gears must be an integer >= 1, got {self.gears!r}")
        if not (isinstance(self.slo_ms, (int, float)) and math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise ValueError(f"slo_ms must be a positive number, got {self.slo_ms!r}")
        if not 0 < self.down_at < self.up_at:
            raise ValueError(f"need 0 < down_at < up_at, got down_at={self.down_at!r}, up_at={self.up_at!r}")
        for name in ("up_interval_s", "down_after_s", "window_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile!r}")
        if self.replicas_for not in REPLICAS_FOR:
            raise ValueError(f"replicas_for must be one of {REPLICAS_FOR}, got {self.replicas_for!r}")

    def record(self, now: float, latency_ms: float) -> None:
        """A request finished after ``latency_ms``."""
        self._latencies.append((now, float(latency_ms)))

    def signal(self, now: float, oldest_ms: float = 0.0) -> float:
        """The larger of the oldest in-flight request's age and the window's latency quantile."""
        while self._latencies and self._latencies[0][0] < now - self.window_s:
            self._latencies.popleft()
        recent = float(np.quantile([ms for _, ms in self._latencies], self.quantile)) if self._latencies else 0.0
        return max(float(oldest_ms), recent)

    def update(self, now: float, oldest_ms: float = 0.0, fits: Callable[[int], bool] | None = None) -> int:
        """The gear to serve now. ``fits(g)``: whether the replicas there are would hold gear
        ``g``'s load (GearSwitch's prediction); a calm queue steps back only into a gear that
        fits (None: every gear does)."""
        signal = self.signal(now, oldest_ms)
        if signal >= self.down_at * self.slo_ms:
            self._last_hot = now
        if signal > self.up_at * self.slo_ms:
            self._calm_since = None
            if self.gear < self.gears - 1 and now - self._changed_at >= self.up_interval_s:
                self._step(now, +1)
        elif signal < self.down_at * self.slo_ms:
            if self._calm_since is None:  # calm since the signal was last seen above down_at (no
                # request arrived in between: nothing queued here), or since the last switch
                self._calm_since = max(self._last_hot, self._changed_at) if self._last_hot > -math.inf else now
            if self.gear > 0 and now - self._calm_since >= self.down_after_s and (fits is None or fits(self.gear - 1)):
                self._step(now, -1)
                self._calm_since = now  # another full calm period before the next step back
        else:
            self._calm_since = None
        return self.gear

    def _step(self, now: float, by: int) -> None:
        self.gear += by
        self.switches += 1
        self._changed_at = now

    def to_dict(self) -> dict[str, Any]:
        return {"slo_ms": self.slo_ms, "up_at": self.up_at, "down_at": self.down_at,
                "up_interval_s": self.up_interval_s, "down_after_s": self.down_after_s,
                "window_s": self.window_s, "quantile": self.quantile, "replicas_for": self.replicas_for}


POLICY_FIELDS = ("slo_ms", "up_at", "down_at", "up_interval_s", "down_after_s", "window_s", "quantile",
                 "replicas_for")


def ladder(opt: Any) -> list[dict[str, Any]]:
    """The certified gears of an optimized pipeline: max_loss, certified loss bound, method, and
    what certification saw (rows, rows whose predicted class differed from the full pipeline's;
    None when unknown), the baseline a live audit compares its disagreement rate with."""
    return [{"gear": i, "max_loss": None if g.max_loss != g.max_loss else float(g.max_loss),
             "loss_bound": None if g.loss_bound is None else float(g.loss_bound), "method": g.method,
             "cert_rows": _count(getattr(g, "cert_rows", None)),
             "cert_disagreed": _count(getattr(g, "cert_disagreed", None))}
            for i, g in enumerate(opt.gears_)]


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


def check_gears(gears: Any, gear_policy: dict[str, Any] | None, opt: Any, *, baseline: bool) -> None:
    """Validate ``deploy(gears=..., gear_policy=...)`` against the artifact (ValueError naming
    the argument)."""
    n = len(opt.gears_)
    if isinstance(gears, bool) or not (gears in GEAR_MODES or isinstance(gears, int)):
        raise ValueError(f"gears must be one of {GEAR_MODES} or a gear index, got {gears!r}")
    if isinstance(gears, int) and not 0 <= gears < n:
        raise ValueError(f"gears={gears}: the artifact certifies gears 0..{n - 1}")
    if gears != "off" and baseline:
        raise ValueError("gears cannot be used with baseline=True (the baseline is the full pipeline)")
    if gears == "adaptive" and n < 2:
        raise ValueError("gears='adaptive' needs an artifact with certified gears: optimize(..., gears=(0.01, 0.02))"
                         f" certified {n - 1} cheaper gear(s) here")
    if gear_policy is not None:
        if not isinstance(gear_policy, dict):
            raise ValueError(f"gear_policy must be a dict, got {type(gear_policy).__name__}")
        unknown = sorted(set(gear_policy) - set(POLICY_FIELDS))
        if unknown:
            raise ValueError(f"gear_policy: unknown key(s) {unknown}; accepted: {list(POLICY_FIELDS)}")
        if gears != "adaptive":
            raise ValueError("gear_policy is only used with gears='adaptive'")


def gear_info(gears: Any, gear_policy: dict[str, Any] | None, opt: Any, slo_ms: float | None) -> dict[str, Any]:
    """What the ingress needs (JSON-able): the mode, the ladder, the policy's parameters. The
    SLO is ``gear_policy['slo_ms']``, else the plan's p99 target or the deadline."""
    policy = dict(gear_policy or {})
    if gears == "adaptive":
        policy.setdefault("slo_ms", slo_ms)
        if policy["slo_ms"] is None:
            raise ValueError("gears='adaptive' needs an SLO: give p99_ms=, deadline_ms= or gear_policy={'slo_ms': ...}")
        GearPolicy(len(opt.gears_), **policy)  # validates the values now, not in the replica
    info = {"mode": gears, "ladder": ladder(opt), "policy": policy}
    if gears == "adaptive":
        info["sent_on"] = sent_on_shares(opt)
    return info


def sent_on_shares(opt: Any) -> list[float | None]:
    """Per gear, the share of the artifact's sample rows its first level leaves unsure (sends on
    to a later stage, smoothed by half a row): what :class:`GearDemand` starts from, so that the
    autoscaler can size for a gear the app has not served yet (the first burst). None per gear
    without sample rows."""
    sample = getattr(opt, "sample_rows_", None)
    if sample is None or len(sample) == 0:
        return [None] * len(opt.gears_)
    n = len(sample)
    try:  # (k + 1/2) / (n + 1): a gear that sends none of the sample on is not read as sending nothing
        return [float((opt.gear(g).run_levels(sample, 0, 0).unsure.size + 0.5) / (n + 1))
                for g in range(len(opt.gears_))]
    except Exception as exc:  # a prior is a convenience: the served rows measure the shares anyway
        warnings.warn(f"the gears' shares of rows sent on could not be read from the sample rows "
                      f"({type(exc).__name__}: {exc}); they are measured from served rows", stacklevel=2)
        return [None] * len(opt.gears_)


class GearDemand:
    """Per gear, the share of rows it sends past the first stage (decayed sums over its own rows,
    :data:`DEMAND_HALF_LIFE_ROWS`), and :meth:`scale`: how many times the rows a call in a gear
    carries the target gear would have sent (module docstring). ``prior``: per gear, a share
    known before any row was served (:func:`sent_on_shares`; None where not known), counted as
    ``min_rows`` rows, so the share is known from the first request and the served rows take
    over as they come."""

    def __init__(self, gears: int, half_life_rows: float = DEMAND_HALF_LIFE_ROWS,
                 min_rows: float = DEMAND_MIN_ROWS, max_scale: float = MAX_DEMAND_SCALE,
                 prior: Sequence[float | None] | None = None):
        if isinstance(gears, bool) or not isinstance(gears, int) or gears < 1:
            raise ValueError(f"gears must be an integer >= 1, got {gears!r}")
        if not half_life_rows > 0:
            raise ValueError(f"half_life_rows must be > 0, got {half_life_rows!r}")
        if not max_scale >= 1:
            raise ValueError(f"max_scale must be >= 1, got {max_scale!r}")
        self.half_life_rows, self.min_rows, self.max_scale = float(half_life_rows), float(min_rows), float(max_scale)
        self.rows = [0.0] * gears
        self.sent = [0.0] * gears
        if prior is not None:
            if len(prior) != gears:
                raise ValueError(f"prior must give one share per gear ({gears}), got {len(prior)}")
            for g, share in enumerate(prior):
                if share is None:
                    continue
                if not (isinstance(share, (int, float)) and 0.0 <= share <= 1.0):
                    raise ValueError(f"prior[{g}] must be a share in [0, 1] or None, got {share!r}")
                self.rows[g], self.sent[g] = self.min_rows, float(share) * self.min_rows

    def observe(self, gear: int, rows: int, sent_on: int) -> None:
        """A request of ``rows`` rows in ``gear`` sent ``sent_on`` of them past the first stage."""
        if rows <= 0 or not 0 <= gear < len(self.rows):
            return
        keep = 0.5 ** (rows / self.half_life_rows)
        self.rows[gear] = self.rows[gear] * keep + rows
        self.sent[gear] = self.sent[gear] * keep + sent_on

    def share(self, gear: int) -> float | None:
        """The share of rows ``gear`` sends on (None until it served :data:`DEMAND_MIN_ROWS`)."""
        if not 0 <= gear < len(self.rows) or self.rows[gear] < self.min_rows:
            return None
        return self.sent[gear] / self.rows[gear]

    def scale(self, gear: int, target: int = 0) -> float:
        """Rows ``target`` would send on per row ``gear`` sends; 1 where either share is not
        known yet, or ``gear`` is the target. A more accurate target sends at least as many
        (in [1, ``max_scale``]), a cheaper one at most as many (in [1 / ``max_scale``, 1]):
        the measured shares' noise never reverses the ladder's order."""
        if gear == target:
            return 1.0
        now, wanted = self.share(gear), self.share(target)
        if now is None or wanted is None:
            return 1.0
        low, high = (1.0, self.max_scale) if target < gear else (1.0 / self.max_scale, 1.0)
        if now <= 0.0:
            return high if wanted > 0.0 else 1.0
        return min(max(wanted / now, low), high)

    def to_dict(self) -> dict[str, Any]:
        return {"share_sent_on": [self.share(g) for g in range(len(self.rows))]}


class GearSwitch:
    """The ingress's gear state: requests in flight (their start times), the policy when
    adaptive, the pinned gear otherwise. ``fits``: whether the later stages' running replicas
    would hold a gear's load (set by the ingress; None: the policy steps back on a calm queue
    alone)."""

    def __init__(self, info: dict[str, Any] | None, clock: Callable[[], float] = time.monotonic):
        info = info or {"mode": "off", "policy": {}, "ladder": [
            {"gear": 0, "max_loss": None, "loss_bound": None, "method": "", "cert_rows": None,
             "cert_disagreed": None}]}
        self.mode = info["mode"]
        self.ladder = info["ladder"]
        self.clock = clock
        self.policy = GearPolicy(len(self.ladder), **info["policy"]) if self.mode == "adaptive" else None
        self.pinned = self.mode if isinstance(self.mode, int) else 0
        self._deployed = (self.mode, self.policy, self.pinned)
        #: gears the live audit's alarm holds (serving.runtime.hold): none are served, nor any cheaper
        self.held: frozenset[int] = frozenset()
        self._started: dict[int, float] = {}
        self._ids = itertools.count()
        #: the gears' shares of rows sent on, for the later stages' autoscaler
        self.demand = GearDemand(len(self.ladder), prior=info.get("sent_on"))
        self.fits: Callable[[int], bool] | None = None

    @property
    def adaptive(self) -> bool:
        return self.policy is not None

    def begin(self) -> tuple[int, int]:
        """A request arrives: its token (for :meth:`end`) and the gear that serves it."""
        now = self.clock()
        gear = self.pinned
        if self.policy is not None:
            oldest = next(iter(self._started.values()), now)
            gear = self.policy.update(now, 1000.0 * (now - oldest), self.fits)
        token = next(self._ids)
        self._started[token] = now
        return token, gear

    def end(self, token: int, timed: bool = True) -> None:
        """The request left (answered or failed): its latency feeds the policy, unless not
        ``timed`` (refused at once: a client's mistake, a shed request; their near-zero
        latencies pulled the tail the policy reads down while the app was shedding load)."""
        started = self._started.pop(token, None)
        if started is not None and self.policy is not None and timed:
            now = self.clock()
            self.policy.record(now, 1000.0 * (now - started))

    def pin(self, gear: int | None) -> None:
        """Serve every request with ``gear`` (an operator's in-place setting:
        serving.runtime.live_settings); None goes back to the mode the app was deployed with
        (its adaptive policy, with the state it had, or its pinned gear)."""
        if gear is None:
            self.mode, self.policy, self.pinned = self._deployed
            return
        if not 0 <= gear < len(self.ladder):
            raise ValueError(f"gear must be from 0 to {len(self.ladder) - 1}, got {gear!r}")
        self.mode, self.policy, self.pinned = gear, None, gear

    def demand_scale(self, gear: int) -> float:
        """How many times a later-stage call's rows in ``gear`` the gear the replicas are sized
        for would send (:data:`REPLICAS_FOR`): gear 0 for an adaptive app (``"deployed"``: its
        cheaper gears answer bursts for a while), the cheapest gear the live audit lets it serve
        (``"cheapest"``: below 1 in a more accurate gear; 1 while gear 0 is held and the full
        pipeline answers), or the served gear itself (``"served"``, and a pinned gear: 1)."""
        if self.policy is None or self.policy.replicas_for == "served":
            return 1.0
        if self.policy.replicas_for == "deployed":
            return self.demand.scale(gear, 0)
        # the cheapest gear the app may serve: below every gear the live audit holds
        cheapest = min(self.held, default=len(self.ladder)) - 1
        return self.demand.scale(gear, cheapest) if cheapest >= 0 else 1.0

    def demand_info(self) -> dict[str, Any]:
        """What the later stages' autoscaler is told (``/plan``'s ``gear_demand``): each gear's
        share of rows sent on, the gear the replicas are sized for, and how many times a call's
        rows in each gear that gear would send (:meth:`demand_scale`)."""
        return {**self.demand.to_dict(), "replicas_for": None if self.policy is None else self.policy.replicas_for,
                "demand_scale": [self.demand_scale(g) for g in range(len(self.ladder))]}

    def predicted_fits(self, load: StageLoad, running: dict[str, int], stages: list[str],
                       gear: int, share: float = STEP_BACK_LOAD) -> bool:
        """Whether ``gear``'s load on each of ``stages`` (:class:`~serving.runtime.stage_load.StageLoad` at the share of rows
        ``gear`` sends on) stays within ``share`` of the replicas ``running`` there; a stage whose
        load or replicas are not known yet does not hold the step back."""
        sent_on = self.demand.share(gear)
        for stage in stages:
            busy, replicas = load.busy_replicas(stage, sent_on), running.get(stage)
            # a stage with no replica running holds no load (0 is known, not "unknown")
            if busy is not None and replicas is not None and busy > share * replicas:
                return False
        return True

    def hold(self, gears: Any) -> None:
        """The gears the monitor's ledger holds now (the answer to the audit's last counts)."""
        self.held = frozenset(int(g) for g in gears if 0 <= int(g) < len(self.ladder))

    def fields(self, gear: int, full: bool = False) -> dict[str, Any]:
        """The answer's gear fields: the gear, the max_loss and certified bound it carries, and
        whether the full pipeline answered every row (gear 0 held by the live audit's alarm)."""
        row = self.ladder[gear]
        return {"gear": gear, "gear_max_loss": row["max_loss"], "gear_loss_bound": row["loss_bound"],
                "full_pipeline": full}


def gear_spec(spec: Any, levels: int) -> Any:
    """The stage boundaries for a gear of ``levels`` levels: the cheap stage keeps level 0,
    a later stage runs every level from its first on (a gear's chain may be longer or
    shorter than the plan's)."""

    if spec.first == 0 and spec.last == 0:
        return spec
    return StageSpec(spec.name, spec.first, levels - 1)


class GearRunners:
    """A stage replica's runner per gear (built on first use, from the runner of gear 0)."""

    def __init__(self, base: Any):
        self.base = base
        self._runners: dict[int, Any] = {0: base}

    def get(self, gear: int) -> Any:
        runner = self._runners.get(gear)
        if runner is None:

            opt = self.base.opt.gear(int(gear))
            runner = StageRunner(opt, gear_spec(self.base.spec, len(opt.levels)), baseline=self.base.baseline,
                                 fallback=self.base.fallback)
            self._runners[gear] = runner
        return runner

    def local(self, gear: int, stage: Any) -> Callable[[list], list]:
        """``run_many`` of gear ``gear`` for a stage run in the ingress (``LocalStage``), its
        answers labelled with that stage's replica like the stage's own."""
        def run_many(items: list) -> list:
            outs = self.get(gear).run_many(items)
            for out in outs:
                if isinstance(out, dict):
                    out["replica"] = stage.replica
            return outs

        return run_many
