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
- null_iid: stationary, light tail (0.2% of rows in a Pareto tail).
- null_ar1: the latency level of every segment alike and the mean of `f_num` wander from pane
  to pane as AR(1) processes (phi 0.8; 3% and 0.02 std): autocorrelated load, not a cause.
Planted families for the sampled regime (change at `change_pane`):
- nested: replica r7, which only region ap has, gets latency x3 (the cause is the replica).
- two_causes: two disjoint 2-attribute combinations both get latency x3.
- latency_x1_5: one 2-attribute combination gets latency x1.5 (a weak cause).
- client_50k: a 50,000-level `client` attribute; one client holding 2% of rows gets x3.
- confounded_mix: a segment that is always 3x slower grows from 2% to 10% of traffic: p99
  rises with no segment getting slower; the cause is the segment (in explain and mix shift).
- slow_client, slow_replica, bad_version: one client (or replica, or model version) holding
  2-20% of rows gets latency x3 (request-level causes).

Serving-shaped streams (`request_rows=(lo, hi)`): rows come in requests of lo..hi rows, as
serving sends them. The rows of a request share its time, latency, error and the request-level
attributes (REQUEST_ATTRIBUTES: the client, where it was served, by which version); the other
columns vary by row. Each row carries its `request_id`. `clients=k` gives the client attribute
k Zipf-distributed levels (exponent CLIENT_ZIPF), as real clients are.
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
KINDS = ("latency_combo", "mix_shift", "conditional", "gradual", "null_heavy", "null_seasonal",
         "null_iid", "null_ar1", "nested", "two_causes", "latency_x1_5", "client_50k",
         "confounded_mix", "slow_client", "slow_replica", "bad_version")
#: Request-level causes: one value of the attribute gets latency x LATENCY_FACTOR.
REQUEST_CAUSES = {"slow_client": "client", "slow_replica": "replica", "bad_version": "version"}
NULL_KINDS = ("null_iid", "null_seasonal", "null_ar1", "null_heavy")
#: AR(1) load of the null_ar1 stream: coefficient, latency-level sd (log scale), f_num mean sd.
AR_PHI, AR_LATENCY_SD, AR_FEATURE_SD = 0.8, 0.03, 0.02
#: Levels of the client attribute of client_50k, and the planted client's share.
CLIENT_LEVELS, CLIENT_SHARE = 50_000, 0.02
#: confounded_mix: the slow segment's latency factor and its share before / after.
CONFOUNDED_FACTOR, CONFOUNDED_BASE, CONFOUNDED_SHIFTED = 3.0, 0.02, 0.10

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
#: Columns a request's rows share in serving-shaped streams (the rest vary by row).
REQUEST_ATTRIBUTES = ("region", "version", "replica", "client", "device")
REQUEST_COLUMNS = ("timestamp", *REQUEST_ATTRIBUTES, "latency_ms", "error")
#: Zipf exponent of the client attribute when `clients` is set.
CLIENT_ZIPF = 1.1


def _values(attr: str, k: int) -> list[str]:
    return [f"{attr}_{i}" for i in range(k)]


_CLIENT_NAMES: list[np.ndarray] = []


def _client_names() -> np.ndarray:
    """The 50,000 client names, built once (a copy per call: callers overwrite some)."""
    if not _CLIENT_NAMES:
        _CLIENT_NAMES.append(np.array([f"c{i}" for i in range(CLIENT_LEVELS)], dtype=object))
    return _CLIENT_NAMES[0].copy()


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
    #: rows per request, uniform on (lo, hi); None: independent rows
    request_rows: tuple[int, int] | None = None
    #: levels of the client attribute (Zipf); None: the default 5
    clients: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.request_rows is not None:
            lo, hi = self.request_rows
            if not 1 <= lo <= hi:
                raise ValueError(f"request_rows must be (lo, hi) with 1 <= lo <= hi, got "
                                 f"{self.request_rows!r}")
        rng = np.random.default_rng([self.seed, 7919])
        cards = [self.clients if a == "client" and self.clients else k
                 for a, k in zip(ATTRIBUTES, CARDINALITIES, strict=True)]
        self.values = {a: _values(a, k) for a, k in zip(ATTRIBUTES, cards, strict=True)}
        self.probs = {}
        for a, k in zip(ATTRIBUTES, cards, strict=True):
            p = _zipf(k, CLIENT_ZIPF) if a == "client" and self.clients else _zipf(k)
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
        elif self.kind in ("latency_x1_5", "client_50k"):
            self.planted = self._pick_combo(rng)
        elif self.kind == "two_causes":
            first = self._pick_combo(rng)
            for _ in range(1000):
                second = self._pick_combo(rng)
                if not set(second["attributes"]) & set(first["attributes"]):
                    break
            self.planted = {"causes": [first["attributes"], second["attributes"]],
                            "attributes": first["attributes"]}
        elif self.kind == "nested":
            self.planted = {"attributes": {"replica": "replica_7"}}
        elif self.kind == "confounded_mix":
            attr = "source"
            special = f"{attr}_slow"
            self.values[attr] = [*self.values[attr], special]
            self.probs[attr] = np.append(self.probs[attr] * (1 - CONFOUNDED_BASE),
                                         CONFOUNDED_BASE)
            self.planted = {"attributes": {attr: special}}
        if self.kind == "client_50k":
            self.planted = {"attributes": {"client": "client_big"}}
        if self.kind in REQUEST_CAUSES:
            attr = REQUEST_CAUSES[self.kind]
            share = self.probs[attr]
            ok = np.flatnonzero((share >= 0.02) & (share <= 0.20))
            i = int(ok[np.argmax(share[ok])]) if ok.size else int(np.argmin(abs(share - 0.1)))
            self.planted = {"attributes": {attr: self.values[attr][i]}}
        self.segment_effect = {
            a: np.exp(rng.normal(0.0, SEGMENT_EFFECT_SD, len(self.values[a]))) for a in ATTRIBUTES
        }

    def _pick_combo(self, rng: np.random.Generator) -> dict[str, Any]:
        for _ in range(1000):
            a, b = rng.choice(len(ATTRIBUTES), 2, replace=False)
            attr_a, attr_b = ATTRIBUTES[a], ATTRIBUTES[b]
            i = int(rng.integers(len(self.values[attr_a])))
            j = int(rng.integers(len(self.values[attr_b])))
            share = self.probs[attr_a][i] * self.probs[attr_b][j]
            if 0.01 <= share <= 0.10 and (self.request_rows is None or (
                    attr_a in REQUEST_ATTRIBUTES and attr_b in REQUEST_ATTRIBUTES)):
                return {"attributes": {attr_a: self.values[attr_a][i],
                                       attr_b: self.values[attr_b][j]}, "share": float(share)}
        raise RuntimeError("no combination with a 1-10% share")  # pragma: no cover

    def _pick_segment(self, rng: np.random.Generator) -> dict[str, Any]:
        for _ in range(1000):
            a = int(rng.integers(len(ATTRIBUTES)))
            i = int(rng.integers(len(self.values[ATTRIBUTES[a]])))
            if 0.08 <= self.probs[ATTRIBUTES[a]][i] <= 0.35:
                return {ATTRIBUTES[a]: self.values[ATTRIBUTES[a]][i]}
        raise RuntimeError("no segment with an 8-35% share")  # pragma: no cover

    def season(self, p: int) -> float:
        return float(np.sin(2 * np.pi * p / self.season_panes))

    def ar_level(self, p: int) -> tuple[float, float]:
        """(log-latency level, f_num mean shift) of pane p for null_ar1 (a pure function of
        seed and pane: the AR(1) path is regenerated from its start)."""
        rng = np.random.default_rng([self.seed, 3571])
        e = rng.normal(0.0, 1.0, (p + 1, 2))
        x = np.zeros(2)
        scale = np.sqrt(1 - AR_PHI**2)
        for i in range(p + 1):
            x = AR_PHI * x + scale * e[i]
        return float(x[0] * AR_LATENCY_SD), float(x[1] * AR_FEATURE_SD)

    def changed(self, p: int) -> bool:
        return p >= self.change_pane

    def pane(self, p: int) -> pd.DataFrame:
        rng = np.random.default_rng([self.seed, 104729, p])
        volume = 1.0 + (SEASON_VOLUME * self.season(p) if self.kind == "null_seasonal" else 0.0)
        sizes = None
        if self.request_rows is None:
            n = int(rng.poisson(self.rate * self.pane_seconds * volume))
        else:
            lo, hi = self.request_rows
            m = int(rng.poisson(self.rate * self.pane_seconds * volume * 2.0 / (lo + hi)))
            sizes = rng.integers(lo, hi + 1, m)
            n = int(sizes.sum())
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
            if self.kind == "confounded_mix" and a == "source" and self.changed(p):
                probs = np.append(probs[:-1] / probs[:-1].sum() * (1 - CONFOUNDED_SHIFTED),
                                  CONFOUNDED_SHIFTED)
            codes[a] = rng.choice(len(probs), n, p=probs)
            data[a] = np.asarray(self.values[a], dtype=object)[codes[a]]
        if self.kind == "nested":  # replicas 6 and 7 serve region_0 only
            region0 = codes["region"] == 0
            codes["replica"] = np.where(region0, 6 + (codes["replica"] % 2),
                                        codes["replica"] % 6)
            data["replica"] = np.asarray(self.values["replica"], dtype=object)[codes["replica"]]
        if self.kind == "client_50k":
            big = rng.random(n) < CLIENT_SHARE
            ids = rng.integers(0, CLIENT_LEVELS, n)
            names = _client_names()[ids]
            names[big] = "client_big"
            data["client"] = names
            codes["client"] = np.where(big, -1, ids % CARDINALITIES[3])
        if sizes is not None:  # a request's rows share its request-level attributes
            first = np.repeat(np.cumsum(sizes) - sizes, sizes)
            for a in REQUEST_ATTRIBUTES:
                codes[a], data[a] = codes[a][first], np.asarray(data[a])[first]
            data["timestamp"] = data["timestamp"][first]
        factor = np.ones(n)
        for a in ATTRIBUTES:
            factor *= self.segment_effect[a][np.maximum(codes[a], 0) % len(self.values[a])]
        latency = rng.lognormal(3.0, 0.5, n) * factor
        tail_p = 0.02 if self.kind == "null_heavy" else 0.002
        tail = rng.random(n) < tail_p
        latency[tail] *= 1.0 + rng.pareto(1.5, int(tail.sum()))
        if self.kind == "null_seasonal":
            latency *= 1.0 + SEASON_LATENCY * self.season(p)
        f_shift = 0.0
        if self.kind == "null_ar1":
            level, f_shift = self.ar_level(p)
            latency *= float(np.exp(level))
        if self.changed(p):
            if self.kind in ("latency_combo", "nested", "client_50k", *REQUEST_CAUSES):
                latency[self.mask(data)] *= LATENCY_FACTOR
            elif self.kind == "latency_x1_5":
                latency[self.mask(data)] *= 1.5
            elif self.kind == "two_causes":
                for cause in self.planted["causes"]:
                    latency[self.mask(data, cause)] *= LATENCY_FACTOR
        if self.kind == "confounded_mix":
            latency[self.mask(data)] *= CONFOUNDED_FACTOR  # always slower: not a change
        error = (rng.random(n) < 0.01).astype(np.float64)
        if sizes is not None:  # one latency and one outcome per request
            latency, error = latency[first], error[first]
            data["request_id"] = np.repeat(
                np.array([f"{self.seed}-{p}-{k}" for k in range(sizes.size)], dtype=object), sizes)
        confidence = rng.beta(6.0, 2.0, n)
        f_num = rng.normal(f_shift, 1.0, n)
        if self.kind == "conditional" and self.changed(p):
            f_num[self.mask(data)] += CONDITIONAL_SHIFT_STD
        if self.kind == "gradual" and self.changed(p):
            f_num += GRADUAL_SHIFT_STD * min(1.0, (p - self.change_pane + 1) / self.ramp_panes)
        data.update(
            latency_ms=latency,
            confidence=confidence,
            error=error,
            level=np.where(confidence >= CHEAP_CONFIDENCE, 0, 1),
            f_num=f_num,
            f_heavy=rng.standard_t(3.0, n),
            f_cat=np.asarray(["c0", "c1", "c2", "c3", "c4"], dtype=object)[
                rng.choice(5, n, p=[0.4, 0.25, 0.15, 0.12, 0.08])
            ],
        )
        return pd.DataFrame(data)

    def mask(self, frame: pd.DataFrame | dict, attrs: dict | None = None) -> np.ndarray:
        """Rows of the planted segment or combination (or of `attrs`)."""
        attrs = self.planted.get("attributes", {}) if attrs is None else attrs
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
