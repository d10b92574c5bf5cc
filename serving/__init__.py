"""serving: an optimized willump pipeline on Ray Serve, as a graph of coarse stages.

``deploy(optimized_or_artifact, name=...)`` starts (or joins) Ray, plans replicas and
batches per stage from costs measured on this machine, and serves HTTP at
``/<name>``: ``POST /predict``, ``POST /top_k``, ``GET /report``, ``/plan``,
``/healthz``, ``/metrics``, and ``/explain`` / ``/drift`` when the monitor is deployed.
The planner (:mod:`serving.planner`) and simulation are plain Python. A Ray that deploy
starts runs HAProxy in front of the ingress replicas (:mod:`serving.proxy`).
"""

from .deploy import ServingApp, deploy
from .planner import Plan, Resources, StageProfile, plan_stages
from .proxy import proxy_environment
from .simulate import simulate
from .stages import profile_baseline, profile_stages, stage_specs

__all__ = [
    "Plan",
    "Resources",
    "ServingApp",
    "StageProfile",
    "deploy",
    "plan_stages",
    "profile_baseline",
    "profile_stages",
    "proxy_environment",
    "simulate",
    "stage_specs",
]
