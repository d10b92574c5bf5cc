"""A redeploy under a running app's name, without Ray: the running replicas' resources come back
to the new app's plan, and what Serve starts before it stops old replicas must fit beside the
running app (the growth plus one replacement per deployment with the surge, the growth alone
without it); where neither fits, Serve would wait forever."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.core import running_apps
from serving.core.constants import HANDOVER_SURGE_PERCENT
from serving.core.profiles import NodeSpec
from serving.core.specs import AppSpec
from serving.launch import handover
from serving.planning.planner import Resources, placement_problem, plan_stages
from tests.serving.planning.test_planner import costs, ingress, linear


def filling_plan():
    """A fused plan on one node of 2 CPUs that takes nearly all of them, with a deployment of
    more than one replica."""
    nodes = [NodeSpec("n1", "h1", 2.0, head=True)]
    plan = plan_stages([linear("cheap", 0.0, 0.0003), linear("expensive", 0.0, 0.002, scale=0.2)],
                       Resources(cpus=2, nodes=nodes), rows_per_request=32, layout="fused", ingress=ingress(),
                       costs=costs(2.0))
    deployments = handover.new_deployments("app", plan, None)
    assert plan.placeable and reserved(deployments) > 1.5, plan.notes
    assert max(n for n, _, _ in deployments.values()) > 1, deployments
    return plan, deployments


def reserved(deployments) -> float:
    return sum(n * c for n, c, _ in deployments.values())


def one_of_each(deployments) -> float:
    return sum(c for _, c, _ in deployments.values())


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
    by_app = running_apps.running_by_app(["app", "app-monitor"])  # an app that does not run holds nothing
    assert set(by_app) == {"app"}
    seen = by_app["app"]
    assert seen.held == {"n1": pytest.approx((1.6, 1.0)), "n2": pytest.approx((0.8, 0.5))}
    assert seen.replicas == {"app-ingress": 3} and seen.apps == {"app"}
    assert running_apps.running_by_app(["other"]) == {}
    fake_client(monkeypatch, RuntimeError("Serve is not running"))
    assert running_apps.running_by_app(["app"]) == {}


def test_the_running_apps_resources_come_back_to_its_replacement():
    plan, deployments = filling_plan()
    used = reserved(deployments)
    free = [NodeSpec("n1", "h1", 2.0 - used, head=True)]
    assert placement_problem(plan, free) is not None  # beside the running app, the same plan does not fit
    returned = running_apps.with_returned(free, {"n1": (used, 0.0), "elsewhere": (4.0, 1.0)})
    assert returned[0].cpus == pytest.approx(2.0) and returned[0].head and free[0].cpus == pytest.approx(2.0 - used)
    assert placement_problem(plan, returned) is None


def test_the_same_plan_needs_one_replacement_of_each_deployment_with_the_surge_and_nothing_without():
    plan, deployments = filling_plan()
    same = running_apps.Running(replicas={d: n for d, (n, _, _) in deployments.items()}, apps={"app"})
    room = [NodeSpec("n1", "h1", one_of_each(deployments) + 0.01, head=True)]
    assert handover.rollout_surge(deployments, same, room) == (HANDOVER_SURGE_PERCENT, None)
    assert placement_problem(plan, room) is not None  # the whole plan would not fit there: the surge does
    surge, why = handover.rollout_surge(deployments, same, [NodeSpec("n1", "h1", 0.05, head=True)])
    assert surge == 0 and "no node has" in why  # stop-first starts nothing before it stops


def test_a_plan_that_grows_needs_its_added_replicas_beside_the_running_app():
    """Serve (2.60) starts a growing deployment's added replicas before it stops old ones, with
    or without the surge: where they do not fit, the rollout would wait forever."""
    _, deployments = filling_plan()
    smaller = running_apps.Running(replicas={d: max(n - 1, 0) for d, (n, _, _) in deployments.items()}, apps={"app"})
    added = sum(c for n, c, _ in deployments.values() if n >= 1)  # one more replica of each
    assert handover.rollout_surge(deployments, smaller, [NodeSpec("n1", "h1", added + 0.01, head=True)])[0] == 0
    assert handover.rollout_surge(deployments, smaller, [NodeSpec("n1", "h1", 2 * added + 0.01, head=True)])[0] \
        == HANDOVER_SURGE_PERCENT
    surge, why = handover.rollout_surge(deployments, smaller, [NodeSpec("n1", "h1", added / 2, head=True)])
    assert surge is None and why


def test_scaled_to_zero_stages_and_new_monitors():
    _, deployments = filling_plan()
    # a deployment with no running replica gets no replacement (Serve surges only over old ones)
    none_running = running_apps.Running(replicas={d: 0 for d in deployments}, apps={"app"})
    whole = [NodeSpec("n1", "h1", reserved(deployments) + 0.01, head=True)]
    assert handover.rollout_surge(deployments, none_running, whole)[0] == HANDOVER_SURGE_PERCENT
    same = running_apps.Running(replicas={d: n for d, (n, _, _) in deployments.items()}, apps={"app"})
    room = [NodeSpec("n1", "h1", one_of_each(deployments) + 0.01, head=True)]
    # a monitor the running app did not have starts first, on the head
    assert handover.rollout_surge(deployments, same, room, monitor_cpus=0.5)[0] == 0
    # a module chain's partition stages are deployments too
    chain = SimpleNamespace(num_cpus=0.5, num_gpus=0.0, stages=[SimpleNamespace(replicas=2)])
    plan, _ = filling_plan()
    assert set(handover.new_deployments("app", plan, {"enc": chain})) == {*deployments, "app-enc-part0"}


def test_the_surge_is_a_checked_field_of_the_app_spec():
    spec = {"name": "a", "artifact": {}, "plan": {}}
    assert AppSpec.model_validate(spec).surge_percent == HANDOVER_SURGE_PERCENT
    assert AppSpec.model_validate({**spec, "surge_percent": 0}).surge_percent == 0
    with pytest.raises(ValueError, match="surge_percent"):
        AppSpec.model_validate({**spec, "surge_percent": 101})


def test_after_a_hand_over_the_app_lets_go_of_every_other_artifact(monkeypatch):
    from serving.core import artifacts

    monkeypatch.setattr("ray.util.list_named_actors", lambda all_namespaces=False: [
        {"name": artifacts.holder_name("v-new"), "namespace": artifacts.HOLDER_NAMESPACE},
        {"name": artifacts.holder_name("v-old"), "namespace": artifacts.HOLDER_NAMESPACE},
        {"name": artifacts.holder_name("v-old"), "namespace": "someone-else"},
        {"name": "unrelated", "namespace": artifacts.HOLDER_NAMESPACE}])
    released: list = []
    monkeypatch.setattr(artifacts, "release", lambda source, app: released.append((source.holder, app)))
    artifacts.release_others(artifacts.ArtifactSource("v-new", holder=artifacts.holder_name("v-new")), "app")
    assert released == [(artifacts.holder_name("v-old"), "app")]


def test_a_built_config_asks_for_the_surge_where_its_plan_leaves_room():
    from dataclasses import replace

    plan, deployments = filling_plan()
    assert handover.planned_surge("app", plan) == 0  # the plan fills its 2 CPUs
    roomy = replace(plan, nodes=[replace(plan.nodes[0], cpus=plan.nodes[0].cpus + one_of_each(deployments))])
    assert handover.planned_surge("app", roomy) == HANDOVER_SURGE_PERCENT
    assert handover.planned_surge("app", replace(plan, nodes=[])) == 0


def test_what_two_sets_of_apps_hold_adds_up():
    a = running_apps.Running({"n1": (1.0, 0.5)}, {"app-ingress": 2}, {"app"})
    b = running_apps.Running({"n1": (0.1, 0.0), "n2": (0.2, 0.0)}, {"monitor": 1}, {"app-monitor"})
    both = a.merged(b)
    assert both.held == {"n1": pytest.approx((1.1, 0.5)), "n2": pytest.approx((0.2, 0.0))}
    assert both.replicas == {"app-ingress": 2, "monitor": 1} and both.apps == {"app", "app-monitor"}


def test_an_artifact_holder_ends_only_when_its_last_user_lets_go():
    from serving.core.artifacts import _Holder

    holder = _Holder({})
    assert holder.release("app") == -1  # published by another deploy, not acquired yet: not a user
    holder.acquire("app")
    holder.acquire("other")
    assert holder.release("app") == 1 and holder.release("other") == 0
