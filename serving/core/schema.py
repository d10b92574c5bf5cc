"""Request and response schemas: static pydantic models plus the per-pipeline row schema.

The row schema is derived from the pipeline: the input columns its feature groups
read (found at capture) with the types seen in the held-out sample rows. Rows are
validated column by column, and every problem names its field
(``rows[3].dep_delay``), so clients can fix requests without guessing.
"""

from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from serving.core.constants import MAX_ROWS
from serving.core.jsonsafe import clean

#: at most this many field errors are listed in one response
MAX_REPORTED_ERRORS = 20
#: most request-level attributes one request may carry, and longest name and string value: they
#: become monitor attributes, metric label values and dashboard text, so one client cannot
#: flood them
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_NAME_CHARS = 64
MAX_ATTRIBUTE_CHARS = 256
#: integers a JSON body may carry: int64's range (a larger one would wrap or overflow)
INT_LIMIT = 2**63
#: a JSON escape of a UTF-16 surrogate (``\ud800``-``\udfff``): only such an escape can put a
#: lone surrogate (a string no UTF-8 encoder takes) into a decoded body
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


AttributeName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ATTRIBUTE_NAME_CHARS)]
AttributeValue = Annotated[str, StringConstraints(max_length=MAX_ATTRIBUTE_CHARS)] | int | float | bool


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Any]] = Field(description="input rows, one object per row")
    attributes: dict[AttributeName, AttributeValue] | None = Field(
        default=None, max_length=MAX_ATTRIBUTES,
        description=f"request-level attributes for the monitor (e.g. source, region): at most "
                    f"{MAX_ATTRIBUTES}, names up to {MAX_ATTRIBUTE_NAME_CHARS} and strings up to "
                    f"{MAX_ATTRIBUTE_CHARS} characters",
    )


class TopKRequest(PredictRequest):
    k: int = Field(description="how many rows to return (1 <= k <= len(rows))")
    label: str | int | float | bool | None = Field(default=None, description="class to rank by")


class PredictResponse(BaseModel):
    predictions: list[Any]
    probabilities: list[list[float]]
    level: list[int]
    degraded: list[bool] = Field(description="rows answered by an earlier level because a later "
                                             "stage missed the deadline or was overloaded (degrade=True)")
    model_version: str
    gear: int = Field(0, description="the certified gear that answered (0: the plan; higher: a cheaper plan "
                                     "certified at a looser max_loss, served under load; see serving.runtime.gears)")
    gear_max_loss: float | None = Field(None, description="the max_loss that gear was certified for")
    gear_loss_bound: float | None = Field(None, description="that gear's loss bound at its threshold alone, "
                                                            "what its certification test saw (the guarantee is "
                                                            "gear_max_loss; None: the full pipeline)")
    full_pipeline: bool = Field(False, description="the full pipeline answered every row: the live audit's alarm "
                                                   "holds gear 0 (deploy(on_alarm='step'); serving.runtime.hold)")


class TopKResponse(BaseModel):
    indices: list[int]
    scores: list[float]
    approximate: list[bool]
    k: int
    label: Any
    ratio: float | None
    #: the filter's certificate (``certified``, ``precision_bound``, what it saw); None when no
    #: filter was tried. An uncertified filter falls back to exact scoring (``ratio`` None).
    certificate: dict[str, Any] | None = None
    model_version: str


class ErrorResponse(BaseModel):
    error: str
    fields: list[dict[str, str]] = Field(default_factory=list)
    request_id: str | None = None
    #: monitor queries (/explain, /drift): why, machine-readable, and when to retry
    reason: str | None = None
    retry_after_s: float | None = None


class RequestError(Exception):
    """A client error with an HTTP status and the fields at fault."""

    def __init__(self, status: int, message: str, fields: list[dict[str, str]] | None = None, *,
                 extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields or []
        self.extra = dict(extra or {})  # more JSON fields (e.g. a monitor error's reason)
        self.headers = dict(headers or {})  # e.g. Retry-After

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "fields": self.fields[:MAX_REPORTED_ERRORS], **self.extra}


@dataclass
class ColumnSpec:
    name: str
    kind: str  # number | integer | string | boolean
    nullable: bool
    dtype: str


@dataclass
class RowSchema:
    """Required input columns with their JSON types; ``optional`` columns may be sent too."""

    columns: list[ColumnSpec]
    optional: list[str] = field(default_factory=list)

    @classmethod
    def from_sample(cls, sample: pd.DataFrame, required: list[str], optional: list[str] = ()) -> RowSchema:
        if not isinstance(sample, pd.DataFrame):
            raise TypeError("serving needs a pipeline whose input rows are a DataFrame")
        missing = [c for c in required if c not in sample.columns]
        if missing:
            raise ValueError(f"sample rows lack required columns {missing}")
        specs = []
        for name in required:
            col = sample[name]
            if pd.api.types.is_bool_dtype(col):
                kind = "boolean"
            elif pd.api.types.is_integer_dtype(col):
                kind = "integer"
            elif pd.api.types.is_numeric_dtype(col):
                kind = "number"
            else:
                kind = "string"
            specs.append(ColumnSpec(name, kind, bool(col.isna().any()), str(col.dtype)))
        return cls(specs, [c for c in optional if c not in required])

    def to_dict(self) -> dict[str, Any]:
        return {"columns": [vars(c).copy() for c in self.columns], "optional": list(self.optional)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RowSchema:
        return cls([ColumnSpec(**c) for c in data["columns"]], list(data.get("optional", [])))

    def json_schema(self) -> dict[str, Any]:
        props = {}
        for c in self.columns:
            t: Any = c.kind if not c.nullable else [c.kind, "null"]
            props[c.name] = {"type": t}
        for name in self.optional:
            props[name] = {"type": ["string", "number", "integer", "boolean", "null"]}
        return {
            "type": "object",
            "properties": props,
            "required": [c.name for c in self.columns],
            "additionalProperties": False,
        }

    def to_frame(self, rows: list[dict[str, Any]], max_rows: int = MAX_ROWS) -> pd.DataFrame:
        """Validate rows and build the DataFrame the pipeline expects; RequestError on problems."""
        if not rows:
            raise RequestError(422, "rows must not be empty", [{"field": "rows", "error": "empty list"}])
        if len(rows) > max_rows:
            raise RequestError(413, f"too many rows: {len(rows)} > {max_rows}",
                               [{"field": "rows", "error": f"at most {max_rows} rows per request"}])
        required = {c.name for c in self.columns}
        frame = self._fast_frame(rows, required)
        if frame is not None:
            return frame
        allowed = required | set(self.optional)
        errors: list[dict[str, str]] = []
        for i, row in enumerate(rows):
            keys = set(row)
            for name in sorted(required - keys):
                errors.append({"field": f"rows[{i}].{name}", "error": "missing column"})
            for name in sorted(keys - allowed):
                errors.append({"field": f"rows[{i}].{name}", "error": "unknown column"})
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
        if errors:
            raise RequestError(422, "rows do not match the input schema", errors)
        data = {}
        for spec in self.columns:
            values = [row[spec.name] for row in rows]
            data[spec.name] = self._column(spec, values, errors)
        if errors:
            raise RequestError(422, "rows have invalid values", errors)
        frame = pd.DataFrame(data)
        for name in self.optional:  # dtype inferred from the values sent
            frame[name] = pd.Series([row.get(name) for row in rows], index=frame.index)
        return frame

    def _fast_frame(self, rows: list[dict[str, Any]], required: set[str] | None = None) -> pd.DataFrame | None:
        """The frame of rows that are plainly valid, checked a column at a time (every row has
        exactly the ``required`` columns; each column's values all of the one type its kind
        takes, no nulls, integers in range, numbers finite); None otherwise, and the per-value
        checks of :meth:`to_frame` find and name what is wrong. Both build each column with
        :func:`_array`."""
        required = {c.name for c in self.columns} if required is None else required
        if not all(row.keys() == required for row in rows):
            return None  # optional columns, or a missing or unknown one
        data: dict[str, Any] = {}
        for spec in self.columns:
            values = list(map(operator.itemgetter(spec.name), rows))
            types = set(map(type, values))
            if spec.kind in ("number", "integer") and types <= ({int, float} if spec.kind == "number" else {int}):
                if int in types and not all(-INT_LIMIT <= v < INT_LIMIT for v in values if type(v) is int):
                    return None
                try:
                    column = _array(spec, values)
                except OverflowError:  # beyond the column's own integer type
                    return None
                if column.dtype.kind == "f" and not np.isfinite(column).all():
                    return None
            elif (spec.kind, types) in (("string", {str}), ("boolean", {bool})):
                column = _array(spec, values)
            else:
                return None
            data[spec.name] = column
        return pd.DataFrame(data)

    @staticmethod
    def _column(spec: ColumnSpec, values: list[Any], errors: list) -> Any:
        ok = _CHECKS[spec.kind]
        before = len(errors)
        for i, v in enumerate(values):
            if v is None:
                if not spec.nullable:
                    errors.append({"field": f"rows[{i}].{spec.name}", "error": "null is not allowed here"})
            elif isinstance(v, float) and not math.isfinite(v):
                errors.append({"field": f"rows[{i}].{spec.name}", "error": "NaN/Infinity is not allowed"})
            elif isinstance(v, int) and not isinstance(v, bool) and not -INT_LIMIT <= v < INT_LIMIT:
                errors.append({"field": f"rows[{i}].{spec.name}", "error": "integer out of range (|v| >= 2^63)"})
            elif not ok(v):
                errors.append({"field": f"rows[{i}].{spec.name}",
                               "error": f"expected {spec.kind}, got {type(v).__name__}"})
            if len(errors) >= MAX_REPORTED_ERRORS:
                return None
        if len(errors) > before:
            return None
        if spec.kind == "integer" and not spec.nullable:
            ints = [int(v) for v in values]
            info = np.iinfo(_integer_dtype(spec))
            for i, v in enumerate(ints):
                if not info.min <= v <= info.max:
                    errors.append({"field": f"rows[{i}].{spec.name}",
                                   "error": f"out of range for {info.dtype.name} ({info.min}..{info.max})"})
                    return None
            return _array(spec, ints)
        return _array(spec, values)


def _integer_dtype(spec: ColumnSpec) -> np.dtype:
    """The array type of a non-nullable integer column: its sample's, or int64."""
    return np.dtype(spec.dtype if spec.dtype.startswith(("int", "uint")) else np.int64)


def _array(spec: ColumnSpec, values: list[Any]) -> Any:
    """A checked column's values as the frame's array, the one rule both the column-at-a-time
    and the per-value paths of :meth:`RowSchema.to_frame` build with. A non-nullable integer
    column is built exactly, not through float64 (which rounds past 2^53 and wraps at 2^63):
    OverflowError beyond its type."""
    if spec.kind == "integer" and not spec.nullable:
        return np.array(values, dtype=_integer_dtype(spec))
    if spec.kind in ("number", "integer"):
        return np.array([np.nan if v is None else v for v in values] if None in values else values,
                        dtype=np.float64)
    if spec.kind == "boolean":
        return pd.array(values, dtype="boolean") if spec.nullable else np.array(values, dtype=bool)
    return pd.array(values, dtype=spec.dtype if spec.dtype in ("str", "string", "object") else "object")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_integer(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


_CHECKS = {
    "number": _is_number,
    "integer": _is_integer,
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
}


def validation_fields(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        out.append({"field": loc or "body", "error": err.get("msg", "invalid")})
    return out


def parse_request(body: bytes, model: type[BaseModel], schema: RowSchema,
                  max_rows: int = MAX_ROWS) -> tuple[Any, pd.DataFrame]:
    """A request body as the validated request and its rows as a frame; RequestError (4xx,
    naming the fields at fault) otherwise. CPU-bound: the ingress runs it off its event loop
    for large bodies."""
    data = parse_json(body)
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise RequestError(422, "request does not match the schema", validation_fields(exc)) from exc
    return parsed, schema.to_frame(parsed.rows, max_rows)


def parse_json(body: bytes) -> Any:
    """A request body's JSON; RequestError 400 when it is not JSON, 422 naming the field that
    holds a lone surrogate (valid JSON, but no text anything downstream can store).

    Decoded by msgspec (about 1.3x ``json`` on a 32-row toxic body; integers stay exact, as in
    ``json``); a body msgspec refuses (not JSON, ``NaN``, nested too deeply, a lone surrogate)
    is decoded again by ``json``, whose answer names what is wrong as before."""
    if not _SURROGATE_ESCAPE.search(body):
        try:
            return _DECODE(body)
        except (msgspec.DecodeError, RecursionError):
            pass  # the slow path below says why, as it always has
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:  # a 5,000-digit integer is a ValueError too
        raise RequestError(400, f"invalid JSON: {exc}") from exc
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    if _SURROGATE_ESCAPE.search(body):
        _refuse_lone_surrogates(data)
    return data


_DECODE = msgspec.json.Decoder().decode


def _refuse_lone_surrogates(data: Any) -> None:
    """422 naming the first field that holds a lone UTF-16 surrogate (valid JSON, but no UTF-8
    text: the monitor, the dashboard and every answer that echoes it would fail on it)."""
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not _utf8(value):
                raise RequestError(422, f"{_safe(where)} holds a lone UTF-16 surrogate (not text)",
                                   [{"field": _safe(where), "error": "invalid unicode"}])
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _utf8(key):
                    raise RequestError(422, f"a key in {_safe(where)} holds a lone UTF-16 surrogate (not text)",
                                       [{"field": _safe(where), "error": "invalid unicode in a key"}])
                stack.append((f"{where}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _safe(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def predict_answer(classes: np.ndarray, proba: np.ndarray, level: np.ndarray, degraded: np.ndarray,
                   version: str, gear: dict[str, Any] | None = None) -> bytes:
    """The /predict answer, JSON-encoded (as Starlette's JSONResponse would); ``gear``: the
    gear fields (:meth:`serving.runtime.gears.GearSwitch.fields`)."""
    labels = classes[np.argmax(proba, axis=1)]
    body = {
        "predictions": clean(list(labels), infinity="null"),
        "probabilities": np.round(proba, 12).tolist(),
        "level": level.tolist(),
        "degraded": degraded.tolist(),
        "model_version": version,
        **(gear or {}),
    }
    if not np.isfinite(proba).all():  # as json.dumps(allow_nan=False) refused it: never a null probability
        raise ValueError("predict_answer: probabilities must be finite")
    return _ENCODE(body)


#: the answer's encoder: msgspec (about 10x ``json.dumps`` on a 32-row answer), compact UTF-8
_ENCODE = msgspec.json.Encoder().encode
