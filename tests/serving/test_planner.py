"""The stage planner and its simulation: pure Python, no Ray."""

from __future__ import annotations

import math

import pytest

from serving.planner import HEADROOM, Resources, StageProfile, plan_stages
from serving.simulate import simulate


def linear(name: str, fixed_s: float, per_row_s: float, scale: float = 1.0) -> StageProfile:
    """A stage whose batch of b rows costs fixed + b * per_row seconds."""
    return StageProfile(name, {b: fixed_s + b * per_row_s for b in (1, 2, 4, 8, 16, 32, 64, 128)}, scale)


def test_service_time_interpolates_and_extrapolates():
    p = StageProfile("s", {1: 0.001, 10: 0.010})
    assert p.service_time(5.5) == pytest.approx(0.0055)
    assert p.service_time(20) == pytest.approx(0.020)
    assert p.service_time(0.2) == pytest.approx(0.001)
    assert p.capacity(10) == pytest.approx(1000)


def test_bottleneck_stage_gets_the_replicas():
    cheap = linear("cheap", 0.001, 0.0001)
    slow = linear("slow", 0.001, 0.001)
    plan = plan_stages([cheap, slow], Resources(cpus=6.25))
    assert plan.stage("slow").replicas > plan.stage("cheap").replicas
    assert plan.stage("cheap").replicas + plan.stage("slow").replicas == 6
    # balanced: taking one replica from the slow stage would make it a worse bottleneck
    per_slow = slow.capacity(plan.stage("slow").max_batch_size)
    assert plan.stage("slow").capacity_rows_s - per_slow < plan.stage("cheap").capacity_rows_s
    assert plan.max_rows_per_s == pytest.approx(plan.stage("slow").capacity_rows_s)


def test_scale_factor_shrinks_the_expensive_stage():
    cheap = linear("cheap", 0.001, 0.0001)
    unsure_few = linear("expensive", 0.001, 0.001, scale=0.05)
    unsure_all = linear("expensive", 0.001, 0.001, scale=1.0)
    few = plan_stages([cheap, unsure_few], Resources(cpus=32), rps=200, rows_per_request=32)
    many = plan_stages([cheap, unsure_all], Resources(cpus=32), rps=200, rows_per_request=32)
    assert few.stage("expensive").replicas < many.stage("expensive").replicas


def test_replicas_follow_the_rate_formula():
    stage = linear("only", 0.0, 0.001)  # 1000 rows/s per replica at any batch
    plan = plan_stages([stage], Resources(cpus=100), rps=2000, rows_per_request=1)
    assert plan.stage("only").replicas == math.ceil(2000 / (HEADROOM * 1000))
    assert plan.feasible
    assert plan.predicted["throughput_rows_s"] == pytest.approx(2000, rel=0.1)


def test_budget_too_small_is_reported_with_what_fits():
    stage = linear("only", 0.0, 0.001)
    plan = plan_stages([stage], Resources(cpus=2), rps=5000)
    assert not plan.feasible
    assert any("only 2 are available" in n for n in plan.notes)


def test_p99_target_shrinks_batches():
    stage = linear("only", 0.002, 0.0005)
    loose = plan_stages([stage], Resources(cpus=4), rps=100, rows_per_request=4)
    tight = plan_stages([stage], Resources(cpus=4), rps=100, rows_per_request=4, p99_ms=12)
    assert tight.stage("only").max_batch_size <= loose.stage("only").max_batch_size
    assert tight.predicted["p99_ms"] <= 12 or not tight.feasible


def test_impossible_p99_is_flagged():
    stage = linear("only", 0.05, 0.001)  # 50 ms minimum service time
    plan = plan_stages([stage], Resources(cpus=4), rps=10, p99_ms=20)
    assert not plan.feasible
    assert any("p99" in n for n in plan.notes)


def test_ongoing_requests_cover_a_full_batch_of_requests():
    cheap = linear("cheap", 0.001, 0.0001)
    expensive = linear("expensive", 0.001, 0.001, scale=0.03)
    plan = plan_stages([cheap, expensive], Resources(cpus=4), rps=300, rows_per_request=32)
    for s in plan.stages:
        rows_per_call = max(1.0, 32 * (1.0 if s.name == "cheap" else 0.03))
        assert s.max_ongoing_requests >= 2 * math.ceil(s.max_batch_size / rows_per_call)


def test_gpu_stage_gets_fractional_gpus():
    cheap = linear("cheap", 0.001, 0.0001)
    gpu = StageProfile("expensive", {1: 0.002, 64: 0.004}, scale=0.2, device="gpu")
    plan = plan_stages([cheap, gpu], Resources(cpus=4, gpus=1), rps=2000, rows_per_request=8)
    g = plan.stage("expensive")
    assert g.device == "gpu" and 0 < g.num_gpus <= 1
    assert plan.stage("cheap").num_gpus == 0
    with pytest.raises(ValueError, match="GPU"):
        plan_stages([gpu], Resources(cpus=4, gpus=0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(rps=-1), "rps"), (dict(p99_ms=0), "p99_ms"), (dict(rows_per_request=0), "rows_per_request"),
     (dict(layout="tiled"), "layout"), (dict(ingress_ms=-1.0), "ingress_ms")],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_stages([linear("s", 0.001, 0.001)], Resources(cpus=2), **kwargs)
    with pytest.raises(ValueError, match="cpus"):
        Resources(cpus=0)
    with pytest.raises(ValueError, match="scale"):
        StageProfile("s", {1: 0.1}, scale=2.0)


def test_simulation_matches_queueing_basics():
    stage = linear("only", 0.0, 0.001)  # 1 ms per row, batch 1 -> M/D/1
    plan = plan_stages([stage], Resources(cpus=1.25), rows_per_request=1)
    plan.stages[0].max_batch_size = 1
    plan.ingress_ms = 0.0  # the stage alone
    light = simulate(plan, [stage], rate_rps=100, hop_ms=0.0, n_requests=5000, seed=1)
    heavy = simulate(plan, [stage], rate_rps=900, hop_ms=0.0, n_requests=5000, seed=1)
    assert light.utilization["only"] == pytest.approx(0.1, abs=0.02)
    assert light.p50_ms == pytest.approx(1.0, abs=0.1)
    # M/D/1 mean wait at rho=0.9: rho / (2 mu (1 - rho)) = 4.5 ms, plus 1 ms service
    assert heavy.mean_ms == pytest.approx(5.5, rel=0.25)
    overload = simulate(plan, [stage], rate_rps=2000, hop_ms=0.0, n_requests=5000, seed=1)
    assert overload.throughput_rows_s == pytest.approx(1000, rel=0.05)


def test_ingress_is_a_station_of_the_simulation():
    stage = linear("only", 0.0, 0.0001)  # 0.1 ms per row: the ingress is the bottleneck
    plan = plan_stages([stage], Resources(cpus=4), rows_per_request=1, ingress_ms=2.0)
    assert plan.ingress_replicas == 1
    one = simulate(plan, [stage], rate_rps=2000, hop_ms=0.0, n_requests=4000, seed=1)
    assert one.throughput_rows_s == pytest.approx(500, rel=0.05)  # 1 / 2 ms
    plan.ingress_replicas = 2
    two = simulate(plan, [stage], rate_rps=2000, hop_ms=0.0, n_requests=4000, seed=1)
    assert two.throughput_rows_s == pytest.approx(1000, rel=0.05)
    assert two.utilization["ingress"] == pytest.approx(1.0, abs=0.05)


def test_fused_ingress_gets_replicas_for_its_share_of_the_work():
    cheap = linear("cheap", 0.0002, 0.00003)  # ~1 ms per 32-row request
    expensive = linear("expensive", 0.001, 0.0005, scale=0.05)  # ~0.8 ms per request
    staged = plan_stages([cheap, expensive], Resources(cpus=2), rows_per_request=32)
    fused = plan_stages([cheap, expensive], Resources(cpus=2), rows_per_request=32, layout="fused")
    assert staged.ingress_replicas == 1 and staged.layout == "staged"
    # ingress 2 ms + cheap ~1 ms of ~3.8 ms per request: 2 CPUs x 0.79 -> 2 processes
    assert fused.ingress_replicas == 2 and fused.layout == "fused"
    assert fused.ingress_replicas * fused.ingress_cpus + sum(s.replicas * s.num_cpus for s in fused.stages) <= 2 + 1e-9
    assert "runs the cheap stage" in str(fused)
    # with a rate: enough ingress processes for it at the headroom
    rated = plan_stages([cheap, expensive], Resources(cpus=8), rows_per_request=32, rps=600, layout="fused")
    per_request = 0.002 + cheap.service_time(rated.stage("cheap").max_batch_size) / rated.stage(
        "cheap").max_batch_size * 32
    assert rated.ingress_replicas == math.ceil(600 * per_request / HEADROOM)
    # the simulation sees the fused ingress as the first stage's servers: no extra hop
    sim_fused = simulate(fused, [cheap, expensive], rate_rps=50, hop_ms=5.0, n_requests=500, seed=0)
    sim_staged = simulate(staged, [cheap, expensive], rate_rps=50, hop_ms=5.0, n_requests=500, seed=0)
    assert sim_fused.p50_ms < sim_staged.p50_ms - 4.0


def test_fused_first_stage_must_be_on_cpu():
    gpu = StageProfile("gpu", {1: 0.001, 8: 0.002}, device="gpu")
    with pytest.raises(ValueError, match="fused"):
        plan_stages([gpu], Resources(cpus=4, gpus=1), layout="fused")
