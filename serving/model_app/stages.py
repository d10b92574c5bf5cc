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
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from torch.utils import _pytree as pytree

#: most rows one request may carry (overridable per deployment)
MAX_ROWS = 10_000
#: largest accepted request body, in bytes
MAX_BODY_BYTES = 16 * 1024 * 1024
#: times a batch is sent through the stages again when a replica died under it
STAGE_RETRIES = 1


def to_wire(value: Any) -> Any:
    """Tensors -> numpy (on the host), everything else unchanged, in any nesting."""
    return pytree.tree_map(lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t, value)


def from_wire(value: Any, device: torch.device) -> Any:
    def conv(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            t = torch.from_numpy(a) if a.flags.writeable else torch.from_numpy(a.copy())
            return t.to(device, non_blocking=True)
        return a
    return pytree.tree_map(conv, value)


class PartitionStageImpl:
    """Loads a stage module from ``path`` and runs batches on ``device``."""

    def __init__(self, path: str, device: str = "cpu", threads: int | None = 1):
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("this stage was planned for a GPU but the replica sees none")
        self.module = torch.load(path, weights_only=False, map_location=self.device).eval()
        self.path = path
        self._lock = threading.Lock()

    def run(self, args: Any) -> Any:
        args = from_wire(args, self.device)
        with self._lock, torch.inference_mode():
            out = self.module(*args) if isinstance(args, tuple) else self.module(args)
            if self.device.type == "cuda":  # pragma: no cover - no GPU where this was written
                torch.cuda.synchronize(self.device)
        return to_wire(out)


@serve.deployment
class PartitionStage(PartitionStageImpl):
    def __call__(self, args: Any) -> Any:
        return self.run(args)


@dataclass(frozen=True)
class InputSpec:
    """What one forward argument must look like: trailing shape and dtype of the example."""

    trailing: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, t: torch.Tensor) -> "InputSpec":
        return cls(tuple(int(d) for d in t.shape[1:]), str(t.dtype).removeprefix("torch."))

    def describe(self) -> str:
        return f"rows x {' x '.join(map(str, self.trailing)) or '(scalars)'} of {self.dtype}"


class BadInput(ValueError):
    def __init__(self, status: int, message: str, field: str = "inputs"):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "fields": [{"field": self.field, "error": self.message}]}


def parse_inputs(body: Any, specs: list[InputSpec], max_rows: int) -> tuple[np.ndarray, ...]:
    """The request's arrays, one per forward argument, checked against ``specs``."""
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadInput(422, 'the body must be a JSON object {"inputs": [...]}', "body")
    extra = sorted(set(body) - {"inputs"})
    if extra:
        raise BadInput(422, f"unknown field(s) {extra}; only 'inputs' is accepted", extra[0])
    raw = body["inputs"]
    parts = [raw] if len(specs) == 1 else raw
    if len(specs) > 1 and (not isinstance(raw, list) or len(raw) != len(specs)):
        raise BadInput(422, f"this model takes {len(specs)} inputs: send a list of {len(specs)} arrays, "
                            f"one per forward argument ({'; '.join(s.describe() for s in specs)})")
    arrays = []
    for k, (part, spec) in enumerate(zip(parts, specs, strict=True)):
        where = "inputs" if len(specs) == 1 else f"inputs[{k}]"
        kind = np.float64 if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat") else None
        try:
            arr = np.asarray(part, dtype=kind)
        except (ValueError, TypeError) as exc:
            raise BadInput(422, f"{where} is not a rectangular numeric array ({exc})", where) from exc
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise BadInput(422, f"{where} must hold numbers, got {arr.dtype}", where)
        if kind is None and arr.dtype.kind == "f" and arr.size:
            if not np.all(arr == np.round(arr)):
                raise BadInput(422, f"{where} must hold integers ({spec.dtype})", where)
        want = (len(arr) if arr.ndim else -1, *spec.trailing)
        if arr.ndim != len(spec.trailing) + 1 or tuple(arr.shape[1:]) != spec.trailing:
            raise BadInput(422, f"{where} has shape {list(arr.shape)}; expected {spec.describe()} "
                                f"(shape {list(want)})", where)
        if len(arr) == 0:
            raise BadInput(422, f"{where} has no rows", where)
        if kind is not None and not np.all(np.isfinite(arr)):
            raise BadInput(422, f"{where} holds NaN or infinity", where)
        arrays.append(arr.astype(np.dtype(spec.dtype.replace("bfloat16", "float32"))))
    rows = {len(a) for a in arrays}
    if len(rows) != 1:
        raise BadInput(422, f"the inputs have different numbers of rows: {[len(a) for a in arrays]}")
    if len(arrays[0]) > max_rows:
        raise BadInput(413, f"{len(arrays[0])} rows is more than max_rows={max_rows}; split the request")
    return tuple(arrays)


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


def jsonable(value: Any) -> Any:
    return pytree.tree_map(lambda a: a.tolist() if isinstance(a, (np.ndarray, np.generic)) else a, value)


class Batcher:
    """Coalesces requests into micro-batches of at most ``batch_size`` rows, waiting at most
    ``wait_s`` for a batch to fill, with at most ``max_inflight`` batches in the pipeline."""

    def __init__(self, run, batch_size: int, wait_s: float, max_inflight: int):
        self.run, self.batch_size, self.wait_s = run, batch_size, wait_s
        self.max_inflight = max_inflight
        self.queue: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None
        self.batches = 0
        self.rows = 0

    async def submit(self, arrays: tuple[np.ndarray, ...]) -> Any:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.sem = asyncio.Semaphore(self.max_inflight)
            self.task = asyncio.get_running_loop().create_task(self._loop())
        n = len(arrays[0])
        futures = []
        for start in range(0, n, self.batch_size):  # a big request becomes several chunks
            fut = asyncio.get_running_loop().create_future()
            stop = min(start + self.batch_size, n)
            await self.queue.put((tuple(a[start:stop] for a in arrays), fut))
            futures.append(fut)
        return concat_rows(list(await asyncio.gather(*futures)))

    async def _loop(self) -> None:
        assert self.queue is not None
        pending = None
        while True:
            first = pending or await self.queue.get()
            pending = None
            items, rows = [first], len(first[0][0])
            deadline = time.monotonic() + self.wait_s
            while rows < self.batch_size:
                try:
                    item = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), left)
                    except asyncio.TimeoutError:
                        break
                if rows + len(item[0][0]) > self.batch_size:
                    pending = item
                    break
                items.append(item)
                rows += len(item[0][0])
            await self.sem.acquire()
            asyncio.get_running_loop().create_task(self._dispatch(items, rows))

    async def _dispatch(self, items: list, rows: int) -> None:
        try:
            args = tuple(np.concatenate([it[0][k] for it in items]) for k in range(len(items[0][0])))
            self.batches += 1
            self.rows += rows
            out = await self.run(args)
            start = 0
            for arrays, fut in items:
                n = len(arrays[0])
                if not fut.done():
                    fut.set_result(rows_of(out, start, start + n, rows))
                start += n
        except Exception as exc:
            for _, fut in items:
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            self.sem.release()


app = FastAPI(title="partitioned torch model", docs_url=None, redoc_url=None)


def _error(status: int, message: str, field: str = "body") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, "fields": [{"field": field,
                                                                                    "error": message}]})


@serve.deployment
@serve.ingress(app)
class ModelIngress:
    """HTTP front: validation, micro-batching and the chain of stage calls."""

    def __init__(self, stages: list[Any], info: dict[str, Any]):
        self.stages = stages
        self.info = info
        self.specs = [InputSpec(tuple(s["trailing"]), s["dtype"]) for s in info["inputs"]]
        self.max_rows = int(info.get("max_rows", MAX_ROWS))
        self.max_body = int(info.get("max_body_bytes", MAX_BODY_BYTES))
        self.batcher = Batcher(self._chain, int(info["batch_size"]), float(info["batch_wait_ms"]) / 1000.0,
                               int(info["max_inflight"]))

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
        body = await request.body()
        if len(body) > self.max_body:
            return _error(413, f"body of {len(body)} bytes is over max_body_bytes={self.max_body}")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"invalid JSON: {exc}")
        try:
            arrays = parse_inputs(data, self.specs, self.max_rows)
        except BadInput as exc:
            return JSONResponse(status_code=exc.status, content=exc.body())
        try:
            out = await self.batcher.submit(arrays)
        except Exception as exc:
            return _error(500, f"internal error: {type(exc).__name__}: {str(exc)[:500]}", "model")
        return JSONResponse({"outputs": jsonable(out)})

    @app.get("/plan")
    def plan(self) -> dict[str, Any]:
        return self.info["plan"]

    @app.get("/healthz")
    def healthz(self) -> dict[str, Any]:
        return {"ok": True, "stages": len(self.stages)}

    @app.get("/stats")
    def stats(self) -> dict[str, Any]:
        b = self.batcher
        return {"batches": b.batches, "rows": b.rows, "mean_batch": b.rows / b.batches if b.batches else 0.0}
