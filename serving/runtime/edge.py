"""The HTTP edge every ingress shares: the API key check and a body read under a size limit.

The pipeline app's :class:`serving.runtime.ingress.Ingress` and the torch-model app's
ingress (:mod:`serving.model_app.stages`) both inherit it, so a key or a size limit means the
same on either: a key is compared by its hash in constant time; a body is read in chunks,
refused (413) as soon as it passes the limit, before it is all in memory, and refused (408)
when it has not all arrived in time. The pipeline app reads it before it takes one of its
admission slots, so clients that trickle bodies cannot starve the others.
"""

from __future__ import annotations

import asyncio
from typing import Any

from serving.core.schema import RequestError
from serving.runtime.keys import KeyCheck

#: seconds a request's whole body may take to arrive
BODY_TIMEOUT_S = 10.0
#: the body types a browser sends cross-site without asking first (no CORS preflight): a POST
#: carrying one is refused, so a web page cannot make a visitor's browser call the app
SIMPLE_BODY_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
#: what a request without the right key is told
KEY_MESSAGE = "missing or wrong API key (send it as 'Authorization: Bearer KEY' or 'X-API-Key')"


def unbuffer_request_logs(logger_name: str = "ray.serve") -> int:
    """Write this replica's log records as they happen. Serve's throughput-optimized mode (which
    the project's Ray runs in) buffers a replica's records 1,000 at a time, flushed only when the
    buffer fills or an error is logged: an app that asked for access or JSON logs would see a
    request's line minutes later, or never. Returns how many buffers were set to one record."""
    import logging.handlers

    handlers = [h for h in logging.getLogger(logger_name).handlers if isinstance(h, logging.handlers.MemoryHandler)]
    for handler in handlers:
        handler.flush()
        handler.capacity = 1
    return len(handlers)


class HttpEdge:
    """Mixed into an ingress deployment that sets ``max_body`` (bytes), ``api_key`` (a
    :class:`serving.runtime.keys.KeyCheck`) and ``allowed_hosts`` (None: any Host)."""

    max_body: int
    api_key: KeyCheck
    allowed_hosts: list[str] | None = None

    def check_origin(self, request: Any, *, body: bool) -> None:
        """Refuse a Host the app does not serve (421: DNS rebinding), a browser's cross-site
        call (403: an ``Origin`` naming another host) and, on routes that take a body, the body
        types browsers send cross-site without a preflight (415)."""
        if self.allowed_hosts is not None:
            host = _hostname(request.headers.get("host", ""))
            if host not in self.allowed_hosts:
                raise RequestError(421, f"this app does not answer to Host {host!r} (allowed: "
                                        f"{', '.join(self.allowed_hosts)})", [{"field": "header:Host",
                                                                              "error": "not allowed"}])
            origin = request.headers.get("origin")
            if origin is not None and _hostname(origin.split("://", 1)[-1]) not in self.allowed_hosts:
                raise RequestError(403, f"cross-site request from {origin!r} refused",
                                   [{"field": "header:Origin", "error": "not allowed"}])
        if body:
            kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind in SIMPLE_BODY_TYPES:
                raise RequestError(415, f"send the body as application/json, not {kind}",
                                   [{"field": "header:Content-Type", "error": "unsupported"}])

    def authorized(self, request: Any) -> bool:
        """Whether the request carries the key (``X-API-Key`` or ``Authorization: Bearer``)."""
        if not self.api_key.required:
            return True
        given = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return self.api_key.accepts(given)

    def check_key(self, request: Any) -> None:
        if not self.authorized(request):
            raise RequestError(401, KEY_MESSAGE)

    async def read_body(self, request: Any, timeout_s: float | None = None) -> bytes:
        """The body, refused with 413 once it passes ``max_body`` (a declared length over it is
        refused before a byte is read) and with 408 when it has not all arrived within
        ``timeout_s`` (default :data:`BODY_TIMEOUT_S`): a slow client cannot hold the app."""
        timeout_s = BODY_TIMEOUT_S if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(self._read_body(request), timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {timeout_s:g} s") from None

    async def _read_body(self, request: Any) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise RequestError(413, f"request body of {length} bytes exceeds the {self.max_body}-byte limit")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise RequestError(413, f"request body exceeds the {self.max_body}-byte limit")
        return bytes(body)


def _hostname(value: str) -> str:
    """``host[:port]`` (or ``[v6]:port``) -> the host, lower case, without brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.index("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def install_error_handlers(app: Any) -> None:
    """Answer the errors FastAPI raises itself (an unknown route 404, a wrong method 405, a
    query parameter that fails its type 422) in the project's shape, ``{"error", "fields"}``,
    as every route's own errors are, instead of FastAPI's ``{"detail"}``."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    async def http_error(request: Any, exc: HTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            allowed = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), "")
            message = f"{request.method} is not allowed on {request.url.path}" + (f" (allowed: {allowed})"
                                                                                  if allowed else "")
        return JSONResponse(status_code=exc.status_code, content={"error": message, "fields": []},
                            headers=exc.headers)

    async def invalid(request: Any, exc: RequestValidationError) -> JSONResponse:
        fields = [{"field": ":".join(str(p) for p in e.get("loc", ())), "error": str(e.get("msg", "invalid"))}
                  for e in exc.errors()]
        return JSONResponse(status_code=422, content={"error": "invalid request", "fields": fields})

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
