"""A feature group whose work is a torch module: declared, captured with a float32 tolerance,
optimized into a cascade, visible to serving as a module with an example input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

import willump

from .synth import make_rows


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _prepare(df):
    return (torch.tensor(df[["a", "b", "c"]].to_numpy(), dtype=torch.float32),)


def _pipeline():
    deep = willump.module_feature(_net(), prepare=_prepare, name="deep", batch_rows=64)

    @willump.feature
    def cheap_a(df):
        return df[["a"]].to_numpy()

    @willump.pipeline
    def with_module(df):
        return [cheap_a(df), deep(df)]

    return with_module, deep


def test_module_feature_is_a_group_serving_can_see():
    pipeline, deep = _pipeline()
    rows = make_rows(300, seed=1)[0]
    graph = pipeline.capture(rows)
    assert graph.groups == ["cheap_a", "deep"]
    assert graph.tolerance_of("deep") == willump._module_feature.MODULE_TOLERANCE
    found = pipeline.graph_features()["deep"]
    assert isinstance(found, willump.ModuleFeature) and found.module is deep.module
    (example,) = found.inputs(rows.iloc[:8])
    assert example.shape == (8, 3) and example.dtype == torch.float32
    with torch.inference_mode():
        want = deep.module(*_prepare(rows)).numpy()
    np.testing.assert_allclose(pipeline(rows)[1], want, rtol=1e-6, atol=1e-6)  # in 64-row batches


def test_a_cascade_whose_expensive_level_is_a_module():
    pipeline, _ = _pipeline()
    X, y = make_rows(4000, seed=2, weights=(3.0, 1.0, 1.0))
    opt = willump.optimize(pipeline, LogisticRegression(max_iter=500), X, y, max_loss=0.03, verbose=False,
                           fixed_costs={"cheap_a": 1e-6, "deep": 5e-4})
    assert opt.report().plan == "cascade"
    assert opt.levels[0].groups == ("cheap_a",) and "deep" in opt.levels[-1].groups


def test_bad_module_features_are_named():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        willump.module_feature(object(), prepare=_prepare)
    with pytest.raises(TypeError, match="prepare must be"):
        willump.module_feature(_net(), prepare=3)
    with pytest.raises(ValueError, match="batch_rows"):
        willump.module_feature(_net(), prepare=_prepare, batch_rows=0)
    with pytest.raises(ValueError, match="tolerance"):
        willump.feature(tolerance=(-1, 0))(lambda df: df)


def test_a_module_group_pickles_device_neutral():
    """A group whose module sat on a GPU pickles with it on the CPU, so the artifact loads
    where no GPU is visible (the device is stood in for: this machine has none)."""
    import pickle

    deep = willump.module_feature(_net(), prepare=_prepare, name="deep")
    assert deep.device == "cpu" and pickle.loads(pickle.dumps(deep)).device == "cpu"
    deep.device = "cuda"  # as if declared with device="cuda" on a GPU machine
    state = deep.__getstate__()
    assert state["device"] == "cpu" and state["saved_from_device"] == "cuda"
    assert all(p.device.type == "cpu" for p in state["module"].parameters())
    assert state["module"] is not deep.module  # the live group is not moved by saving it


def test_a_module_group_is_placed_on_its_device_when_declared():
    net = _net()
    deep = willump.module_feature(net, prepare=_prepare, name="deep", device="meta")
    assert all(p.device.type == "meta" for p in deep.module.parameters())
