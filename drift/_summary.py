"""The mergeable state of a set of records: a pane, a rollup of panes, or a reference.

Why one type: a pane, an hour of panes, a window and a frozen baseline are all "some records";
they answer the same questions (counts per value, sketches per numeric column, a row sample) and
merge the same way. Memory per summary is bounded by `max_values` per categorical column, the
sketch's bins per numeric column and the reservoir's capacity.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from drift._counts import ValueCounts
from drift._reservoir import Reservoir
from drift._sketch import QuantileSketch


@dataclass(frozen=True)
class Layout:
    """Sizes and accuracy parameters every summary of one monitor shares."""

    n_cat: int
    n_num: int
    n_clf: int
    max_values: int
    relative_accuracy: float
    min_value: float
    max_bins: int
    #: per numeric column, the centre its sketch buckets distances from (see drift._sketch)
    offsets: tuple[float, ...] = ()

    def offset(self, j: int) -> float:
        return float(self.offsets[j]) if j < len(self.offsets) else 0.0


class Summary:
    """Counts per categorical value, sketches per numeric column, flag totals, row sample."""

    __slots__ = ("cats", "flagged", "layout", "missing", "n", "nonfinite", "nums", "reservoir",
                 "t_max", "t_min")

    def __init__(self, layout: Layout, reservoir: tuple[int, int] | None) -> None:
        self.layout = layout
        self.n = 0
        self.t_min = math.inf
        self.t_max = -math.inf
        self.cats = [ValueCounts(layout.max_values) for _ in range(layout.n_cat)]
        self.nums = [
            QuantileSketch(layout.relative_accuracy, layout.min_value, layout.max_bins,
                           layout.offset(j))
            for j in range(layout.n_num)
        ]
        self.missing = np.zeros(layout.n_num, dtype=np.int64)
        self.nonfinite = np.zeros(layout.n_num, dtype=np.int64)
        self.flagged = np.zeros(layout.n_clf, dtype=np.int64)
        self.reservoir = (
            None if reservoir is None else Reservoir(layout.n_cat, layout.n_num, reservoir)
        )

    def add(
        self,
        ts: np.ndarray,
        cat: np.ndarray,
        num: np.ndarray,
        flags: np.ndarray,
        prio: np.ndarray | None,
    ) -> None:
        """Add rows given column-major arrays (cat: n_cat x m, num: n_num x m)."""
        m = ts.size
        if m == 0:
            return
        self.n += m
        self.t_min = min(self.t_min, float(ts.min()))
        self.t_max = max(self.t_max, float(ts.max()))
        for i, counts in enumerate(self.cats):
            counts.add_bincount(np.bincount(cat[i]))
        all_finite = bool(np.isfinite(num).all()) if num.size else True
        for j, sketch in enumerate(self.nums):
            x = num[j]
            if all_finite:
                sketch.update(x)
                continue
            fin = np.isfinite(x)
            nan = int(np.isnan(x).sum())
            self.missing[j] += nan
            self.nonfinite[j] += int(m - fin.sum()) - nan
            if fin.any():
                sketch.update(x[fin])
        if self.layout.n_clf:
            if flags.any():
                for k in range(self.layout.n_clf):
                    self.flagged[k] += int(np.count_nonzero(flags & np.uint32(1 << k)))
        if self.reservoir is not None and prio is not None:
            self.reservoir.add(cat, num, flags, prio)

    def merge(self, other: Summary) -> None:
        self.n += other.n
        self.t_min = min(self.t_min, other.t_min)
        self.t_max = max(self.t_max, other.t_max)
        for a, b in zip(self.cats, other.cats, strict=True):
            a.merge(b)
        for a, b in zip(self.nums, other.nums, strict=True):
            a.merge(b)
        self.missing += other.missing
        self.nonfinite += other.nonfinite
        self.flagged += other.flagged
        if self.reservoir is not None and other.reservoir is not None:
            self.reservoir.merge(other.reservoir)

    def copy(self, with_reservoir: bool = True) -> Summary:
        out = Summary(self.layout, None)
        out.n, out.t_min, out.t_max = self.n, self.t_min, self.t_max
        out.cats = [c.copy() for c in self.cats]
        out.nums = [s.copy() for s in self.nums]
        out.missing, out.nonfinite = self.missing.copy(), self.nonfinite.copy()
        out.flagged = self.flagged.copy()
        if with_reservoir and self.reservoir is not None:
            out.reservoir = self.reservoir.copy()
        return out

    def drop_reservoir(self) -> None:
        self.reservoir = None

    def nbytes(self) -> int:
        total = sum(c.nbytes() for c in self.cats) + sum(s.nbytes() for s in self.nums)
        total += self.missing.nbytes + self.nonfinite.nbytes + self.flagged.nbytes + 200
        if self.reservoir is not None:
            total += self.reservoir.nbytes()
        return total

    # ---------------------------------------------------------------- persistence
    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {
            "head": np.array([self.n, self.t_min, self.t_max], dtype=np.float64),
            "missing": self.missing,
            "nonfinite": self.nonfinite,
            "flagged": self.flagged,
        }
        for i, c in enumerate(self.cats):
            for k, v in c.to_state().items():
                arrays[f"c{i}.{k}"] = v
        for j, s in enumerate(self.nums):
            for k, v in s.to_state().items():
                arrays[f"s{j}.{k}"] = v
        if self.reservoir is not None:
            for k, v in self.reservoir.to_state().items():
                arrays[f"r.{k}"] = v
        return pack(arrays)

    @classmethod
    def from_bytes(cls, layout: Layout, blob: bytes) -> Summary:
        arrays = unpack(blob)
        out = cls(layout, None)
        n, t_min, t_max = arrays["head"].tolist()
        out.n, out.t_min, out.t_max = int(n), t_min, t_max
        out.missing = arrays["missing"].astype(np.int64)
        out.nonfinite = arrays["nonfinite"].astype(np.int64)
        out.flagged = arrays["flagged"].astype(np.int64)
        out.cats = [
            ValueCounts.from_state(_sub(arrays, f"c{i}.")) for i in range(layout.n_cat)
        ]
        out.nums = [
            QuantileSketch.from_state(_sub(arrays, f"s{j}.")) for j in range(layout.n_num)
        ]
        if "r.meta" in arrays:
            out.reservoir = Reservoir.from_state(_sub(arrays, "r."))
        return out


def _sub(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    """Arrays to bytes: a JSON header (name, dtype, shape) then the raw buffers."""
    header = []
    chunks = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        header.append([name, a.dtype.str, list(a.shape)])
        chunks.append(a.tobytes())
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


def unpack(blob: bytes) -> dict[str, np.ndarray]:
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size].decode())
    pos = 8 + size
    out = {}
    for name, dtype, shape in header:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        out[name] = np.frombuffer(blob, dtype=dt, count=count, offset=pos).reshape(shape).copy()
        pos += count * dt.itemsize
    return out
