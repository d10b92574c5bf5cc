"""The Ray Serve application: an HTTP ingress, model stages, and the monitor.

No ``from __future__ import annotations`` here: FastAPI resolves the route
annotations of the class Serve pickles by value, so they must be real objects.

Composition follows Ray Serve's own examples: one class per deployment, bound
deployments passed to the ingress constructor, handles for calls, ``@serve.batch``
for batching rows from many requests at a stage.
"""

import asyncio
import inspect
import json
import time
from typing import Any

import numpy as np
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from ray import serve

from .metrics import ServingMetrics
from .records import RecordBuffer, record_columns
from .runtime import (
    Bundle,
    StageRunner,
    concat_blocks,
    concat_rows,
    load_bundle,
    merge_chunks,
    place_models,
    split_outputs,
    split_rows,
)
from .schema import (
    MAX_BODY_BYTES,
    MAX_ROWS,
    ErrorResponse,
    PredictRequest,
    PredictResponse,
    RequestError,
    RowSchema,
    TopKRequest,
    TopKResponse,
    plain,
)
from .stages import StageSpec

#: times a stage call is retried when its replica died mid-call (predictions are idempotent)
STAGE_RETRIES = 2
#: batches a stage replica runs at once (in threads): waits on remote feature lookups overlap,
#: and one slow lookup does not hold up every other request's batch
CONCURRENT_BATCHES = 4
#: most unsure rows the ingress merges into one call to the expensive stage
INGRESS_BATCH_ROWS = 256


def _rows_in(items: list) -> int:
    return sum(len(rows) for rows, _ in items)


def len_rows(frames: list) -> int:
    return sum(len(f) for f in frames)


@serve.deployment
class ModelStage:
    """One stage replica: loads the artifact, runs its levels, batches across requests."""

    def __init__(
        self,
        bundle: Bundle,
        spec: StageSpec,
        *,
        baseline: bool = False,
        device: str = "cpu",
        runtime: str = "native",
        batching: bool = True,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.002,
    ):
        opt = load_bundle(bundle)
        self.notes = place_models(opt, device, runtime)
        self.runner = StageRunner(opt, spec, baseline=baseline)
        self.batching = batching
        self.max_batch_size = max(1, int(max_batch_size))
        if batching:
            self.run_batch.set_max_batch_size(self.max_batch_size)
            self.run_batch.set_batch_wait_timeout_s(float(batch_wait_timeout_s))
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:
            self.replica = "local"

    async def run(self, rows: pd.DataFrame, blocks: dict | None = None) -> dict[str, Any]:
        if not self.batching:
            out = await asyncio.to_thread(self.runner.run, rows, blocks)
        else:
            chunks = list(split_rows(rows, blocks, self.max_batch_size))
            outs = await asyncio.gather(*(self.run_batch((r, b)) for r, b in chunks))
            out = merge_chunks(outs, [len(r) for r, _ in chunks])
        out["replica"] = self.replica
        return out

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002, batch_size_fn=_rows_in,
                 max_concurrent_batches=CONCURRENT_BATCHES)
    async def run_batch(self, items: list) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.runner.run_many, items)

    async def topk_filter(self, rows: pd.DataFrame, k: int, label_index: int) -> dict | None:
        return await asyncio.to_thread(self.runner.topk_filter, rows, k, label_index)

    async def topk_rank(self, rows: pd.DataFrame, blocks: dict, label_index: int) -> np.ndarray:
        return await asyncio.to_thread(self.runner.topk_rank, rows, blocks, label_index)

    async def full_scores(self, rows: pd.DataFrame, label_index: int) -> np.ndarray:
        return await asyncio.to_thread(self.runner.full_scores, rows, label_index)

    def info(self) -> dict[str, Any]:
        return {"replica": self.replica, "notes": self.notes, "batching": self.batching,
                "max_batch_size": self.max_batch_size}


def _coerce(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


@serve.deployment
class MonitorStage:
    """The drift monitor as a deployment of its own, fed off the request path."""

    QUERIES = ("explain", "mix_shift", "conditional_shift", "drift", "change_points", "cascade_health")

    def __init__(self, config: dict[str, Any], reference: list[dict[str, Any]] | None = None):
        from drift import Monitor

        self.monitor = Monitor(**config)
        self.reference_rows = 0
        if reference:
            self.monitor.set_reference(reference)
            self.reference_rows = len(reference)
        self.ingested = 0

    def ingest(self, records: Any) -> int:
        self.monitor.ingest(records)
        self.ingested += len(records)
        return self.ingested

    def flush(self) -> dict[str, Any]:
        self.monitor.flush()
        return {"ingested": self.ingested}

    def __del__(self) -> None:
        # Serve calls __del__ on graceful replica shutdown: persist the open pane too.
        monitor = getattr(self, "monitor", None)
        if monitor is not None:
            try:
                monitor.close()
            except Exception:  # shutting down: nothing left to report to
                pass

    def query(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """Run a monitor query; client mistakes come back as {"status": 4xx, ...}, not raised."""
        if name not in self.QUERIES:
            return {"status": 404, "error": f"unknown monitor query {name!r}", "fields": []}
        method = getattr(self.monitor, name)
        signature = inspect.signature(method).parameters
        accepted = [p for p in signature if p != "self"]
        for key, value in list(params.items()):  # list-typed parameters arrive comma-separated
            annotation = str(signature[key].annotation) if key in signature else ""
            if isinstance(value, str) and ("Sequence" in annotation or "tuple" in annotation):
                parts = [_coerce(v.strip()) for v in value.split(",") if v.strip()]
                params[key] = tuple(parts) if "tuple" in annotation else parts
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            return {"status": 422, "error": f"unknown query parameter(s) {unknown} for {name}",
                    "fields": [{"field": p, "error": f"accepted: {accepted}"} for p in unknown]}
        try:
            result = method(**params)
        except (TypeError, ValueError, KeyError) as exc:
            return {"status": 422, "error": f"{name}: {exc}", "fields": []}
        except Exception as exc:
            if type(exc).__name__ in ("NoReferenceError", "StateError"):
                return {"status": 409, "error": f"{name}: {exc}", "fields": []}
            raise
        data = result.to_dict() if hasattr(result, "to_dict") else result
        return {"status": 200, "query": name, "ingested": self.ingested, "result": data}


# The OpenAPI document and /docs are served by the ingress itself (not FastAPI's defaults)
# because they carry the per-pipeline row schema, known only once the artifact is loaded.
app = FastAPI(
    title="willump serving",
    description="Cascaded ML inference: predictions, top-K, the optimizer's report, and the monitor.",
    openapi_url=None,
    docs_url=None,
    redoc_url=None,
)


def _error(status: int, message: str, fields: list | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, "fields": fields or []})


def _validation_fields(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        out.append({"field": loc or "body", "error": err.get("msg", "invalid")})
    return out


def _openapi(fastapi_app: FastAPI, schema: RowSchema) -> dict[str, Any]:
    """The app's OpenAPI document with this pipeline's row schema filled in."""
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=fastapi_app.title, version="1", description=fastapi_app.description,
                      routes=fastapi_app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components["Row"] = schema.json_schema()
    predict = PredictRequest.model_json_schema()
    predict["properties"]["rows"] = {"type": "array", "items": {"$ref": "#/components/schemas/Row"}, "minItems": 1}
    components["PredictRequestBody"] = predict
    topk = TopKRequest.model_json_schema()
    topk["properties"]["rows"] = predict["properties"]["rows"]
    components["TopKRequestBody"] = topk
    for model in (PredictResponse, TopKResponse, ErrorResponse):
        components.setdefault(model.__name__, model.model_json_schema())
    return doc


class _LocalMethod:
    """Looks like a handle method: ``.remote(*args)`` returns an awaitable (a thread)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args: Any):
        return asyncio.to_thread(self.fn, *args)


class LocalStage:
    """A stage run inside the ingress process (layout="fused"): no hop for the cheap
    levels, which answer most rows; only unsure rows travel to the expensive stage."""

    def __init__(self, bundle: Bundle, spec: StageSpec, device: str = "cpu", runtime: str = "native"):
        opt = load_bundle(bundle)
        self.notes = place_models(opt, device, runtime)
        self.runner = StageRunner(opt, spec)
        self.run = _LocalMethod(self._run)
        self.topk_filter = _LocalMethod(self.runner.topk_filter)
        self.topk_rank = _LocalMethod(self.runner.topk_rank)
        self.full_scores = _LocalMethod(self.runner.full_scores)
        try:  # records name the ingress replica that answered, as they name stage replicas
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:
            self.replica = "ingress"

    def _run(self, rows: pd.DataFrame, blocks: dict | None = None) -> dict[str, Any]:
        out = self.runner.run(rows, blocks)
        out["replica"] = self.replica
        return out


def _over_grpc(handle: Any) -> Any:
    """The same deployment handle, calling over Serve's inter-deployment gRPC instead of
    Ray actor calls (less CPU per hop here: see serving.bench); None stays None."""
    return handle.options(_by_reference=False) if hasattr(handle, "options") else handle


# Serve pickles deployment classes when they are decorated: every helper a method uses
# must be defined above this line.
@serve.deployment
@serve.ingress(app)
class Ingress:
    """HTTP ingress: validates requests, routes rows through the stages, feeds the monitor."""

    def __init__(
        self,
        first: Any,
        second: Any | None,
        monitor: Any | None,
        info: dict[str, Any],
        local_first: dict[str, Any] | None = None,
    ):
        if info.get("transport", "grpc") == "grpc":
            first, second, monitor = (_over_grpc(h) for h in (first, second, monitor))
        if local_first is not None:  # layout="fused": the cheap stage runs in this process
            first = LocalStage(**local_first)
        self.first = first
        self.second = second
        self.monitor = monitor
        self.info = info
        self.name = info["name"]
        self.first_stage = "cheap" if second is not None else info["stages"][0]
        self.batching = bool(info.get("batching", True))
        self.version = info["model_version"]
        self.classes = np.asarray(info["classes"], dtype=object)
        self.schema = RowSchema.from_dict(info["schema"])
        self.max_body = int(info.get("max_body_bytes", MAX_BODY_BYTES))
        self.max_rows = int(info.get("max_rows", MAX_ROWS))
        self.metrics = ServingMetrics(self.name)
        self.records = RecordBuffer(monitor, info.get("monitor_config") or {}) if monitor else None
        self.openapi_doc = _openapi(app, self.schema)

    # --- plumbing ------------------------------------------------------------------------
    async def _read(self, request: Request, model: type) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise RequestError(413, f"request body of {length} bytes exceeds the {self.max_body}-byte limit")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise RequestError(413, f"request body exceeds the {self.max_body}-byte limit")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"invalid JSON: {exc}") from exc
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise RequestError(422, "request does not match the schema", _validation_fields(exc)) from exc

    async def _call(self, handle: Any, stage: str, method: str, *args: Any) -> Any:
        import ray.exceptions as rex

        for attempt in range(STAGE_RETRIES + 1):
            start = time.perf_counter()
            try:
                out = await getattr(handle, method).remote(*args)
            except (rex.RayActorError, rex.ActorUnavailableError):
                if attempt == STAGE_RETRIES:
                    raise
                self.metrics.retries.labels(self.name, stage).inc()
                continue
            self.metrics.stage_latency.labels(self.name, stage).observe(time.perf_counter() - start)
            if isinstance(out, dict) and "seconds" in out:
                self.metrics.stage_compute.labels(self.name, stage).observe(out["seconds"])
            return out
        raise AssertionError("unreachable")

    async def _guarded(self, route: str, work) -> Response:
        start = time.perf_counter()
        status = 200
        try:
            result = await work()
            return result if isinstance(result, Response) else JSONResponse(result)
        except RequestError as exc:
            status = exc.status
            self.metrics.errors.labels(self.name, route, "client").inc()
            return JSONResponse(status_code=exc.status, content=exc.body())
        except Exception as exc:
            status = 500
            self.metrics.errors.labels(self.name, route, "server").inc()
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.metrics.requests.labels(self.name, route, str(status)).inc()
            self.metrics.latency.labels(self.name, route).observe(time.perf_counter() - start)

    @serve.batch(max_batch_size=INGRESS_BATCH_ROWS, batch_wait_timeout_s=0.0, batch_size_fn=len_rows,
                 max_concurrent_batches=CONCURRENT_BATCHES)
    async def _first_batch(self, frames: list) -> list[dict[str, Any]]:
        """Rows of concurrent requests go to the first stage in one call (one hop per batch)."""
        merged = await self._call(self.first, self.first_stage, "run", concat_rows(frames), None)
        return split_outputs(merged, [len(f) for f in frames])

    @serve.batch(max_batch_size=INGRESS_BATCH_ROWS, batch_wait_timeout_s=0.0, batch_size_fn=_rows_in,
                 max_concurrent_batches=CONCURRENT_BATCHES)
    async def _unsure(self, items: list) -> list[dict[str, Any]]:
        """Unsure rows of concurrent requests go to the expensive stage in one call: the hop
        (several ms of overhead here) is paid per batch, not per request."""
        sizes = [len(rows) for rows, _ in items]
        merged = await self._call(self.second, "expensive", "run", concat_rows([r for r, _ in items]),
                                  concat_blocks([b for _, b in items]))
        return split_outputs(merged, sizes)

    # --- routes --------------------------------------------------------------------------
    @app.post("/predict", response_model=PredictResponse, responses={
        400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
    }, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PredictRequestBody"}}}}})
    async def predict(self, request: Request) -> Response:
        return await self._guarded("predict", lambda: self._predict(request))

    async def _predict(self, request: Request) -> dict[str, Any]:
        started = time.time()
        t0 = time.perf_counter()
        body = await self._read(request, PredictRequest)
        frame = self.schema.to_frame(body.rows, self.max_rows)
        if self.batching and len(frame) <= INGRESS_BATCH_ROWS:
            out = await self._first_batch(frame)
        else:  # big enough on its own to amortize the hop
            out = await self._call(self.first, self.first_stage, "run", frame, None)
        proba, level = out["proba"].copy(), out["level"].copy()  # object-store arrays are read-only
        replica = np.full(len(frame), out["replica"], dtype=object)
        unsure = out["unsure"]
        if unsure.size:
            if self.second is None:
                raise RuntimeError("the first stage left rows unanswered but there is no second stage")
            sub = frame.iloc[unsure].reset_index(drop=True)
            if self.batching and len(sub) <= INGRESS_BATCH_ROWS:
                out2 = await self._unsure((sub, out["blocks"]))
            else:  # big enough on its own to amortize the hop
                out2 = await self._call(self.second, "expensive", "run", sub, out["blocks"])
            proba[unsure] = out2["proba"]
            level[unsure] = out2["level"]
            replica[unsure] = out2["replica"]
        latency_ms = (time.perf_counter() - t0) * 1000.0
        counts = np.bincount(level, minlength=len(self.info["levels"]))
        for i, c in enumerate(counts):
            if c:
                self.metrics.rows.labels(self.name, str(i)).inc(int(c))
        if self.records is not None:
            self.records.add(record_columns(frame, proba, level, replica, latency_ms, started,
                                           self.version, body.attributes, self.records.config))
        labels = self.classes[np.argmax(proba, axis=1)]
        return {
            "predictions": [plain(v) for v in labels],
            "probabilities": np.round(proba, 12).tolist(),
            "level": level.tolist(),
            "model_version": self.version,
        }

    @app.post("/top_k", response_model=TopKResponse, responses={
        400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
    }, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/TopKRequestBody"}}}}})
    async def top_k(self, request: Request) -> Response:
        return await self._guarded("top_k", lambda: self._top_k(request))

    async def _top_k(self, request: Request) -> dict[str, Any]:
        body = await self._read(request, TopKRequest)
        frame = self.schema.to_frame(body.rows, self.max_rows)
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
        last = self.second if self.second is not None else self.first
        last_stage = "expensive" if self.second is not None else self.info["stages"][0]
        first_stage = "cheap" if self.second is not None else self.info["stages"][0]
        step = await self._call(self.first, first_stage, "topk_filter", frame, body.k, c)
        if step is None:
            scores = await self._call(last, last_stage, "full_scores", frame, c)
            approximate = np.zeros(n, dtype=bool)
            kept = np.arange(n)
            ratio = None
        else:
            kept = step["kept"]
            full = await self._call(last, last_stage, "topk_rank",
                                    frame.iloc[kept].reset_index(drop=True), step["blocks"], c)
            scores = step["cheap_scores"].copy()
            scores[kept] = full
            approximate = np.ones(n, dtype=bool)
            approximate[kept] = False
            ratio = step["ratio"]
        order = kept[np.lexsort((kept, -scores[kept]))][: body.k]
        return {
            "indices": order.tolist(),
            "scores": [float(s) for s in scores[order]],
            "approximate": approximate[order].tolist(),
            "k": body.k,
            "label": plain(self.classes[c]),
            "ratio": ratio,
            "model_version": self.version,
        }

    @app.get("/report")
    async def report(self) -> Response:
        return await self._guarded("report", self._static("report"))

    @app.get("/plan")
    async def plan(self) -> Response:
        return await self._guarded("plan", self._static("plan"))

    def _static(self, key: str):
        async def work() -> Any:
            return self.info[key]

        return work

    @app.get("/healthz")
    async def healthz(self) -> Response:
        async def work() -> dict[str, Any]:
            return {
                "status": "ok",
                "app": self.name,
                "model_version": self.version,
                "stages": self.info["stages"],
                "monitor": self.monitor is not None,
            }

        return await self._guarded("healthz", work)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(self) -> Response:
        return JSONResponse(self.openapi_doc)

    @app.get("/docs", include_in_schema=False)
    async def docs(self, request: Request) -> Response:
        from fastapi.openapi.docs import get_swagger_ui_html

        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{self.name} - willump")

    @app.get("/metrics")
    async def metrics_route(self) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/explain")
    async def explain(self, request: Request) -> Response:
        return await self._guarded("explain", lambda: self._monitor_query(request, "explain"))

    @app.get("/drift")
    async def drift(self, request: Request) -> Response:
        return await self._guarded("drift", lambda: self._monitor_query(request, "drift"))

    async def _monitor_query(self, request: Request, route: str) -> Any:
        if self.monitor is None:
            raise RequestError(503, "the monitor is not deployed for this app: deploy with monitor=... "
                                    "(or --monitor-attributes on the command line)")
        params = {k: _coerce(v) for k, v in request.query_params.items()}
        name = route
        if route == "explain":
            kind = params.pop("kind", "anomalies")
            kinds = {"anomalies": "explain", "mix": "mix_shift", "conditional": "conditional_shift",
                     "cascade": "cascade_health"}
            if kind not in kinds:
                raise RequestError(422, f"kind must be one of {sorted(kinds)}", [{"field": "kind", "error": "unknown"}])
            name = kinds[kind]
        elif route == "drift":
            kind = params.pop("kind", "columns")
            kinds = {"columns": "drift", "changes": "change_points", "cascade": "cascade_health"}
            if kind not in kinds:
                raise RequestError(422, f"kind must be one of {sorted(kinds)}", [{"field": "kind", "error": "unknown"}])
            name = kinds[kind]
        if self.records is not None:
            await self.records.flush()
        answer = await self.monitor.query.remote(name, params)
        status = answer.pop("status")
        if status != 200:
            raise RequestError(status, answer["error"], answer.get("fields"))
        return answer
