"""The heterogeneity-aware planner (serving.planning.hetero) on given throughput matrices: the LP's
optimum equals brute force over every integer allocation on small cases; the capacity split
sustains what the LP predicts and the uniform split less; min-cost plans are the cheapest
that cover the target; bad input is refused with a message naming it. Plain Python, no Ray."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from serving.planning.hetero import (
    ThroughputMatrix,
    WeightedRouter,
    capacity_weights,
    plan_max_rate,
    plan_min_cost,
    sustained_rate,
    uniform_weights,
)


def _allocations(matrix: ThroughputMatrix, devices: dict[str, int]):
    """Every integer x[s, d] with sum_s x[s, d] <= devices[d] and x = 0 where the rate is 0."""
    S, D = matrix.rates.shape
    per_device = []
    for j, d in enumerate(matrix.device_types):
        options = []
        for split in itertools.product(range(devices.get(d, 0) + 1), repeat=S):
            if sum(split) <= devices.get(d, 0) and all(split[i] == 0 or matrix.rates[i, j] > 0 for i in range(S)):
                options.append(split)
        per_device.append(options)
    for combo in itertools.product(*per_device):
        yield {(matrix.stages[i], matrix.device_types[j]): combo[j][i]
               for i in range(S) for j in range(D) if combo[j][i] > 0}


def _best_rate(matrix, replicas):
    caps = []
    for i, s in enumerate(matrix.stages):
        cap = sum(replicas.get((s, d), 0) * matrix.rates[i, j] for j, d in enumerate(matrix.device_types))
        if matrix.visits[i] > 0:
            caps.append(cap / matrix.visits[i])
    return min(caps)


def _random_case(rng):
    S = int(rng.integers(1, 4))
    D = int(rng.integers(1, 4))
    rates = rng.uniform(1, 50, size=(S, D)).round(1)
    rates[rng.random((S, D)) < 0.2] = 0.0
    for i in range(S):
        if not np.any(rates[i] > 0):
            rates[i, int(rng.integers(D))] = float(rng.uniform(1, 50))
    visits = tuple(float(v) for v in rng.choice([1.0, 0.5, 0.25], size=S))
    matrix = ThroughputMatrix(tuple(f"s{i}" for i in range(S)), tuple(f"d{j}" for j in range(D)), rates, visits)
    devices = {f"d{j}": int(rng.integers(0, 4)) for j in range(D)}
    return matrix, devices


@pytest.mark.parametrize("seed", range(40))
def test_max_rate_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    matrix, devices = _random_case(rng)
    best = max((_best_rate(matrix, r) for r in _allocations(matrix, devices)), default=0.0)
    if best <= 0:
        with pytest.raises(ValueError, match="cannot hold one replica"):
            plan_max_rate(matrix, devices)
        return
    plan = plan_max_rate(matrix, devices)
    assert plan.predicted_rate == pytest.approx(best, rel=1e-6)
    for d, n in devices.items():  # never more replicas than devices
        assert sum(k for (_, dd), k in plan.replicas.items() if dd == d) <= n
    # the capacity split reaches the plan's own capacity bound; uniform routing never beats it
    assert sustained_rate(matrix, plan.replicas, plan.weights) == pytest.approx(_best_rate(matrix, plan.replicas))
    assert sustained_rate(matrix, plan.replicas, uniform_weights(matrix, plan.replicas)) <= plan.predicted_rate + 1e-9


@pytest.mark.parametrize("seed", range(25))
def test_min_cost_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    matrix, devices = _random_case(rng)
    prices = {d: float(rng.choice([0.5, 1.0, 2.5, 4.0])) for d in matrix.device_types}
    feasible = [r for r in _allocations(matrix, devices) if r]
    if not feasible or max(_best_rate(matrix, r) for r in feasible) <= 0:
        return
    top = max(_best_rate(matrix, r) for r in feasible)
    target = float(rng.uniform(0.2, 0.9)) * top * 0.8
    cost = min(sum(n * prices[d] for (_, d), n in r.items())
               for r in feasible if _best_rate(matrix, r) * 0.8 >= target - 1e-9)
    plan = plan_min_cost(matrix, devices, prices, target, utilization=0.8)
    assert plan.cost == pytest.approx(cost)
    assert plan.predicted_rate * 0.8 >= target - 1e-6


def test_gavel_shape_fast_devices_go_to_the_stage_that_gains_most():
    # stage a gains 10x on the fast type, stage b only 1.2x: the one fast device goes to a
    matrix = ThroughputMatrix.from_dict({"a": {"fast": 40.0, "slow": 4.0}, "b": {"fast": 12.0, "slow": 10.0}},
                                        {"a": 1.0, "b": 1.0})
    plan = plan_max_rate(matrix, {"fast": 1, "slow": 3})
    assert plan.replicas == {("a", "fast"): 1, ("b", "slow"): 3}
    assert plan.predicted_rate == pytest.approx(30.0)  # b: 3 x 10; giving b the fast device: 12
    assert plan.weights["a"] == {"fast": 1.0}


def test_capacity_split_beats_uniform_on_the_same_replicas():
    matrix = ThroughputMatrix.from_dict({"model": {"fast": 30.0, "slow": 10.0}}, {"model": 1.0})
    replicas = {("model", "fast"): 1, ("model", "slow"): 2}
    aware = capacity_weights(matrix, replicas)
    assert aware["model"] == pytest.approx({"fast": 0.6, "slow": 0.4})
    assert sustained_rate(matrix, replicas, aware) == pytest.approx(50.0)
    # uniform: each replica a third of the traffic: the slow ones saturate at 3 x 10
    assert sustained_rate(matrix, replicas, uniform_weights(matrix, replicas)) == pytest.approx(30.0)


def test_visits_scale_the_stage_that_sees_fewer_calls():
    matrix = ThroughputMatrix.from_dict({"cheap": {"cpu": 20.0}, "expensive": {"cpu": 5.0}},
                                        {"cheap": 1.0, "expensive": 0.25})
    plan = plan_max_rate(matrix, {"cpu": 2})
    assert plan.replicas == {("cheap", "cpu"): 1, ("expensive", "cpu"): 1}
    assert plan.predicted_rate == pytest.approx(20.0)


def test_max_rate_prefers_the_cheaper_plan_at_the_same_rate():
    matrix = ThroughputMatrix.from_dict({"m": {"fast": 10.0, "slow": 10.0}, "n": {"fast": 100.0, "slow": 0.0}},
                                        {"m": 1.0, "n": 1.0})
    plan = plan_max_rate(matrix, {"fast": 2, "slow": 1}, prices={"fast": 3.0, "slow": 1.0})
    # m is capped by... n needs one fast replica; m gets the other fast and the slow one: 20/s
    assert plan.predicted_rate == pytest.approx(20.0)
    assert plan.replicas[("n", "fast")] == 1


def test_min_cost_refuses_an_unreachable_target_naming_the_limit():
    matrix = ThroughputMatrix.from_dict({"m": {"fast": 10.0}}, {"m": 1.0})
    with pytest.raises(ValueError, match="sustain at most 16"):
        plan_min_cost(matrix, {"fast": 2}, {"fast": 1.0}, 50.0, utilization=0.8)


@pytest.mark.parametrize("bad, message", [
    (lambda: ThroughputMatrix(("a",), ("d",), np.array([[1.0, 2.0]]), (1.0,)), "shape"),
    (lambda: ThroughputMatrix(("a",), ("d",), np.array([[-1.0]]), (1.0,)), ">= 0"),
    (lambda: ThroughputMatrix(("a",), ("d",), np.array([[0.0]]), (1.0,)), "runs on no device"),
    (lambda: ThroughputMatrix.from_dict({"a": {"d": 1.0}}, {}), "visits missing"),
    (lambda: plan_max_rate(ThroughputMatrix.from_dict({"a": {"d": 1.0}}, {"a": 1}), {"e": 1}), "not in the"),
    (lambda: plan_max_rate(ThroughputMatrix.from_dict({"a": {"d": 1.0}}, {"a": 1}), {"d": 1.5}), "whole number"),
    (lambda: plan_min_cost(ThroughputMatrix.from_dict({"a": {"d": 1.0}}, {"a": 1}), {"d": 1}, {}, 1.0),
     "no price"),
    (lambda: plan_min_cost(ThroughputMatrix.from_dict({"a": {"d": 1.0}}, {"a": 1}), {"d": 1}, {"d": 1}, 0.0),
     "target_rate"),
    (lambda: WeightedRouter({"a": 0.0}), "positive weight"),
])
def test_bad_input_is_refused_with_a_message(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_weighted_router_keeps_shares_within_one_pick():
    router = WeightedRouter({"fast": 0.6, "slow": 0.4})
    picks = [router.pick() for _ in range(1000)]
    for n in (5, 17, 100, 1000):
        counts = Counter(picks[:n])
        assert abs(counts["fast"] - 0.6 * n) <= 1.0
    # excluding a target sends everything to the others
    assert {router.pick(exclude=["fast"]) for _ in range(10)} == {"slow"}


def test_a_replica_key_names_its_deployment():
    from serving.emulation.hetero_app import deployment_name, key_deployment

    assert key_deployment("tiers", "cheap@spot_0/1") == deployment_name("tiers", "cheap", "spot_0", 1)


def test_a_plan_that_survives_a_lost_device_type_matches_brute_force():
    """plan_max_rate with ``survive_loss_of``: the best rate held with any one of those device
    types gone, checked against every allocation; an unknown device type is refused by name."""
    from serving.planning.hetero import rate_after_loss

    matrix = ThroughputMatrix.from_dict({"a": {"fast": 40.0, "slow": 10.0}, "b": {"fast": 20.0, "slow": 20.0}},
                                        {"a": 1.0, "b": 1.0})
    devices = {"fast": 3, "slow": 3}
    plan = plan_max_rate(matrix, devices, survive_loss_of=["slow"])
    best = max(rate_after_loss(matrix, x, "slow") for x in _allocations(matrix, devices))
    assert rate_after_loss(matrix, plan.replicas, "slow") == pytest.approx(best)
    with pytest.raises(ValueError, match=r"survive_loss_of: device types \['gpu'\]"):
        plan_max_rate(matrix, devices, survive_loss_of=["gpu"])
    with pytest.raises(ValueError, match="surge_utilization"):
        plan_min_cost(matrix, devices, {"fast": 1.0, "slow": 1.0}, 10.0, survive_loss_of=["slow"], surge_utilization=0)
