"""What a request to the torch-model app must send: one array per forward argument, checked
against the example's trailing shape and dtype (a 4xx naming what is wrong). Shared by the
native route (``POST /predict {"inputs": ...}``) and the Open Inference Protocol's
(:mod:`serving.model_app.oip`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class InputSpec:
    """What one forward argument must look like: trailing shape and dtype of the example."""

    trailing: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, t: torch.Tensor) -> InputSpec:
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
