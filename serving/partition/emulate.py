"""Emulated accelerators: a torch model whose blocks sleep for a profile's device time.

To check the cost model against a real deployment of plans made for GPUs we have not
got, each block of a profile becomes a small module that does a little real compute,
then sleeps for the block's profiled time (scaled to the rows of its batch) and returns
an activation of the profiled size (scaled by ``byte_scale`` so it fits the object store
of a small machine). Sleeping releases the CPU, so eight such "devices" share two cores;
the hops between them are real Serve hops of real bytes.

Two artifacts of emulating on a busy CPU are kept out: a thread woken late from a short
sleep would add its wake-up delay once per block (hundreds of blocks per stage), so the
overshoot is carried as credit and taken off the next sleep of the same thread; and the
activation is a broadcast view of the block's real output (no memory written per block),
which becomes its full size in bytes only when it crosses a hop and is serialized.
"""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from .profile import Profile, Transport

#: real features each emulated block computes on (its small real work)
WORK_WIDTH = 8
#: most sleep overshoot (s) a thread carries to its next blocks
MAX_CREDIT_S = 0.05

_sleep_state = threading.local()


def device_sleep(seconds: float) -> None:
    """Sleep ``seconds`` of emulated device time, net of earlier overshoot on this thread."""
    credit = getattr(_sleep_state, "credit", 0.0)
    target = seconds - credit
    if target <= 0:
        _sleep_state.credit = -target
        return
    t0 = time.perf_counter()
    time.sleep(target)
    _sleep_state.credit = min(max(time.perf_counter() - t0 - target, 0.0), MAX_CREDIT_S)


class EmulatedBlock(nn.Module):
    """``ms`` of device time per ``batch`` rows; returns ``out_width`` floats per row."""

    def __init__(self, ms: float, batch: int, out_width: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.work = nn.Linear(WORK_WIDTH, WORK_WIDTH)
        with torch.no_grad():
            self.work.weight.copy_(torch.randn(WORK_WIDTH, WORK_WIDTH, generator=g) * 0.3)
        self.ms = float(ms)
        self.batch = int(batch)
        self.out_width = max(int(out_width), WORK_WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.work(x[:, :WORK_WIDTH]))
        if self.ms > 0:
            device_sleep(self.ms / 1000.0 * x.shape[0] / self.batch)
        return y[:, :1].expand(x.shape[0], self.out_width)


def emulated(profile: Profile, *, max_cut_bytes: float = 1 << 20, in_width: int = WORK_WIDTH,
             out_width: int = 10, transport: Transport | None = None,
             batch_size: int | None = None) -> tuple[nn.Sequential, torch.Tensor, Profile]:
    """``(module, example, emulated_profile)`` for one batch size of ``profile``.

    Times are the profile's; the bytes crossing each inner cut are scaled so the largest
    is ``max_cut_bytes`` at that batch size (at least ``WORK_WIDTH`` floats a row); the
    model's input and output are ``in_width`` / ``out_width`` floats a row. The returned
    profile describes exactly the emulated module (same times, the scaled bytes), so a
    plan made from it is judged against what the deployment really moves.
    """
    b = batch_size if batch_size is not None else profile.batch_sizes[-1]
    j = profile.batch_index(b)
    n = len(profile)
    cuts = [row[j] for row in profile.cut_bytes]
    inner = max(cuts[1:n], default=1.0) or 1.0
    scale = max_cut_bytes / inner
    widths = [in_width] + [max(round(cuts[c] * scale / b / 4), WORK_WIDTH) for c in range(1, n)] + [out_width]
    blocks = [EmulatedBlock(profile.compute_ms[k][j], b, widths[k + 1], seed=k) for k in range(n)]
    module = nn.Sequential(*blocks).eval()
    cut_bytes = [[float(b * w * 4)] for w in widths]
    emu = Profile(
        name=f"{profile.name}-emulated", device="emulated", batch_sizes=[b],
        block_names=list(profile.block_names), compute_ms=[[profile.compute_ms[k][j]] for k in range(n)],
        cut_bytes=cut_bytes, param_bytes=list(profile.param_bytes),
        workspace_bytes=[[cut_bytes[k][0] + cut_bytes[k + 1][0]] for k in range(n)],
        transport=transport or profile.transport,
        meta={**profile.meta, "emulated_from": profile.name, "byte_scale": scale},
    )
    example = torch.randn(2, in_width, generator=torch.Generator().manual_seed(0))
    return module, example, emu
