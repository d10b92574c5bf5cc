"""The Open Inference Protocol (v2, as KServe and Triton speak it) on the torch-model app.

Why: the pipeline app takes rows (``{"rows": [...]}``) and the model app tensors
(``{"inputs": [...]}``); a client that speaks the protocol reaches both the same way, and both
answer it beside their native route. Under the app's prefix: ``POST /v2/models/{name}/infer``,
``GET /v2/models/{name}`` (metadata), ``GET /v2/models/{name}/ready``, ``GET /v2/health/live``
and ``/v2/health/ready``.

A request sends one tensor per forward argument, named ``input__0``, ``input__1``, ... (the
names of Triton's PyTorch backend, in the order of the forward's arguments), each with its shape
``[n, *trailing]`` and its datatype (``FP16``/``FP32``/``FP64`` or an integer type for a float
argument, an ``INT*``/``UINT*`` for an integer one, ``BOOL`` for a boolean one) and its data,
flat in row-major order or nested. The arrays then pass the native route's checks
(:func:`serving.model_app.stages.parse_inputs`) and go through the same batches; the answer
holds one tensor per leaf of the model's output (``output__0``, ...). Errors keep the app's one
shape (``{"error", "fields"}``), naming ``inputs[j]`` or one of its fields.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from torch.utils import _pytree as pytree

from serving.core.jsonsafe import clean
from serving.model_app.inputs import BadInput, InputSpec

_FLOATS = ("FP16", "FP32", "FP64")
_INTEGERS = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
#: the protocol's name for this server's platform
PLATFORM = "pytorch"


def input_name(k: int) -> str:
    return f"input__{k}"


def accepted_datatypes(spec: InputSpec) -> tuple[str, ...]:
    """The protocol datatypes a forward argument of this dtype takes."""
    if spec.dtype == "bool":
        return ("BOOL",)
    if spec.dtype.startswith(("float", "bfloat")):
        return (*_FLOATS, *_INTEGERS)
    return _INTEGERS


def declared_datatype(dtype: str) -> str:
    """The datatype an argument or an output of this (torch or numpy) dtype is described with."""
    dtype = str(dtype).removeprefix("torch.")
    if dtype == "bool":
        return "BOOL"
    if dtype.startswith("bfloat"):
        return "FP32"  # served as float32 (parse_inputs)
    if dtype.startswith("float"):
        return {"float16": "FP16", "float32": "FP32"}.get(dtype, "FP64")
    if dtype.startswith("uint"):
        return "U" + declared_datatype(dtype[1:])
    if dtype.startswith("int"):
        return f"INT{dtype[3:] or '64'}"
    return "BYTES"


def _fail(message: str, field: str) -> BadInput:
    return BadInput(422, message, field)


def infer_inputs(body: Any, specs: list[InputSpec]) -> tuple[dict[str, Any], str | None]:
    """A parsed infer request: the native body (``{"inputs": ...}``, for ``parse_inputs``)
    and the request's id."""
    if not isinstance(body, dict):
        raise _fail('the body must be a JSON object {"inputs": [...]}', "body")
    unknown = sorted(set(body) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        raise _fail(f"unknown field {unknown[0]!r} of an infer request", unknown[0])
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _fail("id must be a string", "id")
    tensors = body.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise _fail("inputs must be a non-empty list of tensors", "inputs")
    names = [input_name(k) for k in range(len(specs))]
    arrays: dict[str, np.ndarray] = {}
    for j, tensor in enumerate(tensors):
        where = f"inputs[{j}]"
        if not isinstance(tensor, dict):
            raise _fail("an input must be an object with name, shape, datatype, data", where)
        extra = sorted(set(tensor) - {"name", "shape", "datatype", "data", "parameters"})
        if extra:
            raise _fail(f"{extra[0]!r} is not a field of an input tensor", f"{where}.{extra[0]}")
        name = tensor.get("name")
        if name not in names:
            raise _fail(f"this model's inputs are {names}, got {name!r}", f"{where}.name")
        if name in arrays:
            raise _fail(f"input {name} sent twice", f"{where}.name")
        spec = specs[names.index(name)]
        datatype = tensor.get("datatype")
        if datatype not in accepted_datatypes(spec):
            raise _fail(f"{name} is {spec.dtype}: its datatype is one of {list(accepted_datatypes(spec))}, got "
                        f"{datatype!r}", f"{where}.datatype")
        shape = tensor.get("shape")
        if (not isinstance(shape, list) or not shape
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise _fail("shape must be a list of sizes, rows first", f"{where}.shape")
        if list(shape[1:]) != list(spec.trailing):
            raise _fail(f"{name} has shape {shape}; expected [n, {', '.join(map(str, spec.trailing))}]"
                        if spec.trailing else f"{name} has shape {shape}; expected [n]", f"{where}.shape")
        try:  # integers stay integers (an INT64 beyond 2**53 keeps its value); the checks follow
            data = np.asarray(tensor.get("data"))
        except (ValueError, TypeError):
            data = np.asarray([], dtype=object)
        kinds = "b" if datatype == "BOOL" else "iuf" if datatype in _FLOATS else "iu"
        if data.dtype.kind not in kinds and not (data.size == 0 and data.dtype.kind == "f"):
            raise _fail(f"data must hold {'booleans' if datatype == 'BOOL' else 'numbers'} of {datatype} (flat, "
                        "row-major, or nested)", f"{where}.data")
        if data.size != math.prod(shape):
            raise _fail(f"data holds {data.size} values; shape {shape} needs {math.prod(shape)}", f"{where}.data")
        arrays[name] = data.reshape(shape)
    missing = [n for n in names if n not in arrays]
    if missing:
        raise _fail(f"missing input(s) {missing}: this model takes {len(names)}", "inputs")
    ordered = [arrays[n] for n in names]
    return {"inputs": ordered[0] if len(ordered) == 1 else ordered}, rid


def infer_answer(name: str, out: Any, rid: str | None) -> dict[str, Any]:
    """The model's output as the protocol's response: one tensor per leaf."""
    leaves, _ = pytree.tree_flatten(out)
    outputs = []
    for k, leaf in enumerate(leaves):
        arr = np.asarray(leaf)
        outputs.append({"name": f"output__{k}", "shape": list(arr.shape), "datatype": declared_datatype(arr.dtype),
                        "data": clean(arr.reshape(-1).tolist(), infinity="null")})
    answer: dict[str, Any] = {"model_name": name, "outputs": outputs}
    if rid is not None:
        answer["id"] = rid
    return answer


def output_specs(last_stage: Any, last_input: Any) -> list[dict[str, Any]]:
    """The outputs' names, datatypes and shapes (-1: rows), from the last stage run on its
    canary row (deploy_model's one-row example through the stages before it)."""
    import torch

    with torch.inference_mode():
        out = last_stage(*last_input) if isinstance(last_input, tuple) else last_stage(last_input)
    leaves, _ = pytree.tree_flatten(out)
    return [{"name": f"output__{k}", "datatype": declared_datatype(getattr(leaf, "dtype", "float64")),
             "shape": [-1, *[int(d) for d in getattr(leaf, "shape", ())[1:]]]} for k, leaf in enumerate(leaves)]


def metadata(name: str, specs: list[InputSpec], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the inputs and outputs, each with its datatype and shape."""
    return {"name": name, "versions": [], "platform": PLATFORM,
            "inputs": [{"name": input_name(k), "datatype": declared_datatype(s.dtype), "shape": [-1, *s.trailing]}
                       for k, s in enumerate(specs)],
            "outputs": outputs}
