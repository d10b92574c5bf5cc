"""The tier planner (serving.planning.tiers): the cheapest mix of reliable and transient replicas that
holds the target normally and with any one transient pool lost, checked against brute force;
one pool forces reliable capacity to hold the target alone, several pools need less; bad
input is refused naming the argument. Plain Python."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from serving.planning.tiers import all_reliable_cost, plan_tiers


def _holds(rates, visits, target, reliable, transient, pools, util=0.8, surge=0.95):
    for s in rates:
        need = target * visits[s] / rates[s]
        t = {p: transient.get((s, p), 0) for p in pools}
        if reliable[s] + sum(t.values()) < need / util - 1e-9:
            return False
        for lost in pools:
            if reliable[s] + sum(v for p, v in t.items() if p != lost) < need / surge - 1e-9:
                return False
    return all(sum(transient.get((s, p), 0) for s in rates) <= n for p, n in pools.items())


@pytest.mark.parametrize("seed", range(20))
def test_plan_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    stages = [f"s{i}" for i in range(int(rng.integers(1, 3)))]
    rates = {s: float(rng.uniform(5, 30)) for s in stages}
    visits = {s: float(rng.choice([1.0, 0.5])) for s in stages}
    pools = {f"p{j}": int(rng.integers(0, 4)) for j in range(int(rng.integers(1, 3)))}
    target = float(rng.uniform(5, 40))
    pr, pt = 1.0, float(rng.choice([0.2, 0.3, 0.6]))
    plan = plan_tiers(rates, visits, target, price_reliable=pr, price_transient=pt, pools=pools)
    assert _holds(rates, visits, target, plan.reliable, plan.transient, pools)
    best = np.inf
    max_r = {s: int(np.ceil(target * visits[s] / (0.8 * rates[s]))) + 1 for s in stages}
    keys = [(s, p) for s in stages for p in pools]
    for rel in itertools.product(*(range(max_r[s] + 1) for s in stages)):
        reliable = dict(zip(stages, rel, strict=True))
        for tr in itertools.product(*(range(pools[p] + 1) for _, p in keys)):
            transient = dict(zip(keys, tr, strict=True))
            if _holds(rates, visits, target, reliable, transient, pools):
                best = min(best, sum(rel) * pr + sum(tr) * pt)
    assert plan.cost == pytest.approx(best)
    assert plan.cost <= plan.all_reliable_cost + 1e-9


def test_one_pool_needs_reliable_capacity_for_the_whole_target_several_pools_less():
    rates, visits = {"m": 10.0}, {"m": 1.0}
    one = plan_tiers(rates, visits, 38.0, price_reliable=1.0, price_transient=0.3, pools={"a": 8})
    assert one.reliable["m"] == 4  # 38 / (0.95 * 10) = 4: reliable alone holds the target at surge
    three = plan_tiers(rates, visits, 38.0, price_reliable=1.0, price_transient=0.3,
                       pools={"a": 3, "b": 3, "c": 3})
    assert three.reliable["m"] < one.reliable["m"] and three.cost < one.cost
    assert all_reliable_cost(rates, visits, 38.0, 1.0) == 5.0  # ceil(38 / 8)
    assert three.cost_vs_reliable < 1.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(rates={"m": 0.0}), "rates must be > 0"),
    (dict(visits={"x": 1.0}), "same stages"),
    (dict(target_rate=-1.0), "target_rate"),
    (dict(pools={"a": 1.5}), "whole numbers"),
    (dict(utilization=1.5), "utilization"),
])
def test_bad_input_is_refused(kwargs, message):
    args = dict(rates={"m": 10.0}, visits={"m": 1.0}, target_rate=5.0, price_reliable=1.0, price_transient=0.3,
                pools={"a": 2})
    args.update(kwargs)
    rates, visits, target = args.pop("rates"), args.pop("visits"), args.pop("target_rate")
    with pytest.raises(ValueError, match=message):
        plan_tiers(rates, visits, target, **args)


def test_a_tier_plan_deploys_reliable_and_pool_replicas_weighted_by_count():
    from serving.planning.tiers import TierPlan, deployment_of

    plan = TierPlan({"cheap": 1, "expensive": 0}, {("cheap", "spot_0"): 2, ("expensive", "spot_0"): 1,
                                                   ("expensive", "spot_1"): 1}, 2.2, 3.0)
    replicas, weights = deployment_of(plan, "fast")
    assert replicas == {("cheap", "fast"): 1, ("cheap", "spot_0"): 2, ("expensive", "spot_0"): 1,
                        ("expensive", "spot_1"): 1}
    assert weights == {"cheap": {"fast": 1.0, "spot_0": 2.0}, "expensive": {"spot_0": 1.0, "spot_1": 1.0}}
    with pytest.raises(ValueError, match="no replica"):
        deployment_of(TierPlan({"cheap": 0}, {}, 0.0, 1.0), "fast")
