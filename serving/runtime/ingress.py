"""The HTTP ingress: validates requests, routes rows through the stages within each request's
deadline, answers, and feeds the monitor.

No ``from __future__ import annotations`` here: FastAPI resolves the route annotations of
the class Serve pickles by value, so they must be real objects.

Per request: an id (the client's ``X-Request-Id`` or a new one, echoed back and logged with
any server error, whose text never reaches the client); an optional API key; a deadline
(``X-Deadline-Ms``, default from the plan's p99 target); admission against a bound on
requests in flight (503 with ``Retry-After`` beyond it); the body parsed off the event loop
when large; rows merged with other requests' rows into stage calls (:mod:`serving.runtime.coalesce`),
a call failing on one request's rows failing only that request; with ``degrade=True``, rows
whose later stage is late or overloaded answered by the earlier level, marked ``degraded``.
"""

import asyncio
import hmac
import logging
import re
import time
import uuid
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from serving.core.artifacts import ArtifactSource
from serving.core.constants import (
    CONCURRENT_BATCHES,
    INGRESS_BATCH_ROWS,
    INGRESS_SERVE_HEADROOM,
    PARSE_INLINE_BYTES,
)
from serving.core.jsonsafe import clean
from serving.core.plan_board import PlanAdoption
from serving.core.schema import (
    PredictRequest,
    PredictResponse,
    RequestError,
    RowSchema,
    TopKRequest,
    TopKResponse,
    parse_request,
    predict_answer,
)
from serving.core.specs import IngressConfig, StageSpec, pool_deployment
from serving.runtime import oip, spans
from serving.runtime.calls import (
    Deadline,
    DeadlineExceeded,
    StageHedge,
    StageOverloaded,
    call_stage,
    call_stage_compatible,
    wait_or_cancel,
)
from serving.runtime.coalesce import Coalescer, Item
from serving.runtime.dashboard.live import dashboard_of, index_page, plan_metrics, serve_ui
from serving.runtime.edge import HttpEdge, unbuffer_request_logs
from serving.runtime.gc_pauses import GcPauses
from serving.runtime.gears import GearRunners, GearSwitch
from serving.runtime.hold import answer_in_full, full_model_stage, held_gear
from serving.runtime.http_support import (
    OPEN_ROUTES,
    ROUTE_ERRORS,
    LazyHandle,
    error_response,
    key_hash,
    openapi_document,
    public_plan,
    swagger_asset,
)
from serving.runtime.ingress_app import app
from serving.runtime.keys import KeyCheck
from serving.runtime.live_settings import current_settings, reconfigure
from serving.runtime.loop_lag import LoopLag
from serving.runtime.metrics import ServingMetrics, exact_totals
from serving.runtime.monitor_calls import MONITOR_QUERY_S, ingress_audit, monitor_query, post_labels
from serving.runtime.oip import InferRequest, infer_answer
from serving.runtime.pools import PooledStage, pooled_stage, stage_deployments
from serving.runtime.records import FULL_PIPELINE_GEAR, RecordBuffer, record_columns
from serving.runtime.replicas import LocalStage, replica_id
from serving.runtime.routing import any_silent, usable_replicas
from serving.runtime.single_flight import SingleFlight
from serving.runtime.stage_load import StageLoad
from serving.runtime.stage_runner import StageRunner, concat_blocks, concat_rows, split_outputs
from serving.runtime.watch import ReplicaWatch

log = logging.getLogger("ray.serve")

#: share of a request's deadline kept to answer degraded when a later stage is late
DEGRADE_RESERVE = 0.2
#: seconds /readyz waits for each stage's canary before it counts the stage as not ready
READY_TIMEOUT_S = 10.0
#: the status a request is counted under (willump_requests) when it was cancelled before its answer:
#: its client went away, or Serve's request timeout passed (nginx's "client closed request");
#: before, such a request was counted as answered 200
CLIENT_GONE_STATUS = 499
#: routes that show the plan: a replica looks for its refined plan before answering them
PLAN_ROUTES = frozenset({"plan", "metrics", "index", "ui"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")



# Serve pickles deployment classes when they are decorated: every helper a method uses
# must be defined above this line.
@serve.deployment
@serve.ingress(app)
class Ingress(HttpEdge):
    """HTTP ingress: validates requests, routes rows through the stages, feeds the monitor."""

    def __init__(self, first: Any, second: Any | None, config: IngressConfig,
                 local_first: dict[str, Any] | None = None):
        if local_first is not None and "runner" in local_first:  # serving.measure.calibrate's stand-in model
            first = LocalStage(None, None, runner=local_first["runner"], inline=local_first.get("inline", False))
        elif local_first is not None:  # layout="fused": the first stage runs in this process
            first = LocalStage(ArtifactSource(**local_first["artifact"]), StageSpec(**local_first["spec"]),
                               device="cpu", runtime=local_first["runtime"], fallback=local_first["fallback"],
                               inline=local_first.get("inline", False))
        self.config = config
        #: the config's JSON form: what /plan, /report and the dashboard read
        self.info = config.info()
        self.name = config.name
        self.stage_names = list(config.stages)
        #: the traced request's span per stage (serving.runtime.spans), named once
        self.stage_spans = [f"willump.stage {s}" for s in self.stage_names]
        # a stage with a deployment per node pool (deploy(pools=...)) is called as one handle
        names = [*self.stage_names, None][:2]
        first, second = (pooled_stage(target, (config.pools or {}).get(stage))
                         for stage, target in zip(names, (first, second), strict=True))
        self.first, self.second = first, second
        #: Serve deployment -> (stage, pool or None): what the replica watch reports on
        self.deployments = stage_deployments(self.name, self.stage_names, config.pools,
                                             skip_first=isinstance(first, LocalStage))
        self.local = isinstance(first, LocalStage)
        self.version = config.model_version
        if config.unbuffered_logs:
            unbuffer_request_logs()
        self.classes = np.asarray(config.classes, dtype=object)
        self.schema = RowSchema.from_dict(config.row_schema)
        self.max_body = config.max_body_bytes
        self.max_rows = config.max_rows
        self.deadline_s = config.deadline_s
        self.degrade = config.degrade
        self.first_level = config.first_stage_last_level
        self.api_key = KeyCheck(config.api_key_hmac, config.api_key_env)
        self.allowed_hosts = config.allowed_hosts
        #: deploy's in-situ probe marks its requests with a one-off token (serving.measure.insitu)
        self.probe_hash = config.probe_sha256
        #: the plan deploy refines after that probe, adopted without a restart (serving.core.plan_board)
        self.plan_adoption = PlanAdoption(self.name, self.probe_hash, self._adopt_plan)
        self.plan_adoption.start()
        self.max_in_flight = config.max_in_flight
        self.in_flight = 0
        #: this replica's name to the stages it calls (their autoscaler sums what each ingress queues)
        self.replica = replica_id(f"ingress-{uuid.uuid4().hex[:12]}")
        self.metrics = ServingMetrics(self.name)
        for stage, target in zip(self.stage_names, (self.first, self.second), strict=False):
            if isinstance(target, PooledStage):
                target.on_route = lambda pool, stage=stage: self.metrics.count("willump_stage_pool_calls", stage=stage,
                                                                                pool=pool)
                names = {pool: pool_deployment(self.name, stage, pool) for pool in target.pools}  # once, not per call
                target.usable = lambda pool, names=names: usable_replicas(self.name, names[pool])
        batch_rows = INGRESS_BATCH_ROWS if config.batching else 1
        self.coalescers: dict[str, Coalescer] = {}
        for i, (stage, target) in enumerate(zip(self.stage_names, (first, second), strict=False)):
            run = self._local_batch if (i == 0 and self.local) else self._remote_batch(target, stage)
            self.coalescers[stage] = Coalescer(run, stage=stage, max_rows=batch_rows, limit=CONCURRENT_BATCHES,
                                               max_queued=max(self.max_in_flight, 1))
        # copies of slow calls to the remote stages (serving.runtime.calls.StageHedge): hedges where
        # asked for, and always a copy of a call its replica holds past the bound on a silent replica
        hedging = config.hedging or {}
        self.hedges = {
            stage: StageHedge(lambda stage=stage: self.coalescers[stage].limit // CONCURRENT_BATCHES,
                              hedging.get("quantile"), hedging.get("floor_over_median"),
                              on_hedge=lambda won, stage=stage: self.metrics.count(
                                  "willump_stage_hedges", stage=stage, won=str(won).lower()),
                              in_flight=lambda stage=stage: self.coalescers[stage].in_flight,
                              enabled=bool(config.hedging), lost_after_s=config.lost_after_s,
                              on_rescue=lambda won, stage=stage: self.metrics.count(
                                  "willump_stage_rescues", stage=stage, won=str(won).lower()),
                              silent=lambda stage=stage: self._any_silent(stage),
                              min_win_share=hedging.get("min_win_share"),
                              on_backoff=lambda factor, stage=stage: self.metrics.count(
                                  "willump_stage_hedge_backoffs", stage=stage, factor=f"{factor:g}"))
            for i, stage in enumerate(self.stage_names) if not (i == 0 and self.local)}
        monitor = config.monitor
        self.monitor = LazyHandle("monitor", monitor["app"]) if monitor else None
        self.records = None
        if monitor:
            self.records = RecordBuffer(
                self.monitor, monitor["records"],
                on_drop=lambda reason, n: self.metrics.count("willump_monitor_records_dropped", n, reason=reason),
                on_sent=lambda n: self.metrics.count("willump_monitor_records_sent", n),
                on_retry=lambda n: self.metrics.count("willump_monitor_records_retried", n))
        self.openapi_doc = openapi_document(app, self.schema, keyed=self.api_key.required, monitor=bool(monitor))
        self._watch: ReplicaWatch | None = None
        # how late this replica's event loop wakes up (/metrics), from its first admitted request
        self.loop_lag = LoopLag(lambda late: self.metrics.observe("willump_event_loop_lag_seconds", late))
        self.gears = GearSwitch(config.gears)  # load-adaptive gears (serving.runtime.gears)
        #: what the later stages are busy with, and their running replicas: an adaptive app's calm
        #: queue steps back only into a gear whose predicted load those replicas hold (None: no
        #: gears to step, nothing measured on the request path)
        self.stage_load: StageLoad | None = None
        self.running_replicas: dict[str, int] = {}
        if self.gears.adaptive and len(self.stage_names) > 1:
            self.stage_load = StageLoad(ingresses=max(1, int(config.plan.get("ingress_replicas", 1) or 1)))
            self.gears.fits = lambda gear: self.gears.predicted_fits(
                self.stage_load, self.running_replicas, self.stage_names[1:], gear)
        self.gear_now = self.gears.pinned
        self.local_gears = GearRunners(first.runner) if self.local and isinstance(first.runner, StageRunner) else None
        self.audit = ingress_audit(self, config.audit)  # the live audit (serving.runtime.audit)
        if self.audit is not None and self.stage_load is None and full_model_stage(self) is not None:
            # the request path's load on the full model's stage paces the audit (audit_pace)
            self.stage_load = StageLoad(ingresses=max(1, int(config.plan.get("ingress_replicas", 1) or 1)))
        #: the in-place settings (Serve's user_config): applied once yet, and the last refused;
        #: what a user_config leaves out goes back to the deployed values (taken at the first)
        self.settings_applied, self.settings_rejected, self.deployed_settings = False, None, None
        #: every setting applied so far (what /plan shows for those no object of the app holds)
        self.live_values: dict[str, Any] = {}
        #: Serve's own bound on requests in a replica (graph.ingress_options)
        self.max_in_flight_cap = config.max_in_flight + INGRESS_SERVE_HEADROOM
        #: the collector's pauses (/metrics), over the heap Serve froze once the replica started
        self.gc_pauses = GcPauses(lambda generation, seconds: self.metrics.observe(
            "willump_gc_pause_seconds", seconds, generation=str(generation)))

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's in-place update: the settings an operator may change without a restart
        (serving.runtime.live_settings.reconfigure: a bad ``user_config`` is refused, and the
        replica serves with the settings it has and says so). A coroutine, so Serve runs
        it on the requests' event loop, between two of their steps: a plain method ran in a
        worker thread beside them (Serve runs sync methods in a thread pool), and a request could
        read a setting half changed (the audit's rate and its gaps, the gear policy, the bound)."""
        reconfigure(self, user_config)

    # --- plumbing ------------------------------------------------------------------------
    def _remote_batch(self, handle: Any, stage: str):
        async def run(items: list[Item], deadline: Deadline) -> list[Any]:
            # the gear (0: the plan), the rows still queued here and how many times these rows the
            # gear the replicas are sized for would send (serving.runtime.gears.GearDemand), for the
            # stage's autoscaler
            gear = items[0].key or 0
            scale = self.gears.demand_scale(gear) if stage != self.stage_names[0] else 1.0
            backlog = (self.replica, self.coalescers[stage].queued_rows, scale)
            args = (concat_rows([it.rows for it in items]), concat_blocks([it.blocks for it in items]), gear, backlog)
            # a stage replica of earlier code (a rolling update across versions) takes the backlog
            # without the scale, or no backlog at all
            merged = await call_stage_compatible(
                handle, "run", args, ((*args[:3], backlog[:2]), args[:3]), deadline, stage,
                on_retry=lambda: self.metrics.count("willump_stage_retries", stage=stage), hedge=self.hedges.get(stage))
            self._observe_stage(stage, merged, scale)
            return split_outputs(merged, [it.size for it in items])

        return run

    async def _local_batch(self, items: list[Item], deadline: Deadline) -> list[Any]:
        start = time.perf_counter()
        run = self.local_gears.local(items[0].key, self.first) if items[0].key else self.first.run_many
        work = [(it.rows, it.blocks) for it in items]
        outs = run(work) if self.first.inline else await asyncio.to_thread(run, work)
        self.metrics.observe("willump_stage_latency_seconds", time.perf_counter() - start, stage=self.stage_names[0])
        return outs

    def _observe_stage(self, stage: str, out: Any, scale: float = 1.0) -> None:
        """A stage's answer to one call: its compute time for /metrics; its busy seconds, the
        request path's load there (StageLoad: the live audit's pace; ``scale``, the gear demand
        factor the stage's autoscaler reads the call's share at), and a later stage's rows with
        them, for the gears' step back."""
        if isinstance(out, dict) and "seconds" in out:
            self.metrics.observe("willump_stage_compute_seconds", out["seconds"], stage=stage)
        if self.stage_load is not None and isinstance(out, dict):
            self.stage_load.answered(stage, out.get("busy_s"), len(out.get("level", ())),
                                     per_row=stage != self.stage_names[0], scale=scale)

    def _any_silent(self, stage: str) -> bool | None:
        """Whether a replica of ``stage`` (of any of its pools) went silent; None where no capacity
        router of its deployments runs in this process (serving.runtime.routing.any_silent)."""
        seen = [any_silent(self.name, d) for d, (st, _) in self.deployments.items() if st == stage]
        known = [s for s in seen if s is not None]
        return any(known) if known else None

    def _start_watch(self) -> None:
        """The replica's loop tasks, from its first admitted request (its constructor has no loop)."""
        self.loop_lag.start()
        if self._watch is None and not all(c is None for c in (self.first, self.second)):
            self._watch = ReplicaWatch(self.name, list(self.deployments), self._follow_replicas)
            self._watch.start()

            dashboard_of(self).start()  # its sampler: the dashboard has history when first opened

    def _adopt_plan(self, plan: dict[str, Any]) -> None:
        """The refined plan in place of the one this replica started with (the dashboard holds
        the same info dict); the probe is over, so its token stops counting. Called from a
        thread: it only swaps references (/plan scrubs by identity)."""
        self.info["plan"] = plan
        self.probe_hash = None

    def _follow_replicas(self, running: dict[str, int]) -> None:
        """Keep CONCURRENT_BATCHES calls in flight per running replica of each remote stage."""
        per_stage: dict[str, int] = {}
        for deployment, count in running.items():
            stage, pool = self.deployments[deployment]
            per_stage[stage] = per_stage.get(stage, 0) + count
            if pool is not None:
                (self.first if stage == self.stage_names[0] else self.second).set_running(pool, count)
        for stage, count in per_stage.items():
            self.coalescers[stage].limit = max(1, count) * CONCURRENT_BATCHES
        self.running_replicas = per_stage

    async def _parse(self, request: Request, model: type) -> tuple[Any, Any]:
        body = getattr(request.state, "body", None)
        body = await self.read_body(request) if body is None else body
        if len(body) <= PARSE_INLINE_BYTES:
            return parse_request(body, model, self.schema, self.max_rows)
        return await asyncio.to_thread(parse_request, body, model, self.schema, self.max_rows)

    def _probe(self, request: Request) -> bool:
        """Whether the request is deploy's in-situ probe: its monitor records are dropped and
        /metrics does not count it (the stage-level series of shared batches do)."""
        given = request.headers.get("x-willump-probe")
        return bool(self.probe_hash and given and hmac.compare_digest(key_hash(given), self.probe_hash))

    async def _guarded(self, route: str, request: Request, work, *, admit: bool = False) -> Response:
        # Serve gives every request an id (the client's X-Request-Id, or a new one) and echoes it
        # in the response; behind a front that does not, the ingress makes and echoes its own.
        rid = request.headers.get("x-request-id", "")
        own = not _REQUEST_ID.match(rid)
        rid = uuid.uuid4().hex if own else rid
        request.state.request_id = rid  # the monitor's records carry it (rows of one request)
        start = time.perf_counter()
        status = 200
        admitted = False
        self.metrics.flusher.start()  # every request's latency is observed, admitted or not
        self.gc_pauses.start()
        try:
            self.check_origin(request, body=admit)
            if route not in OPEN_ROUTES:
                self.check_key(request)
            if admit:
                # the body first, under its own time limit, and only then a slot: a client that
                # trickles its body holds a connection, never one of the ingress's slots
                request.state.body = await self.read_body(request)
                if self.in_flight >= self.max_in_flight:
                    self.metrics.count("willump_shed_requests", stage="ingress")
                    raise StageOverloaded("ingress")
                self.in_flight += 1
                admitted = True
                self._start_watch()
            if route in PLAN_ROUTES and self.plan_adoption.pending:
                await asyncio.to_thread(self.plan_adoption.check)
            result = await work()
            response = result if isinstance(result, Response) else JSONResponse(result)
        except (RequestError, StageOverloaded, DeadlineExceeded) as exc:
            status, response = error_response(exc, rid, route, self.metrics)
        except asyncio.CancelledError:  # the client went away or Serve timed it out: cancelled, no answer
            status = CLIENT_GONE_STATUS
            raise
        except Exception:
            status = 500
            self.metrics.count("willump_errors", route=route, kind="server")
            log.exception("request %s to %s failed", rid, route)
            response = JSONResponse(status_code=500, content={
                "error": "internal error; the server log has the details under this request id",
                "fields": [], "request_id": rid})
        finally:
            if admitted:
                self.in_flight -= 1
            if not self._probe(request):  # deploy's in-situ probe is not the users' traffic
                self.metrics.count("willump_requests", route=route, status=str(status))
                # a request cancelled before its answer too: the clients who gave up are the tail
                self.metrics.observe("willump_request_latency_seconds", time.perf_counter() - start, route=route)
        if own:
            response.headers["X-Request-Id"] = rid
        return response

    def _deadline(self, request: Request) -> Deadline:
        return Deadline.from_headers(request.headers, self.deadline_s)

    async def _call(self, i: int, method: str, *args: Any, deadline: Deadline) -> Any:
        """One unbatched call (top-K halves) to stage ``i``, within the deadline."""
        stage = self.stage_names[i]
        target = self.first if i == 0 else self.second
        if i == 0 and self.local:
            fn = getattr(self.first.runner, method)
            try:
                return await asyncio.wait_for(asyncio.to_thread(fn, *args), max(deadline.remaining(), 0.0))
            except asyncio.TimeoutError:
                raise DeadlineExceeded(stage, deadline.budget_s) from None
        return await call_stage(target, method, args, deadline, stage,
                                on_retry=lambda: self.metrics.count("willump_stage_retries", stage=stage))

    # --- routes --------------------------------------------------------------------------
    @app.post("/predict", response_model=PredictResponse, responses=ROUTE_ERRORS, openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/PredictRequestBody"}}}}})
    async def predict(self, request: Request) -> Response:
        return await self._guarded("predict", request, lambda: self._geared(request), admit=True)

    async def _geared(self, request: Request, oip: InferRequest | None = None) -> Response:
        """The gear this request is served by (serving.runtime.gears; below any gear the live
        audit holds, serving.runtime.hold), kept for its whole life. ``oip``: an Open Inference
        Protocol request, parsed (serving.runtime.oip), answered in that protocol."""
        token, gear = self.gears.begin()
        gear, full = held_gear(gear, self.gears.held)
        now = "full" if full else gear
        if now != self.gear_now:
            self.gear_now = now
            self.metrics.count("willump_gear_switches", gear=str(now))
        timed = True
        try:
            return await self._predict(request, gear, full, oip)
        except (RequestError, StageOverloaded):  # refused, not served: no latency for the gears to read
            timed = False
            raise
        finally:
            self.gears.end(token, timed)

    async def _predict(self, request: Request, gear: int = 0, full: bool = False,
                       oip: InferRequest | None = None) -> Response:
        deadline = self._deadline(request)
        if oip is None:
            with spans.span("willump.parse"):
                body, frame = await self._parse(request, PredictRequest)
            attributes = body.attributes
        else:
            frame, attributes = oip.frame, oip.attributes
        started, t0 = time.time(), time.perf_counter()
        n = len(frame)
        with spans.span(self.stage_spans[0], rows=n, gear=gear):
            out = await self.coalescers[self.stage_names[0]].submit(frame, None, deadline, key=gear)
        proba, level = np.array(out["proba"], copy=True), np.array(out["level"], copy=True)
        replica = np.full(n, out["replica"], dtype=object)
        degraded = np.zeros(n, dtype=bool)
        unsure = out["unsure"]
        if self.stage_load is not None:  # every request, held or pinned too: the step back reads the rate
            self.stage_load.arrived(n)
        if self.gears.adaptive and not full:  # the gears' shares of rows sent on (the autoscaler's)
            self.gears.demand.observe(gear, n, int(unsure.size))
        if unsure.size:
            if self.second is None:
                raise RuntimeError("the first stage left rows unanswered but there is no second stage")
            sub = frame.iloc[unsure].reset_index(drop=True)
            stage = self.stage_names[1]
            late = deadline.reserve(DEGRADE_RESERVE) if self.degrade and out.get("fallback") is not None else deadline
            try:
                with spans.span(self.stage_spans[1], rows=len(sub), gear=gear):
                    out2 = await self.coalescers[stage].submit(sub, out["blocks"], late, key=gear)
            except (DeadlineExceeded, StageOverloaded) as exc:
                if late is deadline:
                    raise
                name = "willump_deadline_exceeded" if isinstance(exc, DeadlineExceeded) else "willump_shed_requests"
                self.metrics.count(name, stage=stage)
                self.metrics.count("willump_degraded_rows", len(unsure))
                proba[unsure] = out["fallback"]
                level[unsure] = self.first_level
                degraded[unsure] = True
            else:
                proba[unsure] = out2["proba"]
                level[unsure] = out2["level"]
                replica[unsure] = out2["replica"]
        if not full and gear in self.gears.held:
            # the alarm held this gear while the request was in flight: the full pipeline answers it
            # (every gear's certificate is against it), never a gear whose guarantee no longer holds
            full = True
        if full:  # gear 0 held: the full pipeline answers every row, and audits gear 0's decisions
            with spans.span("willump.full_pipeline", rows=n):
                decided, disagreed = await answer_in_full(self, frame, proba, level, replica, degraded,
                                                          self.audit.final_levels[gear], deadline)
        latency_ms = (time.perf_counter() - t0) * 1000.0
        probe = self._probe(request)
        if not probe:
            level_rows = np.bincount(level, minlength=len(self.info["levels"]))
            for i, c in enumerate(level_rows):
                if c:
                    self.metrics.count("willump_rows", int(c), level=str(i))
            self.metrics.count("willump_gear_rows", n, gear="full" if full else str(gear))
        if self.audit is not None and not probe:
            if full:
                self.audit.shadow(gear, n, decided, disagreed, attributes)
            elif degraded.any():  # a late stage's fallback rows are not the gear's decisions (as in answer_in_full)
                kept = ~degraded
                self.audit.observe(frame.iloc[np.flatnonzero(kept)].reset_index(drop=True), proba[kept], level[kept],
                                   gear, attributes)
                self.audit.degraded(gear, int(degraded.sum()), attributes)
            else:
                self.audit.observe(frame, proba, level, gear, attributes, level_rows=level_rows)
        if self.records is not None:  # built for every request; a probe's are not sent (its CPU counts)
            columns = record_columns(frame, proba, level, replica, latency_ms, started, self.version,
                                     attributes, self.records.config, gear=FULL_PIPELINE_GEAR if full else gear,
                                     request_id=getattr(request.state, "request_id", None))
            if not probe:
                self.records.add(columns)
        if oip is not None:
            return Response(infer_answer(self.name, self.version, oip, self.classes, proba, level, degraded,
                                         self.gears.fields(gear, full)), media_type="application/json")
        return Response(predict_answer(self.classes, proba, level, degraded, self.version,
                                       self.gears.fields(gear, full)),
                        media_type="application/json")

    @app.post("/top_k", response_model=TopKResponse, responses=ROUTE_ERRORS, openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/TopKRequestBody"}}}}})
    async def top_k(self, request: Request) -> Response:
        return await self._guarded("top_k", request, lambda: self._top_k(request), admit=True)

    async def _top_k(self, request: Request) -> dict[str, Any]:
        deadline = self._deadline(request)
        body, frame = await self._parse(request, TopKRequest)
        n = len(frame)
        if not 1 <= body.k <= n:
            raise RequestError(422, f"k must be between 1 and the number of rows ({n}), got {body.k}",
                               [{"field": "k", "error": f"1 <= k <= {n}"}])
        if body.label is None:
            c = len(self.classes) - 1
        else:
            matches = [i for i, v in enumerate(self.classes) if v == body.label or str(v) == str(body.label)]
            if not matches:
                raise RequestError(422, f"label {body.label!r} is not a class; classes: {self.classes.tolist()}",
                                   [{"field": "label", "error": "unknown class"}])
            c = matches[0]
        last = 1 if self.second is not None else 0
        step = await self._call(0, "topk_filter", frame, body.k, c, deadline=deadline)
        certificate = None
        if step is not None:
            ranked = await self._call(last, "topk_rank", frame.iloc[step["kept"]].reset_index(drop=True),
                                      step["blocks"], c, step["check"], deadline=deadline)
            certificate = ranked["certificate"]
            if self.stage_load is not None and last:  # work every gear gives the stage alike
                self.stage_load.extra(self.stage_names[last], ranked.get("busy_s"))
            if not certificate["certified"]:
                step = None  # the filter's answer is not certified: score every row
        if step is None:
            scores = await self._full_scores(last, frame, c, deadline)
            approximate, kept, ratio = np.zeros(n, dtype=bool), np.arange(n), None
        else:
            kept = step["kept"]
            scores = step["cheap_scores"].copy()
            scores[kept] = ranked["scores"]
            approximate = np.ones(n, dtype=bool)
            approximate[kept] = False
            ratio = step["ratio"]
        order = kept[np.lexsort((kept, -scores[kept]))][: body.k]
        return {"indices": order.tolist(), "scores": [float(s) for s in scores[order]],
                "approximate": approximate[order].tolist(), "k": body.k, "label": clean(self.classes[c], infinity="null"),
                "ratio": ratio, "certificate": certificate, "model_version": self.version}

    async def _full_scores(self, stage: int, frame: Any, label_index: int, deadline: Deadline) -> np.ndarray:
        """Every row scored in full at ``stage``; a later stage's busy seconds on it are load the
        gears' step back counts (a stage replica of earlier code answers the array alone)."""
        if self.stage_load is None or not stage:
            return await self._call(stage, "full_scores", frame, label_index, deadline=deadline)
        name = self.stage_names[stage]
        answer = await call_stage_compatible(
            self.second, "full_scores", (frame, label_index, True), ((frame, label_index),), deadline, name,
            on_retry=lambda: self.metrics.count("willump_stage_retries", stage=name))
        if isinstance(answer, dict):
            self.stage_load.extra(name, answer.get("busy_s"))
            answer = answer["scores"]
        return answer

    @app.post("/labels", responses=ROUTE_ERRORS, openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["labels"], "additionalProperties": False, "properties": {"labels": {
                "type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["request_id", "row", "label"], "additionalProperties": False,
                    "properties": {"request_id": {"type": "string", "description": "X-Request-Id of the answer"},
                                   "row": {"type": "integer", "minimum": 0,
                                           "description": "the row's index in that request"},
                                   "label": {"description": "the row's true class"}}}}}}}}}})
    async def labels(self, request: Request) -> Response:
        """Labels fed back for served rows, joined by request id and row index (late labels are
        welcome within the monitor's retention window): ``{"accepted", "unknown", "duplicate"}``.
        Served accuracy against the certified bound: ``GET /drift?kind=accuracy``."""
        return await self._guarded("labels", request, lambda: post_labels(self, request.headers, request.state.body),
                                   admit=True)

    @app.get("/report")
    async def report(self, request: Request) -> Response:
        return await self._guarded("report", request, self._static("report"))

    @app.get("/plan")
    async def plan(self, request: Request) -> Response:
        """The plan; on an app without an API key, with the cluster's addresses replaced
        (:func:`serving.runtime.http_support.public_plan`)."""
        async def work() -> Any:
            if self.api_key.required:
                return {**self.info["plan"], **self._live()}
            plan = self.info["plan"]
            cached = getattr(self, "_public_plan", None)
            if cached is None or cached[0] is not plan:  # scrubbed once per plan in force
                cached = self._public_plan = (plan, public_plan(plan))
            return {**cached[1], **self._live()}

        return await self._guarded("plan", request, work)

    def _live(self) -> dict[str, Any]:
        """/plan's in-place settings: those served now, and the last ones refused, if any."""
        out = {"live_settings": current_settings(self), "live_settings_rejected": self.settings_rejected}
        if self.gears.adaptive:  # what the autoscaler is told a cheaper gear's rows stand for
            out["gear_demand"] = self.gears.demand_info()
        return out

    def _static(self, key: str):
        async def work() -> Any:
            return self.info[key]

        return work

    @app.get("/", include_in_schema=False)
    async def index(self, request: Request) -> Response:
        async def work() -> Response:
            from fastapi.responses import HTMLResponse

            return HTMLResponse(index_page(self.name, request.scope.get("root_path", ""), self.monitor is not None))

        return await self._guarded("index", request, work)

    @app.get("/ui", include_in_schema=False)
    async def ui(self, request: Request) -> Response:
        return await self._guarded("ui", request, lambda: serve_ui(self, request))

    @app.get("/healthz")
    async def healthz(self, request: Request) -> Response:
        async def work() -> dict[str, Any]:  # open to all: says nothing about the app
            return {"status": "ok"}

        return await self._guarded("healthz", request, work)

    @app.get("/readyz")
    async def readyz(self, request: Request) -> Response:
        """Every stage runs its canary row on its device (one replica each): 200 when all
        answer, 503 naming the stage that does not. ``/healthz`` says the ingress is up;
        this says the pipeline can answer."""
        async def work() -> Response:
            stages, ready = await self.stage_health()
            return JSONResponse({"status": "ready" if ready else "not ready", "app": self.name,
                                 "model_version": self.version, "monitor": self.monitor is not None,
                                 "stages": clean(stages)}, status_code=200 if ready else 503)

        return await self._guarded("readyz", request, work)

    # --- the Open Inference Protocol v2 (serving.runtime.oip) ----------------------------------
    @app.post("/v2/models/{model}/infer", responses=ROUTE_ERRORS, openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/InferRequestBody"}}}}})
    async def oip_infer(self, model: str, request: Request) -> Response:
        return await self._guarded("infer", request, lambda: oip.infer(self, model, request), admit=True)

    @app.get("/v2/models/{model}")
    async def oip_metadata(self, model: str, request: Request) -> Response:
        return await self._guarded("metadata", request, lambda: oip.model_metadata(self, model))

    @app.get("/v2/models/{model}/ready")
    async def oip_model_ready(self, model: str, request: Request) -> Response:
        return await self._guarded("readyz", request, lambda: oip.model_ready(self, model))

    @app.get("/v2/health/live")
    async def oip_live(self, request: Request) -> Response:
        return await self._guarded("healthz", request, oip.live)  # open to all, as /healthz

    @app.get("/v2/health/ready")
    async def oip_ready(self, request: Request) -> Response:
        return await self._guarded("readyz", request, lambda: oip.model_ready(self))

    async def stage_health(self, timeout_s: float = READY_TIMEOUT_S) -> tuple[dict[str, Any], bool]:
        """Each stage's canary answer (or its error), and whether every stage answered, each
        within ``timeout_s``."""
        stages: dict[str, Any] = {}
        for i, (name, target) in enumerate(zip(self.stage_names, (self.first, self.second), strict=False)):
            try:
                if i == 0 and self.local:
                    canary = getattr(target.runner, "canary", None)
                    flight = getattr(self, "_canary", None)
                    if canary is not None and (flight is None or flight.fn != canary):
                        self._canary = SingleFlight(canary)  # a hung canary holds one thread, not one a probe
                    stages[name] = {"canary": "none"} if canary is None else await self._canary(timeout_s)
                elif isinstance(target, PooledStage):  # every pool's deployment answers for itself
                    stages[name] = await target.health(timeout_s)
                else:
                    stages[name] = await asyncio.wait_for(target.health.remote(), timeout_s)
            except Exception as exc:  # a stage that cannot answer is reported, never raised
                stages[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        return stages, all("error" not in v for v in stages.values())

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(self, request: Request) -> Response:
        async def work() -> dict[str, Any]:
            return self.openapi_doc

        return await self._guarded("openapi", request, work)

    @app.get("/docs", include_in_schema=False)
    async def docs(self, request: Request) -> Response:
        async def work() -> Response:
            from fastapi.openapi.docs import get_swagger_ui_html

            root = request.scope.get("root_path", "")
            return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{self.name} - willump",
                                       swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
                                       swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
                                       swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png")

        return await self._guarded("docs", request, work)

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(self, name: str, request: Request) -> Response:
        """Swagger UI's own files, from the installed bundle: the docs page loads nothing
        from a CDN (whose script would run with this origin's rights, unchecked)."""
        async def work() -> Response:
            return swagger_asset(name)

        return await self._guarded("docs", request, work)

    @app.get("/metrics")
    async def metrics_route(self, request: Request) -> Response:
        async def work() -> Response:
            text = await exact_totals(self.name)

            text += plan_metrics(self.info)
            if self.monitor is not None:  # the monitor's verdicts: drift_* families
                try:
                    text += await call_stage(self.monitor, "prometheus", (), Deadline.after(MONITOR_QUERY_S),
                                             "monitor")
                except Exception as exc:
                    log.warning("monitor metrics unavailable: %s", exc)
                    text += "# the monitor's metrics are unavailable right now\n"
            return Response(text, media_type="text/plain; version=0.0.4")

        return await self._guarded("metrics", request, work)

    @app.get("/explain")
    async def explain(self, request: Request) -> Response:
        return await self._guarded("explain", request, lambda: monitor_query(self, request.headers, request.query_params,
                                                                                 "explain"))

    @app.get("/drift")
    async def drift(self, request: Request) -> Response:
        return await self._guarded("drift", request, lambda: monitor_query(self, request.headers, request.query_params,
                                                                               "drift"))

    async def __del__(self) -> None:
        # Serve awaits this on a graceful shutdown: stop watching, send the buffered records.
        self.plan_adoption.stop()
        if self._watch is not None:
            self._watch.stop()
        self.loop_lag.stop()
        self.gc_pauses.stop()
        self.metrics.flusher.stop()
        if getattr(self, "_dashboard", None) is not None:
            self._dashboard.stop()
        if getattr(self, "audit", None) is not None:
            try:
                await wait_or_cancel(self.audit.close(), 10.0, "monitor", 10.0)
            except Exception as exc:
                log.warning("live audit counts not sent at shutdown: %s", exc)
        if self.records is not None:
            try:
                await wait_or_cancel(self.records.close(), 10.0, "monitor", 10.0)
            except Exception as exc:  # the monitor is gone: the records are counted as dropped
                log.warning("records not flushed at shutdown: %s", exc)
