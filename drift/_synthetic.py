"""Seeded synthetic serving streams with planted causes, for the benchmark and the tests.

Why synthetic: quality needs ground truth. Each stream is a pure function of (kind, seed, pane),
so a pane can be regenerated anywhere (benchmark, tests, the persistence subprocess) and the
planted cause is known exactly.

Kinds (the change starts at `change_pane`):
- latency_combo: latency x3 for rows of one 2-attribute combination.
- mix_shift: one attribute value's share goes from 2% to 20%.
- conditional: feature `f_num` shifts by +1 std only inside one segment (attribute value).
- gradual: `f_num`'s mean drifts linearly by +1 std over `ramp_panes` panes, everywhere.
- null_heavy: stationary, heavy-tailed latency (a Pareto tail) and Student-t feature.
- null_seasonal: stationary mix and features; traffic volume follows a cycle (+-60%) and the
  latency level follows it (+-15%) for every segment alike (load, not a cause).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

ATTRIBUTES = ("region", "version", "replica", "client", "source", "device")
CARDINALITIES = (4, 3, 8, 5, 10, 6)
METRICS = ("latency_ms", "confidence", "error")
FEATURES = {"f_num": "numeric", "f_heavy": "numeric", "f_cat": "categorical"}
LEVEL = "level"
KINDS = ("latency_combo", "mix_shift", "conditional", "gradual", "null_heavy", "null_seasonal")

#: Planted effect sizes.
LATENCY_FACTOR = 3.0
MIX_BASE_SHARE, MIX_SHIFTED_SHARE = 0.02, 0.20
CONDITIONAL_SHIFT_STD = 1.0
GRADUAL_SHIFT_STD = 1.0
#: Seasonal null: volume and latency-level amplitudes, cycle length in panes.
SEASON_VOLUME, SEASON_LATENCY = 0.6, 0.15
#: Spread of per-value latency multipliers (log scale): segments differ a little, none is a cause.
SEGMENT_EFFECT_SD = 0.02
#: A confident small-model answer (the cheap cascade level answers it).
CHEAP_CONFIDENCE = 0.6


def _values(attr: str, k: int) -> list[str]:
    return [f"{attr}_{i}" for i in range(k)]


def _zipf(k: int, s: float = 0.8) -> np.ndarray:
    p = 1.0 / np.arange(1, k + 1) ** s
    return p / p.sum()


@dataclass
class Stream:
    """One seeded stream; `pane(p)` returns the records of pane p as a DataFrame."""

    kind: str
    seed: int
    rate: float = 50.0
    pane_seconds: float = 60.0
    change_pane: int = 60
    ramp_panes: int = 120
    season_panes: int = 240
    t0: float = 1_700_000_000.0
    planted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        rng = np.random.default_rng([self.seed, 7919])
        self.values = {a: _values(a, k) for a, k in zip(ATTRIBUTES, CARDINALITIES, strict=True)}
        self.probs = {}
        for a, k in zip(ATTRIBUTES, CARDINALITIES, strict=True):
            p = _zipf(k)
            self.probs[a] = p[rng.permutation(k)]
        if self.kind == "latency_combo":
            self.planted = self._pick_combo(rng)
        elif self.kind == "mix_shift":
            attr = str(rng.choice(ATTRIBUTES))
            special = f"{attr}_new"
            self.values[attr] = [*self.values[attr], special]
            self.probs[attr] = np.append(self.probs[attr] * (1 - MIX_BASE_SHARE), MIX_BASE_SHARE)
            self.planted = {"attributes": {attr: special}}
        elif self.kind == "conditional":
            self.planted = {"attributes": self._pick_segment(rng), "column": "f_num"}
        elif self.kind == "gradual":
            self.planted = {"column": "f_num"}
        self.segment_effect = {
            a: np.exp(rng.normal(0.0, SEGMENT_EFFECT_SD, len(self.values[a]))) for a in ATTRIBUTES
        }

    def _pick_combo(self, rng: np.random.Generator) -> dict[str, Any]:
        for _ in range(1000):
            a, b = rng.choice(len(ATTRIBUTES), 2, replace=False)
            i = int(rng.integers(CARDINALITIES[a]))
            j = int(rng.integers(CARDINALITIES[b]))
            attr_a, attr_b = ATTRIBUTES[a], ATTRIBUTES[b]
            share = self.probs[attr_a][i] * self.probs[attr_b][j]
            if 0.01 <= share <= 0.10:
                return {"attributes": {attr_a: self.values[attr_a][i],
                                       attr_b: self.values[attr_b][j]}, "share": float(share)}
        raise RuntimeError("no combination with a 1-10% share")  # pragma: no cover

    def _pick_segment(self, rng: np.random.Generator) -> dict[str, Any]:
        for _ in range(1000):
            a = int(rng.integers(len(ATTRIBUTES)))
            i = int(rng.integers(CARDINALITIES[a]))
            if 0.08 <= self.probs[ATTRIBUTES[a]][i] <= 0.35:
                return {ATTRIBUTES[a]: self.values[ATTRIBUTES[a]][i]}
        raise RuntimeError("no segment with an 8-35% share")  # pragma: no cover

    def season(self, p: int) -> float:
        return float(np.sin(2 * np.pi * p / self.season_panes))

    def changed(self, p: int) -> bool:
        return p >= self.change_pane

    def pane(self, p: int) -> pd.DataFrame:
        rng = np.random.default_rng([self.seed, 104729, p])
        volume = 1.0 + (SEASON_VOLUME * self.season(p) if self.kind == "null_seasonal" else 0.0)
        n = int(rng.poisson(self.rate * self.pane_seconds * volume))
        start = self.t0 + p * self.pane_seconds
        data: dict[str, Any] = {
            "timestamp": start + np.sort(rng.random(n)) * self.pane_seconds,
        }
        codes = {}
        for a in ATTRIBUTES:
            probs = self.probs[a]
            if self.kind == "mix_shift" and a in self.planted["attributes"] and self.changed(p):
                probs = np.append(probs[:-1] / probs[:-1].sum() * (1 - MIX_SHIFTED_SHARE),
                                  MIX_SHIFTED_SHARE)
            codes[a] = rng.choice(len(probs), n, p=probs)
            data[a] = np.asarray(self.values[a], dtype=object)[codes[a]]
        factor = np.ones(n)
        for a in ATTRIBUTES:
            factor *= self.segment_effect[a][codes[a]]
        latency = rng.lognormal(3.0, 0.5, n) * factor
        tail_p = 0.02 if self.kind == "null_heavy" else 0.002
        tail = rng.random(n) < tail_p
        latency[tail] *= 1.0 + rng.pareto(1.5, int(tail.sum()))
        if self.kind == "null_seasonal":
            latency *= 1.0 + SEASON_LATENCY * self.season(p)
        if self.kind == "latency_combo" and self.changed(p):
            latency[self.mask(data)] *= LATENCY_FACTOR
        confidence = rng.beta(6.0, 2.0, n)
        f_num = rng.normal(0.0, 1.0, n)
        if self.kind == "conditional" and self.changed(p):
            f_num[self.mask(data)] += CONDITIONAL_SHIFT_STD
        if self.kind == "gradual" and self.changed(p):
            f_num += GRADUAL_SHIFT_STD * min(1.0, (p - self.change_pane + 1) / self.ramp_panes)
        data.update(
            latency_ms=latency,
            confidence=confidence,
            error=(rng.random(n) < 0.01).astype(np.float64),
            level=np.where(confidence >= CHEAP_CONFIDENCE, 0, 1),
            f_num=f_num,
            f_heavy=rng.standard_t(3.0, n),
            f_cat=np.asarray(["c0", "c1", "c2", "c3", "c4"], dtype=object)[
                rng.choice(5, n, p=[0.4, 0.25, 0.15, 0.12, 0.08])
            ],
        )
        return pd.DataFrame(data)

    def mask(self, frame: pd.DataFrame | dict) -> np.ndarray:
        """Rows of the planted segment or combination."""
        attrs = self.planted.get("attributes", {})
        m = np.ones(len(frame["timestamp"]), dtype=bool)
        for a, v in attrs.items():
            m &= np.asarray(frame[a]) == v
        return m


def monitor_kwargs(**overrides: Any) -> dict[str, Any]:
    """Monitor arguments that fit the synthetic schema."""
    kw: dict[str, Any] = {
        "attributes": list(ATTRIBUTES),
        "metrics": ["latency_ms"],
        "features": dict(FEATURES),
        "level_column": LEVEL,
        "confidence_column": "confidence",
        "error_column": "error",
    }
    kw.update(overrides)
    return kw
