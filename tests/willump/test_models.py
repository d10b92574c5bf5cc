"""Model adapters: the torch classifier and ONNX export checked against native models."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from lightgbm import LGBMClassifier
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

import willump
from willump import OnnxModel, TorchClassifier, check_onnx, to_onnx

from .synth import make_rows, no_sleep, three_groups


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 5))
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])
    return X, y


def test_torch_default_mlp_learns(xy):
    X, y = xy
    model = TorchClassifier(epochs=30, random_state=0).fit(X, y)
    assert list(model.classes_) == [0, 1, 2]
    assert (model.predict(X) == y).mean() > 0.8
    np.testing.assert_allclose(model.predict_proba(X).sum(axis=1), 1.0, atol=1e-6)


def test_torch_factory_instance_and_fit_fn(xy):
    X, y = xy
    seen = {}

    def factory(n_in, n_out):
        seen["shape"] = (n_in, n_out)
        return torch.nn.Linear(n_in, n_out)

    TorchClassifier(module=factory, epochs=2).fit(X, y)
    assert seen["shape"] == (5, 3)

    lazy = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.LazyLinear(3))
    narrow = TorchClassifier(module=lazy, epochs=2).fit(X[:, :2], y)
    assert narrow.n_features_in_ == 2

    def one_step(module, X_, y_, device):
        seen["fit_fn"] = (X_.shape, device)

    TorchClassifier(fit_fn=one_step).fit(X, y)
    assert seen["fit_fn"] == ((600, 5), "cpu")

    with pytest.raises(TypeError, match="module must be"):
        TorchClassifier(module=3).fit(X, y)


def test_torch_is_deterministic(xy):
    X, y = xy
    a = TorchClassifier(epochs=3, random_state=1).fit(X, y).predict_proba(X)
    b = TorchClassifier(epochs=3, random_state=1).fit(X, y).predict_proba(X)
    np.testing.assert_array_equal(a, b)


def test_torch_in_a_cascade_with_sparse_input():
    X, y = make_rows(3000, seed=2)
    model = TorchClassifier(hidden=(16,), epochs=5, random_state=0)
    opt = willump.optimize(three_groups, model, X, y, max_loss=0.03, verbose=False,
                           profile_repeats=1, profile_single_rows=2, importance_repeats=1)
    assert isinstance(opt.levels[-1].model, TorchClassifier)
    sparse = sp.random(20, 7, density=0.3, format="csr", random_state=0)
    model = TorchClassifier(epochs=1).fit(sparse, np.arange(20) % 2)
    assert model.predict_proba(sparse).shape == (20, 2)


@pytest.mark.parametrize(
    "model",
    [
        LogisticRegression(max_iter=500),
        RandomForestClassifier(n_estimators=10, random_state=0),
        LGBMClassifier(n_estimators=20, verbose=-1),
        TorchClassifier(epochs=3, random_state=0),
    ],
    ids=["logistic", "forest", "lightgbm", "torch"],
)
def test_onnx_matches_native(xy, model):
    X, y = xy
    model.fit(X, y)
    runner = OnnxModel(to_onnx(model, X.shape[1]), model.classes_)
    assert check_onnx(model, runner, X) < 1e-4
    assert runner.providers[-1] == "CPUExecutionProvider"


def test_onnx_cuda_request_on_a_cpu_machine_is_never_silent(xy):
    """Asked for CUDA where ONNX Runtime cannot run it, the session says so: a warning naming
    the provider it took (and ``fallback`` set), or an error with ``on_fallback="error"``."""
    import onnxruntime as ort

    X, y = xy
    model = LogisticRegression().fit(X, y)
    onnx = to_onnx(model, X.shape[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = OnnxModel(onnx, model.classes_, device="cuda")
    if runner.providers[0] == "CUDAExecutionProvider":  # pragma: no cover - a machine with a GPU
        assert runner.fallback is None
        return
    assert runner.fallback is not None and "CPUExecutionProvider" in runner.fallback
    assert any("ONNX Runtime was asked for 'cuda'" in str(w.message) for w in caught)
    assert check_onnx(model, runner, X) < 1e-4
    with pytest.raises(RuntimeError, match="asked for 'cuda'"):
        OnnxModel(onnx, model.classes_, device="cuda", on_fallback="error")
    with pytest.raises(ValueError, match="on_fallback"):
        OnnxModel(onnx, model.classes_, on_fallback="ignore")
    assert OnnxModel(onnx, model.classes_).fallback is None  # the CPU asked for, the CPU taken
    assert "CPUExecutionProvider" in ort.get_available_providers()


def test_export_whole_cascade(tmp_path):
    X, y = make_rows(3000, seed=4)
    fixed = {"fast_a": 1e-6, "fast_bc": 1e-4}
    opt = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, verbose=False,
                           fixed_costs=fixed)
    assert opt.is_cascade
    with pytest.warns(willump.WillumpWarning, match="routing_tolerance"):  # certified for 0 difference
        summary = willump.export_onnx(opt, tmp_path, X[:500])
    assert len(summary["levels"]) == len(opt.levels)
    assert all(level["max_abs_diff"] < 1e-4 for level in summary["levels"])
    from willump._onnx import onnx_levels

    levels = onnx_levels(opt, tmp_path)
    served = willump.OptimizedPipeline(opt.pipeline, levels, opt.classes_, opt.baseline, None, opt.report_)
    np.testing.assert_allclose(served.predict_proba(X[:500]), opt.predict_proba(X[:500]), atol=1e-4)
    covered = willump.optimize(no_sleep, LogisticRegression(), X, y, max_loss=0.03, verbose=False,
                               fixed_costs=fixed, routing_tolerance=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", willump.WillumpWarning)  # certified for ONNX's differences
        assert "routing_warning" not in willump.export_onnx(covered, tmp_path / "covered", X[:500])


def test_unknown_model_has_no_converter():
    with pytest.raises(TypeError, match="no ONNX converter"):
        to_onnx(object(), 3)
