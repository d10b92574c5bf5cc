"""The HTTP ingress's helpers (:mod:`serving.runtime.ingress`): its OpenAPI document with the pipeline's
row schema, handles to other Serve applications, API-key hashing, and the HTTP answers to
failed requests and to the monitor's error answers.

No ``from __future__ import annotations``, as in :mod:`serving.runtime.ingress`.
"""

import hashlib
import math
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from ray import serve

from serving.core.schema import (
    ErrorResponse,
    PredictRequest,
    PredictResponse,
    RequestError,
    RowSchema,
    TopKRequest,
    TopKResponse,
)
from serving.runtime.calls import RETRY_AFTER_S, DeadlineExceeded, StageOverloaded
from serving.runtime.metrics import ServingMetrics
from serving.runtime.oip import infer_request_schema

#: routes answered without the API key (load balancers' health checks)
OPEN_ROUTES = ("healthz",)
#: their paths (the Open Inference Protocol's liveness route is open too: serving.runtime.oip)
OPEN_PATHS = ("/healthz", "/v2/health/live")

#: GET /explain and /drift: ``kind`` -> the monitor query it runs, and the default kind
MONITOR_ROUTES: dict[str, tuple[str, dict[str, str]]] = {
    "explain": ("anomalies", {"anomalies": "explain", "mix": "mix_shift", "conditional": "conditional_shift",
                              "cascade": "cascade_health"}),
    "drift": ("columns", {"columns": "drift", "sequential": "sequential_drift", "changes": "change_points",
                          "cascade": "cascade_health", "guarantee": "guarantee", "accuracy": "accuracy"}),
}
#: how a monitor query's annotation reads in OpenAPI (lists arrive comma-separated)
_QUERY_TYPES = (("Sequence", {"type": "string", "description": "comma-separated"}),
                ("tuple", {"type": "string", "description": "comma-separated"}),
                ("float", {"type": "number"}), ("int", {"type": "integer"}), ("bool", {"type": "boolean"}))


def monitor_query_parameters(route: str) -> list[dict[str, Any]]:
    """OpenAPI query parameters of ``GET /{route}``: ``kind`` and every parameter of the monitor
    queries it runs (read from their signatures, as the monitor replica accepts them), with their
    defaults and the bounds HTTP puts on the costly ones."""
    import inspect

    from drift import Monitor
    from serving.runtime.replicas import HTTP_QUERY_BOUNDS

    default, kinds = MONITOR_ROUTES[route]
    params: list[dict[str, Any]] = [{"name": "kind", "in": "query", "required": False,
                                     "schema": {"type": "string", "enum": list(kinds), "default": default}}]
    seen: dict[str, dict[str, Any]] = {}
    for kind, query in kinds.items():
        if query in ("guarantee", "accuracy"):  # the live guarantee (serving.runtime.feedback), not the Monitor
            seen.setdefault("segment", {"name": "segment", "in": "query", "required": False,
                                        "schema": {"type": "string"},
                                        "description": "a request attribute: one verdict per value of it; for "
                                                       "kind=guarantee, accuracy"})
            continue
        for name, p in inspect.signature(getattr(Monitor, query)).parameters.items():
            if name in ("self", "classifier", "gate", "segments", "reference", "window", "as_of"):
                continue  # Python objects, or times and references the HTTP API does not take
            if name in seen:
                seen[name]["description"] += f", {kind}"
                continue
            annotation = str(p.annotation)
            schema = next((dict(s) for key, s in _QUERY_TYPES if key in annotation), {"type": "string"})
            note = schema.pop("description", "")
            if p.default is not inspect.Parameter.empty and isinstance(p.default, (int, float, str)):
                schema["default"] = p.default
            if name in HTTP_QUERY_BOUNDS:
                schema["minimum"], schema["maximum"] = HTTP_QUERY_BOUNDS[name]
            seen[name] = {"name": name, "in": "query", "required": False, "schema": schema,
                          "description": (note + "; " if note else "") + f"for kind={kind}"}
    return params + list(seen.values())


def openapi_document(fastapi_app: FastAPI, schema: RowSchema, *, keyed: bool = False,
                     monitor: bool = False) -> dict[str, Any]:
    """The app's OpenAPI document with this pipeline's row schema filled in, the monitor routes'
    query parameters (``monitor``) and, on an app with a key (``keyed``), its two ways of sending
    it (every route but the open ones)."""
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
    components["InferRequestBody"] = infer_request_schema(schema)
    if monitor:
        for route in MONITOR_ROUTES:
            operation = doc.get("paths", {}).get(f"/{route}", {}).get("get")
            if operation is not None:
                operation["parameters"] = monitor_query_parameters(route)
    if keyed:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
        for path, operations in doc.get("paths", {}).items():
            if path in OPEN_PATHS:
                for operation in operations.values():
                    operation["security"] = []
    return doc


class LazyHandle:
    """A deployment handle of another Serve application, fetched on first use."""

    def __init__(self, deployment: str, app_name: str):
        self.deployment, self.app_name, self._handle = deployment, app_name, None

    def __getattr__(self, name: str) -> Any:
        if self._handle is None:
            self._handle = serve.get_deployment_handle(self.deployment, self.app_name)
        return getattr(self._handle, name)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def monitor_error(answer: dict[str, Any]) -> RequestError:
    """A monitor query's error answer (``MonitorStage.query``) as the client's HTTP error: its
    status, message and fields, the monitor's ``reason`` and ``retry_after_s`` in the body,
    and ``Retry-After`` (whole seconds, at least 1) when waiting helps."""
    extra = {k: answer[k] for k in ("reason", "retry_after_s") if answer.get(k) is not None}
    wait = answer.get("retry_after_s")
    headers = {"Retry-After": str(max(1, math.ceil(float(wait))))} if wait is not None else None
    return RequestError(int(answer["status"]), str(answer["error"]), answer.get("fields"), extra=extra,
                        headers=headers)


ROUTE_ERRORS = {400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}, 403: {"model": ErrorResponse},
                408: {"model": ErrorResponse}, 415: {"model": ErrorResponse}, 421: {"model": ErrorResponse},
                413: {"model": ErrorResponse},
                422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}, 504: {"model": ErrorResponse}}


def error_response(exc: Exception, rid: str, route: str, metrics: ServingMetrics) -> tuple[int, JSONResponse]:
    """The HTTP answer to a request that failed for a known reason, counted in ``metrics``:
    the client's error (4xx, its body), overload (503 with ``Retry-After``), or a missed
    deadline (504)."""
    if isinstance(exc, RequestError):
        metrics.count("willump_errors", route=route, kind="client")
        headers = {**exc.headers, **({"WWW-Authenticate": "Bearer"} if exc.status == 401 else {})}
        return exc.status, JSONResponse(status_code=exc.status, content={**exc.body(), "request_id": rid},
                                        headers=headers or None)
    if isinstance(exc, StageOverloaded):
        metrics.count("willump_errors", route=route, kind="overloaded")
        if exc.stage != "ingress":
            metrics.count("willump_shed_requests", stage=exc.stage)
        wait = str(int(max(1, round(exc.retry_after_s or RETRY_AFTER_S))))
        return 503, JSONResponse(status_code=503, content={"error": str(exc), "fields": [], "request_id": rid},
                                 headers={"Retry-After": wait})
    if isinstance(exc, DeadlineExceeded):
        metrics.count("willump_errors", route=route, kind="deadline")
        metrics.count("willump_deadline_exceeded", stage=exc.stage)
        return 504, JSONResponse(status_code=504, content={"error": str(exc), "fields": [], "request_id": rid})
    raise TypeError(f"error_response: no HTTP answer for {type(exc).__name__}") from exc


#: the Swagger UI files /docs/assets serves, and their media types (nothing else is served)
SWAGGER_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                  "favicon-32x32.png": "image/png"}


def swagger_asset(name: str) -> Any:
    """One of :data:`SWAGGER_ASSETS` from the installed ``swagger-ui-bundle``; a 404 for any
    other name (no path is ever joined from the request)."""
    from fastapi.responses import Response

    media = SWAGGER_ASSETS.get(name)
    if media is None:
        return JSONResponse({"error": f"no docs asset {name!r}"}, status_code=404)
    from pathlib import Path

    import swagger_ui_bundle

    body = (Path(swagger_ui_bundle.swagger_ui_path) / name).read_bytes()
    return Response(body, media_type=media, headers={"Cache-Control": "public, max-age=86400"})


def public_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with the cluster's addresses replaced by stable names: every node's host and
    Ray node id, wherever they appear (as values or as keys, e.g. per-host costs), become
    ``host-0``, ``node-0``, ... What ``GET /plan`` answers on an app without an API key,
    where anyone who reaches the port may ask."""
    nodes = plan.get("nodes") or []
    hosts = dict.fromkeys(n["host"] for n in nodes if isinstance(n.get("host"), str))
    names = {host: f"host-{i}" for i, host in enumerate(hosts)}
    names.update({n["node_id"]: f"node-{i}" for i, n in enumerate(nodes) if isinstance(n.get("node_id"), str)})

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {scrub(k) if isinstance(k, str) else k: scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, str):  # also inside text (a plan's notes name nodes)
            for name, alias in names.items():
                value = value.replace(name, alias)
            return value
        return value

    return scrub(plan)
