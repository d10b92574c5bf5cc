"""The ingress's ASGI front: the hot routes answered without FastAPI's per-request machinery.

Profiled under load (``python -m benchmarks.request_profile --py-spy``), FastAPI's middleware
stack, router and endpoint wrapper took about 14% of an ingress replica's CPU for a route that
takes the raw request and answers a ready response: nothing that machinery offers (dependency
injection, body validation, exception middleware) is used by it. :class:`LeanFastAPI` is a
FastAPI app that answers the routes named in ``hot_routes`` itself (a Starlette ``Request`` in,
the route's ``Response`` out) and hands every other request to FastAPI, so OpenAPI, the docs,
and every other route behave as before. The route's method belongs to the replica's deployment
instance, found through Serve's public replica context.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request

log = logging.getLogger("ray.serve")

#: what a hot route answers when it fails outside its own error handling (it should not)
_SERVER_ERROR = json.dumps({"error": "internal error", "fields": []}).encode()


def route_path(scope: dict[str, Any]) -> str:
    """The path the app routes on: the request's path without the mount's ``root_path`` (Serve
    mounts an app at its route prefix)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


def _servable() -> Any:
    """This replica's deployment instance (None outside a Serve replica)."""
    try:
        from ray import serve

        return serve.get_replica_context().servable_object
    except Exception:  # not in a replica (a unit test drives the app directly)
        return None


class LeanFastAPI(FastAPI):
    """A FastAPI app whose ``hot_routes`` ((method, path) -> the name of the deployment's method
    that answers it, taking a ``Request`` and returning a Starlette ``Response``) skip FastAPI.
    ``owner`` finds the object whose methods answer them (default: this Serve replica's
    deployment instance); while it finds none, FastAPI answers every route."""

    def __init__(self, *args: Any, hot_routes: dict[tuple[str, str], str] | None = None,
                 owner: Callable[[], Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hot_routes = dict(hot_routes or {})
        self.owner = owner
        self._found: Any = None  # the owner, once found: a replica's instance does not change

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and self.hot_routes:
            name = self.hot_routes.get((scope["method"], route_path(scope)))
            if name is not None and self._found is None:
                self._found = (self.owner or _servable)()
            if name is not None and self._found is not None:
                await answer(getattr(self._found, name), scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def answer(route: Callable[[Request], Awaitable[Any]], scope: dict[str, Any], receive: Callable,
                 send: Callable) -> None:
    """Run one hot route on the raw ASGI request and send its response; a route that raises
    (its own guard answers every known failure) gets a plain 500, logged."""
    start = time.perf_counter()
    try:
        response = await route(Request(scope, receive))
    except Exception:
        log.exception("%s %s failed outside its route's error handling", scope.get("method"), scope.get("path"))
        await send({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_SERVER_ERROR)).encode())]})
        await send({"type": "http.response.body", "body": _SERVER_ERROR})
        return
    response.headers["server-timing"] = f"app;dur={(time.perf_counter() - start) * 1000.0:.3f}"
    await response(scope, receive, send)
