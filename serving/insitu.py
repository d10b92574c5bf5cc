"""Correct a plan's CPU model from a few seconds of the running app (in-situ calibration).

A plan charges each group of processes (the ingress, each stage, the HTTP front, Ray's own
processes, a co-located load generator) the CPU per request that its profiles say: stage
models timed in-process, HTTP and hop costs timed on probe deployments
(:mod:`serving.calibrate`). A running app can spend more than the parts did apart: a fused
ingress runs its first stage in threads that share one GIL with its event loop, and Ray's own
processes do more per request around a real app than around an echo probe. Those are
properties of the deployed app, so they are measured on it: read every process's CPU from
/proc while a fraction of the planned load runs for a few seconds, simulate the plan at that
same load, and take measured over modelled CPU per group as a factor that the simulation then
applies to that group's work (``simulate(cpu_scale=...)``). CPU time, not wall time, is
compared, so other users' load on the machine does not leak into the factors.

InferLine profiles each model in the container that serves it for the same reason.
"""

from __future__ import annotations

import math
from typing import Any

#: share of the planned closed-loop clients the probe runs (a light load: batches merge less
#: than at the bound, so the factors err on the side of more CPU per request)
PROBE_CLIENT_SHARE = 0.25
#: seconds of probe traffic
PROBE_S = 4.0
#: groups the model charges less than this (ms per request) keep factor 1: a ratio of two
#: near-zero figures says nothing
MIN_MODELLED_MS = 0.05
#: measured roles (serving.bench.cpu_per_request) that the simulation names differently
ROLE_TO_GROUP = {"load generator": "client"}
#: groups whose CPU does not scale with requests, so that a ratio per request measured at the
#: probe's rate would be wrong at another: Ray's own processes (calibration splits them into
#: cores while serving plus CPU per request, serving.calibrate.split_rest)
NOT_PER_REQUEST = frozenset({"other"})


def probe_clients(clients: int, share: float = PROBE_CLIENT_SHARE) -> int:
    """Closed-loop clients of the probe for a phase of ``clients``."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    return max(1, round(clients * share))


def cpu_factors(measured: dict[str, float], modelled: dict[str, float],
                min_modelled_ms: float = MIN_MODELLED_MS) -> dict[str, float]:
    """Measured over modelled CPU ms per request, per simulated group.

    ``measured``: roles as :func:`serving.bench.cpu_per_request` names them ("ingress", a
    stage, "front", "other", "load generator"; "total" is ignored). ``modelled``: the
    simulation's ``cpu_ms`` at the same load. Groups the model barely charges, groups the probe
    did not see, GPU groups and ``NOT_PER_REQUEST`` keep their modelled cost (no factor)."""
    factors: dict[str, float] = {}
    for role, ms in measured.items():
        group = ROLE_TO_GROUP.get(role, role)
        model = modelled.get(group)
        if role == "total" or model is None or group.endswith("(GPU)") or group in NOT_PER_REQUEST:
            continue
        if model < min_modelled_ms or not math.isfinite(ms) or ms <= 0:
            continue
        factors[group] = ms / model
    return factors


def summary(factors: dict[str, Any]) -> str:
    return ", ".join(f"{k} x{v:.2f}" for k, v in sorted(factors.items())) or "none"
