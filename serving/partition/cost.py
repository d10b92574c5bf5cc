"""The cost model every plan, baseline and brute-force answer is judged by.

A stage ``(i, j]`` of blocks ``i..j-1`` replicated ``r`` times, at batch size ``b``:

- one batch keeps a replica busy for ``compute(i..j) + hop(cut_i)/2 + hop(cut_j)/2``:
  a hop of ``B`` bytes costs ``fixed + B / bandwidth`` end to end (the transport's
  calibration) and each side of it pays half (serializing, deserializing). With
  ``overlap=True`` transfers run beside the compute (a GPU copy engine, or a CPU-side
  hop next to an accelerator), and the busy time is the larger of the two;
- the stage passes ``b * r / busy`` rows per second; the plan's throughput is the
  slowest stage's; its latency (one batch through an idle pipeline) is the sum of the
  stages' compute plus every hop once;
- a replica fits a device when the stage's parameters plus its largest block workspace
  fit ``memory_per_device``; each replica takes one device.

The hop into the first stage and out of the last one (from and to the ingress) are
counted too (``ingress_hops``): every plan pays them, whole-model replicas included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .profile import Profile, Transport


@dataclass(frozen=True)
class CostModel:
    """The terms of the model that are choices, not measurements."""

    transport: Transport
    overlap: bool = False
    ingress_hops: bool = True


def model_of(profile: Profile, transport: Transport | None = None, *, overlap: bool = False,
             ingress_hops: bool = True) -> CostModel:
    return CostModel(transport or profile.transport, overlap, ingress_hops)


class StageCosts:
    """Busy time, latency and memory of every candidate stage ``(i, j]`` at one batch size,
    from prefix sums (PipeDream's optimizer keeps the same arrays)."""

    def __init__(self, profile: Profile, batch_size: int, model: CostModel):
        self.n = len(profile)
        self.batch_size = batch_size
        c = profile.compute(batch_size)
        self.prefix = np.concatenate([[0.0], np.cumsum(c)])
        self.pprefix = np.concatenate([[0.0], np.cumsum(profile.params())])
        self.work = profile.workspace(batch_size)
        cuts = profile.cuts(batch_size)
        hop = np.array([model.transport.hop_ms(b) for b in cuts])
        if not model.ingress_hops:
            hop[0] = hop[-1] = 0.0
        self.hop = hop
        self.overlap = model.overlap

    def compute(self, i: int, j: int) -> float:
        return float(self.prefix[j] - self.prefix[i])

    def busy(self, i: int, j: int) -> float:
        comm = (self.hop[i] + self.hop[j]) / 2.0
        c = self.compute(i, j)
        return max(c, comm) if self.overlap else c + comm

    def latency(self, i: int, j: int) -> float:
        """This stage's share of one batch's latency: its compute and the hop into it
        (the last stage also the hop out)."""
        return self.compute(i, j) + self.hop[i] + (self.hop[j] if j == self.n else 0.0)

    def memory(self, i: int, j: int) -> float:
        return float(self.pprefix[j] - self.pprefix[i] + (self.work[i:j].max() if j > i else 0.0))

    def matrices(self, memory_per_device: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """busy[i, j], latency[i, j] for i < j, with inf where the stage does not fit."""
        n = self.n
        busy = np.full((n + 1, n + 1), np.inf)
        lat = np.full((n + 1, n + 1), np.inf)
        for i in range(n):
            j = np.arange(i + 1, n + 1)
            comp = self.prefix[j] - self.prefix[i]
            comm = (self.hop[i] + self.hop[j]) / 2.0
            b = np.maximum(comp, comm) if self.overlap else comp + comm
            lt = comp + self.hop[i] + np.where(j == n, self.hop[n], 0.0)
            if memory_per_device is not None:
                mem = self.pprefix[j] - self.pprefix[i] + np.maximum.accumulate(self.work[i:])
                bad = mem > memory_per_device
                b = np.where(bad, np.inf, b)
                lt = np.where(bad, np.inf, lt)
            busy[i, i + 1:] = b
            lat[i, i + 1:] = lt
        return busy, lat


@dataclass
class Stage:
    """One pipeline stage of a plan: blocks ``start..end-1`` on ``replicas`` devices."""

    start: int
    end: int
    replicas: int
    device: str = "cpu"
    batch_size: int = 1
    compute_ms: float = 0.0
    busy_ms: float = 0.0
    memory_bytes: float = 0.0
    fits: bool = True

    @property
    def period_ms(self) -> float:
        """Time between batches this stage can take: busy time over replicas."""
        return self.busy_ms / self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("start", "end", "replicas", "device", "batch_size",
                                               "compute_ms", "busy_ms", "memory_bytes", "fits")}


def _normalize(stages: Sequence[Any], n: int) -> list[tuple[int, int, int]]:
    out = []
    for s in stages:
        if hasattr(s, "start"):
            out.append((int(s.start), int(s.end), int(getattr(s, "replicas", 1))))
        elif isinstance(s, (tuple, list)) and len(s) in (2, 3):
            out.append((int(s[0]), int(s[1]), int(s[2]) if len(s) == 3 else 1))
        else:
            raise TypeError(f"a stage must be (start, end[, replicas]) or have .start/.end/.replicas, got {s!r}")
    if not out or out[0][0] != 0 or out[-1][1] != n or any(a >= b for a, b, _ in out) or any(
            out[k][1] != out[k + 1][0] for k in range(len(out) - 1)):
        raise ValueError(f"stages must be contiguous non-empty block ranges covering 0..{n}, got "
                         f"{[(a, b) for a, b, _ in out]}")
    if any(r < 1 for _, _, r in out):
        raise ValueError(f"replicas must be >= 1, got {[r for _, _, r in out]}")
    return out


def assess(profile: Profile, stages: Sequence[Any], *, devices: int | None = None,
           memory_per_device: float | None = None, batch_size: int | None = None,
           model: CostModel | None = None) -> tuple[list[Stage], float, float, list[str]]:
    """Stage details, throughput (rows/s), latency (ms) and the reasons a plan is infeasible."""
    model = model or model_of(profile)
    b = batch_size if batch_size is not None else profile.batch_sizes[-1]
    costs = StageCosts(profile, b, model)
    triples = _normalize(stages, len(profile))
    notes: list[str] = []
    out = []
    for i, j, r in triples:
        mem = costs.memory(i, j)
        fits = memory_per_device is None or mem <= memory_per_device
        if not fits:
            notes.append(f"stage blocks {i}..{j - 1} needs {mem / 2**20:.1f} MiB per device, more "
                         f"than memory_per_device={memory_per_device / 2**20:.1f} MiB")
        out.append(Stage(i, j, r, profile.device, b, costs.compute(i, j), costs.busy(i, j), mem, fits))
    used = sum(r for _, _, r in triples)
    if devices is not None and used > devices:
        notes.append(f"the stages use {used} devices but only {devices} are available")
    if notes:
        return out, 0.0, math.inf, notes
    period = max(s.period_ms for s in out)
    throughput = math.inf if period <= 0 else b * 1000.0 / period
    latency = sum(costs.latency(i, j) for i, j, _ in triples)
    return out, throughput, latency, notes
