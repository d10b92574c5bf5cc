"""Counts per encoded value: exact up to a cap, then a mergeable heavy-hitter summary.

Why: attribute columns such as region or model version have few values and must be counted
exactly (chi-squared, mix shift); a column with unbounded cardinality (client id) must not grow
a pane without bound. Beyond `max_values` distinct values the counts become a mergeable
Misra-Gries summary (Agarwal et al., "Mergeable summaries", 2012), the lower-bound twin of
SpaceSaving: every kept count is at most `error` below the truth, `error <= total / (max_values+1)`,
and every value with true count above `error` is kept.
"""

from __future__ import annotations

import numpy as np

#: Default number of distinct values counted exactly per column per pane.
DEFAULT_MAX_VALUES = 1024


class ValueCounts:
    """Counts of integer codes; dense array while codes are small, sparse summary otherwise."""

    __slots__ = ("codes", "counts", "dense", "error", "max_values", "total")

    def __init__(self, max_values: int = DEFAULT_MAX_VALUES) -> None:
        if int(max_values) < 1:
            raise ValueError(f"max_values must be >= 1, got {max_values!r}")
        self.max_values = int(max_values)
        self.dense: np.ndarray | None = np.zeros(0, dtype=np.int64)
        self.codes: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.error = 0
        self.total = 0

    def copy(self) -> ValueCounts:
        out = ValueCounts(self.max_values)
        out.dense = None if self.dense is None else self.dense.copy()
        out.codes = None if self.codes is None else self.codes.copy()
        out.counts = None if self.counts is None else self.counts.copy()
        out.error, out.total = self.error, self.total
        return out

    @property
    def exact(self) -> bool:
        return self.error == 0

    def add_bincount(self, counts: np.ndarray) -> None:
        """Add a bincount (index = code) of a batch."""
        counts = np.asarray(counts, dtype=np.int64)
        self.total += int(counts.sum())
        if self.dense is not None and counts.size <= self.max_values:
            if counts.size > self.dense.size:
                grown = np.zeros(counts.size, dtype=np.int64)
                grown[: self.dense.size] = self.dense
                self.dense = grown
            self.dense[: counts.size] += counts
            return
        nz = np.flatnonzero(counts)
        self._merge_sparse(nz, counts[nz], 0)

    def add_codes(self, codes: np.ndarray) -> None:
        if codes.size:
            self.add_bincount(np.bincount(codes))

    def _to_sparse(self) -> None:
        if self.dense is not None:
            nz = np.flatnonzero(self.dense)
            self.codes, self.counts = nz.astype(np.int64), self.dense[nz].copy()
            self.dense = None

    def _merge_sparse(self, codes: np.ndarray, counts: np.ndarray, error: int) -> None:
        self._to_sparse()
        assert self.codes is not None and self.counts is not None
        all_codes = np.concatenate((self.codes, codes.astype(np.int64, copy=False)))
        all_counts = np.concatenate((self.counts, counts.astype(np.int64, copy=False)))
        uniq, inverse = np.unique(all_codes, return_inverse=True)
        summed = np.bincount(inverse, weights=all_counts, minlength=uniq.size)
        summed = np.rint(summed).astype(np.int64)
        self.error += int(error)
        if uniq.size > self.max_values:
            # Misra-Gries merge: subtract the (k+1)-th largest count, keep what stays positive.
            kth = int(np.partition(summed, summed.size - self.max_values - 1)[
                summed.size - self.max_values - 1
            ])
            summed = summed - kth
            keep = summed > 0
            uniq, summed = uniq[keep], summed[keep]
            self.error += kth
        self.codes, self.counts = uniq, summed

    def merge(self, other: ValueCounts) -> None:
        """Add another summary of the same column."""
        if other.dense is not None and self.dense is not None:
            self.total += other.total
            if other.dense.size > self.dense.size:
                grown = np.zeros(other.dense.size, dtype=np.int64)
                grown[: self.dense.size] = self.dense
                self.dense = grown
            self.dense[: other.dense.size] += other.dense
            self.error += other.error
            return
        codes, counts = other.items()
        self.total += other.total
        self._merge_sparse(codes, counts, other.error)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes, counts) of values with a positive kept count, codes ascending."""
        if self.dense is not None:
            nz = np.flatnonzero(self.dense)
            return nz.astype(np.int64), self.dense[nz]
        assert self.codes is not None and self.counts is not None
        return self.codes, self.counts

    @property
    def other_mass(self) -> int:
        """Count not attributed to any kept value (mass dropped by the summary)."""
        return int(self.total - self.items()[1].sum())

    def nbytes(self) -> int:
        arrays = (self.dense, self.codes, self.counts)
        return sum(a.nbytes for a in arrays if a is not None) + 64

    def to_state(self) -> dict:
        codes, counts = self.items()
        return {
            "meta": np.array(
                [self.max_values, self.error, self.total, self.dense is not None], dtype=np.int64
            ),
            "codes": codes,
            "counts": counts,
        }

    @classmethod
    def from_state(cls, state: dict) -> ValueCounts:
        max_values, error, total, is_dense = (int(v) for v in state["meta"])
        out = cls(max_values)
        codes = np.asarray(state["codes"], dtype=np.int64)
        counts = np.asarray(state["counts"], dtype=np.int64)
        if is_dense:
            size = int(codes[-1]) + 1 if codes.size else 0
            out.dense = np.zeros(size, dtype=np.int64)
            out.dense[codes] = counts
        else:
            out.dense = None
            out.codes, out.counts = codes.copy(), counts.copy()
        out.error, out.total = error, total
        return out
