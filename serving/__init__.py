"""serving: an optimized willump pipeline on Ray Serve, as a graph of coarse stages.

``deploy(optimized_or_artifact, name=...)`` starts (or joins) Ray, plans replicas and
batches per stage from costs measured on this machine, and serves HTTP at
``/<name>``: ``POST /predict``, ``POST /top_k``, ``GET /report``, ``/plan``,
``/healthz``, ``/metrics``, and ``/explain`` / ``/drift`` when the monitor is deployed.
The planner (:mod:`serving.planning.planner`) and simulation are plain Python. A Ray that deploy
starts runs HAProxy in front of the ingress replicas (:mod:`serving.launch.proxy`).
"""

from serving import partition
from serving.core.specs import stage_specs
from serving.launch.deploy import ServingApp, deploy
from serving.launch.proxy import proxy_environment
from serving.measure.stages import profile_baseline, profile_stages
from serving.model_app.deploy import ModelApp, deploy_model
from serving.model_app.transport import calibrate_transport
from serving.planning.hetero import (
    HeteroPlan,
    ThroughputMatrix,
    plan_agnostic,
    plan_max_rate,
    plan_min_cost,
)
from serving.planning.planner import Plan, Resources, StageProfile, plan_again, plan_stages
from serving.planning.simulate import simulate

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
