"""Measure what HTTP, hops and Ray's own processes cost on this cluster (serving.costs).

Deploys two probe deployments built like the app (a FastAPI ingress answering HTTP itself,
a stage it calls over the same transport), drives them from this process with closed-loop
HTTP clients, and reads every process's CPU from /proc before and after each phase:

1. idle: Ray's own processes at rest (``background_cores``);
2. ``/echo`` with a small and a large body: the ingress's HTTP handling and the front,
   fixed and per KB;
3. ``/hop`` with 1 and 256 rows: one stage call per request, each side, fixed and per KB;
4. everything else that ran (raylet, GCS, controller, metrics) per request: ``other_ms``,
   and this process's own client CPU per request: ``client_ms``.

The probes are pinned to this node, whose /proc this process can read. About 15 s.

No ``from __future__ import annotations``: FastAPI reads the route annotations.
"""

import asyncio
import os
import pickle
import secrets
import socket
import time
from typing import Any

import numpy as np
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from .costs import HostCosts
from .procstat import group_cpu, process_cpu, session_dir, session_processes

#: seconds of load per phase
PHASE_S = 2.0
#: closed-loop clients per phase
CLIENTS = 8
#: the large body of the per-KB HTTP phase (bytes)
LARGE_BODY = 64 * 1024
#: rows of the large stage call (8 float columns)
LARGE_ROWS = 256
#: seconds to let the processes settle before measuring the idle background
SETTLE_S = 1.0

probe_app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)


def _frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(rows)
    return pd.DataFrame(rng.normal(size=(rows, 8)), columns=[f"x{i}" for i in range(8)])


def _result(rows: int) -> dict[str, Any]:
    return {"proba": np.full((rows, 2), 0.5), "level": np.zeros(rows, dtype=np.int64),
            "unsure": np.zeros(0, dtype=np.int64), "blocks": None, "seconds": 0.0}


@serve.deployment
class ProbeSink:
    async def run(self, rows: pd.DataFrame, blocks: Any = None) -> dict[str, Any]:
        return _result(len(rows))


@serve.deployment
@serve.ingress(probe_app)
class ProbeIngress:
    def __init__(self, sink: Any):
        self.sink = sink
        self.frames = {1: _frame(1), LARGE_ROWS: _frame(LARGE_ROWS)}

    @probe_app.post("/echo")
    async def echo(self, request: Request) -> Response:
        await request.body()
        return Response(b'{"ok":true}', media_type="application/json")

    @probe_app.post("/hop")
    async def hop(self, request: Request) -> Response:
        await request.body()
        rows = int(request.query_params.get("rows", "1"))
        await self.sink.run.remote(self.frames[rows], None)
        return Response(b'{"ok":true}', media_type="application/json")


def _kb_of_call(rows: int) -> float:
    return (len(pickle.dumps(_frame(rows), protocol=5)) + len(pickle.dumps(_result(rows), protocol=5))) / 1024


async def _load(url: str, body: bytes, seconds: float, clients: int) -> int:
    import aiohttp

    done = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"calibration probe answered {r.status}: {await r.text()}")
                done += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    return done


def _phase(url: str, body: bytes, seconds: float, groups: dict[str, Any], ours) -> tuple[int, dict[str, float]]:
    before = process_cpu()
    n = asyncio.run(_load(url, body, seconds, CLIENTS))
    after = process_cpu()
    return n, group_cpu(before, after, groups, rest=ours())


def calibrate(base_url: str, app_name: str, *, front: str, transport: str, cores: dict[str, float],
              host: str, phase_s: float = PHASE_S) -> HostCosts:
    """Run the probes on the Serve instance answering at ``base_url`` (its root URL) and
    return what they measured; the probe app is deleted afterwards."""
    import ray

    node = f"node:{ray.util.get_node_ip_address()}"
    pin = {"num_cpus": 0, "resources": {node: 0.001}}
    sink = ProbeSink.options(name=f"{app_name}-sink", ray_actor_options=pin).bind()
    ingress = ProbeIngress.options(name=f"{app_name}-ingress", ray_actor_options=pin).bind(sink)
    route = f"/{app_name}"
    serve.run(ingress, name=app_name, route_prefix=route, logging_config={"enable_access_log": False,
                                                                          "log_level": "WARNING"})
    url = base_url.rstrip("/") + route
    me = os.getpid()
    session = session_dir(ray.get_runtime_context().gcs_address)
    state = {"ours": set()}

    def ours() -> set[int]:  # this Ray's processes: other users' work on the machine is not ours
        state["ours"] = session_processes(session) if session else set()
        return state["ours"]

    ours()
    groups = {
        "ingress": lambda pid, title: f"ServeReplica:{app_name}:{app_name}-ingress" in title,
        "sink": lambda pid, title: f"ServeReplica:{app_name}:{app_name}-sink" in title,
        "front": lambda pid, title: pid in state["ours"] and ("haproxy" in title or "ProxyActor" in title),
        "client": lambda pid, title: pid == me,
    }
    try:
        asyncio.run(_load(url + "/echo", b"{}", 0.5, CLIENTS))  # warm-up
        time.sleep(SETTLE_S)
        before = process_cpu()
        t0 = time.perf_counter()
        time.sleep(phase_s / 2)
        idle = group_cpu(before, process_cpu(), groups, rest=ours())
        background = idle["rest"] / (time.perf_counter() - t0)
        small = b'{"rows": []}'
        large = b'{"pad": "' + b"x" * LARGE_BODY + b'"}'
        phases = {}
        for key, path, body in (("echo_small", "/echo", small), ("echo_large", "/echo", large),
                                ("hop_small", "/hop?rows=1", small),
                                ("hop_large", f"/hop?rows={LARGE_ROWS}", small)):
            t0 = time.perf_counter()
            n, cpu = _phase(url + path, body, phase_s, groups, ours)
            elapsed = time.perf_counter() - t0
            cpu["rest"] = max(0.0, cpu["rest"] - background * elapsed)
            phases[key] = {k: 1000.0 * v / max(n, 1) for k, v in cpu.items()}
    finally:
        serve.delete(app_name)
    e_s, e_l, h_s, h_l = (phases[k] for k in ("echo_small", "echo_large", "hop_small", "hop_large"))
    kb_large = (len(large) - len(small)) / 1024
    kb_small_call, kb_large_call = _kb_of_call(1), _kb_of_call(LARGE_ROWS)
    d_kb = kb_large_call - kb_small_call
    caller = max(0.0, h_s["ingress"] - e_s["ingress"])
    caller_l = max(0.0, h_l["ingress"] - e_s["ingress"])
    return HostCosts(
        http_ms=e_s["ingress"],
        http_ms_per_kb=max(0.0, (e_l["ingress"] - e_s["ingress"]) / kb_large),
        front_ms=e_s["front"],
        front_ms_per_kb=max(0.0, (e_l["front"] - e_s["front"]) / kb_large),
        hop_caller_ms=caller,
        hop_caller_ms_per_kb=max(0.0, (caller_l - caller) / d_kb),
        hop_callee_ms=h_s["sink"],
        hop_callee_ms_per_kb=max(0.0, (h_l["sink"] - h_s["sink"]) / d_kb),
        other_ms=float(np.median([p["rest"] for p in phases.values()])),
        background_cores={host: background},
        cores=dict(cores),
        client_ms=float(np.median([p["client"] for p in phases.values()])),
        front=front, transport=transport, measured=True,
        measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        notes=[],
    )


def probe_name() -> str:
    return f"willump-calibrate-{secrets.token_hex(3)}"


def fingerprint(cores: dict[str, float], front: str, transport: str) -> str:
    import ray

    machines = ",".join(f"{h}={c:g}" for h, c in sorted(cores.items()))
    return f"ray{ray.__version__}|{socket.gethostname()}|{machines}|{front}|{transport}"
