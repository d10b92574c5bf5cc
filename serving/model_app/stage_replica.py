"""What one stage replica of a partitioned model does, as plain torch (no Ray): the stage file
written for it and checked before it is unpickled, the module moved to the replica's device
(device constants included), batches run one at a time, and the canary row its health check
runs. :mod:`serving.model_app.stages` wraps it in a Serve deployment; ``benchmarks.gpu_check``
runs it on a GPU where Ray is not installed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from serving import partition as sp
from serving.partition.device import retarget_module
from serving.runtime.wire import from_wire, to_wire


def write_stage_file(module: torch.nn.Module, path: str | os.PathLike) -> str:
    """Save a stage module for this user only (0600); returns its sha256, which travels with
    the replica and is checked before the file is unpickled (a stage module is code:
    ``torch.load(weights_only=True)`` cannot load it)."""
    path = Path(path)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        torch.save(module, fh)
    os.chmod(path, 0o600)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def canary_inputs(stages: list[torch.nn.Module], args: tuple) -> list[Any]:
    """One row of each stage's input: the example's first row run through the stages before
    it (on the CPU, here); the replicas' health checks run it."""
    value: Any = sp.batch_of(tuple(a.cpu() for a in args), 1)
    out = []
    with torch.inference_mode():
        for stage in stages:
            out.append(value)
            value = stage(*value) if isinstance(value, tuple) else stage(value)
    return out



class PartitionStageImpl:
    """Loads a stage module from ``path`` and runs batches on ``device``."""

    def __init__(self, path: str, device: str = "cpu", threads: int | None = 1, sha256: str | None = None,
                 canary: Any = None):
        if sha256 is not None:  # checked before anything is unpickled
            with open(path, "rb") as fh:
                found = hashlib.sha256(fh.read()).hexdigest()
            if not hmac.compare_digest(found, sha256):
                raise RuntimeError(f"stage file {path} does not match the digest deploy_model wrote; refusing "
                                   "to load it (it was changed after it was written)")
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("this stage was planned for a GPU but the replica sees none")
        # device constants an exported graph baked in (aten.arange(device=cpu)) follow the stage
        self.module = retarget_module(torch.load(path, weights_only=False, map_location=self.device),
                                      self.device).eval()
        self.path = path
        self._lock = threading.Lock()
        #: one row of this stage's input (the example run through the stages before it)
        self.canary_args = canary

    def canary(self) -> dict[str, Any]:
        """The canary row through this stage on its device; RuntimeError when it fails or
        answers a non-finite value (a broken CUDA context, a corrupted module)."""
        if self.canary_args is None:
            return {"canary": "none"}
        start = time.perf_counter()
        try:
            out = self.run(self.canary_args)
        except Exception as exc:
            raise RuntimeError(f"stage {self.path}: the canary row failed: {type(exc).__name__}: {exc}") from exc
        for leaf in pytree.tree_leaves(out):  # tensors, or the arrays they travel as
            arr = leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor) else leaf
            if isinstance(arr, np.ndarray) and arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise RuntimeError(f"stage {self.path}: the canary row answered a non-finite value")
        return {"canary": "ok", "seconds": time.perf_counter() - start, "device": str(self.device)}

    def run(self, args: Any) -> Any:
        args = from_wire(args, self.device)
        with self._lock, torch.inference_mode():
            out = self.module(*args) if isinstance(args, tuple) else self.module(args)
            if self.device.type == "cuda":  # pragma: no cover - no GPU where this was written
                torch.cuda.synchronize(self.device)
        return to_wire(out)
