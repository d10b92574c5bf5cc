"""Node pools in deploy's apps, the planning half (no Ray): the pools' spec, the LP over rates
measured per (stage, pool), the plan's record of it, and what cannot be placed."""

from __future__ import annotations

import pytest

from serving.core.profiles import NodeSpec, StageProfile
from serving.core.specs import StageSpec
from serving.launch.pools import place_on_pools
from serving.planning.planner import Plan, StagePlan
from serving.planning.pools import (
    PoolSpec,
    check_pools,
    off_preemptible,
    outside_pools,
    place_pools,
    plan_pools,
    pool_slots,
    pools_entry,
    specs_of_entry,
)

POOLS = {"fast": {"labels": {"pool": "fast"}}, "slow": {"resources": ["slow_pool"], "price": 0.25, "max_replicas": 3}}


def test_pools_are_read_and_named():
    fast, slow = check_pools(POOLS)
    assert fast == PoolSpec("fast", {"pool": "fast"}) and fast.actor_options() == {"label_selector": {"pool": "fast"}}
    assert slow.max_replicas == 3 and slow.price == 0.25
    assert slow.actor_options() == {"resources": {"slow_pool": 0.001}}
    assert fast.holds({"pool": "fast"}, {}) and not fast.holds({"pool": "slow"}, {"slow_pool": 1})
    assert slow.holds({}, {"slow_pool": 1.0}) and not slow.holds({"pool": "fast"}, {})


@pytest.mark.parametrize(("pools", "named"), [
    ({"fast": {"labels": {"pool": "fast"}}}, "two or more"),
    ("fast", "two or more"),
    ({"Fast": {"labels": {"a": "b"}}, "slow": {"labels": {"a": "c"}}}, "pools['Fast']"),
    ({"fast": {}, "slow": {"labels": {"a": "c"}}}, "no labels and no resources"),
    ({"fast": {"labels": {"a": 1}}, "slow": {"labels": {"a": "c"}}}, "pools['fast']['labels']"),
    ({"fast": {"resources": "gpu_pool"}, "slow": {"labels": {"a": "c"}}}, "pools['fast']['resources']"),
    ({"fast": {"labels": {"a": "b"}, "max_replicas": -1}, "slow": {"labels": {"a": "c"}}}, "max_replicas"),
    ({"fast": {"labels": {"a": "b"}, "price": "cheap"}, "slow": {"labels": {"a": "c"}}}, "price"),
    ({"fast": {"labels": {"a": "b"}, "nodes": 2}, "slow": {"labels": {"a": "c"}}}, "unknown keys ['nodes']"),
    ({"fast": {"labels": {"a": "!b"}}, "slow": {"labels": {"a": "in(c,d)"}}}, "selector syntax"),
    ({"fast": {"labels": {"a": "b"}, "preemptible": "yes"}, "slow": {"labels": {"a": "c"}}}, "['preemptible']"),
])
def test_bad_pools_are_refused_by_name(pools, named):
    with pytest.raises(ValueError, match="pools") as err:
        check_pools(pools)
    assert named in str(err.value)


def test_slots_are_free_cpus_over_a_replica_at_most_the_cap():
    pools = check_pools(POOLS)
    assert pool_slots(pools, {"fast": 2.0, "slow": 4.0}, 0.5) == {"fast": 4, "slow": 3}


def test_the_lp_puts_the_expensive_stage_where_it_runs_fastest():
    """Two stages, two pools: the cheap stage costs the same on both, the expensive one is four
    times as fast on "fast"; the LP gives "fast" to the expensive stage."""
    pools = check_pools({"fast": {"labels": {"p": "f"}}, "slow": {"labels": {"p": "s"}}})
    rates = {"cheap": {"fast": 1000.0, "slow": 1000.0}, "expensive": {"fast": 400.0, "slow": 100.0}}
    visits = {"cheap": 1.0, "expensive": 0.5}
    plan = plan_pools(rates, visits, {"fast": 2, "slow": 2}, pools)
    assert plan.replicas.get(("expensive", "fast"), 0) == 2 and plan.replicas.get(("cheap", "slow"), 0) >= 1
    # the whole graph's rate: the expensive stage's 800 rows/s over its 0.5 visits
    assert plan.predicted_rate == pytest.approx(1600.0)
    entry = pools_entry(pools, rates, plan, {"fast": ["n1"], "slow": ["n2"]}, {"fast": 2, "slow": 2})
    assert entry["replicas"]["expensive"] == {"fast": 2}
    assert entry["specs"]["fast"]["labels"] == {"p": "f"}


def test_a_stage_no_row_reaches_still_gets_a_replica_and_no_plan_names_the_pools():
    pools = check_pools({"fast": {"labels": {"p": "f"}}, "slow": {"labels": {"p": "s"}}})
    rates = {"cheap": {"fast": 1000.0, "slow": 500.0}, "expensive": {"fast": 400.0, "slow": 100.0}}
    plan = plan_pools(rates, {"cheap": 1.0, "expensive": 0.0}, {"fast": 2, "slow": 2}, pools)
    assert sum(n for (s, _), n in plan.replicas.items() if s == "expensive") >= 1
    with pytest.raises(ValueError, match=r"pools: no plan on slots \{'fast': 1, 'slow': 0\}"):
        plan_pools(rates, {"cheap": 1.0, "expensive": 0.5}, {"fast": 1, "slow": 0}, pools)


def test_a_target_rate_buys_the_cheapest_replicas():
    pools = check_pools({"fast": {"labels": {"p": "f"}, "price": 1.0}, "slow": {"labels": {"p": "s"}, "price": 0.2}})
    rates = {"expensive": {"fast": 400.0, "slow": 100.0}}
    plan = plan_pools(rates, {"expensive": 1.0}, {"fast": 4, "slow": 4}, pools, target_rows_s=150, utilization=0.75)
    # 150 rows/s at 75%: 200 rows/s of capacity; two slow replicas (0.4) beat one fast one (1.0)
    assert plan.replicas == {("expensive", "slow"): 2}
    with pytest.raises(ValueError, match=r"pools: .*at rps x rows_per_request = 1000 rows/s.*cannot be covered"):
        plan_pools(rates, {"expensive": 1.0}, {"fast": 1, "slow": 1}, pools, target_rows_s=1000)


def test_replicas_that_do_not_fit_the_pools_nodes_are_named():
    entry = {"replicas": {"expensive": {"fast": 3}}, "nodes": {"fast": ["a", "b"]}}
    assert place_pools(entry, {"a": 1.0, "b": 0.5, "c": 8.0}, {"expensive": 0.5}) == {"expensive": {"a": 2, "b": 1}}
    problem = place_pools(entry, {"a": 0.5, "b": 0.5, "c": 8.0}, {"expensive": 0.5})
    assert "replica 3 of 3 of stage 'expensive' on pool 'fast'" in problem


def _plan() -> Plan:
    stages = [StagePlan("cheap", 1, 32, 0.002, 4, 0.5, 0.0, "cpu", 1000.0, None),
              StagePlan("expensive", 1, 32, 0.002, 4, 0.5, 0.0, "cpu", 200.0, None)]
    return Plan(stages, 32, None, None, 0.5, 0.0, 1000.0, layout="fused",
                profiles=[StageProfile("cheap", {32: 0.01}), StageProfile("expensive", {32: 0.05}, scale=0.25)])


def test_a_plan_placed_on_pools_keeps_what_it_was_made_from():
    """place_on_pools with the nodes and rates given (what deploy measures on the cluster)."""
    pools = check_pools({"fast": {"labels": {"p": "f"}}, "slow": {"labels": {"p": "s"}, "max_replicas": 1}})
    nodes = [NodeSpec("head", "h", 2.0, head=True), NodeSpec("worker", "h", 2.0)]
    plan = _plan()
    specs = [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)]
    note = place_on_pools(plan, None, specs, pools, nodes, target_rows_s=None,
                          node_pools={"fast": ["head"], "slow": ["worker"]},
                          rates={"expensive": {"fast": 300.0, "slow": 100.0}})
    # the ingress (0.5 CPU) goes to the head first: 3 slots of 0.5 there, 1 (the cap) on the worker
    assert plan.pools["slots"] == {"fast": 3, "slow": 1}
    assert plan.pools["replicas"] == {"expensive": {"fast": 3, "slow": 1}}
    assert plan.stage("expensive").replicas == 4 and plan.stage("expensive").capacity_rows_s == 1000.0
    assert plan.pools["predicted_rows_s"] == pytest.approx(1000.0 / 0.25)
    assert "3 on fast, 1 on slow" in note and note in plan.notes
    again = Plan.from_dict(plan.to_dict())
    assert again.pools == plan.pools
    assert "on pool fast: 3 replica(s), 300 rows/s each" in str(again)


def test_pools_without_nodes_or_sharing_one_are_refused():
    pools = check_pools({"fast": {"labels": {"p": "f"}}, "slow": {"labels": {"p": "s"}}})
    nodes = [NodeSpec("head", "h", 2.0, head=True), NodeSpec("worker", "h", 2.0)]
    rates = {"expensive": {"fast": 300.0, "slow": 100.0}}
    specs = [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)]
    with pytest.raises(ValueError, match=r"pools\['slow'\]: no live node"):
        place_on_pools(_plan(), None, specs, pools, nodes, target_rows_s=None,
                       node_pools={"fast": ["head"], "slow": ["gone"]}, rates=rates)
    with pytest.raises(ValueError, match="a node is in one pool"):
        place_on_pools(_plan(), None, specs, pools, nodes, target_rows_s=None,
                       node_pools={"fast": ["head"], "slow": ["head", "worker"]}, rates=rates)
    whole = _plan()
    whole.layout, whole.stages = "fused", whole.stages[:1]
    with pytest.raises(ValueError, match="layout 'fused' runs every stage in the ingress"):
        place_on_pools(whole, None, specs[:1], pools, nodes, target_rows_s=None,
                       node_pools={"fast": ["head"], "slow": ["worker"]}, rates=rates)


def test_a_serve_config_of_a_plan_on_pools_has_a_deployment_per_pool(synth_opt, tmp_path):
    """serve_config (what `willump build` writes) carries the plan's pools: one deployment per
    (stage, pool), pinned by the pool's label selector or resource, with the LP's replicas."""
    from serving.launch.config import plan_offline, serve_config
    from serving.launch.graph import deployment_overrides

    plan = plan_offline(synth_opt, cpus=4, rows_per_request=32, rps=None, p99_ms=None, layout="fused", monitor=None)
    pools = check_pools({"fast": {"labels": {"p": "f"}, "max_replicas": 2}, "slow": {"resources": ["slow_pool"]}})
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, len(synth_opt.levels) - 1)],
                   pools, [NodeSpec("head", "h", 16.0, head=True), NodeSpec("worker", "h", 16.0)], target_rows_s=None,
                   node_pools={"fast": ["head"], "slow": ["worker"]},
                   rates={"expensive": {"fast": 3000.0, "slow": 1000.0}})
    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    config = serve_config(artifact, plan, name="pooled")
    app = next(a for a in config["applications"] if a["name"] == "pooled")
    by_name = {d["name"]: d for d in app["deployments"]}
    assert "pooled-expensive" not in by_name
    assert set(by_name) == {"pooled-ingress", "pooled-expensive-fast", "pooled-expensive-slow"}, (by_name, plan.pools)
    fast, slow = by_name["pooled-expensive-fast"], by_name["pooled-expensive-slow"]
    assert fast["num_replicas"] == 2 and fast["ray_actor_options"]["label_selector"] == {"p": "f"}
    assert slow["num_replicas"] == plan.pools["replicas"]["expensive"]["slow"] >= 1
    assert slow["ray_actor_options"]["resources"] == {"slow_pool": 0.001}
    assert deployment_overrides(app["args"], synth_opt) == app["deployments"]


def test_a_preemptible_pool_makes_a_tier_plan_that_holds_the_rate_without_it():
    """Proteus/Tributary through the pools: a reliable pool and a cheaper preemptible one that
    vanishes as a whole. The cheapest plan for 150 rows/s buys only spot replicas; marked
    preemptible, the reliable pool must cover the target alone at the surge utilization, and
    the spot replicas carry the rest at the planner's headroom."""
    pools = {"ondemand": {"labels": {"p": "od"}, "price": 1.0}, "spot": {"labels": {"p": "sp"}, "price": 0.3}}
    rates = {"expensive": {"ondemand": 100.0, "spot": 100.0}}
    slots = {"ondemand": 4, "spot": 4}
    plain = plan_pools(rates, {"expensive": 1.0}, slots, check_pools(pools), target_rows_s=150, utilization=0.75)
    assert plain.replicas == {("expensive", "spot"): 2}  # 200 rows/s of the cheaper replicas
    pools["spot"]["preemptible"] = True
    specs = check_pools(pools)
    tiered = plan_pools(rates, {"expensive": 1.0}, slots, specs, target_rows_s=150, utilization=0.75)
    # without spot: ondemand alone covers 150 at 0.95 -> 2 replicas; both pools at 0.75 -> 200 rows/s
    assert tiered.replicas == {("expensive", "ondemand"): 2}
    assert any("spot lost" in n for n in tiered.notes)
    entry = pools_entry(specs, rates, tiered, {"ondemand": ["a"], "spot": ["b"]}, slots)
    assert entry["after_loss_rows_s"] == {"spot": pytest.approx(200.0)}
    assert entry["specs"]["spot"]["preemptible"] is True
    # a target the reliable pool cannot hold through a loss is refused, naming what it holds
    with pytest.raises(ValueError, match=r"with any one of \['spot'\] lost.*hold at most 400/s"):
        plan_pools(rates, {"expensive": 1.0}, slots, specs, target_rows_s=600, utilization=0.75)


def test_without_a_target_the_rate_held_through_a_loss_is_maximized():
    """Two preemptible pools and no reliable one: each must hold the rate alone. Without tiers
    the LP fills both pools; with them it keeps the rate each alone holds and frees the rest."""
    pools = check_pools({"a": {"labels": {"p": "a"}, "preemptible": True},
                         "b": {"labels": {"p": "b"}, "preemptible": True}})
    rates = {"cheap": {"a": 1000.0, "b": 1000.0}, "expensive": {"a": 300.0, "b": 100.0}}
    visits = {"cheap": 1.0, "expensive": 1.0}
    plan = plan_pools(rates, visits, {"a": 3, "b": 3}, pools)
    held = min(pools_entry(pools, rates, plan, {"a": ["x"], "b": ["y"]}, {"a": 3, "b": 3})
               ["after_loss_rows_s"].values())
    # pool b alone: one cheap replica and two expensive ones at 100 -> 200 rows/s, the most b holds
    assert held == pytest.approx(200.0)
    # keeping that, the rate with both pools is as high as the slots allow: every slot used
    assert plan.predicted_rate == pytest.approx(800.0) and sum(plan.replicas.values()) == 6


def test_a_tier_plan_keeps_its_pools_through_the_plans_record():
    entry = {"specs": {"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}}}
    od, spot = specs_of_entry(entry)
    assert not od.preemptible and spot.preemptible


def test_the_request_path_is_kept_off_preemptible_pools_named_by_one_label():
    """A replica on a preemptible node goes with it, with every request in flight through it:
    the ingress and the monitor get a label selector excluding each preemptible pool named by
    one label (exactly that pool's nodes); pools Ray cannot exclude are named instead."""
    pools = check_pools({"od": {"labels": {"p": "od"}}, "sp1": {"labels": {"p": "s1"}, "preemptible": True},
                         "sp2": {"labels": {"p": "s2"}, "preemptible": True}})
    off = off_preemptible(pools)
    assert off.selector == {"p": "!in(s1,s2)"} and off.excluded_pools == ("sp1", "sp2") and off.note() is None
    one = off_preemptible(pools[:2])
    assert one.selector == {"p": "!s1"} and one.excluded_pools == ("sp1",)
    assert off_preemptible(pools[:1]).selector == {}
    loose = off_preemptible(check_pools({"od": {"labels": {"p": "od"}},
                                         "byres": {"resources": ["spot"], "preemptible": True},
                                         "two": {"labels": {"p": "t", "zone": "b"}, "preemptible": True}}))
    assert loose.selector == {} and loose.unexcludable == ("byres", "two")
    assert "['byres', 'two']" in loose.note() and "one label" in loose.note()
    assert outside_pools(["a", "b", "c"], ["sp1"], {"sp1": ["b"], "od": ["a"]}) == {"a", "c"}


def test_a_tier_plan_places_its_ingress_off_the_preemptible_pool():
    """place_on_pools counts the reliable pool's slots after the ingress pinned there, records
    the selector in the plan (which the ingress's and the monitor's Serve options carry), and
    falls back, with a note, where no node outside the preemptible pools holds the ingress."""
    from serving.launch.graph import off_spot
    from serving.launch.handover import pool_pins

    pools = check_pools({"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}})
    nodes = [NodeSpec("worker", "h", 2.0), NodeSpec("head", "h", 2.0, head=True)]
    rates = {"expensive": {"od": 100.0, "spot": 100.0}}
    plan = _plan()
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)], pools, nodes,
                   target_rows_s=None, node_pools={"od": ["head"], "spot": ["worker"]}, rates=rates)
    # the ingress (0.5 CPU) on the head, the reliable pool: 3 slots of 0.5 left there, 4 on spot
    assert plan.pools["slots"] == {"od": 3, "spot": 4}
    assert plan.pools["request_path"] == {"label_selector": {"p": "!sp"}, "off_pools": ["spot"]}
    assert off_spot(Plan.from_dict(plan.to_dict())) == {"label_selector": {"p": "!sp"}}
    assert "ingress and monitor kept off the preemptible pools spot" in str(plan)
    assert pool_pins("app", plan, ["head", "worker"])["app-ingress"] == {"head"}
    # no node outside the preemptible pools holds the ingress (a small head in no pool): it goes
    # where Serve puts it, and the plan says so
    both = check_pools({"a": {"labels": {"p": "a"}, "preemptible": True},
                        "b": {"labels": {"p": "b"}, "preemptible": True}})
    plan = _plan()
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)], both,
                   [NodeSpec("head", "h", 0.2, head=True), NodeSpec("w1", "h", 2.0), NodeSpec("w2", "h", 2.0)],
                   target_rows_s=None, node_pools={"a": ["w1"], "b": ["w2"]},
                   rates={"expensive": {"a": 100.0, "b": 100.0}})
    assert "request_path" not in plan.pools and off_spot(plan) == {}
    assert any("the ingress may run on the preemptible pools ['a', 'b']: no other node holds it" in n
               for n in plan.notes), plan.notes


def test_a_serve_config_of_a_tier_plan_runs_its_fronts_on_the_head_and_the_ingress_off_spot(synth_opt, tmp_path):
    """What `willump build`'s serve_config writes for a tier plan: Serve's HTTP proxies on the
    head only (a front on a preempted node takes its clients' connections), and the ingress's
    actor options excluding the preemptible pool; a plan without one keeps EveryNode."""
    from serving.launch.config import plan_offline, serve_config

    plan = plan_offline(synth_opt, cpus=4, rows_per_request=32, rps=None, p99_ms=None, layout="fused", monitor=None)
    artifact = tmp_path / "a.willump"
    synth_opt.save(artifact)
    assert serve_config(artifact, plan, name="plain")["proxy_location"] == "EveryNode"
    pools = check_pools({"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}})
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, len(synth_opt.levels) - 1)],
                   pools, [NodeSpec("head", "h", 16.0, head=True), NodeSpec("worker", "h", 16.0)], target_rows_s=None,
                   node_pools={"od": ["head"], "spot": ["worker"]},
                   rates={"expensive": {"od": 1000.0, "spot": 1000.0}})
    config = serve_config(artifact, plan, name="tiered", monitor={"attributes": []})
    assert config["proxy_location"] == "HeadOnly"
    app = next(a for a in config["applications"] if a["name"] == "tiered")
    ingress = next(d for d in app["deployments"] if d["name"] == "tiered-ingress")
    assert ingress["ray_actor_options"]["label_selector"] == {"p": "!sp"}
    # the monitor app the config names is built with the same selector, beside its pin to the head
    from serving.launch.graph import build_monitor

    monitor = next(a for a in config["applications"] if a["name"] == "tiered-monitor")
    options = vars(build_monitor(monitor["args"], synth_opt))["_bound_deployment"].ray_actor_options
    assert options["label_selector"] == {"p": "!sp"} and "resources" in options, options


def test_a_tier_plan_keeps_its_headroom_through_a_loss_unless_told_otherwise():
    """With a pool lost, the replicas left cover the rate at the plan's own utilization, so the
    latency it was planned for holds while the pool is away; 0.95 (the former rule) held only
    the rate: 180 rows/s at 0.75 needs 240 of capacity left, three on-demand replicas, where
    0.95 took two and a spot one."""
    pools = check_pools({"ondemand": {"labels": {"p": "od"}, "price": 1.0},
                         "spot": {"labels": {"p": "sp"}, "price": 0.3, "preemptible": True}})
    rates, slots = {"expensive": {"ondemand": 100.0, "spot": 100.0}}, {"ondemand": 4, "spot": 4}
    kept = plan_pools(rates, {"expensive": 1.0}, slots, pools, target_rows_s=180, utilization=0.75)
    assert kept.replicas == {("expensive", "ondemand"): 3}
    loose = plan_pools(rates, {"expensive": 1.0}, slots, pools, target_rows_s=180, utilization=0.75,
                       surge_utilization=0.95)
    assert loose.replicas == {("expensive", "ondemand"): 2, ("expensive", "spot"): 1}


def test_a_head_in_a_preemptible_pool_keeps_the_request_path_where_it_is():
    """The monitor keeps its state on the head: with the head in a preemptible pool no selector
    is recorded (it would leave the monitor nowhere to run), and the plan says why."""
    pools = check_pools({"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}})
    plan = _plan()
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)], pools,
                   [NodeSpec("head", "h", 2.0, head=True), NodeSpec("worker", "h", 2.0)], target_rows_s=None,
                   node_pools={"od": ["worker"], "spot": ["head"]}, rates={"expensive": {"od": 100.0, "spot": 100.0}})
    assert "request_path" not in plan.pools
    assert any("the head node is in one of them" in n for n in plan.notes), plan.notes


def test_the_pinned_ingress_is_where_the_plan_and_its_surge_check_see_it():
    """The plan's placement moves the ingress to where the pin puts it, and the surge a Serve
    config asks for (planned_surge) counts a replacement ingress on the reliable nodes only: the
    1.5-CPU reliable head holds the ingress, the reliable pool's replica and one replacement, not
    two, so no surge (unpinned, the ingress's replacement went to the spot worker: surge)."""
    from serving.launch.handover import planned_surge

    pools = check_pools({"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}})
    nodes = [NodeSpec("head", "h", 1.5, head=True), NodeSpec("worker", "h", 4.0)]
    plan = _plan()
    plan.nodes, plan.placement = nodes, {"ingress": {"worker": 1}}  # where the planner put it, unpinned
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)], pools, nodes,
                   target_rows_s=30, node_pools={"od": ["head"], "spot": ["worker"]},
                   rates={"expensive": {"od": 100.0, "spot": 100.0}})
    assert plan.pools["request_path"]["off_pools"] == ["spot"] and plan.pools["replicas"] == {"expensive": {"od": 1}}
    assert plan.placement["ingress"] == {"head": 1}
    assert planned_surge("app", plan) == 0


def test_a_plan_on_pools_given_again_is_checked_where_its_replicas_are_pinned():
    """placement_problem (deploy's check of a plan made elsewhere) places each (stage, pool)'s
    replicas on that pool's nodes and the ingress off the preemptible ones: room on the spot
    worker does not make the reliable pool's replicas fit."""
    from serving.planning.planner import placement_problem

    pools = check_pools({"od": {"labels": {"p": "od"}}, "spot": {"labels": {"p": "sp"}, "preemptible": True}})
    nodes = [NodeSpec("head", "h", 2.0, head=True), NodeSpec("worker", "h", 2.0)]
    plan = _plan()
    place_on_pools(plan, None, [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, 1)], pools, nodes,
                   target_rows_s=30, node_pools={"od": ["head"], "spot": ["worker"]},
                   rates={"expensive": {"od": 100.0, "spot": 100.0}})
    assert plan.pools["replicas"] == {"expensive": {"od": 1}}
    assert placement_problem(plan, nodes) is None
    crowded = [NodeSpec("head", "h", 0.6, head=True), NodeSpec("worker", "h", 8.0)]
    problem = placement_problem(plan, crowded)
    assert problem is not None and "'expensive on pool od'" in problem, problem
    gone = [NodeSpec("other", "h", 8.0, head=True)]  # a cluster without the plan's pool nodes
    assert "on pool od" in (placement_problem(plan, gone) or "")
