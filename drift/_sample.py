"""Weighted row samples of a window or a reference, assembled from per-pane reservoirs.

Why: the explainer and the per-segment tests need rows; each pane contributes its reservoir
rows with that pane's Horvitz-Thompson weights, so the union estimates window totals without
bias and is exact whenever every pane kept all its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from drift._reservoir import Reservoir


@dataclass
class Sample:
    """Rows: categorical codes (n_cat x R), numeric values (n_num x R), flags, weights."""

    cat: np.ndarray
    num: np.ndarray
    flags: np.ndarray
    weight: np.ndarray
    #: request key per row (its sampling priority, shared by a request's rows) when rows came
    #: in requests (drift._clusters); None: independent rows
    cluster: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.weight.size)

    @property
    def exact(self) -> bool:
        """True when every row stands for itself only (no sampling)."""
        return bool(np.all(self.weight == 1.0))

    @property
    def sampling_var(self) -> np.ndarray:
        """Per-row Horvitz-Thompson variance contribution w * (w - 1)."""
        return self.weight * (self.weight - 1.0)

    @classmethod
    def from_reservoirs(cls, reservoirs: Sequence[Reservoir], n_cat: int, n_num: int,
                        clustered: bool = False) -> Sample:
        """The union of reservoirs; `clustered`: their rows came in requests, each request's
        rows sharing one priority, which then serves as the request key."""
        parts = [r for r in reservoirs if r is not None]
        if not parts:
            return cls(
                np.zeros((n_cat, 0), dtype=np.int32), np.zeros((n_num, 0)),
                np.zeros(0, dtype=np.uint32), np.zeros(0),
                np.zeros(0) if clustered else None,
            )
        weights = [r.weights() for r in parts]  # compacts
        return cls(
            np.concatenate([r.cat for r in parts], axis=1),
            np.concatenate([r.num for r in parts], axis=1),
            np.concatenate([r.flags for r in parts]),
            np.concatenate(weights),
            np.concatenate([r.prio for r in parts]) if clustered else None,
        )

    def thin(self, max_rows: int) -> Sample:
        """At most about `max_rows` rows: every k-th row (reservoir rows are in priority order,
        so this is a uniform thinning), weights rescaled per stratum so totals stay exact."""
        if self.size <= max_rows:
            return self
        k = -(-self.size // max_rows)
        if self.cluster is None:
            idx = np.arange(0, self.size, k)
        else:  # whole requests: every k-th request by key (keys are uniform priorities)
            _, inverse = np.unique(self.cluster, return_inverse=True)
            idx = np.flatnonzero((inverse.ravel() % k) == 0)
        w = self.weight[idx].copy()
        for stratum in (self.flags == 0, self.flags != 0):
            kept = stratum[idx]
            total, part = float(self.weight[stratum].sum()), float(w[kept].sum())
            if part > 0:
                w[kept] *= total / part
        return Sample(self.cat[:, idx], self.num[:, idx], self.flags[idx], w,
                      None if self.cluster is None else self.cluster[idx])

    def zero_cell_floor(self, rows: np.ndarray | None = None) -> float:
        """Variance floor of a cell total estimated from these rows (drift._ratios): half a row
        of the heaviest stratum, 0.5 w (w - 1) with w that stratum's mean weight; 0 when exact.
        `rows` (a mask) restricts which rows count (e.g. the outliers)."""
        w, flags = self.weight, self.flags
        if rows is not None:
            w, flags = w[rows], flags[rows]
        if w.size == 0:
            w, flags = self.weight, self.flags
        floor = 0.0
        for stratum in (flags == 0, flags != 0):
            if stratum.any():
                m = float(w[stratum].mean())
                floor = max(floor, 0.5 * m * (m - 1.0))
        return floor

    def column_values(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Numeric columns by name (views)."""
        return {name: self.num[i] for i, name in enumerate(names)}
