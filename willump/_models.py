"""Model adapters: anything with scikit-learn's fit / predict_proba / classes_ works.

scikit-learn classifiers and LightGBM's LGBMClassifier are used as they are;
torch modules go through :class:`TorchClassifier`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
import sklearn
from sklearn.base import BaseEstimator, ClassifierMixin, clone

from ._fast_proba import fast_proba

#: rows per forward pass when a torch model predicts, bounding memory on wide sparse input
TORCH_PREDICT_BATCH = 4096


def check_model(model: Any, name: str = "model") -> None:
    """Raise a TypeError naming ``name`` unless it is a classifier we can fit and query."""
    missing = [m for m in ("fit", "predict_proba") if not callable(getattr(model, m, None))]
    if missing:
        raise TypeError(
            f"{name} must be a classifier with fit() and predict_proba() (scikit-learn, LightGBM "
            f"or willump.TorchClassifier); {type(model).__name__} lacks {missing}"
        )


def new_model(model: Any, seed: int) -> Any:
    """An unfitted copy of ``model``, seeded where it takes a random_state left unset."""
    try:
        fresh = clone(model)
    except Exception:
        fresh = copy.deepcopy(model)
    params = fresh.get_params() if hasattr(fresh, "get_params") else {}
    if "random_state" in params and params["random_state"] is None:
        fresh.set_params(random_state=seed)
    return fresh


def fitted_calls() -> Any:
    """A context in which scikit-learn skips checking its estimators' and functions' own
    arguments (``validate_params``; the inputs are still checked). A fitted plan's calls repeat
    arguments ``optimize`` already ran with, row after row: the check costs about 0.1 ms of a
    one-row prediction of toxic's cascade (0.76 -> 0.66 ms in process, 2026-12-06). Thread-local,
    as scikit-learn's configuration is."""
    return sklearn.config_context(skip_parameter_validation=True)


def predict_proba(model: Any, X: Any) -> np.ndarray:
    """Class probabilities as a float64 (rows x classes) array: the model's own ``predict_proba``,
    or for fitted logistic regressions and LightGBM classifiers on plain arrays the same numbers
    without its per-call checks (:mod:`willump._fast_proba`)."""
    fast = fast_proba(model, X)
    proba = np.asarray(model.predict_proba(X) if fast is None else fast, dtype=np.float64)
    if proba.ndim != 2:
        raise ValueError(f"{type(model).__name__}.predict_proba returned shape {proba.shape}")
    return proba


def time_predict(model: Any, X: Any, repeats: int, single_rows: int) -> tuple[float, float]:
    """Seconds per row of predict_proba at batch size and at one row (medians of repeats)."""
    n = X.shape[0]
    batch = []
    for _ in range(repeats):
        start = time.perf_counter()
        predict_proba(model, X)
        batch.append((time.perf_counter() - start) / n)
    single = []
    for i in range(min(single_rows, n)):
        row = X[i : i + 1]
        start = time.perf_counter()
        predict_proba(model, row)
        single.append(time.perf_counter() - start)
    return float(np.median(batch)), float(np.median(single))


def _default_mlp(hidden: tuple[int, ...]) -> Callable[[int, int], Any]:
    def build(n_features: int, n_classes: int) -> Any:
        import torch.nn as nn

        layers: list[Any] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_classes))
        return nn.Sequential(*layers)

    return build


def default_fit_loop(
    module: Any,
    X: Any,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    device: Any,
    seed: int,
) -> None:
    """Adam on cross-entropy, mini-batches drawn with a seeded generator."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()
    target = torch.as_tensor(y, dtype=torch.long)
    n = X.shape[0]
    module.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).numpy()
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb = _tensor(X[idx], device)
            optimizer.zero_grad()
            loss = loss_fn(module(xb), target[idx].to(device))
            loss.backward()
            optimizer.step()
    module.eval()


def _tensor(X: Any, device: Any) -> Any:
    import torch

    dense = X.toarray() if sp.issparse(X) else np.asarray(X)
    return torch.as_tensor(np.ascontiguousarray(dense, dtype=np.float32), device=device)


def resolve_device(device: str) -> str:
    """'auto' means CUDA when torch sees a GPU, else CPU; the same code runs on both."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TorchClassifier(ClassifierMixin, BaseEstimator):
    """A torch ``nn.Module`` classifier with scikit-learn's interface.

    ``module`` is either a factory ``(n_features, n_classes) -> nn.Module`` (so that
    willump's small models get the right input width) or a module instance, which
    is deep-copied before fitting (use lazy layers such as ``nn.LazyLinear`` so a
    copy can take a narrower input). ``None`` builds an MLP with ``hidden`` units.
    ``fit_fn(module, X, y, device)`` replaces the default Adam loop. ``device`` is
    'cpu', 'cuda', 'cuda:N' or 'auto'.
    """

    def __init__(
        self,
        module: Any = None,
        fit_fn: Callable[..., None] | None = None,
        hidden: tuple[int, ...] = (64,),
        epochs: int = 20,
        batch_size: int = 256,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        device: str = "cpu",
        random_state: int | None = None,
    ):
        self.module = module
        self.fit_fn = fit_fn
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.device = device
        self.random_state = random_state

    def _build(self, n_features: int, n_classes: int) -> Any:
        import torch.nn as nn

        if self.module is None:
            return _default_mlp(tuple(self.hidden))(n_features, n_classes)
        if isinstance(self.module, nn.Module):
            module = copy.deepcopy(self.module)
            for sub in module.modules():
                if hasattr(sub, "reset_parameters") and not isinstance(
                    sub, nn.modules.lazy.LazyModuleMixin
                ):
                    sub.reset_parameters()
            return module
        if callable(self.module):
            return self.module(n_features, n_classes)
        raise TypeError(
            f"module must be an nn.Module, a factory (n_features, n_classes) -> nn.Module, or None; "
            f"got {type(self.module).__name__}"
        )

    def fit(self, X: Any, y: Any) -> TorchClassifier:
        import torch

        seed = 0 if self.random_state is None else int(self.random_state)
        torch.manual_seed(seed)
        self.classes_, encoded = np.unique(np.asarray(y), return_inverse=True)
        self.n_features_in_ = int(X.shape[1])
        device = resolve_device(self.device)
        module = self._build(self.n_features_in_, len(self.classes_))
        with torch.no_grad():  # materialise lazy layers before the optimizer sees them
            module(_tensor(X[:1], "cpu"))
        module = module.to(device)
        if self.fit_fn is not None:
            self.fit_fn(module, X, encoded, device)
        else:
            default_fit_loop(
                module,
                X,
                encoded,
                epochs=self.epochs,
                batch_size=self.batch_size,
                lr=self.lr,
                weight_decay=self.weight_decay,
                device=device,
                seed=seed,
            )
        module.eval()
        self.module_ = module
        self.device_ = device
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        import torch

        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features; the model was fitted on {self.n_features_in_}")
        parts = []
        with torch.no_grad():
            for start in range(0, X.shape[0], TORCH_PREDICT_BATCH):
                logits = self.module_(_tensor(X[start : start + TORCH_PREDICT_BATCH], self.device_))
                parts.append(torch.softmax(logits, dim=1).double().cpu().numpy())
        if not parts:
            return np.zeros((0, len(self.classes_)))
        return np.vstack(parts)

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def to(self, device: str) -> TorchClassifier:
        """Move the fitted module to another device (serving picks the device)."""
        self.device_ = resolve_device(device)
        self.module_ = self.module_.to(self.device_)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if "module_" in state:  # pickle on CPU so a GPU-less machine can load it
            state["module_"] = copy.deepcopy(state["module_"]).to("cpu")
            state["device_"] = "cpu"
        return state
