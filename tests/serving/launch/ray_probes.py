"""Probes of a served app's listeners, sent through loopback only: does any of Ray's or
HAProxy's listeners do anything for a caller without Ray's token? (tests/serving/launch/test_cli.py)"""

from __future__ import annotations

import http.client
import socket

#: methods of each gRPC service a Ray process may run (GCS, raylet node and object managers,
#: core worker, dashboard agent, Serve replica): a listener that serves one answers it
#: UNAUTHENTICATED without the token, and UNIMPLEMENTED when it serves another service
GRPC_METHODS = (
    "/ray.rpc.JobInfoGcsService/GetAllJobInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.rpc.ReporterService/ReportOCMetrics",
    "/ray.serve.ASGIService/HandleRequest",
)
#: the content type of a Prometheus exporter: read-only figures, no token by design
PROMETHEUS = "text/plain; version=0.0.4"


def outside_address() -> str | None:
    """This machine's address toward other machines, or None when it has only loopback
    (a UDP connect picks the route and sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def http_probe(port: int) -> tuple[int, str] | None:
    """(status, content type) of ``GET /api/jobs/`` (Ray's job API) on 127.0.0.1:port, or None
    when the listener does not speak HTTP/1."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/api/jobs/")
        response = conn.getresponse()
        response.read(1024)
        return response.status, response.getheader("content-type") or ""
    except (http.client.HTTPException, OSError):
        return None
    finally:
        conn.close()


def grpc_probe(port: int) -> dict[str, str]:
    """Each known method's status code name on 127.0.0.1:port, sent without a token, for the
    methods the listener serves (UNIMPLEMENTED ones left out)."""
    import grpc

    answers = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for method in GRPC_METHODS:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=5)
                answers[method] = "OK"
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    answers[method] = e.code().name
    return answers


def open_without_token(port: int, app_ports: set[int]) -> str | None:
    """Why the listener on ``port`` does something for a caller without Ray's token, or None.
    HTTP: the job API must refuse (401/403); a 200 is allowed only from a Prometheus exporter,
    and the app's own HTTP ports (``app_ports``, with their own key) are not Ray's. gRPC: every
    method the listener serves must answer UNAUTHENTICATED, and it must serve one of them."""
    if port in app_ports:
        return None
    answer = http_probe(port)
    if answer is not None:
        status, kind = answer
        if status == 200 and not kind.startswith(PROMETHEUS):
            return f"HTTP GET /api/jobs/ answered 200 ({kind}) without a token"
        return None
    answers = grpc_probe(port)
    if not answers:
        return "a listener that is neither HTTP nor one of Ray's gRPC services (unknown, not probed)"
    opened = {m: code for m, code in answers.items() if code != "UNAUTHENTICATED"}
    return f"gRPC answered without a token: {opened}" if opened else None
