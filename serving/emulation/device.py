"""An emulated device for the stages of :mod:`serving.emulation.hetero_app`: this machine has no
accelerators, so a replica runs the stage's real code (answers stay the pipeline's), then
holds its device, one batch at a time, for ``fixed_ms + per_row_ms * rows`` times the device
type's slowdown for the stage, and ``factor`` times longer on a ``share`` of its calls where
jitter is injected. The slowdowns stand in for hardware; no planner reads them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from ray import serve

from serving.core.specs import StageSpec
from serving.runtime.gears import GearRunners
from serving.runtime.stage_runner import StageRunner

#: a stage replica's queue limit: above any offered concurrency, so that Serve never backs off
#: (REFERENCES: callers of a replica at max_ongoing_requests retry with backoff up to 0.5 s)
MAX_ONGOING = 1000


@dataclass(frozen=True)
class DeviceEmulation:
    """Emulated device time per stage call: ``(fixed_ms + per_row_ms * rows) * slowdown``.

    ``slowdown[device_type][stage]`` (missing: 1.0) is the emulated hardware's speed factor.
    """

    fixed_ms: Mapping[str, float]
    per_row_ms: Mapping[str, float]
    slowdown: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, table in (("fixed_ms", self.fixed_ms), ("per_row_ms", self.per_row_ms)):
            bad = {k: v for k, v in table.items() if not np.isfinite(v) or v < 0}
            if bad:
                raise ValueError(f"DeviceEmulation.{name}: values must be finite and >= 0, got {bad}")
        for device, per_stage in self.slowdown.items():
            bad = {k: v for k, v in per_stage.items() if not np.isfinite(v) or v <= 0}
            if bad:
                raise ValueError(f"DeviceEmulation.slowdown[{device!r}]: factors must be > 0, got {bad}")

    def seconds(self, stage: str, device_type: str, rows: int) -> float:
        base = self.fixed_ms.get(stage, 0.0) + self.per_row_ms.get(stage, 0.0) * rows
        return base * self.slowdown.get(device_type, {}).get(stage, 1.0) / 1000.0


def check_jitter(jitter: Mapping[str, tuple[float, float]]) -> None:
    for key, value in jitter.items():
        share, factor = value
        if not 0 <= share <= 1 or factor < 1:
            raise ValueError(f"jitter[{key!r}]: (share of calls in [0, 1], factor >= 1), got {value!r}")


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class DeviceStage:
    """One replica of a stage on one (emulated) device."""

    def __init__(self, artifact: Any, spec: StageSpec, device_type: str, emulation: DeviceEmulation,
                 seed: int = 0, jitter: tuple[float, float] = (0.0, 1.0)):
        from serving.runtime.replicas import replica_id

        self.runner = StageRunner(artifact.load(), spec)
        self.gears = GearRunners(self.runner)  # the certified gears (serving.runtime.gears)
        self.stage, self.device_type, self.emulation = spec.name, device_type, emulation
        self.replica = replica_id(f"{spec.name}@{device_type}")
        self.lock = asyncio.Lock()
        self.rng = np.random.default_rng(seed)
        self.jitter = jitter
        self.calls = 0
        self.cancelled = 0
        self.device_seconds = 0.0

    async def run(self, rows: pd.DataFrame, blocks: dict | None = None, gear: int = 0) -> dict[str, Any]:
        out = await asyncio.to_thread(self.gears.get(gear).run, rows, blocks)
        hold = self.emulation.seconds(self.stage, self.device_type, len(rows))
        share, factor = self.jitter
        if share > 0 and self.rng.random() < share:
            hold *= factor
        held = 0.0
        try:
            async with self.lock:
                t0 = time.perf_counter()
                try:
                    await asyncio.sleep(hold)
                finally:
                    held = time.perf_counter() - t0
                    self.device_seconds += held
        except asyncio.CancelledError:  # a hedged call whose twin answered first
            self.cancelled += 1
            raise
        self.calls += 1
        out["replica"], out["device"], out["device_s"] = self.replica, self.device_type, held
        return out

    def info(self) -> dict[str, Any]:
        import ray

        return {"replica": self.replica, "stage": self.stage, "device": self.device_type,
                "node_id": ray.get_runtime_context().get_node_id(), "calls": self.calls,
                "cancelled": self.cancelled, "device_seconds": self.device_seconds}
