"""An emulated device for the stage replicas of ``deploy``'s apps, set per node by node labels:
for tests and benchmarks of node pools and stragglers on one machine (it has one kind of
core). Never set on a real cluster: without the labels a replica computes as it is.

* ``willump.io/emulated-slowdown`` = F: every batch holds the replica F times its compute time,
  one batch at a time (a device F times slower, bound by its own time, not the shared cores).
* ``willump.io/emulated-slowdown-<stage>`` = F and ``willump.io/emulated-ms-per-row-<stage>`` = M:
  the same for one stage's replicas only (e.g. ``...-expensive``), in place of the node's own:
  node types whose speeds differ from stage to stage, as a GPU speeds a deep model more than a
  TF-IDF level.
* ``willump.io/emulated-ms-per-row`` = M: every batch holds the replica at least M ms a row,
  one batch at a time (a device of a fixed speed, whatever load this machine's cores carry:
  with the slowdown alone, a busy machine stretches the compute time and the device with it).
* ``willump.io/emulated-straggle-factor`` = K and ``willump.io/emulated-straggle-share`` = P:
  a share P of the batches take K times as long again (a straggler, "The Tail at Scale"),
  drawn with a seeded generator. The file :data:`STRAGGLE_SWITCH` (on this machine) turns the
  straggling off while it exists, so a benchmark compares with and without on the same cluster.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

SLOWDOWN_LABEL = "willump.io/emulated-slowdown"
MS_PER_ROW_LABEL = "willump.io/emulated-ms-per-row"
STRAGGLE_FACTOR_LABEL = "willump.io/emulated-straggle-factor"
STRAGGLE_SHARE_LABEL = "willump.io/emulated-straggle-share"
#: while this file exists, emulated stragglers compute at their node's plain speed
STRAGGLE_SWITCH = os.path.join(os.environ.get("TMPDIR", "/tmp"), "willump-emulated-straggle-off")


def _label(labels: dict, key: str, default: float) -> float:
    value = labels.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return float(value) if value else default
    except ValueError:
        return default


@dataclass
class NodeEmulation:
    """What this node's labels ask of a replica's batches."""

    slowdown: float = 1.0
    straggle_factor: float = 1.0
    straggle_share: float = 0.0
    seed: int = 0
    ms_per_row: float = 0.0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.slowdown = max(1.0, self.slowdown)
        self.straggle_factor = max(1.0, self.straggle_factor)
        self.straggle_share = min(max(0.0, self.straggle_share), 1.0)
        self.ms_per_row = max(0.0, self.ms_per_row)
        self.rng = random.Random(self.seed)

    @property
    def active(self) -> bool:
        return (self.slowdown > 1.0 or self.ms_per_row > 0.0
                or (self.straggle_factor > 1.0 and self.straggle_share > 0.0))

    def hold_s(self, compute_s: float, rows: int = 0) -> float:
        """Seconds a batch of ``rows`` that computed in ``compute_s`` holds the device beyond that."""
        device_s = max(self.slowdown * compute_s, self.ms_per_row * rows / 1000.0)
        if self.straggle_share and self.rng.random() < self.straggle_share and not os.path.exists(STRAGGLE_SWITCH):
            device_s *= self.straggle_factor
        return max(0.0, device_s - compute_s)

    def info(self) -> dict[str, float]:
        return {"slowdown": self.slowdown, "ms_per_row": self.ms_per_row, "straggle_factor": self.straggle_factor,
                "straggle_share": self.straggle_share}


def node_emulation(seed: int = 0, stage: str | None = None) -> NodeEmulation:
    """This node's emulation for a replica of ``stage`` (none outside Ray or without the labels)."""
    try:
        import ray

        if not ray.is_initialized():  # outside Ray: never connect to whatever Ray runs here
            return NodeEmulation()
        labels = ray.get_runtime_context().get_node_labels()
    except Exception:  # outside Ray
        return NodeEmulation()
    slowdown, ms_per_row = _label(labels, SLOWDOWN_LABEL, 1.0), _label(labels, MS_PER_ROW_LABEL, 0.0)
    if stage is not None:
        slowdown = _label(labels, f"{SLOWDOWN_LABEL}-{stage}", slowdown)
        ms_per_row = _label(labels, f"{MS_PER_ROW_LABEL}-{stage}", ms_per_row)
    return NodeEmulation(slowdown, _label(labels, STRAGGLE_FACTOR_LABEL, 1.0),
                         _label(labels, STRAGGLE_SHARE_LABEL, 0.0), seed=seed, ms_per_row=ms_per_row)
