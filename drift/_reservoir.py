"""Stratified priority sample of rows, mergeable without bias across unequal panes.

Why: explaining attribute combinations needs rows (joint values), not marginal counts, but a
pane may hold any number of rows. Each row gets a uniform random priority u; a stratum keeps its
`k` highest priorities (bottom-k / priority sampling). Rows flagged by any classifier form their
own stratum so rare outliers are kept far more often than a uniform sample would keep them.

Per-row inclusion probabilities make merges unbiased. Every compaction that discards rows has a
cut c (the largest discarded priority); each surviving row remembers `tau`, the largest cut it
lived through, and was kept with probability 1 - tau (rank conditioning, as in priority sampling:
Duffield, Lund and Thorup 2007). Merging panes that sampled at different rates (500 rows of
500, 20,000 rows of 20,000 sampled down to 500) therefore keeps each row's own probability
instead of one weight per stratum, which is what biased the old `population / kept` merge.
Horvitz-Thompson weights 1 / (1 - tau) are calibrated per stratum to the exact population
(a Hajek estimator), so stratum totals stay exact. While a stratum never discarded a row every
weight is 1: small data is exact. The sample is independent of arrival order (the kept set is
the top-k of the union), so a restarted monitor rebuilds the same sample.
"""

from __future__ import annotations

import numpy as np

#: Default rows kept per pane among rows no classifier flagged.
DEFAULT_RESERVOIR_SIZE = 20_000
#: Default rows kept per pane among rows some classifier flagged.
DEFAULT_FLAGGED_RESERVOIR_SIZE = 10_000

STRATA = 2  # 0: unflagged, 1: flagged by at least one classifier


class Reservoir:
    """Rows (categorical codes, numeric values, flags) with per-row inclusion thresholds."""

    __slots__ = ("_pending", "_sorted", "capacity", "cat", "flags", "n_cat", "n_num", "num",
                 "population", "prio", "tau", "threshold")

    def __init__(self, n_cat: int, n_num: int, capacity: tuple[int, int]) -> None:
        self.n_cat, self.n_num = int(n_cat), int(n_num)
        self.capacity = (int(capacity[0]), int(capacity[1]))
        if min(self.capacity) < 1:
            raise ValueError(f"reservoir sizes must be >= 1, got {capacity!r}")
        self.population = np.zeros(STRATA, dtype=np.int64)
        # largest priority this reservoir discarded per stratum: later rows at or below it
        # can never be kept, so `add` drops them before copying anything
        self.threshold = np.full(STRATA, -1.0)
        self.cat = np.zeros((self.n_cat, 0), dtype=np.int32)
        self.num = np.zeros((self.n_num, 0), dtype=np.float64)
        self.flags = np.zeros(0, dtype=np.uint32)
        self.prio = np.zeros(0, dtype=np.float64)
        self.tau = np.zeros(0, dtype=np.float64)
        self._pending: list[tuple[np.ndarray, ...]] = []
        self._sorted = True

    def copy(self) -> Reservoir:
        self.compact()
        out = Reservoir(self.n_cat, self.n_num, self.capacity)
        out.population = self.population.copy()
        out.threshold = self.threshold.copy()
        out.cat, out.num = self.cat.copy(), self.num.copy()
        out.flags, out.prio, out.tau = self.flags.copy(), self.prio.copy(), self.tau.copy()
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
        tau: np.ndarray | None = None,
    ) -> None:
        """Offer rows; `population` (per stratum) defaults to the rows offered, `tau` to 0."""
        stratum = (flags != 0).astype(np.int8)
        if population is None:
            flagged = int(np.count_nonzero(stratum))
            population = np.array([prio.size - flagged, flagged], dtype=np.int64)
        self.population += population
        if tau is None:
            tau = np.zeros(prio.size)
        keep = prio > self.threshold[stratum]
        if not keep.all():
            cat, num, flags, prio, tau = cat[:, keep], num[:, keep], flags[keep], prio[keep], \
                tau[keep]
        if prio.size:
            # a row that passed this reservoir's earlier cut was subject to it
            tau = np.maximum(tau, self.threshold[stratum[keep]] if not keep.all()
                             else self.threshold[stratum])
            self._pending.append((cat, num, flags, prio, tau))
            if self.size > 2 * sum(self.capacity):
                self._fold()

    def compact(self, capacity: tuple[int, int] | None = None) -> None:
        """Fold pending rows in, keep each stratum's top-k priorities (k = capacity), and put
        the rows in priority order (a content-defined order: samples are identical whatever
        the merge order). Readers call this; ingest only folds."""
        self._fold(capacity)
        if not self._sorted:
            order = np.argsort(-self.prio, kind="stable")
            self.cat, self.num = self.cat[:, order], self.num[:, order]
            self.flags, self.prio, self.tau = self.flags[order], self.prio[order], self.tau[order]
            self._sorted = True

    def _fold(self, capacity: tuple[int, int] | None = None) -> None:
        """Fold pending rows in and keep each stratum's top-k priorities, unordered."""
        if capacity is not None:
            self.capacity = (int(capacity[0]), int(capacity[1]))
        elif not self._pending:
            return
        parts = [(self.cat, self.num, self.flags, self.prio, self.tau), *self._pending]
        self._pending = []
        cat = np.concatenate([p[0] for p in parts], axis=1)
        num = np.concatenate([p[1] for p in parts], axis=1)
        flags = np.concatenate([p[2] for p in parts])
        prio = np.concatenate([p[3] for p in parts])
        tau = np.concatenate([p[4] for p in parts])
        stratum = flags != 0
        keep_idx = []
        for s in range(STRATA):
            idx = np.flatnonzero(stratum == bool(s))
            k = self.capacity[s]
            if idx.size > k:
                part = np.argpartition(-prio[idx], k)
                cut = float(prio[idx[part[k:]]].max())
                idx = idx[part[:k]]
                self.threshold[s] = max(self.threshold[s], cut)
                tau[idx] = np.maximum(tau[idx], cut)
            keep_idx.append(idx)
        order = np.concatenate(keep_idx)
        self.cat, self.num = cat[:, order], num[:, order]
        self.flags, self.prio, self.tau = flags[order], prio[order], tau[order]
        self._sorted = False

    def merge(self, other: Reservoir) -> None:
        """Add another reservoir's rows; each keeps its own inclusion threshold."""
        other.compact()
        self.add(other.cat, other.num, other.flags, other.prio, other.population.copy(),
                 other.tau)

    def top(self, capacity: tuple[int, int]) -> Reservoir:
        """A new reservoir holding only the top `capacity` priorities per stratum (what
        `copy().downsample(capacity)` gives, without copying the rows that are cut)."""
        self.compact()
        out = Reservoir(self.n_cat, self.n_num, capacity)
        out.population = self.population.copy()
        out.threshold = self.threshold.copy()
        stratum = self.flags != 0
        keep = []
        tau = self.tau.copy()
        for s_ in range(STRATA):
            idx = np.flatnonzero(stratum == bool(s_))  # priority order (compacted)
            k = out.capacity[s_]
            if idx.size > k:
                cut = float(self.prio[idx[k]])
                out.threshold[s_] = max(out.threshold[s_], cut)
                idx = idx[:k]
                tau[idx] = np.maximum(tau[idx], cut)
            keep.append(idx)
        order = np.sort(np.concatenate(keep))
        out.cat, out.num = self.cat[:, order], self.num[:, order]
        out.flags, out.prio, out.tau = self.flags[order], self.prio[order], tau[order]
        return out

    def downsample(self, capacity: tuple[int, int]) -> None:
        """Keep only the top `capacity` priorities per stratum (older tiers keep fewer rows)."""
        self.compact(capacity)

    def weights(self) -> np.ndarray:
        """Calibrated Horvitz-Thompson weight of each kept row (1.0 while nothing was cut)."""
        self.compact()
        stratum = (self.flags != 0).astype(np.int8)
        ht = 1.0 / np.maximum(1.0 - np.maximum(self.tau, 0.0), 1e-300)
        sums = np.bincount(stratum, weights=ht, minlength=STRATA)
        scale = np.where(sums > 0, self.population / np.maximum(sums, 1e-300), 0.0)
        w = ht * scale[stratum]
        exact = np.bincount(stratum, minlength=STRATA) == self.population
        if exact.any():
            w = np.where(exact[stratum], 1.0, w)
        return w

    def nbytes(self) -> int:
        self.compact()
        return int(self.cat.nbytes + self.num.nbytes + self.flags.nbytes + self.prio.nbytes
                   + self.tau.nbytes) + 96

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
            "tau": self.tau,
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
        tau = state.get("tau")
        out.tau = (np.zeros(out.prio.size) if tau is None
                   else np.asarray(tau, dtype=np.float64).copy())
        return out
