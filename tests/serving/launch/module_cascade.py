"""A cascade whose expensive level is a torch module group, for the launch tests: rows of
three columns, a cheap group on one of them, the module on all three."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from sklearn.linear_model import LogisticRegression

import willump


def rows(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.standard_normal((n, 3)), columns=["a", "b", "c"])
    y = (3.0 * X["a"] + X["b"] - X["c"] + 0.3 * rng.standard_normal(n) > 0).astype(int).to_numpy()
    return X, y


class Inputs:
    """``prepare``: the frame's columns as one float tensor (a class: the artifact pickles it)."""

    def __call__(self, df: pd.DataFrame) -> tuple[torch.Tensor]:
        return (torch.tensor(df[["a", "b", "c"]].to_numpy(), dtype=torch.float32),)


def optimized_with(net: torch.nn.Module) -> tuple[willump.OptimizedPipeline, willump.ModuleFeature]:
    """``net`` (3 inputs) as the module group ``deep`` of a certified cascade [cheap_a] -> [cheap_a, deep]."""
    deep = willump.module_feature(net, prepare=Inputs(), name="deep")

    @willump.feature
    def cheap_a(df):
        return df[["a"]].to_numpy()

    @willump.pipeline
    def with_module(df):
        return [cheap_a(df), deep(df)]

    X, y = rows(3000, 1)
    opt = willump.optimize(with_module, LogisticRegression(max_iter=500), X, y, max_loss=0.03, verbose=False,
                           fixed_costs={"cheap_a": 1e-6, "deep": 5e-4}, top_k=None)
    assert opt.report().plan == "cascade"
    return opt, deep
