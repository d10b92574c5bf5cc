"""The HTTP edge both ingresses share (serving.runtime.edge), on stand-in requests (no Ray):
a Host the app does not serve (DNS rebinding), a browser's cross-site call and the body types
browsers send cross-site without a preflight are refused; API clients that send JSON, or no
Content-Type at all, pass. Over HTTP: tests/serving/launch/test_api.py."""

from __future__ import annotations

import types

import pytest

from serving.core.constants import LOOPBACK_HOSTS
from serving.core.schema import RequestError
from serving.runtime.edge import HttpEdge


def _request(**headers):
    return types.SimpleNamespace(headers={k.replace("_", "-"): v for k, v in headers.items()})


def _edge(allowed):
    edge = HttpEdge()
    edge.allowed_hosts = allowed
    return edge


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "127.0.0.1"])
def test_loopback_names_are_served(host):
    _edge(list(LOOPBACK_HOSTS)).check_origin(_request(host=host, content_type="application/json"), body=True)


@pytest.mark.parametrize(("headers", "status", "field"), [
    ({"host": "evil.example:8000"}, 421, "header:Host"),
    ({"host": "127.0.0.1.evil.example"}, 421, "header:Host"),
    ({"host": "127.0.0.1:8000", "origin": "http://evil.example"}, 403, "header:Origin"),
    ({"host": "127.0.0.1:8000", "origin": "null"}, 403, "header:Origin"),
    ({"host": "127.0.0.1:8000", "content_type": "text/plain"}, 415, "header:Content-Type"),
    ({"host": "127.0.0.1:8000", "content_type": "application/x-www-form-urlencoded"}, 415, "header:Content-Type"),
    ({"host": "127.0.0.1:8000", "content_type": "multipart/form-data; boundary=x"}, 415, "header:Content-Type"),
])
def test_cross_site_and_rebinding_requests_are_refused(headers, status, field):
    with pytest.raises(RequestError) as caught:
        _edge(list(LOOPBACK_HOSTS)).check_origin(_request(**headers), body=True)
    assert caught.value.status == status and caught.value.fields[0]["field"] == field


def test_api_clients_pass_and_an_unbound_app_takes_any_host():
    loopback = _edge(list(LOOPBACK_HOSTS))
    loopback.check_origin(_request(host="127.0.0.1:8000"), body=True)  # no Content-Type: python requests' data=
    loopback.check_origin(_request(host="localhost:8000", origin="http://localhost:8000",
                                   content_type="application/json; charset=utf-8"), body=True)
    loopback.check_origin(_request(host="localhost", content_type="text/plain"), body=False)  # a GET
    _edge(None).check_origin(_request(host="models.example.com", content_type="application/json"), body=True)
    with pytest.raises(RequestError):  # bound beyond loopback: the body type rule still holds
        _edge(None).check_origin(_request(host="models.example.com", content_type="text/plain"), body=True)


def test_build_warns_or_refuses_beyond_loopback_without_a_key(capsys):
    from serving.cli import _check_exposure

    _check_exposure("127.0.0.1", None, require_key=True)  # loopback: fine
    _check_exposure("0.0.0.0", "WILLUMP_API_KEY", require_key=True)  # a key: fine
    _check_exposure("0.0.0.0", None, require_key=False)
    assert "WARNING" in capsys.readouterr().err
    with pytest.raises(ValueError, match="require-key"):
        _check_exposure("0.0.0.0", None, require_key=True)


def test_the_docs_page_loads_nothing_from_another_origin():
    """Swagger UI's files come from the app (/docs/assets), not a CDN; any other asset name,
    a path among them, is a 404 (no request text is ever joined into a path)."""
    import re

    from fastapi.openapi.docs import get_swagger_ui_html

    from serving.runtime.http_support import SWAGGER_ASSETS, swagger_asset

    for name, media in SWAGGER_ASSETS.items():
        response = swagger_asset(name)
        assert response.status_code == 200 and response.media_type == media and len(response.body) > 100
    for bad in ("../../etc/passwd", "index.html", "swagger-ui-bundle.js.map", ""):
        assert swagger_asset(bad).status_code == 404
    page = get_swagger_ui_html(openapi_url="/a/openapi.json", title="t", swagger_js_url="/a/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url="/a/docs/assets/swagger-ui.css",
                               swagger_favicon_url="/a/docs/assets/favicon-32x32.png").body.decode()
    assert re.findall(r"https?://", page) == []


def test_a_public_plan_names_no_address_of_the_cluster():
    from serving.runtime.http_support import public_plan

    plan = {"nodes": [{"node_id": "abc123", "host": "10.1.2.3", "cpus": 2.0},
                      {"node_id": "def456", "host": "10.1.2.3", "cpus": 2.0}],
            "costs": {"cores": {"10.1.2.3": 2.0}}, "notes": ["node 10.1.2.3 (abc123) holds the ingress"],
            "stages": [{"name": "cheap", "replicas": 2}]}
    public = public_plan(plan)
    text = str(public)
    assert "10.1.2.3" not in text and "abc123" not in text and "def456" not in text
    assert public["costs"]["cores"] == {"host-0": 2.0} and public["nodes"][1]["node_id"] == "node-1"
    assert public["notes"] == ["node host-0 (node-0) holds the ingress"]
    assert public["stages"] == plan["stages"] and plan["nodes"][0]["host"] == "10.1.2.3"  # a copy


def _call(app, method: str, path: str, query: str = "") -> tuple[int, dict, dict]:
    """One request through the ASGI app itself (no server, no httpx): status, headers, JSON."""
    import asyncio
    import json

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "root_path": "", "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body)


def test_fastapis_own_errors_answer_in_the_projects_shape():
    """404, 405 and a query parameter of the wrong type answer {"error", "fields"} (as every
    route's own errors do), not FastAPI's {"detail"}."""
    from fastapi import FastAPI

    from serving.runtime.edge import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/explain")
    def explain(top: int = 5) -> dict:
        return {"top": top}

    status, _, body = _call(app, "GET", "/nowhere")
    assert status == 404 and body == {"error": "no route GET /nowhere", "fields": []}
    status, headers, body = _call(app, "POST", "/explain")
    assert status == 405 and headers["allow"] == "GET"
    assert body == {"error": "POST is not allowed on /explain (allowed: GET)", "fields": []}
    status, _, body = _call(app, "GET", "/explain", "top=many")
    assert status == 422 and body["fields"][0]["field"] == "query:top" and "error" in body
    assert _call(app, "GET", "/explain", "top=3")[2] == {"top": 3}


def test_the_monitor_routes_list_their_query_parameters_with_bounds_and_defaults():
    """OpenAPI names every parameter GET /explain and /drift accept (from the monitor queries'
    own signatures, as the monitor replica accepts them), with defaults and the HTTP bounds."""
    from serving.runtime.http_support import MONITOR_ROUTES, monitor_query_parameters
    from serving.runtime.replicas import HTTP_QUERY_BOUNDS

    for route, (default, kinds) in MONITOR_ROUTES.items():
        params = {p["name"]: p for p in monitor_query_parameters(route)}
        assert params["kind"]["schema"] == {"type": "string", "enum": list(kinds), "default": default}
        assert all(p["in"] == "query" and not p["required"] for p in params.values())
        for name, (low, high) in HTTP_QUERY_BOUNDS.items():
            if name in params:
                assert (params[name]["schema"]["minimum"], params[name]["schema"]["maximum"]) == (low, high)
    explain = {p["name"]: p for p in monitor_query_parameters("explain")}
    assert explain["min_support"]["schema"] == {"type": "number", "default": 0.01, "minimum": 0.001, "maximum": 1.0}
    assert explain["attributes"]["schema"]["type"] == "string" and "comma-separated" in explain["attributes"]["description"]
    assert "kind=anomalies, mix" in explain["min_ratio"]["description"]
    assert "classifier" not in explain and "as_of" not in explain
