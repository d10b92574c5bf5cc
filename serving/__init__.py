"""serving: an optimized willump pipeline on Ray Serve, as a graph of coarse stages.

``deploy(optimized_or_artifact, name=...)`` starts (or joins) Ray, plans replicas and
batches per stage from costs measured on this machine, and serves HTTP at
``/<name>``: ``POST /predict``, ``POST /top_k``, ``GET /report``, ``/plan``,
``/healthz``, ``/metrics``, and ``/explain`` / ``/drift`` when the monitor is deployed.
The planner (:mod:`serving.planner`) and simulation are plain Python. A Ray that deploy
starts runs HAProxy in front of the ingress replicas (:mod:`serving.proxy`).
"""

from . import partition
from .deploy import ServingApp, deploy
from .hetero import HeteroPlan, ThroughputMatrix, plan_agnostic, plan_max_rate, plan_min_cost
from .model_app import ModelApp, deploy_model
from .model_transport import calibrate_transport
from .planner import Plan, Resources, StageProfile, plan_again, plan_stages
from .proxy import proxy_environment
from .simulate import simulate
from .stages import profile_baseline, profile_stages, stage_specs

__all__ = [
    "HeteroPlan",
    "ModelApp",
    "Plan",
    "Resources",
    "ServingApp",
    "StageProfile",
    "ThroughputMatrix",
    "calibrate_transport",
    "deploy",
    "deploy_model",
    "partition",
    "plan_again",
    "plan_agnostic",
    "plan_max_rate",
    "plan_min_cost",
    "plan_stages",
    "profile_baseline",
    "profile_stages",
    "proxy_environment",
    "simulate",
    "stage_specs",
]
