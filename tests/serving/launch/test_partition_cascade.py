"""A cascade whose expensive level is a torch module group (willump.module_feature): serving
sees the module, places it with the stage that computes it, and asks for a GPU for that stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.core.specs import StageSpec, stage_specs
from serving.launch.deploy import _use_gpu
from serving.runtime.stage_runner import StageRunner, module_groups, place_models

from .module_cascade import optimized_with, rows

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray


def _optimized():
    torch.manual_seed(0)
    return optimized_with(torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)))


@pytest.fixture(scope="module")
def optimized():
    return _optimized()


def test_the_expensive_stage_is_the_one_computing_the_module(optimized):
    opt, _ = optimized
    cheap, expensive = stage_specs(opt)
    assert module_groups(opt, cheap) == []
    assert module_groups(opt, expensive) == ["deep"]
    assert module_groups(opt, StageSpec("baseline", 0, len(opt.levels) - 1)) == ["deep"]


def test_module_groups_follow_the_replica_device(optimized):
    opt, deep = optimized
    assert place_models(opt, "cpu", "native") == []  # already there: nothing moved
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="no GPU"):
            notes = place_models(opt, "gpu", "native")
        assert notes == [] and deep.device == "cpu"
    else:  # pragma: no cover - no GPU on the project machine
        assert "module group deep: torch on cuda" in place_models(opt, "gpu", "native")
        assert next(deep.module.parameters()).is_cuda
        place_models(opt, "cpu", "native")


def test_a_module_stage_may_ask_for_a_gpu(optimized):
    opt, _ = optimized
    specs = stage_specs(opt)
    use, notes = _use_gpu(opt, specs, "gpu", "native", 1.0)
    assert use and notes == []
    assert _use_gpu(opt, specs, "auto", "native", 1.0)[0]
    assert not _use_gpu(opt, specs, "auto", "native", 0.0)[0]


def test_stages_answer_like_the_cascade(optimized):
    opt, _ = optimized
    X, _ = rows(400, 7)
    cheap, expensive = stage_specs(opt)
    first = StageRunner(opt, cheap).run(X)
    want_proba, want_level = opt.predict_with_levels(X)
    unsure = first["unsure"]
    assert 0 < len(unsure) < len(X)
    rest = StageRunner(opt, expensive).run(X.iloc[unsure].reset_index(drop=True), first.get("blocks"))
    proba = first["proba"].copy()
    proba[unsure] = rest["proba"]
    np.testing.assert_allclose(proba, want_proba, atol=1e-6)
    assert np.array_equal(np.where(np.isin(np.arange(len(X)), unsure), 1, 0), want_level)


def test_stage_canaries_run_one_row_and_name_a_broken_stage(optimized):
    """The replicas' health check: one sample row through the stage on its device."""
    opt, deep = optimized
    cheap, expensive = stage_specs(opt)
    assert StageRunner(opt, cheap).canary()["canary"] == "ok"
    runner = StageRunner(opt, expensive)
    assert runner.canary()["canary"] == "ok"
    module = deep.module

    class Broken(torch.nn.Module):  # a stage whose device can no longer compute
        def forward(self, x):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    deep.module = Broken()
    try:
        with pytest.raises(RuntimeError, match="stage expensive: the canary row failed.*illegal memory"):
            runner.canary()
        assert StageRunner(opt, cheap).canary()["canary"] == "ok"  # the cheap stage never runs the module
    finally:
        deep.module = module


def test_stages_a_gpu_will_time_are_not_timed_on_the_cpu(optimized):
    """deploy(device="gpu") times the GPU stages on the GPU only: the CPU profile skips them."""
    from serving.measure.stages import profile_stages

    opt, _ = optimized
    X, _ = rows(64, 5)
    kept = profile_stages(opt, X, batch_sizes=(4,), repeats=1, skip=["expensive"])
    assert [p.name for p in kept] == ["cheap"]


@pytest.mark.parametrize("baseline", [False, True])
def test_deploy_times_gpu_stages_on_the_gpu_only_and_the_baseline_too(optimized, monkeypatch, baseline):
    """make_plan: the stages a GPU runs are skipped by the CPU profiler and timed in GPU actors;
    the full-pipeline baseline goes on the GPU as well, so cascade and baseline compare on one device."""
    import serving.launch.deploy as d
    from serving.core.nodes import within_gpus
    from serving.core.profiles import NodeSpec, StageProfile
    from serving.launch.graph import specs_of

    opt, _ = optimized
    calls: dict = {}

    def cpu_profiles(source, *, skip=(), **_):
        calls["skip"] = list(skip)
        names = [s.name for s in specs_of(opt, baseline) if s.name not in skip]
        return [StageProfile(n, {1: 0.001}, 1.0) for n in names], None

    def gpu_profile(source, spec, scale, *, runtime, gpus):
        calls.setdefault("gpu", []).append((spec.name, scale))
        calls["gpus"] = gpus
        return StageProfile(spec.name, {1: 0.001}, scale, "gpu")

    monkeypatch.setattr(d, "profile_on_cluster", cpu_profiles)
    monkeypatch.setattr(d, "profile_gpu_stage", gpu_profile)
    monkeypatch.setattr(d, "plan_layouts", lambda profiles, whole, *a, **k: profiles)
    specs = specs_of(opt, baseline)
    # the app may use half of the node's GPU (deploy(gpus=0.5)): the profiling stays within it
    nodes = within_gpus([NodeSpec("n", "h", 2.0, 1.0)], 0.5)
    profiles = d.make_plan(opt, None, specs, nodes, None, cpus=2, use_gpu=True, baseline=baseline, runtime="native",
                           rps=None, p99_ms=None, rows_per_request=8, monitor=None, layout="fused")
    assert [p.name for p in profiles] == [s.name for s in specs]
    assert calls["gpus"] == 0.5
    if baseline:
        assert calls["skip"] == ["baseline"] and calls["gpu"] == [("baseline", 1.0)]
    else:
        assert calls["skip"] == ["expensive"] and [n for n, _ in calls["gpu"]] == ["expensive"]
    assert [p.device for p in profiles] == (["gpu"] if baseline else ["cpu", "gpu"])


def _answers_like_in_process(app, opt) -> None:
    import requests

    X, _ = rows(64, 11)
    r = requests.post(app.url + "/predict", json={"rows": X.to_dict("records")}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    want_proba, want_level = opt.predict_with_levels(X)
    np.testing.assert_allclose(np.asarray(body["probabilities"]), want_proba, atol=1e-6)
    assert body["level"] == want_level.tolist() and 0 < sum(body["level"]) < len(X)


def test_served_cascade_answers_like_in_process(ray_cluster, optimized):
    """Served through Ray Serve: the cheap level in the ingress, the module group in the
    expensive stage; then the same plan with that stage on a (logical) GPU: its replicas ask
    Ray for one and place the module there, which stays on the CPU when torch sees no CUDA
    device (a device choice, not a fork). The second deploy reuses the plan: no profiling."""
    from dataclasses import replace

    from serving import deploy

    opt, _ = optimized
    app = deploy(opt, name="module-cascade", port=ray_cluster, cpus=2, device="cpu", calibrate="never",
                 insitu="never", layout="fused")
    try:
        assert {s.name: s.device for s in app.plan.stages}["expensive"] == "cpu"
        _answers_like_in_process(app, opt)
        import requests

        ready = requests.get(app.url + "/readyz", timeout=60)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ready"
        assert {k: v["canary"] for k, v in ready.json()["stages"].items()} == {"cheap": "ok", "expensive": "ok"}
        plan = app.plan
    finally:
        app.shutdown(stop_ray=False)
    plan = replace(plan, stages=[replace(s, device="gpu", num_gpus=1.0) if s.name == "expensive" else s
                                 for s in plan.stages])
    app = deploy(opt, name="module-cascade-gpu", port=ray_cluster, plan=plan, calibrate="never", insitu="never")
    try:
        _answers_like_in_process(app, opt)
    finally:
        app.shutdown(stop_ray=False)
