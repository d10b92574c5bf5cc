"""serving: an optimized willump pipeline on Ray Serve, as a graph of coarse stages.

``deploy(optimized_or_artifact, name=...)`` starts (or joins) Ray, plans replicas and
batches per stage from costs measured on this machine, and serves HTTP at
``/<name>``: ``POST /predict``, ``POST /top_k``, ``GET /report``, ``/plan``,
``/healthz``, ``/metrics``, and ``/explain`` / ``/drift`` when the monitor is deployed.
The planner (:mod:`serving.planning.planner`) and simulation are plain Python. A Ray that deploy
starts runs HAProxy in front of the ingress replicas (:mod:`serving.launch.proxy`).

The names below are imported when first used (PEP 562), so ``serving.partition`` (plain
torch: capture, profile, plan, split) imports on a machine without Ray, such as a GPU box
that only profiles.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS = {
    "HeteroPlan": "serving.planning.hetero",
    "ModelApp": "serving.model_app.deploy",
    "Plan": "serving.planning.planner",
    "Resources": "serving.planning.planner",
    "ServingApp": "serving.launch.deploy",
    "StageProfile": "serving.planning.planner",
    "ThroughputMatrix": "serving.planning.hetero",
    "calibrate_transport": "serving.model_app.transport",
    "deploy": "serving.launch.deploy",
    "deploy_model": "serving.model_app.deploy",
    "plan_again": "serving.planning.planner",
    "plan_agnostic": "serving.planning.hetero",
    "plan_max_rate": "serving.planning.hetero",
    "plan_min_cost": "serving.planning.hetero",
    "plan_stages": "serving.planning.planner",
    "profile_baseline": "serving.measure.stages",
    "profile_stages": "serving.measure.stages",
    "proxy_environment": "serving.launch.proxy",
    "simulate": "serving.planning.simulate",
    "stage_specs": "serving.core.specs",
}

__all__ = sorted([*_EXPORTS, "partition"])


def __getattr__(name: str) -> Any:
    if name == "partition":
        return importlib.import_module("serving.partition")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'serving' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:  # the core install has no Ray: say which extra adds it
        from willump.runtime import explain_missing

        raise explain_missing(exc, f"serving.{name}") from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
