"""Stratified bottom-k row sample for combination mining and per-segment tests.

Why: explaining attribute combinations needs rows (joint values), not marginal counts, but a
pane may hold any number of rows. Each row gets a uniform random priority; a stratum keeps its
`k` highest priorities. That sample is uniform within the stratum, mergeable (the top-k of a
union is the top-k of the parts' top-ks) and independent of arrival order, so a restarted
monitor rebuilds the same sample. Rows flagged by any classifier form their own stratum so rare
outliers are kept far more often than a uniform sample would keep them. A kept row stands for
`population / kept` rows of its stratum (Horvitz-Thompson weight); while a stratum has fewer
than `k` rows every row is kept with weight 1, so small data is exact.
"""

from __future__ import annotations

import numpy as np

#: Default rows kept per pane among rows no classifier flagged.
DEFAULT_RESERVOIR_SIZE = 20_000
#: Default rows kept per pane among rows some classifier flagged.
DEFAULT_FLAGGED_RESERVOIR_SIZE = 10_000

STRATA = 2  # 0: unflagged, 1: flagged by at least one classifier


class Reservoir:
    """Rows (categorical codes, numeric values, classifier flags) with per-stratum weights."""

    __slots__ = ("_pending", "capacity", "cat", "flags", "n_cat", "n_num", "num", "population",
                 "prio", "threshold")

    def __init__(self, n_cat: int, n_num: int, capacity: tuple[int, int]) -> None:
        self.n_cat, self.n_num = int(n_cat), int(n_num)
        self.capacity = (int(capacity[0]), int(capacity[1]))
        if min(self.capacity) < 1:
            raise ValueError(f"reservoir sizes must be >= 1, got {capacity!r}")
        self.population = np.zeros(STRATA, dtype=np.int64)
        self.threshold = np.full(STRATA, -1.0)  # priorities at or below can never be kept
        self.cat = np.zeros((self.n_cat, 0), dtype=np.int32)
        self.num = np.zeros((self.n_num, 0), dtype=np.float64)
        self.flags = np.zeros(0, dtype=np.uint32)
        self.prio = np.zeros(0, dtype=np.float64)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def copy(self) -> Reservoir:
        self.compact()
        out = Reservoir(self.n_cat, self.n_num, self.capacity)
        out.population = self.population.copy()
        out.threshold = self.threshold.copy()
        out.cat, out.num = self.cat.copy(), self.num.copy()
        out.flags, out.prio = self.flags.copy(), self.prio.copy()
        return out

    @property
    def size(self) -> int:
        return int(self.prio.size + sum(p[3].size for p in self._pending))

    def add(
        self,
        cat: np.ndarray,
        num: np.ndarray,
        flags: np.ndarray,
        prio: np.ndarray,
        population: np.ndarray | None = None,
    ) -> None:
        """Offer rows; `population` (per stratum) defaults to the rows offered."""
        stratum = (flags != 0).astype(np.int8)
        if population is None:
            flagged = int(np.count_nonzero(stratum))
            population = np.array([prio.size - flagged, flagged], dtype=np.int64)
        self.population += population
        keep = prio > self.threshold[stratum]
        if not keep.all():
            cat, num, flags, prio = cat[:, keep], num[:, keep], flags[keep], prio[keep]
        if prio.size:
            self._pending.append((cat, num, flags, prio))
            if self.size > 2 * sum(self.capacity):
                self.compact()

    def compact(self) -> None:
        """Fold pending rows in and keep each stratum's top-k priorities."""
        if not self._pending:
            return
        parts = [(self.cat, self.num, self.flags, self.prio), *self._pending]
        self._pending = []
        cat = np.concatenate([p[0] for p in parts], axis=1)
        num = np.concatenate([p[1] for p in parts], axis=1)
        flags = np.concatenate([p[2] for p in parts])
        prio = np.concatenate([p[3] for p in parts])
        stratum = flags != 0
        keep_idx = []
        for s in range(STRATA):
            idx = np.flatnonzero(stratum == bool(s))
            k = self.capacity[s]
            if idx.size > k:
                top = np.argpartition(-prio[idx], k - 1)[:k]
                idx = idx[top]
                self.threshold[s] = float(prio[idx].min())
            keep_idx.append(idx)
        order = np.concatenate(keep_idx)
        # a content-defined order (priority) makes samples identical whatever the merge order
        order = order[np.argsort(-prio[order], kind="stable")]
        self.cat, self.num = cat[:, order], num[:, order]
        self.flags, self.prio = flags[order], prio[order]

    def merge(self, other: Reservoir) -> None:
        other.compact()
        self.add(other.cat, other.num, other.flags, other.prio, other.population.copy())
        self.threshold = np.maximum(self.threshold, other.threshold)

    def weights(self) -> np.ndarray:
        """Horvitz-Thompson weight of each kept row (1.0 while a stratum is complete)."""
        self.compact()
        stratum = (self.flags != 0).astype(np.int8)
        kept = np.bincount(stratum, minlength=STRATA)
        per = np.where(kept > 0, self.population / np.maximum(kept, 1), 0.0)
        per = np.where(kept == self.population, 1.0, per)
        return per[stratum]

    def nbytes(self) -> int:
        self.compact()
        return int(self.cat.nbytes + self.num.nbytes + self.flags.nbytes + self.prio.nbytes) + 96

    def to_state(self) -> dict:
        self.compact()
        return {
            "meta": np.array(
                [self.n_cat, self.n_num, *self.capacity, *self.population], dtype=np.int64
            ),
            "threshold": self.threshold.copy(),
            "cat": self.cat,
            "num": self.num,
            "flags": self.flags,
            "prio": self.prio,
        }

    @classmethod
    def from_state(cls, state: dict) -> Reservoir:
        n_cat, n_num, k0, k1, p0, p1 = (int(v) for v in state["meta"])
        out = cls(n_cat, n_num, (k0, k1))
        out.population = np.array([p0, p1], dtype=np.int64)
        out.threshold = np.asarray(state["threshold"], dtype=np.float64).copy()
        out.cat = np.asarray(state["cat"], dtype=np.int32).reshape(n_cat, -1).copy()
        out.num = np.asarray(state["num"], dtype=np.float64).reshape(n_num, -1).copy()
        out.flags = np.asarray(state["flags"], dtype=np.uint32).copy()
        out.prio = np.asarray(state["prio"], dtype=np.float64).copy()
        return out
