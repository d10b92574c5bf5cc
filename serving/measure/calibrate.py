"""Measure what HTTP, hops and Ray's own processes cost on this cluster (serving.core.costs).

Deploys the app's own code around a stand-in model: the real :class:`serving.runtime.ingress.Ingress`
(routing, request ids, metrics, batching, answers) in front of a real
:class:`serving.runtime.replicas.ModelStage` whose runner echoes probabilities without computing
anything; drives it from this process with closed-loop HTTP clients; and reads every
process's CPU from /proc before and after each phase:

1. idle: this Ray's processes at rest (``background_cores``);
2. ``GET /healthz``: the ingress's HTTP handling and the front per request;
3. ``POST /predict`` with 1 row from one client (one request per stage call), with 1 row,
   32 and 256 rows (8 numeric columns) from several clients (the ingress merges waiting
   requests into calls; the stand-in counts the calls): the caller's and the callee's side
   of a hop per call, per request it carries and per KB, once the route's own parsing and
   answer (timed here, in-process) are taken out;
4. the same 1-row requests to a fused ingress running the stand-in in-process: the batching
   around a fused first stage, per request (both stand-ins run inline, on the event loop, as
   CPU-bound stages do: ``serving.core.profiles.StageProfile.runs_inline``);
5. the rest of this Ray's processes (raylet, GCS, controller, metrics agents), fitted over
   the phases' different rates as cores while serving (``serving_cores``) plus CPU per
   request (``other_ms``), and this process's own client CPU per request, ``client_ms``.

The probes are pinned to this node, whose /proc this process reads. About 17 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import secrets
import socket
import time
from typing import Any

import numpy as np
import pandas as pd

from serving.core.costs import HostCosts
from serving.core.procstat import group_cpu, process_cpu, session_dir, session_processes
from serving.core.schema import ColumnSpec, PredictRequest, RowSchema, parse_request, predict_answer
from serving.core.serve_apps import delete_app, run_app
from serving.core.specs import IngressConfig
from serving.planning.planner import MIN_IN_FLIGHT

#: seconds of load per phase
PHASE_S = 2.0
#: closed-loop clients per phase
CLIENTS = 8
#: rows of the large request (8 float columns)
LARGE_ROWS = 256
#: rows of a mid-sized request (a fourth equation for the three hop costs: with exactly three,
#: a noisy phase goes straight into the per-KB figure)
MEDIUM_ROWS = 32
#: seconds to let the processes settle before measuring the idle background
SETTLE_S = 1.0
COLUMNS = [f"x{i}" for i in range(8)]
#: what the cached figures mean; a change here measures again instead of reading old figures
COSTS_VERSION = "costs4"


class EchoRunner:
    """Stands in for a stage's models: answers every row at level 0, computes nothing, and
    counts the calls it got (the ingress merges requests into calls)."""

    def __init__(self):
        self.calls = 0

    def run(self, rows: pd.DataFrame, blocks: Any = None) -> dict[str, Any]:
        n = len(rows)
        return {"proba": np.full((n, 2), 0.5), "level": np.zeros(n, dtype=np.int64),
                "unsure": np.zeros(0, dtype=np.int64), "blocks": None, "seconds": 0.0}

    def run_many(self, items: list) -> list[dict[str, Any]]:
        self.calls += len(items)
        return [self.run(rows, blocks) for rows, blocks in items]


def _schema() -> Any:
    return RowSchema([ColumnSpec(c, "number", False, "float64") for c in COLUMNS])


def _body(rows: int) -> bytes:
    rng = np.random.default_rng(rows)
    frame = pd.DataFrame(rng.normal(size=(rows, len(COLUMNS))), columns=COLUMNS)
    return json.dumps({"rows": frame.to_dict("records")}).encode()


def _route_ms(rows: int, repeats: int = 30) -> float:
    """The /predict route's own work for ``rows`` probe rows (parse, answer), in-process."""

    body, schema = _body(rows), _schema()
    proba, level = np.full((rows, 2), 0.5), np.zeros(rows, dtype=np.int64)
    classes, degraded = np.asarray([0, 1], dtype=object), np.zeros(rows, dtype=bool)

    def once() -> None:
        parse_request(body, PredictRequest, schema, 10_000)
        predict_answer(classes, proba, level, degraded, "v")

    once()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        once()
        times.append(time.process_time() - t0)
    return 1000.0 * float(np.median(times))


def _call_kb(rows: int) -> float:
    """KB a stage call moves for ``rows`` probe rows: the frame the ingress sends and the answer."""
    frame = _schema().to_frame(json.loads(_body(rows))["rows"])
    return (len(pickle.dumps(frame, protocol=5)) + len(pickle.dumps(EchoRunner().run(frame), protocol=5))) / 1024


def _config(name: str, layout: str = "staged") -> IngressConfig:
    return IngressConfig(name=name, model_version="calibration", classes=[0, 1], levels=[["x"]], stages=["model"],
                         row_schema=_schema().to_dict(), layout=layout, deadline_s=30.0,
                         max_in_flight=MIN_IN_FLIGHT * 8)


async def _load(url: str, body: bytes | None, seconds: float, clients: int) -> int:
    import aiohttp

    done = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                call = session.get(url) if body is None else session.post(
                    url, data=body, headers={"Content-Type": "application/json"})
                async with call as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"calibration probe answered {r.status}: {await r.text()}")
                done += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    return done


async def _model_calls(app_name: str) -> int:
    """Calls the echo model has served so far. Asked from inside the running event loop (with
    ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` a handle's router runs in the loop that first uses it)
    through a handle of its own, shut down before the loop ends: a handle from Serve's cache
    would outlive the loop, and ``serve.shutdown()`` would fail on it later."""
    from ray.serve.handle import DeploymentHandle

    handle = DeploymentHandle(f"{app_name}-model", app_name)
    try:
        return (await handle.info.remote())["calls"]
    finally:
        await handle.shutdown_async()


def calibrate(base_url: str, app_name: str, *, front: str, transport: str, cores: dict[str, float],
              host: str, phase_s: float = PHASE_S) -> HostCosts:
    """Run the probes on the Serve instance answering at ``base_url`` (its root URL) and
    return what they measured; the probe app is deleted afterwards."""
    import ray

    from serving.runtime.ingress import Ingress
    from serving.runtime.replicas import ModelStage

    pin = {"num_cpus": 0, "resources": {f"node:{ray.util.get_node_ip_address()}": 0.001}}
    stage = ModelStage.options(name=f"{app_name}-model", ray_actor_options=pin, max_ongoing_requests=64).bind(
        None, None, max_batch_size=LARGE_ROWS, batch_wait_timeout_s=0.0, runner=EchoRunner(), inline=True)
    ingress = Ingress.options(name=f"{app_name}-ingress", ray_actor_options=pin, max_ongoing_requests=1024).bind(
        stage, None, _config(app_name))
    fused_name = f"{app_name}-fused"
    fused = Ingress.options(name=f"{fused_name}-ingress", ray_actor_options=pin, max_ongoing_requests=1024).bind(
        None, None, _config(fused_name, "fused"), {"runner": EchoRunner(), "inline": True})
    logging = {"enable_access_log": False, "log_level": "WARNING"}
    route = f"/{app_name}"
    run_app(ingress, app_name, route, logging)
    run_app(fused, fused_name, f"/{fused_name}", logging)
    url = base_url.rstrip("/") + route
    me = os.getpid()
    session = session_dir(ray.get_runtime_context().gcs_address)
    state: dict[str, set[int]] = {"ours": set()}

    def ours() -> set[int]:  # this Ray's processes: other users' work on the machine is not ours
        state["ours"] = session_processes(session) if session else set()
        return state["ours"]

    ours()
    groups = {
        "ingress": lambda pid, title: f"ServeReplica:{app_name}:{app_name}-ingress" in title,
        "fused": lambda pid, title: f"ServeReplica:{fused_name}:{fused_name}-ingress" in title,
        "stage": lambda pid, title: f"ServeReplica:{app_name}:{app_name}-model" in title,
        "front": lambda pid, title: pid in state["ours"] and ("haproxy" in title or "ProxyActor" in title),
        "client": lambda pid, title: pid == me,
    }
    small, medium, large = _body(1), _body(MEDIUM_ROWS), _body(LARGE_ROWS)
    loop = asyncio.new_event_loop()  # one loop for every load phase and model call
    try:
        loop.run_until_complete(_load(url + "/predict", small, 0.5, CLIENTS))  # warm-up
        time.sleep(SETTLE_S)
        before, t0 = process_cpu(), time.perf_counter()
        time.sleep(phase_s / 2)
        background = group_cpu(before, process_cpu(), groups, rest=ours())["rest"] / (time.perf_counter() - t0)
        phases = {}
        rest_load: list[tuple[float, float]] = []  # (requests/s, cores of the rest) per phase
        for key, path, body, clients in (("health", "/healthz", None, CLIENTS), ("one", "/predict", small, 1),
                                         ("small", "/predict", small, CLIENTS),
                                         ("medium", "/predict", medium, CLIENTS),
                                         ("large", "/predict", large, CLIENTS),
                                         ("fused", "-fused/predict", small, CLIENTS)):
            calls0 = loop.run_until_complete(_model_calls(app_name))
            before, t0 = process_cpu(), time.perf_counter()
            n = loop.run_until_complete(_load(url + path, body, phase_s, clients))
            cpu = group_cpu(before, process_cpu(), groups, rest=ours())
            seconds = time.perf_counter() - t0
            cpu["rest"] = max(0.0, cpu["rest"] - background * seconds)
            rest_load.append((n / seconds, cpu["rest"] / seconds))
            phases[key] = {k: 1000.0 * v / max(n, 1) for k, v in cpu.items()}
            phases[key]["per_call"] = max(n, 1) / max(loop.run_until_complete(_model_calls(app_name)) - calls0, 1)
    finally:
        loop.close()
        delete_app(app_name)
        delete_app(fused_name)
    h = phases["health"]
    kb = {"one": _call_kb(1), "small": _call_kb(1), "medium": _call_kb(MEDIUM_ROWS), "large": _call_kb(LARGE_ROWS)}
    rows = {"one": 1, "small": 1, "medium": MEDIUM_ROWS, "large": LARGE_ROWS}
    keys = ("one", "small", "medium", "large")
    # per request: fixed + per_call / (requests per call) + per_kb * (KB per request)
    design = np.array([[1.0, 1.0 / phases[k]["per_call"], kb[k]] for k in keys])
    caller = _solve(design, [phases[k]["ingress"] - h["ingress"] - _route_ms(rows[k]) for k in keys])
    callee = _solve(design, [phases[k]["stage"] for k in keys])
    body_kb = (len(large) - len(small)) / 1024
    serving_cores, other_ms = split_rest(rest_load)
    return HostCosts(
        http_ms=h["ingress"],
        # the body's HTTP handling and the call's bytes grow together here: both go to the hop
        http_ms_per_kb=0.0,
        front_ms=h["front"],
        front_ms_per_kb=max(0.0, (phases["large"]["front"] - phases["small"]["front"]) / body_kb),
        hop_caller_request_ms=caller[0], hop_caller_ms=caller[1], hop_caller_ms_per_kb=caller[2],
        hop_callee_request_ms=callee[0], hop_callee_ms=callee[1], hop_callee_ms_per_kb=callee[2],
        local_request_ms=max(0.0, phases["fused"]["fused"] - h["ingress"] - _route_ms(1)),
        other_ms=other_ms,
        background_cores={host: background},
        serving_cores={host: serving_cores},
        cores=dict(cores),
        client_ms=float(np.median([p["client"] for p in phases.values()])),
        front=front, transport=transport, measured=True,
        measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        notes=[f"calibration: requests per stage call {phases['small']['per_call']:.2f} (1-row, "
               f"{CLIENTS} clients), {phases['large']['per_call']:.2f} (256 rows)"],
    )


def split_rest(load: list[tuple[float, float]]) -> tuple[float, float]:
    """Ray's own processes' CPU while serving, as fixed cores plus CPU ms per request, fitted
    (non-negative least squares) over phases that ran at different rates: ``load`` holds
    (requests/s, cores above idle) per phase. Much of it does not grow with the rate (metrics
    pushes, the controller's loops), so charging it all per request undercounts it at the low
    rates of heavy requests. When the rates hardly differ, all of it is counted per request."""
    from scipy.optimize import nnls

    rates = np.array([r for r, _ in load], dtype=float)
    cores = np.array([c for _, c in load], dtype=float)
    if len(load) == 0 or rates.max() <= 0:
        return 0.0, 0.0
    if len(load) < 2 or np.ptp(rates) < 0.25 * rates.max():
        return 0.0, 1000.0 * float(np.median(cores / np.maximum(rates, 1e-9)))
    (fixed, per_request), _ = nnls(np.column_stack([np.ones_like(rates), rates]), cores)
    return float(fixed), 1000.0 * float(per_request)


def _solve(design: np.ndarray, observed: list[float]) -> list[float]:
    """Non-negative (per request, per call, per KB) costs fitting the phases; when the phases
    cannot tell per-call from per-request costs apart (no merging happened), all of the fixed
    cost is counted per request (never undercounted when requests are merged)."""
    from scipy.optimize import nnls

    y = np.asarray(observed, dtype=float)
    if np.ptp(design[:, 1]) < 0.15:  # requests per call hardly varied
        solution, _ = nnls(design[:, [0, 2]], y)
        return [float(solution[0]), 0.0, float(solution[1])]
    solution, _ = nnls(design, y)
    return [float(v) for v in solution]


def probe_name() -> str:
    return f"willump-calibrate-{secrets.token_hex(3)}"


def fingerprint(cores: dict[str, float], front: str, transport: str) -> str:
    import ray

    machines = ",".join(f"{h}={c:g}" for h, c in sorted(cores.items()))
    return f"{COSTS_VERSION}|ray{ray.__version__}|{socket.gethostname()}|{machines}|{front}|{transport}"
