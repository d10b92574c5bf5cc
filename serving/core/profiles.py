"""Measured costs the planner works from: per stage, per request at the ingress, per node.

Plain data (no Ray, no willump), serialisable into the plan so that a plan carries the
measurements it was made from (``GET /plan`` shows them; ``benchmarks.serving`` re-simulates
from them).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from serving.core.constants import CONCURRENT_BATCHES, INLINE_CPU_SHARE, INLINE_MAX_BATCH_S


@dataclass(frozen=True)
class StageProfile:
    """Measured cost of one stage: seconds per batch at each batch size (rows).

    ``scale`` is the share of a request's rows that reach the stage (1 for the first stage,
    the unsure share for later ones); ``cpu_seconds`` the part of each batch's time that the
    process computes (measured with its thread's CPU clock), the rest being waits that
    overlap with other work. For a GPU stage, ``speedup`` maps k concurrent
    processes sharing one GPU to the throughput they reach together relative to one
    (measured; ``{1: 1.0}`` means not measured beyond one), and ``measured_on`` says what
    the timings were taken on.
    """

    name: str
    batch_seconds: dict[int, float]
    scale: float = 1.0
    device: str = "cpu"
    speedup: dict[int, float] = field(default_factory=lambda: {1: 1.0})
    measured_on: str = "cpu"
    #: CPU seconds of the process per batch (the rest of ``batch_seconds`` is waiting: remote
    #: lookups, sleeps, a device); None: all of it is CPU
    cpu_seconds: dict[int, float] | None = None
    #: CPU per batch when CONCURRENT_BATCHES batches run at once in one process (threads
    #: contending for the GIL and the caches), relative to one at a time: measured
    thread_inflation: float = 1.0

    @property
    def cpu_share(self) -> float:
        """CPU time over batch time at the largest measured batch (1: it never waits)."""
        if self.cpu_seconds is None:
            return 1.0
        size = max(self.batch_seconds)
        return min(1.0, self.cpu_seconds.get(size, self.batch_seconds[size]) / self.batch_seconds[size])

    @property
    def runs_inline(self) -> bool:
        """Whether its replicas run its batches on their event loop, one at a time (a CPU-bound
        CPU stage whose batches are short: :data:`~serving.core.constants.INLINE_CPU_SHARE`,
        :data:`~serving.core.constants.INLINE_MAX_BATCH_S`), not in threads."""
        return (self.device == "cpu" and self.cpu_share >= INLINE_CPU_SHARE
                and self.batch_seconds[max(self.batch_seconds)] <= INLINE_MAX_BATCH_S)

    def inflation(self, batches: float) -> float:
        """CPU factor with ``batches`` batches running at once in the process (1 for one, and
        for a stage that runs inline; the measured ``thread_inflation`` from CONCURRENT_BATCHES on)."""

        if batches <= 1 or CONCURRENT_BATCHES <= 1 or self.runs_inline:
            return 1.0
        return 1.0 + (self.thread_inflation - 1.0) * min(batches - 1, CONCURRENT_BATCHES - 1) / (CONCURRENT_BATCHES - 1)

    def __post_init__(self) -> None:
        if not self.batch_seconds:
            raise ValueError(f"stage {self.name!r} has no measured batch sizes")
        if any(b < 1 or t <= 0 for b, t in self.batch_seconds.items()):
            raise ValueError(f"stage {self.name!r}: batch sizes must be >= 1 and times > 0")
        if not 0 <= self.scale <= 1:
            raise ValueError(f"stage {self.name!r}: scale must be in [0, 1], got {self.scale}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"stage {self.name!r}: device must be 'cpu' or 'gpu', got {self.device!r}")

    @property
    def sizes(self) -> list[int]:
        return sorted(self.batch_seconds)

    def service_time(self, rows: float) -> float:
        """Seconds for a batch of ``rows`` rows: piecewise linear between measured sizes."""
        return _interpolate(self.batch_seconds, rows)

    def cpu_time(self, rows: float) -> float:
        """CPU seconds of a batch of ``rows`` rows (at most its service time)."""
        wall = self.service_time(rows)
        if not self.cpu_seconds:
            return wall
        share = _interpolate(self.cpu_seconds, rows) / max(_interpolate(self.batch_seconds, rows), 1e-12)
        return wall * min(1.0, max(0.0, share))

    def capacity(self, rows: int) -> float:
        """Rows per second one replica (one process, or a whole GPU) sustains at batch ``rows``."""
        return rows / self.service_time(rows)

    def gpu_speedup(self, k: float) -> float:
        """Throughput of k processes sharing one GPU, relative to one (interpolated)."""
        points = sorted(self.speedup.items())
        if k <= points[0][0]:
            return points[0][1] * k / points[0][0]
        for (k0, s0), (k1, s1) in itertools.pairwise(points):
            if k <= k1:
                return s0 + (s1 - s0) * (k - k0) / (k1 - k0)
        return points[-1][1]  # more processes than measured: no further gain

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("batch_seconds", "speedup", "cpu_seconds"):
            if data[key] is not None:
                data[key] = {str(k): v for k, v in data[key].items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageProfile:
        data = dict(data)
        data["batch_seconds"] = {int(k): float(v) for k, v in data["batch_seconds"].items()}
        data["speedup"] = {int(k): float(v) for k, v in data.get("speedup", {1: 1.0}).items()}
        if data.get("cpu_seconds") is not None:
            data["cpu_seconds"] = {int(k): float(v) for k, v in data["cpu_seconds"].items()}
        return cls(**data)


def _interpolate(table: dict[int, float], rows: float) -> float:
    """Piecewise linear between measured batch sizes; per-row beyond the largest."""
    sizes = sorted(table)
    rows = max(rows, 1.0)
    if rows <= sizes[0]:
        return table[sizes[0]]
    for lo, hi in itertools.pairwise(sizes):
        if rows <= hi:
            w = (rows - lo) / (hi - lo)
            return (1 - w) * table[lo] + w * table[hi]
    last = sizes[-1]
    return table[last] + (rows - last) * table[last] / last


@dataclass(frozen=True)
class IngressProfile:
    """The ingress route's own work for one request of ``rows_per_request`` rows, measured
    in-process on the artifact's sample rows (HTTP handling is in :class:`HostCosts`), and
    the sizes that hops and the front move."""

    rows_per_request: int
    #: JSON decoding, schema checks, building the frame
    parse_ms: float
    #: the answer: arrays to lists, JSON encoding
    respond_ms: float
    #: monitor records for the request's rows (0 without the monitor)
    records_ms: float = 0.0
    #: request body and answer sizes
    body_kb: float = 1.0
    response_kb: float = 0.5
    #: a stage call's arguments per row (the rows), results per row (probabilities, levels),
    #: and the feature blocks an earlier stage hands on, per unsure row
    rows_kb_per_row: float = 0.05
    result_kb_per_row: float = 0.03
    blocks_kb_per_row: float = 0.05
    measured: bool = True

    def per_request_ms(self) -> float:
        return self.parse_ms + self.respond_ms + self.records_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IngressProfile:
        return cls(**data)

    @classmethod
    def unmeasured(cls, rows_per_request: int) -> IngressProfile:
        """A stand-in when no sample rows are at hand: scales with rows like a few numeric columns."""
        r = rows_per_request
        return cls(r, parse_ms=0.2 + 0.01 * r, respond_ms=0.1 + 0.005 * r, body_kb=0.1 * r,
                   response_kb=0.05 * r, measured=False)


@dataclass(frozen=True)
class NodeSpec:
    """One Ray node as the planner sees it: logical resources free for this app, and the
    machine (``host``) whose cores it shares with other nodes on the same machine."""

    node_id: str
    host: str
    cpus: float
    gpus: float = 0.0
    head: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
