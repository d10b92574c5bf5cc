"""The Open Inference Protocol (v2, as KServe and Triton speak it) beside the native routes.

Under the app's prefix: ``POST /v2/models/{name}/infer``, ``GET /v2/models/{name}``
(metadata), ``GET /v2/models/{name}/ready``, ``GET /v2/health/live`` and ``/v2/health/ready``.
A request sends one input tensor per input column (shape ``[n]`` or ``[n, 1]``, its datatype one
the column's kind takes: ``BYTES`` for strings, ``BOOL``, an ``INT*``/``UINT*`` for integers, and
those or ``FP*`` for numbers), optionally ``id``, ``outputs`` (the subset wanted) and
``parameters.attributes`` (the monitor's request attributes, as the native body's). The rows are
then checked by the same :class:`serving.core.schema.RowSchema` rules as ``POST /predict`` (a
4xx names ``inputs[j]`` or ``inputs[j].data[i]``), and answered by the same cascade: the outputs
``predictions``, ``probabilities`` (``[n, classes]``), ``level`` and ``degraded``, with the gear
fields in ``parameters``. Errors keep the app's one shape (``{"error", "fields", ...}``), whose
``error`` is what the protocol asks for.
"""

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pandas as pd
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from serving.core.constants import PARSE_INLINE_BYTES
from serving.core.jsonsafe import clean
from serving.core.schema import (
    MAX_REPORTED_ERRORS,
    PredictRequest,
    RequestError,
    RowSchema,
    parse_json,
    validation_fields,
)

#: the protocol's datatypes -> the column kinds (RowSchema) each may fill
_INTEGER_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
_NUMBER_TYPES = (*_INTEGER_TYPES, "FP16", "FP32", "FP64")
KIND_DATATYPES = {"string": ("BYTES",), "boolean": ("BOOL",), "integer": _INTEGER_TYPES, "number": _NUMBER_TYPES}
#: the datatype a column of each kind is described with in the metadata
KIND_DATATYPE = {"string": "BYTES", "boolean": "BOOL", "integer": "INT64", "number": "FP64"}
OUTPUTS = ("predictions", "probabilities", "level", "degraded")
#: the protocol's name for this server's platform
PLATFORM = "willump"


@dataclass
class InferRequest:
    """A parsed infer request: its rows, the monitor's attributes, the id to echo, the outputs wanted."""

    frame: pd.DataFrame
    attributes: dict[str, Any] | None
    id: str | None
    outputs: tuple[str, ...]


def _fail(message: str, field: str, error: str, status: int = 422) -> RequestError:
    return RequestError(status, message, [{"field": field, "error": error}])


def _tensor(j: int, tensor: Any) -> tuple[str, str, list[Any]]:
    """One input tensor's name, datatype and flat values, its shape checked."""
    where = f"inputs[{j}]"
    if not isinstance(tensor, dict):
        raise _fail("an input must be an object", where, "expected an object with name, shape, datatype, data")
    unknown = sorted(set(tensor) - {"name", "shape", "datatype", "data", "parameters"})
    if unknown:
        raise _fail("unknown input field", f"{where}.{unknown[0]}", "not a field of an input tensor")
    name, datatype, shape, data = (tensor.get(k) for k in ("name", "datatype", "shape", "data"))
    if not isinstance(name, str):
        raise _fail("an input needs a name", f"{where}.name", "expected the input column's name")
    if not isinstance(datatype, str):
        raise _fail("an input needs a datatype", f"{where}.datatype", "expected e.g. FP64, INT64, BYTES, BOOL")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or (len(shape) == 2 and shape[1] != 1)):
        raise _fail("an input's shape must be [n] or [n, 1]", f"{where}.shape", "one value per row")
    if not isinstance(data, list):
        raise _fail("an input needs its data", f"{where}.data", "expected a list of values")
    if data and isinstance(data[0], list):  # nested row-major, as [[v], [v], ...]
        if not all(isinstance(v, list) and len(v) == 1 for v in data):
            raise _fail("nested data must hold one value per row", f"{where}.data", "expected [[v], [v], ...]")
        data = [v[0] for v in data]
    if len(data) != shape[0]:
        raise _fail("an input's data does not match its shape", f"{where}.data",
                    f"{len(data)} values for shape {shape}")
    return name, datatype, data


def parse_infer(body: bytes, schema: RowSchema, max_rows: int) -> InferRequest:
    """A ``POST .../infer`` body as rows checked by ``schema`` (RequestError 4xx naming the field)."""
    data = parse_json(body)
    if not isinstance(data, dict):
        raise _fail("the body must be an object", "body", "expected {\"inputs\": [...]}")
    unknown = sorted(set(data) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        raise _fail("unknown request field", unknown[0], "not a field of an inference request")
    rid = data.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _fail("id must be a string", "id", "expected a string")
    attributes = _attributes(data.get("parameters"))
    outputs = _outputs(data.get("outputs"))
    tensors = data.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise _fail("inputs must be a non-empty list", "inputs", "one tensor per input column")
    columns: dict[str, list[Any]] = {}
    position: dict[str, int] = {}
    kinds = {c.name: c.kind for c in schema.columns}
    for j, tensor in enumerate(tensors):
        name, datatype, values = _tensor(j, tensor)
        if name in columns:
            raise _fail("an input is sent twice", f"inputs[{j}].name", f"{name!r} already given")
        if name not in kinds and name not in schema.optional:
            raise _fail("unknown input", f"inputs[{j}].name", f"not an input column of this model: {name!r}")
        allowed = KIND_DATATYPES.get(kinds.get(name), ("BYTES", "BOOL", *_NUMBER_TYPES))
        if datatype not in allowed:
            raise _fail("an input's datatype does not fit its column", f"inputs[{j}].datatype",
                        f"{name!r} takes {', '.join(allowed)}, got {datatype!r}")
        columns[name], position[name] = values, j
    missing = [c.name for c in schema.columns if c.name not in columns]
    if missing:
        raise RequestError(422, "inputs lack required columns",
                           [{"field": "inputs", "error": f"missing input {m!r}"} for m in missing[:MAX_REPORTED_ERRORS]])
    sizes = {len(v) for v in columns.values()}
    if len(sizes) != 1:
        raise _fail("every input must hold one value per row", "inputs", f"inputs of {sorted(sizes)} rows")
    names = list(columns)
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    try:
        frame = schema.to_frame(rows, max_rows)
    except RequestError as exc:  # the row rules' fields, named as this body holds them
        exc.fields = [_field(f, position) for f in exc.fields]
        raise
    return InferRequest(frame, attributes, rid, outputs)


def _field(entry: dict[str, str], position: dict[str, int]) -> dict[str, str]:
    """``rows[i].col`` -> ``inputs[j].data[i]``; ``rows`` -> ``inputs``."""
    field = entry.get("field", "")
    if field.startswith("rows[") and "]." in field:
        row, name = field[len("rows["):].split("].", 1)
        if name in position:
            return {**entry, "field": f"inputs[{position[name]}].data[{row}]"}
    return {**entry, "field": "inputs" if field == "rows" else field}


def _attributes(parameters: Any) -> dict[str, Any] | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise _fail("parameters must be an object", "parameters", "expected an object")
    attributes = parameters.get("attributes")
    if attributes is None:
        return None
    try:  # the native body's rules for request attributes (names, lengths, count)
        return PredictRequest.model_validate({"rows": [], "attributes": attributes}).attributes
    except ValidationError as exc:
        raise RequestError(422, "parameters.attributes are not valid request attributes",
                           [{**f, "field": f"parameters.{f['field']}"} for f in validation_fields(exc)]) from None


def _outputs(outputs: Any) -> tuple[str, ...]:
    if outputs is None:
        return OUTPUTS
    if not isinstance(outputs, list) or not outputs:
        raise _fail("outputs must be a non-empty list", "outputs", "expected [{\"name\": ...}]")
    wanted = []
    for i, out in enumerate(outputs):
        name = out.get("name") if isinstance(out, dict) else None
        if name not in OUTPUTS:
            raise _fail("unknown output", f"outputs[{i}].name", f"one of {list(OUTPUTS)}")
        wanted.append(name)
    return tuple(dict.fromkeys(wanted))


def _label_datatype(labels: np.ndarray) -> str:
    """The protocol's datatype of the class labels (an object array by the types it holds)."""
    labels = np.asarray(labels)
    kind = labels.dtype.kind
    if kind == "O" and labels.size:
        types = set(map(type, labels.ravel().tolist()))
        kind = ("b" if types == {bool} else "i" if types <= {int} else
                "f" if types <= {int, float} else "O")
    return {"b": "BOOL", "i": "INT64", "u": "UINT64", "f": "FP64"}.get(kind, "BYTES")


def infer_answer(model: str, version: str, request: InferRequest, classes: np.ndarray, proba: np.ndarray,
                 level: np.ndarray, degraded: np.ndarray, gear: dict[str, Any]) -> bytes:
    """The infer answer: the outputs asked for, the gear fields as parameters."""
    n, k = proba.shape
    labels = np.asarray(classes)[np.argmax(proba, axis=1)]
    if not np.isfinite(proba).all():
        raise ValueError("infer_answer: probabilities must be finite")
    datatype = _label_datatype(labels)
    tensors = {
        "predictions": {"datatype": datatype, "shape": [n],
                        "data": clean(labels.tolist() if datatype != "BYTES" else [str(v) for v in labels])},
        "probabilities": {"datatype": "FP64", "shape": [n, k], "data": np.round(proba, 12).ravel().tolist()},
        "level": {"datatype": "INT64", "shape": [n], "data": np.asarray(level).tolist()},
        "degraded": {"datatype": "BOOL", "shape": [n], "data": np.asarray(degraded).tolist()},
    }
    body = {"model_name": model, "model_version": version,
            "outputs": [{"name": name, **tensors[name]} for name in request.outputs],
            "parameters": clean(gear)}
    if request.id is not None:
        body["id"] = request.id
    return msgspec.json.encode(body)


def metadata(model: str, version: str, schema: RowSchema, classes: np.ndarray) -> dict[str, Any]:
    """``GET /v2/models/{name}``: inputs from the row schema, outputs with their shapes."""
    labels = _label_datatype(np.asarray(classes))
    return {"name": model, "versions": [version], "platform": PLATFORM,
            "inputs": [{"name": c.name, "datatype": KIND_DATATYPE[c.kind], "shape": [-1]} for c in schema.columns],
            "outputs": [{"name": "predictions", "datatype": labels, "shape": [-1]},
                        {"name": "probabilities", "datatype": "FP64", "shape": [-1, len(classes)]},
                        {"name": "level", "datatype": "INT64", "shape": [-1]},
                        {"name": "degraded", "datatype": "BOOL", "shape": [-1]}]}


def infer_request_schema(schema: RowSchema) -> dict[str, Any]:
    """The JSON schema of an infer body for this pipeline (the OpenAPI document's InferRequestBody)."""
    tensors = [{"type": "object", "required": ["name", "shape", "datatype", "data"], "properties": {
        "name": {"const": c.name}, "shape": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        "datatype": {"enum": list(KIND_DATATYPES[c.kind])}, "data": {"type": "array"}}} for c in schema.columns]
    return {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "id": {"type": "string"},
        "inputs": {"type": "array", "minItems": len(tensors), "items": {"oneOf": tensors},
                   "description": "one tensor per input column, shape [n] or [n, 1]"},
        "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"enum": list(OUTPUTS)}}}},
        "parameters": {"type": "object", "properties": {"attributes": {
            "type": "object", "description": "request-level attributes for the monitor, as POST /predict's"}}}}}


def check_model(model: str, name: str) -> None:
    """404 (the app's error shape) unless the path names this app's model."""
    if model != name:
        raise RequestError(404, f"no model {model!r} here: this app serves {name!r}",
                           [{"field": "path:model", "error": "unknown model"}])



# --- what the ingress's protocol routes do (serving.runtime.ingress declares the routes) -------
async def infer(ingress: Any, model: str, request: Request) -> Response:
    """``POST /v2/models/{model}/infer``: parsed (in a thread when large), then the native path."""
    check_model(model, ingress.name)
    body = request.state.body
    parsed = (parse_infer(body, ingress.schema, ingress.max_rows) if len(body) <= PARSE_INLINE_BYTES else
              await asyncio.to_thread(parse_infer, body, ingress.schema, ingress.max_rows))
    return await ingress._geared(request, parsed)


async def model_metadata(ingress: Any, model: str) -> dict[str, Any]:
    check_model(model, ingress.name)
    return metadata(ingress.name, ingress.version, ingress.schema, ingress.classes)


async def model_ready(ingress: Any, model: str | None = None) -> Response:
    """``GET /v2/models/{model}/ready`` and ``/v2/health/ready``: every stage's canary answers."""
    if model is not None:
        check_model(model, ingress.name)
    _, ready = await ingress.stage_health()
    body = {"ready": ready} if model is None else {"name": ingress.name, "ready": ready}
    return JSONResponse(body, status_code=200 if ready else 503)


async def live() -> dict[str, Any]:
    return {"live": True}
