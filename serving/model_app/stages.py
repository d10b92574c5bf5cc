"""The Serve deployments of a partitioned torch model (see :func:`serving.deploy_model`).

- :class:`PartitionStage`: one stage of a plan. Each replica loads *its own stage's*
  module from the file deploy wrote (weights never travel through constructor
  arguments), owns one device and runs one batch at a time on it (a lock: the planner's
  unit is a device, and a second queued batch only deserializes while the first runs).
- :class:`ModelIngress`: the HTTP front. ``POST /predict {"inputs": ...}`` is validated
  against the example's trailing shape and dtype (4xx JSON naming what is wrong),
  requests are coalesced into micro-batches of up to the plan's batch size *once*, here,
  and each batch is chained through the stage handles without awaiting in between
  (Serve hands one stage's result to the next through the object store).

Between deployments, tensors travel as numpy arrays (zero-copy on read) and move to the
stage's device inside the replica: a CUDA tensor goes GPU -> host -> object store ->
host -> GPU, the hop :func:`serving.model_app.transport.calibrate_transport` measures.
"""


import asyncio
import json
import logging
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from torch.utils import _pytree as pytree

from serving.core.jsonsafe import clean
from serving.core.schema import RequestError
from serving.model_app.inputs import BadInput, InputSpec, parse_inputs
from serving.model_app.oip import infer_answer, infer_inputs, metadata
from serving.model_app.stage_replica import PartitionStageImpl
from serving.runtime.calls import DEFAULT_DEADLINE_S, Deadline, DeadlineExceeded, StageOverloaded
from serving.runtime.coalesce import Coalescer, Item
from serving.runtime.edge import HttpEdge, install_error_handlers
from serving.runtime.keys import KeyCheck

#: most rows one request may carry (overridable per deployment)
MAX_ROWS = 10_000
#: largest accepted request body, in bytes
MAX_BODY_BYTES = 16 * 1024 * 1024
#: times a batch is sent through the stages again when a replica died under it
STAGE_RETRIES = 1
#: seconds /readyz waits for each stage's canary
READY_TIMEOUT_S = 10.0


@serve.deployment
class PartitionStage(PartitionStageImpl):
    def __call__(self, args: Any) -> Any:
        return self.run(args)

    def check_health(self) -> None:
        """Serve's periodic health check: the canary row (an exception replaces the replica)."""
        self.canary()


def rows_of(value: Any, start: int, stop: int, batch_rows: int) -> Any:
    """Rows ``start:stop`` of every array leaf whose first dimension is the batch's."""
    def cut(a: Any) -> Any:
        if isinstance(a, np.ndarray) and a.ndim and a.shape[0] == batch_rows:
            return a[start:stop]
        return a
    return pytree.tree_map(cut, value)


def concat_rows(parts: list[Any]) -> Any:
    """Outputs of several chunks of one request joined back along the rows."""
    if len(parts) == 1:
        return parts[0]
    leaves = [pytree.tree_flatten(p) for p in parts]
    spec = leaves[0][1]
    joined = []
    for group in zip(*(flat for flat, _ in leaves), strict=True):
        if isinstance(group[0], np.ndarray) and group[0].ndim:
            joined.append(np.concatenate(group))
        else:
            joined.append(group[0])
    return pytree.tree_unflatten(joined, spec)


log = logging.getLogger(__name__)

app = FastAPI(title="partitioned torch model", docs_url=None, redoc_url=None)
install_error_handlers(app)


def _error(status: int, message: str, field: str = "body", headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, "fields": [{"field": field, "error": message}]},
                        headers=headers)


@serve.deployment
@serve.ingress(app)
class ModelIngress(HttpEdge):
    """HTTP front: validation, micro-batching and the chain of stage calls."""

    def __init__(self, stages: list[Any], info: dict[str, Any]):
        self.stages = stages
        self.info = info
        self.specs = [InputSpec(tuple(s["trailing"]), s["dtype"]) for s in info["inputs"]]
        self.max_rows = int(info.get("max_rows", MAX_ROWS))
        self.max_body = int(info.get("max_body_bytes", MAX_BODY_BYTES))
        self.api_key = KeyCheck(info.get("api_key_hmac"))
        self.allowed_hosts = info.get("allowed_hosts")
        self.batch_size = int(info["batch_size"])
        self.batcher = Coalescer(self._run, stage="model", max_rows=self.batch_size, limit=int(info["max_inflight"]),
                                 wait_s=float(info["batch_wait_ms"]) / 1000.0)
        self.rows = 0

    async def _run(self, items: list[Item], deadline: Deadline) -> list[Any]:
        """One micro-batch through the chain of stages: the items' arrays joined, the output
        cut back per item."""
        total = sum(it.size for it in items)
        args = tuple(np.concatenate([it.rows[k] for it in items]) for k in range(len(items[0].rows)))
        self.rows += total
        out = await self._chain(args)
        outs, start = [], 0
        for it in items:
            outs.append(rows_of(out, start, start + it.size, total))
            start += it.size
        return outs

    async def _submit(self, arrays: tuple[np.ndarray, ...], deadline: Deadline) -> Any:
        """A request larger than a micro-batch goes as several chunks, joined back in order."""
        n = len(arrays[0])
        chunks = [tuple(a[i:i + self.batch_size] for a in arrays) for i in range(0, n, self.batch_size)]
        parts = await asyncio.gather(*(self.batcher.submit(c, None, deadline, size=len(c[0])) for c in chunks))
        return concat_rows(list(parts))

    async def _chain(self, args: tuple[np.ndarray, ...]) -> Any:
        import ray.exceptions as rex

        for attempt in range(STAGE_RETRIES + 1):
            response = self.stages[0].remote(args)
            for handle in self.stages[1:]:  # chained, not awaited: Serve passes the result on
                response = handle.remote(response)
            try:
                return await response
            except (rex.RayActorError, rex.ActorUnavailableError):
                if attempt == STAGE_RETRIES:  # a replica died mid-batch: inference is idempotent
                    raise
        raise AssertionError("unreachable")

    @app.post("/predict")
    async def predict(self, request: Request) -> JSONResponse:
        done = await self._answer(request, lambda data: (data, None))
        if isinstance(done, JSONResponse):
            return done
        return JSONResponse({"outputs": clean(done[0], infinity="null")})

    async def _answer(self, request: Request, body_of: Any) -> Any:
        """The native route's checks, batches and errors for a body parsed by ``body_of(data)``
        into (``{"inputs": ...}``, extra); returns (outputs, extra) or an error response."""
        try:
            self.check_origin(request, body=True)
            self.check_key(request)
            body = await self.read_body(request)
            deadline = Deadline.from_headers(request.headers, DEFAULT_DEADLINE_S)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"invalid JSON: {exc}")
        try:
            native, extra = body_of(data)
            arrays = parse_inputs(native, self.specs, self.max_rows)
        except BadInput as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        try:
            return await self._submit(arrays, deadline), extra
        except DeadlineExceeded as exc:
            return _error(504, str(exc), "model")
        except StageOverloaded as exc:
            return _error(503, str(exc), "model", {"Retry-After": f"{exc.retry_after_s:g}"})
        except Exception:
            rid = uuid.uuid4().hex
            log.exception("request %s failed", rid)  # the details stay in the server log
            return JSONResponse(status_code=500, content={
                "error": "internal error; the server log has the details under this request id",
                "fields": [], "request_id": rid}, headers={"X-Request-Id": rid})

    def _model(self, request: Request, model: str) -> JSONResponse | None:
        """An error response for a request the app must refuse (origin, key, model name)."""
        try:
            self.check_origin(request, body=False)
            self.check_key(request)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        if model != self.info["name"]:
            return _error(404, f"no model {model!r} here; this app serves {self.info['name']!r}", "model")
        return None

    @app.post("/v2/models/{model}/infer")
    async def infer(self, model: str, request: Request) -> JSONResponse:
        """The Open Inference Protocol's infer (serving.model_app.oip): one tensor per forward
        argument, the same checks and batches as POST /predict."""
        refused = self._model(request, model)  # the key first: a caller without it learns nothing
        if refused is not None:
            return refused
        done = await self._answer(request, lambda data: infer_inputs(data, self.specs))
        if isinstance(done, JSONResponse):
            return done
        out, rid = done
        return JSONResponse(infer_answer(model, out, rid))

    @app.get("/v2/models/{model}")
    def model_metadata(self, model: str, request: Request) -> Any:
        refused = self._model(request, model)
        return refused or metadata(model, self.specs, self.info["outputs"])

    @app.get("/v2/models/{model}/ready")
    async def model_ready(self, model: str, request: Request) -> Any:
        refused = self._model(request, model)
        if refused is not None:
            return refused
        ready = all("error" not in v for v in (await self._stage_health()).values())
        return JSONResponse(status_code=200 if ready else 503, content={"name": model, "ready": ready})

    @app.get("/v2/health/live")
    def server_live(self) -> dict[str, Any]:  # open to all, as /healthz
        return {"live": True}

    @app.get("/v2/health/ready")
    async def server_ready(self, request: Request) -> Any:
        refused = self._model(request, self.info["name"])
        if refused is not None:
            return refused
        ready = all("error" not in v for v in (await self._stage_health()).values())
        return JSONResponse(status_code=200 if ready else 503, content={"ready": ready})

    @app.get("/plan")
    def plan(self, request: Request) -> Any:
        try:
            self.check_origin(request, body=False)
            self.check_key(request)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        return self.info["plan"]

    @app.get("/healthz")
    def healthz(self) -> dict[str, Any]:  # open to all: says nothing about the app
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self, request: Request) -> Any:
        """Every stage runs its canary row (one replica each): 200 when all answer, 503
        naming the stage that does not."""
        try:
            self.check_origin(request, body=False)
            self.check_key(request)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        stages = await self._stage_health()
        ready = all("error" not in v for v in stages.values())
        return JSONResponse(status_code=200 if ready else 503,
                            content={"status": "ready" if ready else "not ready", "stages": clean(stages)})

    async def _stage_health(self) -> dict[str, Any]:
        """Each stage's canary row (one replica each), or the error it raised."""
        stages: dict[str, Any] = {}
        for k, handle in enumerate(self.stages):
            try:
                stages[f"stage{k}"] = await asyncio.wait_for(handle.canary.remote(), READY_TIMEOUT_S)
            except Exception as exc:  # reported, never raised
                stages[f"stage{k}"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        return stages

    @app.get("/stats")
    def stats(self, request: Request) -> Any:
        try:
            self.check_origin(request, body=False)
            self.check_key(request)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        batches = self.batcher.batches
        return {"batches": batches, "rows": self.rows, "mean_batch": self.rows / batches if batches else 0.0}
