"""The ingress's ASGI front (serving.runtime.front): hot routes go straight to the deployment's
method, everything else (and a hot route outside a replica) through FastAPI as before."""

from __future__ import annotations

import asyncio
import json

from fastapi.responses import JSONResponse, Response

import serving.runtime.front as front
from serving.runtime.edge import install_error_handlers


class Owner:
    """Stands in for the replica's deployment instance."""

    def __init__(self):
        self.seen: list[tuple[str, bytes]] = []

    async def predict(self, request):
        body = await request.body()
        self.seen.append((request.headers.get("x-request-id", ""), body))
        return Response(b'{"ok":true}', media_type="application/json", headers={"X-Request-Id": "r1"})

    async def broken(self, request):
        raise RuntimeError("not handled")


def _app() -> front.LeanFastAPI:
    app = front.LeanFastAPI(hot_routes={("POST", "/predict"): "predict", ("POST", "/broken"): "broken"})
    install_error_handlers(app)

    @app.get("/plain")
    async def plain():
        return JSONResponse({"via": "fastapi"})

    @app.post("/predict")
    async def predict_via_fastapi():
        return JSONResponse({"via": "fastapi"})

    return app


def _call(app, method: str, path: str, body: bytes = b"", root: str = "") -> tuple[int, dict, bytes]:
    scope = {"type": "http", "method": method, "path": root + path, "root_path": root, "raw_path": (root + path).encode(),
             "query_string": b"", "headers": [(b"x-request-id", b"abc"), (b"content-type", b"application/json")],
             "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5)}
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body[:3], "more_body": True},
              {"type": "http.request", "body": body[3:], "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_an_owner_given_answers_the_hot_routes():
    owner = Owner()
    app = front.LeanFastAPI(hot_routes={("POST", "/predict"): "predict"}, owner=lambda: owner)
    assert _call(app, "POST", "/predict", b"{}")[0] == 200 and owner.seen == [("abc", b"{}")]


def test_a_hot_route_is_answered_by_the_deployment_method(monkeypatch):
    owner = Owner()
    monkeypatch.setattr(front, "_servable", lambda: owner)
    status, headers, body = _call(_app(), "POST", "/predict", b'{"rows": []}', root="/toxic")
    assert (status, json.loads(body), headers["x-request-id"]) == (200, {"ok": True}, "r1")
    assert owner.seen == [("abc", b'{"rows": []}')]  # the whole body, read from the ASGI stream
    # the route's own time, for clients and benchmarks that split a request's latency (W3C Server-Timing)
    name, dur = headers["server-timing"].split(";")
    assert name == "app" and dur.startswith("dur=") and float(dur[4:]) >= 0.0


def test_other_routes_methods_and_requests_outside_a_replica_go_through_fastapi(monkeypatch):
    owner = Owner()
    monkeypatch.setattr(front, "_servable", lambda: owner)
    app = _app()
    assert json.loads(_call(app, "GET", "/plain")[2]) == {"via": "fastapi"}
    status, _, body = _call(app, "GET", "/predict")  # the hot route is POST only
    assert status == 405 and json.loads(body)["error"].startswith("GET is not allowed")
    status, _, body = _call(app, "GET", "/nothing")
    assert status == 404 and json.loads(body) == {"error": "no route GET /nothing", "fields": []}
    monkeypatch.setattr(front, "_servable", lambda: None)
    assert json.loads(_call(app, "POST", "/predict", b"{}")[2]) == {"via": "fastapi"}
    assert owner.seen == []


def test_a_hot_route_that_raises_answers_500_json(monkeypatch):
    monkeypatch.setattr(front, "_servable", lambda: Owner())
    status, headers, body = _call(_app(), "POST", "/broken", b"{}")
    assert status == 500 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "internal error", "fields": []}


def test_route_path_strips_the_mount():
    assert front.route_path({"path": "/toxic/predict", "root_path": "/toxic"}) == "/predict"
    assert front.route_path({"path": "/toxic", "root_path": "/toxic"}) == "/"
    assert front.route_path({"path": "/predict", "root_path": ""}) == "/predict"
    assert front.route_path({"path": "/other/predict", "root_path": "/toxic"}) == "/other/predict"


def test_the_ingress_app_answers_predict_and_top_k_itself():
    import serving.runtime.ingress as ingress

    assert ingress.app.hot_routes == {("POST", "/predict"): "predict", ("POST", "/top_k"): "top_k"}
    cls = ingress.Ingress.func_or_class
    assert all(callable(getattr(cls, name)) for name in ingress.app.hot_routes.values())



def test_the_owner_is_looked_up_once():
    """Serve's replica context is read on the first hot request only, not on every one."""
    owner, looks = Owner(), []
    app = front.LeanFastAPI(hot_routes={("POST", "/predict"): "predict"}, owner=lambda: looks.append(1) or owner)
    for _ in range(3):
        assert _call(app, "POST", "/predict", b"{}")[0] == 200
    assert len(looks) == 1 and len(owner.seen) == 3
