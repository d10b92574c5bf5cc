"""Tensors between deployments: numpy on the wire; on arrival, arrays *and* tensors go to the
stage's device (a canary row arrives as CPU tensors; on a GPU stage it failed with "Tensor
device mismatch" until tensors were moved too: found by benchmarks.gpu_check on an H200)."""

from __future__ import annotations

import numpy as np
import torch

from serving.runtime.wire import from_wire, to_wire


def test_arrays_and_tensors_arrive_on_the_stage_device():
    meta = torch.device("meta")  # stands in for a GPU: a device other than the CPU
    value = (np.ones((2, 3), dtype=np.float32), torch.zeros(2, 3), 7)
    arrived = from_wire(value, meta)
    assert arrived[0].device == meta and arrived[1].device == meta and arrived[2] == 7


def test_to_wire_sends_numpy_and_read_only_arrays_are_copied():
    sent = to_wire({"x": torch.arange(4.0), "n": 3})
    assert isinstance(sent["x"], np.ndarray) and sent["n"] == 3
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    back = from_wire(frozen, torch.device("cpu"))
    assert torch.equal(back, torch.arange(4.0, dtype=torch.float64))
