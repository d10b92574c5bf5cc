"""The planner, its cost model and its simulation: pure Python, no Ray, deterministic costs."""

from __future__ import annotations

import math

import pytest

from serving.core.costs import HostCosts
from serving.core.profiles import IngressProfile, NodeSpec, StageProfile
from serving.planning.planner import HEADROOM, Plan, Resources, plan_stages
from serving.planning.simulate import simulate


def linear(name: str, fixed_s: float, per_row_s: float, scale: float = 1.0, device: str = "cpu",
           speedup=None) -> StageProfile:
    """A stage whose batch of b rows costs fixed + b * per_row seconds."""
    return StageProfile(name, {b: fixed_s + b * per_row_s for b in (1, 2, 4, 8, 16, 32, 64, 128)}, scale,
                        device, speedup=speedup or {1: 1.0}, measured_on=device)


def costs(cores: float = 2.0, **over) -> HostCosts:
    base = dict(http_ms=1.0, http_ms_per_kb=0.0, front_ms=0.2, front_ms_per_kb=0.0, hop_caller_ms=0.5,
                hop_caller_ms_per_kb=0.0, hop_callee_ms=0.5, hop_callee_ms_per_kb=0.0, other_ms=0.1,
                cores={"localhost": cores}, measured=True)
    return HostCosts(**(base | over))


def ingress(rows: int = 32, parse_ms: float = 0.5) -> IngressProfile:
    return IngressProfile(rows, parse_ms=parse_ms, respond_ms=0.2, body_kb=1.0, response_kb=1.0)


def free_costs(cores: float) -> HostCosts:
    """No HTTP, hop or background cost: the stages alone."""
    return costs(cores, http_ms=0.0, front_ms=0.0, hop_caller_ms=0.0, hop_callee_ms=0.0, other_ms=0.0)


def test_service_time_interpolates_and_extrapolates():
    p = StageProfile("s", {1: 0.001, 10: 0.010})
    assert p.service_time(5.5) == pytest.approx(0.0055)
    assert p.service_time(20) == pytest.approx(0.020)
    assert p.service_time(0.2) == pytest.approx(0.001)
    assert p.capacity(10) == pytest.approx(1000)


def test_bottleneck_processes_get_replicas_until_the_cores_bind():
    cheap = linear("cheap", 0.0, 0.00001)
    slow = linear("slow", 0.0, 0.001)  # 32 ms of CPU per 32-row request: one process holds ~31 req/s
    plan = plan_stages([cheap, slow], Resources(cpus=8), rows_per_request=32, ingress=ingress(),
                       costs=free_costs(8.0))
    assert plan.stage("slow").replicas > plan.stage("cheap").replicas
    # the slow stage's processes bound the plan until the 8 cores do
    assert plan.bottleneck in ("cores of localhost", "logical CPUs")
    assert plan.max_rows_per_s == pytest.approx(8 * 1000 / (32 * 1.0 + 0.32 + 0.7) * 32, rel=0.02)
    # each replica reserves what it uses at that rate, and the reservations fit the budget
    reserved = plan.ingress_replicas * plan.ingress_cpus + sum(s.replicas * s.num_cpus for s in plan.stages)
    assert reserved <= 8 + 0.05


def test_shared_cores_cap_the_plan_below_the_sum_of_replicas():
    """Four replicas on two cores serve what two cores do, not four replicas' worth."""
    stage = linear("only", 0.0, 0.001)
    plan = plan_stages([stage], Resources(cpus=2), rows_per_request=1, ingress=ingress(1, parse_ms=0.0),
                       costs=free_costs(2.0))
    per_request_ms = 1.0 + 0.2  # the model plus the ingress's answer
    assert plan.max_rows_per_s == pytest.approx(2 * 1000 / per_request_ms, rel=0.02)
    sim = simulate(plan, clients=16, n_requests=3000, seed=1)
    assert sim.throughput_rows_s == pytest.approx(plan.max_rows_per_s, rel=0.1)


def test_ingress_is_a_station_with_its_measured_cost():
    stage = linear("only", 0.0, 0.00001)
    plan = plan_stages([stage], Resources(cpus=1), rows_per_request=1, ingress=ingress(1, parse_ms=2.0),
                       costs=free_costs(1.0))
    assert plan.cpu_ms["ingress"] == pytest.approx(2.2)
    assert plan.ingress_profile.parse_ms == 2.0  # stored with the plan
    sim = simulate(plan, clients=8, n_requests=2000, seed=1)
    assert sim.throughput_rps == pytest.approx(1000 / (2.2 + 0.01), rel=0.1)
    assert sim.utilization["ingress"] == pytest.approx(1.0, abs=0.05)


def test_hops_cost_cpu_on_both_sides():
    cheap = linear("cheap", 0.0, 0.00001)
    expensive = linear("expensive", 0.0, 0.00001, scale=1.0)
    c = costs(4.0, hop_caller_ms=2.0, hop_callee_ms=3.0, front_ms=0.0, other_ms=0.0)
    staged = plan_stages([cheap, expensive], Resources(cpus=4), rows_per_request=1, ingress=ingress(1),
                         costs=c, layout="staged")
    fused = plan_stages([cheap, expensive], Resources(cpus=4), rows_per_request=1, ingress=ingress(1),
                        costs=c, layout="fused")
    # staged: the ingress pays the caller's side of two hops, each stage the callee's side of one
    assert staged.cpu_ms["ingress"] == pytest.approx(1.0 + 0.7 + 2 * 2.0, rel=0.01)
    assert staged.cpu_ms["cheap"] == pytest.approx(3.0 + 0.01, rel=0.01)
    # fused: the cheap stage runs in the ingress, one hop left
    assert fused.cpu_ms["ingress"] == pytest.approx(1.0 + 0.7 + 2.0 + 0.01, rel=0.01)
    assert "cheap" not in fused.cpu_ms


def test_a_rate_plan_above_headroom_is_not_feasible():
    stage = linear("only", 0.0, 0.001)
    ok = plan_stages([stage], Resources(cpus=4), rps=100, rows_per_request=1, ingress=ingress(1),
                     costs=free_costs(4.0))
    assert ok.feasible, ok.notes
    assert ok.stage("only").replicas == math.ceil(100 * 1.0 / 1000 / HEADROOM)
    # 99% of what the machine can do is not feasible at 75% headroom, and the note says what fits
    capacity = plan_stages([stage], Resources(cpus=4), rows_per_request=1, ingress=ingress(1),
                           costs=free_costs(4.0)).max_rows_per_s
    near = plan_stages([stage], Resources(cpus=4), rps=0.99 * capacity, rows_per_request=1, ingress=ingress(1),
                       costs=free_costs(4.0))
    assert not near.feasible
    assert any("most this cluster sustains" in n for n in near.notes), near.notes


def test_p99_target_shrinks_batches_or_is_flagged():
    stage = linear("only", 0.002, 0.0005)
    loose = plan_stages([stage], Resources(cpus=4), rps=50, rows_per_request=4, ingress=ingress(4),
                        costs=free_costs(4.0))
    tight = plan_stages([stage], Resources(cpus=4), rps=50, rows_per_request=4, p99_ms=12, ingress=ingress(4),
                        costs=free_costs(4.0))
    assert tight.stage("only").max_batch_size <= loose.stage("only").max_batch_size
    assert tight.predicted["p99_ms"] <= 12 or not tight.feasible
    slow = plan_stages([linear("only", 0.05, 0.0)], Resources(cpus=4), rps=10, p99_ms=20, ingress=ingress(1),
                       rows_per_request=1, costs=free_costs(4.0))
    assert not slow.feasible and any("p99" in n for n in slow.notes)


def test_replicas_are_placed_per_node_and_an_unplaceable_plan_is_refused():
    cheap = linear("cheap", 0.0, 0.00003)
    expensive = linear("expensive", 0.0, 0.0005, scale=0.2)
    nodes = [NodeSpec("head", "h1", 1.0, head=True), NodeSpec("worker", "h2", 1.0)]
    c = costs(1.0)
    c.cores = {"h1": 1.0, "h2": 1.0}
    plan = plan_stages([cheap, expensive], Resources(cpus=2, nodes=nodes), rows_per_request=32, layout="fused",
                       ingress=ingress(), costs=c)
    assert plan.placeable and plan.feasible, plan.notes
    per_node = {}
    for deployment, where in plan.placement.items():
        cpus = plan.ingress_cpus if deployment == "ingress" else plan.stage(deployment).num_cpus
        for node, count in where.items():
            per_node[node] = per_node.get(node, 0.0) + cpus * count
    assert all(v <= 1.0 + 1e-9 for v in per_node.values()), per_node  # no node holds more than it has
    assert plan.ingress_cpus <= 1.0
    tiny = [NodeSpec("head", "h1", 0.04, head=True), NodeSpec("worker", "h2", 0.04)]
    refused = plan_stages([cheap, expensive], Resources(cpus=0.08, nodes=tiny), rows_per_request=32,
                          ingress=ingress(), costs=c)
    assert not refused.placeable and not refused.feasible
    assert any("no node has" in n for n in refused.notes), refused.notes


def test_a_second_machine_adds_cores():
    stage = linear("only", 0.0, 0.001)
    one = [NodeSpec("a", "h1", 2.0, head=True)]
    two = [NodeSpec("a", "h1", 2.0, head=True), NodeSpec("b", "h2", 2.0)]
    c = free_costs(2.0)
    c.cores = {"h1": 2.0, "h2": 2.0}
    p1 = plan_stages([stage], Resources(cpus=2, nodes=one), rows_per_request=1, ingress=ingress(1, 0.0), costs=c)
    p2 = plan_stages([stage], Resources(cpus=4, nodes=two), rows_per_request=1, ingress=ingress(1, 0.0), costs=c)
    assert p2.max_rows_per_s > 1.5 * p1.max_rows_per_s
    assert len(p2.placement["only"]) == 2  # spread over both nodes


def test_shared_gpu_is_one_server_with_measured_speedup():
    cheap = linear("cheap", 0.0, 0.00001)
    flat = linear("expensive", 0.0, 0.002, scale=1.0, device="gpu", speedup={1: 1.0, 2: 1.0, 4: 1.0})
    scaling = linear("expensive", 0.0, 0.002, scale=1.0, device="gpu", speedup={1: 1.0, 2: 1.8, 4: 3.0})
    kwargs = dict(rows_per_request=1, ingress=ingress(1, 0.0), costs=free_costs(16.0))
    one_gpu = Resources(cpus=16, gpus=1)
    p_flat = plan_stages([cheap, flat], one_gpu, **kwargs)
    p_scaling = plan_stages([cheap, scaling], one_gpu, **kwargs)
    # replicas sharing a GPU that does not overlap their work add nothing
    assert p_flat.stage("expensive").replicas == 1
    assert p_flat.max_rows_per_s == pytest.approx(500, rel=0.05)
    assert p_scaling.stage("expensive").replicas > 1
    assert p_scaling.max_rows_per_s > 1.5 * p_flat.max_rows_per_s
    g = p_scaling.stage("expensive")
    assert g.device == "gpu" and 0 < g.num_gpus <= 1 and p_scaling.stage("cheap").num_gpus == 0
    with pytest.raises(ValueError, match="GPU"):
        plan_stages([flat], Resources(cpus=4, gpus=0), **kwargs)
    with pytest.raises(ValueError, match="fused"):
        plan_stages([flat], Resources(cpus=4, gpus=1), layout="fused", **kwargs)


def test_plan_round_trips_through_its_dict():
    plan = plan_stages([linear("cheap", 0.001, 0.0001), linear("expensive", 0.001, 0.001, 0.1)],
                       Resources(cpus=2), rows_per_request=32, ingress=ingress(), costs=costs())
    again = Plan.from_dict(plan.to_dict())
    assert again.to_dict() == plan.to_dict()
    assert simulate(again, clients=4, n_requests=200, seed=0).completed == 200


def test_unmeasured_costs_are_noted():
    plan = plan_stages([linear("only", 0.001, 0.0001)], Resources(cpus=2), rows_per_request=8)
    assert any("not measured" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(rps=-1), "rps"), (dict(p99_ms=0), "p99_ms"), (dict(rows_per_request=0), "rows_per_request"),
     (dict(layout="tiled"), "layout"), (dict(headroom=0), "headroom")],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_stages([linear("s", 0.001, 0.001)], Resources(cpus=2), **kwargs)
    with pytest.raises(ValueError, match="cpus"):
        Resources(cpus=0)
    with pytest.raises(ValueError, match="scale"):
        StageProfile("s", {1: 0.1}, scale=2.0)


def test_simulation_matches_queueing_basics():
    stage = linear("only", 0.0, 0.001)  # 1 ms per row, batch 1: M/D/1 behind a free ingress
    plan = plan_stages([stage], Resources(cpus=1), rows_per_request=1, ingress=ingress(1, 0.0),
                       costs=free_costs(1.0))
    plan.stages[0].max_batch_size = 1
    plan.ingress_profile = IngressProfile(1, parse_ms=0.0, respond_ms=0.0)
    light = simulate(plan, rate_rps=100, n_requests=5000, seed=1)
    heavy = simulate(plan, rate_rps=900, n_requests=5000, seed=1)
    assert light.utilization["only"] == pytest.approx(0.1, abs=0.02)
    assert light.p50_ms == pytest.approx(1.0, abs=0.1)
    # M/D/1 mean wait at rho=0.9: rho / (2 mu (1 - rho)) = 4.5 ms, plus 1 ms service
    assert heavy.mean_ms == pytest.approx(5.5, rel=0.25)
    overload = simulate(plan, rate_rps=2000, n_requests=5000, seed=1)
    assert overload.throughput_rows_s == pytest.approx(1000, rel=0.05)
    with pytest.raises(ValueError, match="exactly one"):
        simulate(plan, n_requests=100)


def test_ingress_limits_calls_in_flight_per_stage_replica():
    """The ingress keeps CONCURRENT_BATCHES calls per replica: a stage of 3 replicas whose
    work is waiting (not CPU) serves 3x what one does."""
    stage = linear("lookup", 0.02, 0.0, device="gpu", speedup={1: 1.0, 2: 2.0, 4: 4.0, 64: 64.0})
    kwargs = dict(rows_per_request=1, ingress=ingress(1, 0.0), costs=free_costs(8.0))
    one = plan_stages([stage], Resources(cpus=8, gpus=1), rps=10, **kwargs)
    three = plan_stages([stage], Resources(cpus=8, gpus=1), rps=10, **kwargs)
    one.stages[0].replicas, three.stages[0].replicas = 1, 3
    for p in (one, three):
        p.stages[0].max_batch_size = 1
        p.placement = {}
    r1 = simulate(one, clients=64, n_requests=3000, seed=2)
    r3 = simulate(three, clients=64, n_requests=3000, seed=2)
    assert r3.throughput_rps > 2.4 * r1.throughput_rps  # Serve routes by two random choices: not quite 3x


def test_in_situ_factors_plan_again_and_the_simulation_keeps_them():
    """Factors measured on the running app (serving.measure.insitu) go into the cost model: an
    ingress found to spend twice its modelled CPU gets more replicas at a target rate and a
    lower bound; the plan keeps the factors, its simulation applies them unless told {}, and
    planning again without factors gives back the same deployments."""
    from serving.planning.planner import plan_again, same_deployments

    stages = [linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)]
    kwargs = dict(rows_per_request=32, layout="fused", ingress=ingress(), costs=costs(8.0))
    plain = plan_stages(stages, Resources(cpus=8), rps=150, **kwargs)
    heavy = plan_stages(stages, Resources(cpus=8), rps=150, cpu_scale={"ingress": 2.0}, **kwargs)
    assert plain.in_situ == {} and heavy.in_situ == {"factors": {"ingress": 2.0}}
    assert heavy.ingress_replicas > plain.ingress_replicas
    assert heavy.cpu_ms["ingress"] == pytest.approx(2.0 * plain.cpu_ms["ingress"])
    assert heavy.cpu_ms["expensive"] == pytest.approx(plain.cpu_ms["expensive"])
    most = plan_stages(stages, Resources(cpus=2), **kwargs)
    slower = plan_stages(stages, Resources(cpus=2), cpu_scale={"ingress": 2.0, "front": 3.0}, **kwargs)
    assert slower.max_rows_per_s < 0.8 * most.max_rows_per_s

    # the simulation takes the plan's factors by default; {} is the model alone
    modelled = simulate(heavy, clients=8, n_requests=400, seed=1, cpu_scale={})
    measured = simulate(heavy, clients=8, n_requests=400, seed=1)
    assert measured.cpu_ms["ingress"] == pytest.approx(2.0 * modelled.cpu_ms["ingress"], rel=0.05)
    assert Plan.from_dict(heavy.to_dict()).in_situ == heavy.in_situ

    again = plan_again(plain, budget_cpus=8)
    assert same_deployments(plain, again) and again.max_rows_per_s == pytest.approx(plain.max_rows_per_s)
    assert not same_deployments(plain, plan_again(plain, budget_cpus=8, cpu_scale={"ingress": 2.0}))
    with pytest.raises(ValueError, match="cpu_scale"):
        plan_stages(stages, Resources(cpus=2), cpu_scale={"ingress": -1.0}, **kwargs)


def test_a_refined_plan_with_the_same_replicas_is_adopted_with_the_running_reservations():
    """serving.launch.insitu restarts an app only where the refined plan runs other replicas,
    batches or queues (same_replicas); otherwise the running app adopts it and keeps its own
    CPU reservations and admission bound (kept_running), which the adopted plan then says."""
    from dataclasses import replace

    from serving.planning.planner import kept_running, plan_again, same_deployments, same_replicas

    stages = [linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)]
    plain = plan_stages(stages, Resources(cpus=8), rps=150, rows_per_request=32, layout="fused",
                        ingress=ingress(), costs=costs(8.0))
    retuned = replace(plain, ingress_cpus=plain.ingress_cpus * 0.9, ingress_max_in_flight=plain.ingress_max_in_flight + 300,
                      stages=[replace(s, num_cpus=s.num_cpus + 0.1) for s in plain.stages], max_rows_per_s=1.5)
    assert same_replicas(plain, retuned) and not same_deployments(plain, retuned)
    kept = kept_running(retuned, plain)
    assert same_deployments(plain, kept) and kept.max_rows_per_s == 1.5  # the refined figures, the running shape
    assert not same_replicas(plain, plan_again(plain, budget_cpus=8, cpu_scale={"ingress": 2.0}))
    more = replace(plain, stages=[replace(plain.stages[0], replicas=plain.stages[0].replicas + 1), *plain.stages[1:]])
    assert not same_replicas(plain, more)
    with pytest.raises(ValueError, match="same replicas"):
        kept_running(more, plain)
