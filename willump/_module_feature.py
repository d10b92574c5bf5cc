"""A feature group whose work is a torch module, declared so that willump (and serving) know it.

``willump.module_feature(module, prepare=..., finish=...)`` is a feature group computing
``finish(module(*prepare(rows)))``: ``prepare`` turns request rows into the module's input
tensors on the CPU (tokenizing, say), the module runs on the group's device (moved there
when the group is declared) under ``torch.inference_mode``, and ``finish`` turns its output into a 2-D array (default: the
tensor itself). Declared this way, the module is visible: ``serving.deploy`` can place the
group on GPU replicas and partition the module PipeDream-style (``serving.partition``), and
``prepare(sample_rows)`` is its example input. Float32 networks give a row slightly different
values with different batch-mates (padding, blocking), so capture's checks use a float32
tolerance. A group pickles with its module on the CPU (artifacts are device-neutral).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._capture import FeatureGroup

#: (rtol, atol) within which a module's outputs count as equal in capture's checks
MODULE_TOLERANCE = (1e-4, 1e-5)
#: rows per forward pass (bounds activation memory on long inputs)
MODULE_BATCH_ROWS = 256


class ModuleFeature(FeatureGroup):
    """A feature group around a torch module (see the module docstring)."""

    def __init__(self, module: Any, prepare: Callable[[Any], Sequence[Any]],
                 finish: Callable[[Any], Any] | None = None, *, name: str | None = None,
                 device: str = "cpu", batch_rows: int = MODULE_BATCH_ROWS,
                 tolerance: tuple[float, float] = MODULE_TOLERANCE):
        import torch

        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not callable(prepare):
            raise TypeError("prepare must be a function rows -> the module's input tensors")
        if finish is not None and not callable(finish):
            raise TypeError("finish must be a function (module output) -> 2-D array")
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows must be a positive integer, got {batch_rows!r}")
        self.module = module.to(device).eval()  # where _run sends its inputs
        self.prepare = prepare
        self.finish = finish
        self.device = device
        self.batch_rows = batch_rows
        super().__init__(self._run, name=name or type(module).__name__.lower(), tolerance=tolerance)

    def inputs(self, rows: Any) -> tuple[Any, ...]:
        """The module's input tensors for ``rows`` (a tuple), made on the CPU by ``prepare``."""
        prepared = self.prepare(rows)
        return tuple(prepared) if isinstance(prepared, (tuple, list)) else (prepared,)

    def to(self, device: str) -> ModuleFeature:
        """Move the module (its inputs follow it at call time)."""
        self.module.to(device)
        self.device = device
        return self

    def __getstate__(self) -> dict[str, Any]:
        # saved device-neutral: the module pickles on the CPU, so an artifact optimized with
        # it on a GPU loads where no GPU is visible; serving (or ``to``) places it again
        state = self.__dict__.copy()
        if self.device != "cpu":
            import copy

            state["module"] = copy.deepcopy(self.module).to("cpu")
            state["device"] = "cpu"
            state["saved_from_device"] = self.device
        return state

    def _run(self, rows: Any) -> Any:
        import torch

        from ._rows import n_rows, take

        n = n_rows(rows)
        parts = []
        with torch.inference_mode():
            for start in range(0, max(n, 1), self.batch_rows):
                chunk = take(rows, np.arange(start, min(start + self.batch_rows, n)))
                inputs = [t.to(self.device) if hasattr(t, "to") else t for t in self.inputs(chunk)]
                out = self.module(*inputs)
                parts.append(self.finish(out) if self.finish is not None else out.detach().cpu().numpy())
        if not parts:
            return np.zeros((0, 0))
        return np.vstack([np.asarray(p) for p in parts]) if len(parts) > 1 else np.asarray(parts[0])


def module_feature(module: Any, *, prepare: Callable[[Any], Sequence[Any]],
                   finish: Callable[[Any], Any] | None = None, name: str | None = None,
                   device: str = "cpu", batch_rows: int = MODULE_BATCH_ROWS,
                   tolerance: tuple[float, float] = MODULE_TOLERANCE) -> ModuleFeature:
    """A feature group computing ``finish(module(*prepare(rows)))`` (see ``ModuleFeature``)."""
    return ModuleFeature(module, prepare, finish, name=name, device=device, batch_rows=batch_rows,
                         tolerance=tolerance)
