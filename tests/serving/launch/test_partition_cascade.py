"""A cascade whose expensive level is a torch module group (willump.module_feature): serving
sees the module, places it with the stage that computes it, and asks for a GPU for that stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

import willump
from serving.core.specs import StageSpec, stage_specs
from serving.launch.deploy import _use_gpu
from serving.runtime.stage_runner import StageRunner, module_groups, place_models

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it on the serial worker
pytestmark = pytest.mark.starts_ray


def _rows(n: int, seed: int):
    import pandas as pd

    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.standard_normal((n, 3)), columns=["a", "b", "c"])
    y = (3.0 * X["a"] + X["b"] - X["c"] + 0.3 * rng.standard_normal(n) > 0).astype(int).to_numpy()
    return X, y


def _optimized():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    deep = willump.module_feature(net, prepare=lambda df: (torch.tensor(df[["a", "b", "c"]].to_numpy(),
                                                                        dtype=torch.float32),), name="deep")

    @willump.feature
    def cheap_a(df):
        return df[["a"]].to_numpy()

    @willump.pipeline
    def with_module(df):
        return [cheap_a(df), deep(df)]

    X, y = _rows(3000, 1)
    opt = willump.optimize(with_module, LogisticRegression(max_iter=500), X, y, max_loss=0.03, verbose=False,
                           fixed_costs={"cheap_a": 1e-6, "deep": 5e-4}, top_k=None)
    assert opt.report().plan == "cascade"
    return opt, deep


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
    X, _ = _rows(400, 7)
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


def _answers_like_in_process(app, opt) -> None:
    import requests

    X, _ = _rows(64, 11)
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
                 insitu="never")
    try:
        assert {s.name: s.device for s in app.plan.stages}["expensive"] == "cpu"
        _answers_like_in_process(app, opt)
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
