"""The planner as Ray Serve's autoscaler: a stage's replicas chosen from the work its replicas
measure they do, not from the requests they hold.

Ray Serve's default policy scales a deployment so that each replica holds
``target_ongoing_requests`` (Serve's "replica queue length" policy). The ingress of a deploy()
app keeps at most CONCURRENT_BATCHES calls in flight per running replica of a stage and queues
the rest itself, so what Serve sees is bounded by the replicas it has, and a request count says
little about work (a call carries one row or hundreds). Each stage replica measures the share
of time it computes (serving.runtime.routing.BusyMeter, reported through
``record_autoscaling_stats``): the rows it answers times what a row costs it, measured where it
runs. Summed over replicas (Serve averages each over its look-back window) that is the replicas'
worth of work the stage has, and the policy asks for

    replicas = sum of busy shares / headroom

with the planner's own headroom (serving.planning.planner.HEADROOM, InferLine's utilisation
target; the plans are made at the same one). Up fast, down slowly: the busy shares are read twice, over the last ``react_s`` of the
replicas' reports (a burst is answered within seconds, not after Serve's look-back window has
averaged it in) and over Serve's whole window, and the larger of the two is asked for (a
lull must last the window, and Serve's downscale delay after it). A saturated stage hides its demand: when every call slot the ingress keeps for it is
taken (``total_num_requests`` at ``saturated_ongoing`` per replica) the busy shares are capped at
the replicas there are, so the policy asks for at least one replica more than it has; and the
work queued at the ingresses is asked for in one step: every call an ingress makes tells the
stage replica how many rows it still queues for the stage (serving.runtime.routing.BusyMeter
reports the sum over ingresses), and the policy adds the replicas that clear those rows, at what
a row costs the replicas, within a replica's start time beside the arriving load (without it a
burst got one replica more per replica start time while its queue grew). That start time is
measured by the policy from Serve's counts of replicas asked for and running (a start from zero
included), not typed in; ``drain_s`` stands in until the first start is seen.

A cheaper gear (serving.runtime.gears) is the first answer to a burst and the replicas
the lasting one: the policy reads each replica's busy share scaled to the rows the gear the
app is deployed to serve would have sent it (``deployed_gear_busy_share``; a cheaper gear
sends fewer rows on, and replicas sized for its load would keep the app in it), so the
replicas for that gear start while the cheaper gear holds the latency, and the gear policy
steps back once they answer. Only the busy share is scaled: the rows queued at the ingresses
and the saturation rule count what the served gear sends, and a row of a later stage is taken
to cost the same in every gear. With ``gear_policy={"replicas_for": "cheapest"}`` the share is
scaled down instead, to what the cheapest certified gear would send: replicas are asked for only
where that gear would not hold the load, and bursts are served in cheaper gears.

The live audit's calls (``deferrable_busy_share``) are paced by the ingress to the room the
request path leaves below serving.runtime.audit_pace.AUDIT_ROOM of the running replicas, and
wait in a burst: they count in the window's reading (the audit's steady load is planned for) but
not in the recent one, so that the audit filling that room is never read as a burst; nor do its
calls count toward the saturation rule (``deferrable_ongoing``: Serve's request count holds an
audit call while it waits its turn in pieces). Each time
the policy asks for more replicas than run it says why in Serve's controller log
(:data:`SCALE_LOG`). Serve's wrapper
around a custom policy still applies ``min_replicas``/``max_replicas``, the up- and downscale
delays and the scale-from-zero fast path.

``PlannerAutoscaler`` is a class so that Serve builds it once with its parameters
(``policy_kwargs``); it holds no Ray import and is tested on plain objects.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from serving.core.constants import CONCURRENT_BATCHES
from serving.planning.planner import HEADROOM

#: the stage replicas' reports Serve aggregates (serving.runtime.routing.BusyMeter.autoscaling_stats)
BUSY_METRIC = "busy_share"
#: the busy share scaled to the deployed gear's rows (read instead of BUSY_METRIC where reported)
DEPLOYED_GEAR_BUSY_METRIC = "deployed_gear_busy_share"
ROWS_METRIC = "rows_per_s"
BACKLOG_METRIC = "backlog_rows"
COST_METRIC = "busy_s_per_row"
#: the part of the busy share the calls that can wait took (the live audit's)
DEFERRABLE_METRIC = "deferrable_busy_share"
#: the calls that can wait a replica held on average (in Serve's request count all the while)
DEFERRABLE_ONGOING_METRIC = "deferrable_ongoing"
#: the ingress replicas that called a stage replica lately (serving.runtime.routing.BusyMeter)
CALLERS_METRIC = "ingress_callers"
#: share of the ingress's call slots for a stage that reads as saturated: Serve's request count
#: is a mean over its look-back window, which a capped count reaches only if every sample of the
#: window sat at the cap
SATURATED_SHARE = 0.9
#: seconds of the latest reports a rise in work is read from (replicas record every
#: serving.launch.proxy.AUTOSCALING_PUSH_S, 0.5 s, through AutoscalingConfig.metrics_interval_s)
REACT_S = 2.0
#: seconds after which a replica's last report of its backlog no longer counts (it reports every
#: serving.launch.proxy.AUTOSCALING_PUSH_S while it runs)
STALE_REPORT_S = 5.0
#: seconds within which the replicas asked for should clear the rows the ingresses queue, beside
#: the load arriving, until a replica start is measured: then the measured start time (a shorter
#: span asks for replicas that start after the queue would have drained, a longer one leaves the
#: queue growing while they start)
DRAIN_S = 5.0
#: replica starts the measured start time is the median of (the latest ones)
START_SAMPLES = 8
#: a measured start shorter than this is not one (a process boots and loads for longer)
MIN_START_S = 0.5
#: what starts each line the policy logs when it measures a start (Serve's controller log)
START_LOG = "willump autoscaler"
#: what starts each line the policy logs when it asks for more replicas than run, and why
SCALE_LOG = "willump autoscaler asks"
#: Serve's logger: lines reach the controller's log file
logger = logging.getLogger("ray.serve")
#: the policy's import path, as a Serve config names it
POLICY_PATH = "serving.planning.autoscale:PlannerAutoscaler"


def planned_replicas(busy_replicas: float, *, headroom: float = HEADROOM) -> float:
    """Replicas that do ``busy_replicas`` replicas' worth of work with each busy ``headroom`` of
    the time (a fraction: Serve rounds it up)."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom!r}")
    return max(busy_replicas, 0.0) / headroom


class PlannerAutoscaler:
    """Serve's custom autoscaling policy for a stage deployment (module docstring).

    ``headroom``: the share of its time a replica is planned to compute; ``saturated_ongoing``:
    calls per stage replica at which every slot the ingresses keep for the stage is taken
    (CONCURRENT_BATCHES per ingress replica; :data:`SATURATED_SHARE` of it reads as saturated); ``react_s``:
    the recent span of reports a rise is read from; ``drain_s``: seconds within which the replicas
    asked for should clear the rows the ingresses queue until a replica start is measured, after
    which the measured start time is that span (``measure_start=False`` keeps ``drain_s``).

    The start time is measured here, from Serve's own counts: a replica asked for (the target
    rose, or a running replica was lost and Serve replaces it) is matched, first asked first
    served, with the next replica that runs (by replica id where Serve gives them); the time
    between is one start (Serve's scheduling, the worker's boot, the artifact's load), the median
    of the latest ``START_SAMPLES`` the start time. It lives in the policy's state
    (``replica_start_s``), so a stage scaled to zero keeps it for its next start. A start from
    zero is measured from the policy's last call before Serve's cold-start path took over; the
    replacement of a stage's last replica lost under traffic is not measured (that path skips the
    policy while it runs none)."""

    def __init__(self, headroom: float = HEADROOM, saturated_ongoing: float = CONCURRENT_BATCHES,
                 react_s: float = REACT_S, drain_s: float = DRAIN_S, measure_start: bool = True):
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {headroom!r}")
        if not saturated_ongoing > 0:
            raise ValueError(f"saturated_ongoing must be > 0, got {saturated_ongoing!r}")
        if not react_s > 0:
            raise ValueError(f"react_s must be > 0, got {react_s!r}")
        if not drain_s > 0:
            raise ValueError(f"drain_s must be > 0, got {drain_s!r}")
        self.headroom = float(headroom)
        self.saturated_ongoing = float(saturated_ongoing)
        self.react_s = float(react_s)
        self.drain_s = float(drain_s)
        self.measure_start = bool(measure_start)

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        """Serve's policy call: ``ctx`` is its AutoscalingContext. Returns the replicas wanted
        (a fraction Serve rounds up) and what the decision read (kept as the policy's state)."""
        current = int(ctx.current_num_replicas)
        metrics = ctx.aggregated_metrics or {}
        # per replica, its deployed-gear share; a replica of earlier code reports none: its busy share
        measured = metrics.get(BUSY_METRIC) or {}
        busy = _per_replica(metrics.get(DEPLOYED_GEAR_BUSY_METRIC) or {}, measured)
        rows = metrics.get(ROWS_METRIC) or {}
        # Serve's count less the audit's calls, which wait by design: never the request path's saturation
        audit_calls = float(sum((metrics.get(DEFERRABLE_ONGOING_METRIC) or {}).values()))
        ongoing = max(float(ctx.total_num_requests or 0.0) - audit_calls, 0.0)
        # the slots the ingresses keep: CONCURRENT_BATCHES per stage replica for each ingress replica
        # the stage replicas heard from (an edited config's or a scaled ingress's count, not the
        # planned one: with two ingress replicas against the planned one every tick read as
        # saturated and the stage ratcheted to max_replicas); the planned count until they report
        callers = max((metrics.get(CALLERS_METRIC) or {}).values(), default=0.0)
        per_replica = CONCURRENT_BATCHES * round(callers) if callers >= 0.5 else self.saturated_ongoing
        saturated = current > 0 and ongoing >= SATURATED_SHARE * per_replica * current
        raw = ctx.raw_metrics or {}
        recent = _recent_sum(_per_replica(raw.get(DEPLOYED_GEAR_BUSY_METRIC) or {}, raw.get(BUSY_METRIC) or {}),
                             self.react_s)
        deferrable = _recent_sum(raw.get(DEFERRABLE_METRIC) or {}, self.react_s)
        recent = max(recent - deferrable, 0.0)  # the audit's rise is no burst (module docstring)
        starts = _starts(ctx) if self.measure_start else {}
        drain_s = starts.get("replica_start_s") or self.drain_s
        queued_rows, row_cost = _queued(raw.get(BACKLOG_METRIC) or {}, raw.get(COST_METRIC) or {}, self.react_s,
                                        getattr(ctx, "current_time", None))
        queued = queued_rows * row_cost / drain_s
        if busy:
            wanted = planned_replicas(max(float(sum(busy.values())), recent) + queued, headroom=self.headroom)
        else:  # nothing reported yet (a replica just started): keep what there is
            wanted = float(ctx.target_num_replicas)
        if saturated:
            wanted = max(wanted, current + 1)
        # float noise off (Serve rounds the answer up: 1.0000000000000002, a sum of busy shares over
        # the headroom, asked for a replica more than the state and the log said)
        wanted = round(wanted, 9)
        state = {"busy_replicas": float(sum(measured.values())),
                 "deployed_gear_busy_replicas": float(sum(busy.values())), "busy_replicas_recent": recent,
                 "deferrable_busy_replicas": float(sum((metrics.get(DEFERRABLE_METRIC) or {}).values())),
                 "rows_per_s": float(sum(rows.values())), "ongoing": ongoing, "audit_ongoing": audit_calls,
                 "saturated": saturated, "saturated_ongoing": per_replica,
                 "queued_rows": queued_rows, "queued_replicas": queued, "drain_s": drain_s, "wanted": wanted,
                 "asked": math.ceil(wanted), **starts}
        before = getattr(ctx, "policy_state", None) or {}
        if busy and state["asked"] > current and state["asked"] != before.get("asked"):
            logger.info("%s %s/%s: %d replicas (%.2f) with %d running: busy %.2f over the window (of it the "
                        "audit's %.2f), %.2f recent (less the audit's %.2f), %.2f queued, saturated %s (%.1f ongoing)",
                        SCALE_LOG, getattr(ctx, "app_name", "?"), getattr(ctx, "deployment_name", "?"),
                        state["asked"], wanted, current, state["deployed_gear_busy_replicas"],
                        state["deferrable_busy_replicas"], recent, deferrable, queued, saturated, ongoing)
        return wanted, state

    def __repr__(self) -> str:
        return (f"PlannerAutoscaler(headroom={self.headroom}, saturated_ongoing={self.saturated_ongoing}, "
                f"drain_s={self.drain_s}, measure_start={self.measure_start})")


def _starts(ctx: Any) -> dict[str, Any]:
    """The replica starts measured so far, carried in the policy's state (class docstring):
    ``start_asked_at`` (when each replica not yet running was asked for), ``start_samples_s``
    (the latest starts, seconds), ``replica_start_s`` (their median, None before one), and what
    this call saw (``target_seen``, ``running_seen``, ``time_seen``). Empty without Serve's
    clock (``current_time``)."""
    now = getattr(ctx, "current_time", None)
    if now is None:
        return {}
    before = getattr(ctx, "policy_state", None) or {}
    target, running = int(ctx.target_num_replicas), int(ctx.current_num_replicas)
    asked = [float(t) for t in before.get("start_asked_at", [])]
    samples = [float(x) for x in before.get("start_samples_s", [])]
    ids = getattr(ctx, "running_replicas", None)
    current = None if ids is None else sorted(str(getattr(r, "unique_id", r)) for r in ids)
    if "target_seen" in before:
        seen_target, seen_running = int(before["target_seen"]), int(before["running_seen"])
        if current is not None and before.get("running_ids") is not None:  # by replica: a swap counts
            gone = len(set(before["running_ids"]) - set(current))
            came = len(set(current) - set(before["running_ids"]))
        else:
            gone, came = max(seen_running - running, 0), max(running - seen_running, 0)
        # replicas asked for since the last call: a higher target (the last call's decision set
        # it) and replacements of lost ones (Serve starts them as it sees the loss, as this call does)
        asked += [float(before["time_seen"])] * max(target - seen_target, 0)
        asked += [float(now)] * (gone if target >= seen_target else 0)
        new = [now - asked.pop(0) for _ in range(came) if asked]  # oldest ask first
        # a replica Serve counts without a start of its own (a swap within one call, a migration's
        # replacement matched to an ask) reads as a start of about nothing: not one
        new = [x for x in new if x >= MIN_START_S]
        samples += new
        if new:  # in Serve's controller log, where an operator looks for autoscaling decisions
            logger.info("%s %s/%s: replica start %s s; start time %.2f s (median of the latest %d)", START_LOG,
                        getattr(ctx, "app_name", "?"), getattr(ctx, "deployment_name", "?"),
                        ", ".join(f"{x:.2f}" for x in new),
                        statistics.median(samples[-START_SAMPLES:]), len(samples[-START_SAMPLES:]))
    asked = asked[:max(target - running, 0)]  # a lower target: the latest asks were withdrawn
    samples = samples[-START_SAMPLES:]
    return {"start_asked_at": asked, "start_samples_s": samples,
            "replica_start_s": float(statistics.median(samples)) if samples else None,
            "target_seen": target, "running_seen": running, "time_seen": float(now), "running_ids": current}


def _per_replica(preferred: dict[Any, Any], fallback: dict[Any, Any]) -> dict[Any, Any]:
    """Per replica, its ``preferred`` figure where it reports one, else its ``fallback``."""
    return {**fallback, **preferred}


def _recent_sum(series: dict[Any, Any], span_s: float) -> float:
    """Per replica, the mean of its reports in the last ``span_s`` of its own series (Serve's
    TimeStampedValue lists), summed over replicas; 0 without reports."""
    total = 0.0
    for points in series.values():
        if not points:
            continue
        last = max(p.timestamp for p in points)
        values = [p.value for p in points if p.timestamp > last - span_s]
        total += sum(values) / len(values)
    return total


def _queued(backlog: dict[Any, Any], cost: dict[Any, Any], span_s: float,
            now: float | None = None) -> tuple[float, float]:
    """The rows the ingresses queue for the stage (the largest sum any replica heard: each
    ingress calls most replicas; its latest report) and the busy seconds a row costs (the
    median of the replicas' latest figures, each within ``span_s`` of that replica's own latest
    report, a row cost of 0, a window without rows, left out). Each replica is read on its own
    series and counts while its latest report is within STALE_REPORT_S of ``now`` (the
    controller's clock; without it, the newest report of any replica): replicas push at their
    own phases and clocks, and judging every report against the newest of any replica within
    ``span_s`` kept only the replica that pushed last (a replica just started, with nothing
    queued, hid the backlog the others reported). (0, 0) unknown."""
    def latest(series: dict[Any, Any], positive: bool) -> list[float]:
        lasts = {k: max(p.timestamp for p in ps) for k, ps in series.items() if ps}
        if not lasts:
            return []
        newest = max(lasts.values()) if now is None else now
        out = []
        for k, last in lasts.items():
            if last < newest - STALE_REPORT_S:
                continue  # a replica that stopped reporting
            fresh = [p for p in series[k] if p.timestamp > last - span_s and (p.value > 0 or not positive)]
            if fresh:
                out.append(float(max(fresh, key=lambda p: p.timestamp).value))
        return out

    rows, costs = latest(backlog, False), latest(cost, True)
    if not rows or not costs:
        return 0.0, 0.0
    return max(rows), float(statistics.median(costs))


def policy_config(headroom: float = HEADROOM, ingress_replicas: int = 1) -> dict[str, Any]:
    """The ``policy`` entry of a stage's ``autoscaling_config`` (Serve's AutoscalingPolicy, in
    the plain form a Serve config file holds); every ingress replica keeps CONCURRENT_BATCHES
    calls in flight per stage replica."""
    saturated = float(CONCURRENT_BATCHES * max(int(ingress_replicas), 1))
    PlannerAutoscaler(headroom, saturated)  # checks them here, not in Serve's controller
    return {"policy_function": POLICY_PATH,
            "policy_kwargs": {"headroom": float(headroom), "saturated_ongoing": saturated}}
