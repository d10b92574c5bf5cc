"""Where a cascade's levels run: the whole cascade in the ingress against its expensive stage
apart (plan_layouts, deterministic costs), which stages run inline, and the specs a plan implies."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from serving.core.profiles import StageProfile
from serving.core.specs import WHOLE_STAGE, StageSpec, whole_cascade
from serving.planning.planner import Resources, plan_layouts
from tests.serving.planning.test_planner import costs, ingress, linear


def _cascade(whole_per_row_s: float) -> tuple[list[StageProfile], StageProfile]:
    cheap = linear("cheap", 0.0, 0.00005)
    expensive = linear("expensive", 0.0001, 0.001, scale=0.02)
    return [cheap, expensive], linear(WHOLE_STAGE, 0.0, whole_per_row_s)


def test_auto_keeps_the_whole_cascade_where_hops_cost_more_than_the_expensive_rows():
    split, whole = _cascade(0.00005 + 0.02 * 0.001)  # what the levels cost, merged: no hop
    hops = costs(2.0, hop_caller_ms=3.0, hop_callee_ms=3.0)
    plan = plan_layouts(split, whole, Resources(cpus=2), layout="auto", rows_per_request=32, ingress=ingress(),
                        costs=hops)
    assert [s.name for s in plan.stages] == [WHOLE_STAGE] and plan.layout == "fused"
    fused = plan_layouts(split, whole, Resources(cpus=2), layout="fused", rows_per_request=32, ingress=ingress(),
                         costs=hops)
    assert plan.max_rows_per_s > fused.max_rows_per_s
    assert any(n.startswith("layout: every level in the ingress") and f"{fused.max_rows_per_s:.0f}" in n
               for n in plan.notes), plan.notes


def test_auto_keeps_the_expensive_stage_apart_where_merging_costs_more():
    split, whole = _cascade(0.002)  # merged, the expensive level runs on tiny batches: slower
    plan = plan_layouts(split, whole, Resources(cpus=2), layout="auto", rows_per_request=32, ingress=ingress(),
                        costs=costs(2.0))
    assert [s.name for s in plan.stages] == ["cheap", "expensive"] and plan.layout == "fused"
    assert any(n.startswith("layout: the expensive stage a deployment of its own") for n in plan.notes)


def test_explicit_layouts_plan_as_asked_and_bad_ones_are_refused():
    split, whole = _cascade(0.0001)
    kwargs = dict(rows_per_request=32, ingress=ingress(), costs=costs(2.0))
    assert [s.name for s in plan_layouts(split, whole, Resources(cpus=2), layout="whole", **kwargs).stages] == [
        WHOLE_STAGE]
    staged = plan_layouts(split, whole, Resources(cpus=2), layout="staged", **kwargs)
    assert staged.layout == "staged" and not any(n.startswith("layout:") for n in staged.notes)
    with pytest.raises(ValueError, match="layout='whole' needs a cascade"):
        plan_layouts(split, None, Resources(cpus=2), layout="whole", **kwargs)
    with pytest.raises(ValueError, match="layout must be one of"):
        plan_layouts(split, whole, Resources(cpus=2), layout="tiled", **kwargs)
    # no whole profile (a GPU stage): auto is the split cascade, fused
    assert plan_layouts(split, None, Resources(cpus=2), layout="auto", **kwargs).layout == "fused"


def test_cpu_bound_stages_run_inline_and_are_not_charged_thread_inflation():
    sizes = (1, 8, 64)
    busy = StageProfile("busy", {b: 0.001 * b for b in sizes}, cpu_seconds={b: 0.00095 * b for b in sizes},
                        thread_inflation=1.5)
    waits = StageProfile("waits", {b: 0.001 * b for b in sizes}, cpu_seconds={b: 0.0002 * b for b in sizes},
                         thread_inflation=1.5)
    assert busy.runs_inline and busy.inflation(4) == 1.0
    assert not waits.runs_inline and waits.inflation(4) == pytest.approx(1.5)
    assert StageProfile("unmeasured", {1: 0.001}).runs_inline  # no CPU split measured: all of it is CPU
    assert not StageProfile("gpu", {1: 0.001}, device="gpu").runs_inline
    # CPU-bound but long (a deep model on CPU): its batches would hold the event loop, so threads
    deep = StageProfile("deep", {b: 0.01 * b for b in sizes}, cpu_seconds={b: 0.01 * b for b in sizes})
    assert not deep.runs_inline


def test_the_layout_deploy_plans_in():
    from serving.launch.deploy import _cascade_layout

    plan = types.SimpleNamespace(layout="fused")
    assert _cascade_layout("auto", None, False, None, False, False) == "auto"
    assert _cascade_layout("auto", None, False, 0, False, False) == "staged"  # autoscaling stages
    assert _cascade_layout("auto", None, False, None, True, False) == "fused"  # a GPU stage
    assert _cascade_layout("auto", None, False, None, False, True) == "fused"  # degrade or hedging
    assert _cascade_layout("staged", plan, False, None, False, False) == "fused"  # a given plan's own
    for whole_plan, min_replicas, gpu in ((None, 0, False), (None, None, True), (plan, 1, False)):
        with pytest.raises(ValueError, match="layout='whole'"):
            _cascade_layout("whole" if whole_plan is None else "auto", whole_plan, True, min_replicas, gpu, False)


class _Runner:
    def __init__(self):
        self.threads: list[int] = []

    def run(self, rows, blocks=None):
        self.threads.append(threading.get_ident())
        return {"proba": [[0.5, 0.5]], "level": [0], "unsure": [], "blocks": None, "seconds": 0.0}


@pytest.mark.parametrize("inline", [True, False])
def test_a_stage_replica_runs_inline_on_its_event_loop_or_in_a_thread(inline):
    from serving.runtime.replicas import ModelStage

    runner = _Runner()
    stage = ModelStage.func_or_class(None, None, runner=runner, batching=False, inline=inline)

    async def call() -> int:
        await stage.run(types.SimpleNamespace(), None)
        return threading.get_ident()

    loop_thread = asyncio.run(call())
    assert (runner.threads == [loop_thread]) is inline


def test_specs_follow_the_plan():
    from serving.launch.graph import specs_of

    opt = types.SimpleNamespace(levels=[object(), object(), object()])
    assert whole_cascade(opt) == [StageSpec(WHOLE_STAGE, 0, 2)]
    plan = types.SimpleNamespace(stages=[types.SimpleNamespace(name=WHOLE_STAGE)])
    assert specs_of(opt, False, plan) == [StageSpec(WHOLE_STAGE, 0, 2)]
    assert [s.name for s in specs_of(opt, False)] == ["cheap", "expensive"]
    assert specs_of(opt, True, plan) == [StageSpec("baseline", 0, 2)]
