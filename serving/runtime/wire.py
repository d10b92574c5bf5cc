"""Tensors between deployments: numpy arrays on the wire (zero-copy on read), moved to the
receiving stage's device inside its replica."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree


def to_wire(value: Any) -> Any:
    """Tensors -> numpy (on the host), everything else unchanged, in any nesting."""
    return pytree.tree_map(lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t, value)


def from_wire(value: Any, device: torch.device) -> Any:
    """numpy arrays (a read-only one copied first) and tensors -> tensors on ``device``: a
    canary row or a local caller may hand over CPU tensors, which a GPU stage cannot mix
    with its own."""
    def conv(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            t = torch.from_numpy(a) if a.flags.writeable else torch.from_numpy(a.copy())
            return t.to(device, non_blocking=True)
        if isinstance(a, torch.Tensor):
            return a.to(device, non_blocking=True)
        return a
    return pytree.tree_map(conv, value)
