"""A redeploy under a running app's name, without Ray: the running replicas' resources come back
to the new app's plan, and only the replacements Serve starts first (the surge) must fit beside
the running app; where they do not, deploy hands over without the surge and says so."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from serving.core.constants import HANDOVER_SURGE_PERCENT
from serving.core.profiles import NodeSpec
from serving.core.specs import AppSpec
from serving.launch import deploy as deploy_module
from serving.launch import handover
from serving.planning.planner import Resources, placement_problem, plan_stages, surge_problem
from tests.serving.planning.test_planner import costs, ingress, linear


def filling_plan():
    """A fused plan on one node of 2 CPUs that takes nearly all of them, with a deployment of
    more than one replica (so the whole plan needs more than one replica of each)."""
    nodes = [NodeSpec("n1", "h1", 2.0, head=True)]
    plan = plan_stages([linear("cheap", 0.0, 0.0003), linear("expensive", 0.0, 0.002, scale=0.2)],
                       Resources(cpus=2, nodes=nodes), rows_per_request=32, layout="fused", ingress=ingress(),
                       costs=costs(2.0))
    assert plan.placeable and reserved(plan) > 1.5 and one_of_each(plan) < reserved(plan), plan.notes
    return plan


def reserved(plan) -> float:
    return plan.ingress_replicas * plan.ingress_cpus + sum(s.replicas * s.num_cpus for s in plan.remote_stages())


def one_of_each(plan) -> float:
    return plan.ingress_cpus + sum(s.num_cpus for s in plan.remote_stages())


def details(replicas: list[tuple[str, str]], cpus: float = 0.8, gpus: float = 0.0) -> dict:
    return {"applications": {"app": {"deployments": {"app-ingress": {
        "required_resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})},
        "replicas": [{"node_id": node, "state": SimpleNamespace(value=state)} for node, state in replicas]}}}}}


def fake_client(monkeypatch, served: dict | Exception) -> None:
    class Client:
        def get_serve_details(self):
            if isinstance(served, Exception):
                raise served
            return served

    monkeypatch.setattr("ray.serve.context._get_global_client", lambda *a, **k: Client())


def test_what_the_running_replicas_hold_is_summed_per_node(monkeypatch):
    fake_client(monkeypatch, details([("n1", "RUNNING"), ("n1", "RUNNING"), ("n2", "UPDATING"), ("n2", "STARTING"),
                                      ("n3", "STOPPING")], cpus=0.8, gpus=0.5))
    held = handover.held_by_apps(["app", "app-monitor"])  # an app that does not run holds nothing
    assert held == {"n1": pytest.approx((1.6, 1.0)), "n2": pytest.approx((0.8, 0.5))}
    assert handover.held_by_apps(["other"]) == {}
    fake_client(monkeypatch, RuntimeError("Serve is not running"))
    assert handover.held_by_apps(["app"]) == {}


def test_the_running_apps_resources_come_back_to_its_replacement():
    plan = filling_plan()
    used = reserved(plan)
    free = [NodeSpec("n1", "h1", 2.0 - used, head=True)]
    assert placement_problem(plan, free) is not None  # beside the running app, the same plan does not fit
    returned = handover.with_returned(free, {"n1": (used, 0.0), "elsewhere": (4.0, 1.0)})
    assert returned[0].cpus == pytest.approx(2.0) and returned[0].head and free[0].cpus == pytest.approx(2.0 - used)
    assert placement_problem(plan, returned) is None


def test_the_surge_needs_one_replica_of_each_deployment_beside_the_running_app():
    plan = filling_plan()
    room = [NodeSpec("n1", "h1", one_of_each(plan) + 0.01, head=True)]
    assert surge_problem(plan, room) is None
    assert placement_problem(plan, room) is not None  # the whole plan would not: only the surge must
    assert surge_problem(plan, [NodeSpec("n1", "h1", one_of_each(plan) - 0.05, head=True)]) is not None
    # a module chain's partition stages surge too
    assert surge_problem(plan, room, extra={"app-enc-part0": (0.5, 0.0)}) is not None
    gpu_room = [NodeSpec("n1", "h1", one_of_each(plan) + 1.0, gpus=0.25, head=True)]
    assert surge_problem(plan, gpu_room, extra={"app-enc-part0": (0.5, 0.5)}) is not None


def test_without_room_for_the_surge_deploy_hands_over_stopping_old_replicas_first():
    plan = filling_plan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deploy_module._surge_percent("app", plan, None, [NodeSpec("n1", "h1", 2.0, head=True)]) \
            == HANDOVER_SURGE_PERCENT > 0
    with pytest.warns(UserWarning, match="no room beside the running app 'app'.*stops old replicas"):
        assert deploy_module._surge_percent("app", plan, None, [NodeSpec("n1", "h1", 0.1, head=True)]) == 0


def test_the_surge_is_a_checked_field_of_the_app_spec():
    spec = {"name": "a", "artifact": {}, "plan": {}}
    assert AppSpec.model_validate(spec).surge_percent == HANDOVER_SURGE_PERCENT
    assert AppSpec.model_validate({**spec, "surge_percent": 0}).surge_percent == 0
    with pytest.raises(ValueError, match="surge_percent"):
        AppSpec.model_validate({**spec, "surge_percent": 101})
