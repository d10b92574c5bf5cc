"""What the ingress asks of the monitor replica: its queries (``GET /explain``, ``/drift``),
the labels fed back (``POST /labels``), and the live audit's wiring (:mod:`serving.runtime.audit`).

Every call first sends what the ingress still buffers (records of rows a query or a label is
about), within the request's deadline; the monitor's own errors come back as the client's
HTTP error (:func:`serving.runtime.http_support.monitor_error`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from serving.core.schema import RequestError, parse_json
from serving.runtime.audit import AUDIT_CALL_S, LiveAudit
from serving.runtime.audit_pace import AUDIT_ROOM, AuditPace
from serving.runtime.calls import Deadline, DeadlineExceeded, call_stage, call_stage_compatible
from serving.runtime.hold import full_model_stage, full_proba
from serving.runtime.http_support import MONITOR_ROUTES, monitor_error
from serving.runtime.replicas import coerce

#: seconds a monitor call may take when the client sets no deadline
MONITOR_QUERY_S = 30.0
_NO_MONITOR = ("the monitor is not deployed for this app: deploy with monitor=... "
               "(or --monitor-attributes on the command line)")


async def _flush_records(ingress: Any, deadline: Deadline) -> None:
    """What is buffered first; a short deadline waits less, never cancels the send."""
    if ingress.records is not None:
        try:
            await asyncio.wait_for(asyncio.shield(ingress.records.flush_soon()), max(deadline.remaining(), 0.001))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("monitor", deadline.budget_s) from None


async def _answer(ingress: Any, method: str, args: tuple, deadline: Deadline) -> dict[str, Any]:
    answer = await call_stage(ingress.monitor, method, args, deadline, "monitor")
    if answer["status"] != 200:
        raise monitor_error(answer)
    answer.pop("status")
    return answer


#: query parameters that name something (an attribute), passed on as written
NAME_PARAMETERS = frozenset({"segment"})


async def monitor_query(ingress: Any, headers: Any, query: Any, route: str) -> dict[str, Any]:
    """``GET /{route}?kind=...``: the monitor query the kind names, with the other parameters."""
    if ingress.monitor is None:
        raise RequestError(503, _NO_MONITOR)
    deadline = Deadline.from_headers(headers, MONITOR_QUERY_S)
    # a segment names an attribute: as written (coerced, ?segment=none read as no segment at all)
    params = {k: v if k in NAME_PARAMETERS else coerce(v) for k, v in query.items()}
    default, names = MONITOR_ROUTES[route]
    kind = params.pop("kind", default)
    if kind not in names:
        raise RequestError(422, f"kind must be one of {sorted(names)}", [{"field": "kind", "error": "unknown"}])
    await _flush_records(ingress, deadline)
    return await _answer(ingress, "query", (names[kind], params), deadline)


async def post_labels(ingress: Any, headers: Any, body: bytes) -> dict[str, Any]:
    """``POST /labels``: the labels joined to the served rows they name (drift.LabelJoin)."""
    if ingress.monitor is None:
        raise RequestError(503, "labels are joined by the monitor; " + _NO_MONITOR)
    deadline = Deadline.from_headers(headers, MONITOR_QUERY_S)
    payload = parse_json(body)
    await _flush_records(ingress, deadline)  # the served rows they name may still be buffered here
    return await _answer(ingress, "labels", (payload,), deadline)


def ingress_audit(ingress: Any, settings: dict[str, Any] | None) -> LiveAudit | None:
    """The ingress's live audit (None without settings or the monitor): the full pipeline's
    classes from the stage that holds the full model, counts to the monitor, and shedding
    whenever the request path needs the slots."""
    if not settings or ingress.monitor is None:
        return None

    def on_cpu(part: str, seconds: float) -> None:
        ingress.metrics.count("willump_audit_cpu_seconds", seconds, part=part)

    pace = AuditPace(lambda: audit_room(ingress))

    async def full_classes(rows: Any) -> Any:
        proba = await full_proba(ingress, rows, Deadline.after(AUDIT_CALL_S),
                                 on_cpu=lambda seconds: on_cpu("full_pipeline", seconds),
                                 on_busy=lambda busy: pace.spent(len(rows), busy))
        return proba.argmax(axis=1)

    async def send(entries: list, batch_id: str) -> dict[str, Any]:
        # a monitor replica of earlier code takes the entries alone (and counts a repeat twice)
        answer = await call_stage_compatible(ingress.monitor, "audit", (entries, batch_id), ((entries,),),
                                             Deadline.after(MONITOR_QUERY_S), "monitor")
        if answer.get("error"):
            raise RuntimeError(answer["error"])
        return answer

    def on_answer(answer: dict[str, Any]) -> None:
        """The gears the ledger holds now (only an app deployed with on_alarm='step' acts on them)."""
        if settings.get("on_alarm") == "step":
            ingress.gears.hold(answer.get("held", ()))

    def busy() -> bool:
        """At half the admission bound, or every call slot of the full model's stage taken."""
        if 2 * ingress.in_flight >= ingress.max_in_flight:
            return True
        full = ingress.coalescers.get(ingress.stage_names[-1])
        return full is not None and len(ingress.stage_names) > 1 and full.in_flight >= full.limit

    return LiveAudit(settings["rate"], settings["final_levels"], full_classes, send, busy,
                     segments=settings.get("segments"), seed=settings.get("seed", 0),
                     idle=lambda: ingress.in_flight == 0,
                     on_count=lambda outcome, n: ingress.metrics.count("willump_audit_rows", n, outcome=outcome),
                     on_answer=on_answer, on_cpu=on_cpu, pace=pace, sender=getattr(ingress, "replica", "ingress"))


def audit_room(ingress: Any) -> float | None:
    """The busy seconds per second this ingress's audit may take on the full model's stage: what
    its share of the running replicas' time up to AUDIT_ROOM leaves beside the request path's
    calls there (serving.runtime.stage_load.StageLoad.request_busy_per_s; before any, the whole
    share), at least 0; 0 while the stage runs no replica (the audit does not start one: its rows
    wait, and are shed once the queue is full); None where not known (the full model in the
    ingress, no load kept, no replica count yet)."""
    stage, load = full_model_stage(ingress), getattr(ingress, "stage_load", None)
    running = ingress.running_replicas.get(stage) if stage is not None else None
    if load is None or running is None:
        return None
    return max(running * AUDIT_ROOM / load.ingresses - load.request_busy_per_s(stage), 0.0)
