"""Counting weights over combinations of attribute values, vectorised.

Why apart from the search (drift._apriori): the search decides which combinations to score;
this module only sums every per-row weight (outliers, rows, sampling variances, the
clustered-variance terms of drift._clusters) over the rows matching each combination, with
integer keys and one `np.bincount` per attribute set, on the outlier rows alone where a
weight is zero elsewhere. The same code counts rows or requests (drift._request_units):
only the weights differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from drift._clusters import ROW_WEIGHTS, TARGET_ROW_WEIGHTS, Clusters

if TYPE_CHECKING:
    from drift._apriori import Rows


class Weights:
    """The per-row weight arrays summed for every combination, in a fixed order."""

    def __init__(self, rows: Rows) -> None:
        self.names: list[str] = ["target"]
        self.arrays: list[np.ndarray | None] = [rows.target]
        self.names.append("count")
        self.arrays.append(rows.count)  # None means unit weights
        for name in ("target_var", "count_var"):
            arr = getattr(rows, name)
            if arr is not None and np.any(arr):
                self.names.append(name)
                self.arrays.append(arr)
        if rows.value is not None:
            c = rows.count if rows.count is not None else 1.0
            self.names += ["x", "x2"]
            self.arrays += [rows.value * c, rows.value * rows.value * c]
            if rows.count is not None:
                self.names.append("w2")  # Kish effective sizes of weighted means
                self.arrays.append(rows.count * rows.count)
        self.clusters: Clusters | None = None
        if rows.cluster is not None:
            c = np.ones(rows.n) if rows.count is None else rows.count
            t = rows.target if rows.value is None else rows.value * c
            self.clusters = Clusters(rows.cluster, t, c)
            for name in ROW_WEIGHTS:
                self.names.append(name)
                self.arrays.append(self.clusters.row_weights[name])

    def over(self, mask: np.ndarray, grouped: bool = True) -> dict[str, np.ndarray]:
        """Every weight's sum over the rows of `mask` (one-element arrays), and, with
        `grouped`, the grouped squares of that one group where the rows came in requests."""
        out = {name: np.array([float(mask.sum() if arr is None else arr[mask].sum())])
               for name, arr in zip(self.names, self.arrays, strict=True)}
        if grouped and self.clusters is not None:
            out.update(self.clusters.masked(mask))
        return out


def group_sums(
    rows: Rows,
    weights: Weights,
    attrs: tuple[int, ...],
    combos: np.ndarray,
    start: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Sums of every weight over the rows matching each combination (combos: m x len(attrs))."""
    m = combos.shape[0]
    radix = []
    local = np.zeros(m, dtype=np.int64)
    sel = start
    rel: list[np.ndarray] = []
    for j, a in enumerate(attrs):
        vals = np.unique(combos[:, j])
        lut = np.zeros(rows.cards[a], dtype=np.int64)
        lut[vals] = np.arange(1, vals.size + 1)
        r = lut[rows.codes[a]] if sel is None else lut[rows.codes[a][sel]]
        keep = np.flatnonzero(r)
        sel = keep if sel is None else sel[keep]
        rel = [x[keep] for x in rel]
        rel.append(r[keep])
        radix.append(vals.size + 1)
        local = local * (vals.size + 1) + lut[combos[:, j]]
    size = int(np.prod(radix))
    key = np.zeros(sel.size, dtype=np.int64)
    for r, base in zip(rel, radix, strict=True):
        key = key * base + r
    out = {}
    for name, arr in zip(weights.names, weights.arrays, strict=True):
        if arr is None:
            sums = np.bincount(key, minlength=size).astype(np.float64)
        else:
            sums = np.bincount(key, weights=arr[sel], minlength=size)
        out[name] = sums[local]
    if weights.clusters is not None:
        out.update(weights.clusters.grouped(key, local, size, sel))
    return out


#: Largest dense key space (bins) counted with one bincount; larger sets relabel per combination.
_DENSE_KEY_LIMIT = 1 << 22
#: Key spaces up to this size (or 4x the rows counted) find supported combinations by bincount.
_DENSE_SUPPORT_LIMIT = 1 << 16
_SPARSE_WEIGHTS = ("target", "target_var", *TARGET_ROW_WEIGHTS)


class Relabelled:
    """Codes of kept values relabelled 1..k (0 = not kept), cached per attribute.

    Counting a set of attributes then needs only integer multiply-adds and one bincount.
    Target weights are counted on the rows that carry any (outlier rows), the rest on all rows.
    """

    def __init__(self, rows: Rows, weights: Weights, kept: list[np.ndarray], tidx: np.ndarray):
        self.rows, self.weights, self.kept, self.tidx = rows, weights, kept, tidx
        self.luts = []
        for a, vals in enumerate(kept):
            lut = np.zeros(rows.cards[a], dtype=np.int64)
            lut[vals] = np.arange(1, vals.size + 1)
            self.luts.append(lut)
        self._all: dict[int, np.ndarray] = {}
        self._sub: dict[int, np.ndarray] = {}
        self._t_sub = {
            name: arr[tidx]
            for name, arr in zip(weights.names, weights.arrays, strict=True)
            if name in _SPARSE_WEIGHTS and arr is not None
        }

    def all_rows(self, a: int) -> np.ndarray:
        if a not in self._all:
            self._all[a] = self.luts[a][self.rows.codes[a]]
        return self._all[a]

    def target_rows(self, a: int) -> np.ndarray:
        if a not in self._sub:
            self._sub[a] = (
                self._all[a][self.tidx] if a in self._all else self.luts[a][self.rows.codes[a][
                    self.tidx]]
            )
        return self._sub[a]

    def radix(self, attrs: tuple[int, ...]) -> list[int]:
        return [self.kept[a].size + 1 for a in attrs]

    def supported(self, attrs: tuple[int, ...], min_target: float) -> np.ndarray:
        """Local keys (mixed radix of relabelled codes) of combinations with enough target."""
        radix = self.radix(attrs)
        key = np.zeros(self.tidx.size, dtype=np.int64)
        ok = np.ones(self.tidx.size, dtype=bool)
        for a, base in zip(attrs, radix, strict=True):
            r = self.target_rows(a)
            ok &= r > 0
            key = key * base + r
        key = key[ok]
        t = self._t_sub["target"][ok]
        size = int(np.prod(radix, dtype=np.float64))
        if size <= max(_DENSE_SUPPORT_LIMIT, 4 * key.size):
            # small key space: one bincount, no sort (np.unique sorts every target row)
            sums = np.bincount(key, weights=t, minlength=size)
            return np.flatnonzero(sums >= min_target)
        uniq, inverse = np.unique(key, return_inverse=True)
        sums = np.bincount(inverse, weights=t, minlength=uniq.size)
        return uniq[sums >= min_target]

    def decode(self, attrs: tuple[int, ...], keys: np.ndarray) -> np.ndarray:
        """Original codes (m x len(attrs)) of local keys."""
        radix = self.radix(attrs)
        out = np.empty((keys.size, len(attrs)), dtype=np.int64)
        rest = keys.copy()
        for j in range(len(attrs) - 1, -1, -1):
            out[:, j] = self.kept[attrs[j]][rest % radix[j] - 1]
            rest //= radix[j]
        return out

    def sums(self, attrs: tuple[int, ...], keys: np.ndarray,
             only: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Every weight's sum (or `only` those, without the grouped squares) for each
        combination given by its local key."""
        radix = self.radix(attrs)
        size = int(np.prod(radix, dtype=np.float64))
        if size > _DENSE_KEY_LIMIT:
            return group_sums(self.rows, self.weights, attrs, self.decode(attrs, keys))
        out = {}
        key_all = None
        key_t = None
        for name, arr in zip(self.weights.names, self.weights.arrays, strict=True):
            if only is not None and name not in only:
                continue
            if name in _SPARSE_WEIGHTS:
                if key_t is None:
                    key_t = np.zeros(self.tidx.size, dtype=np.int64)
                    for a, base in zip(attrs, radix, strict=True):
                        key_t = key_t * base + self.target_rows(a)
                sums = np.bincount(key_t, weights=self._t_sub[name], minlength=size)
            else:
                if key_all is None:
                    key_all = np.zeros(self.rows.n, dtype=np.int64)
                    for a, base in zip(attrs, radix, strict=True):
                        key_all = key_all * base + self.all_rows(a)
                if arr is None:
                    sums = np.bincount(key_all, minlength=size).astype(np.float64)
                else:
                    sums = np.bincount(key_all, weights=arr, minlength=size)
            out[name] = sums[keys]
        clusters = None if only is not None else self.weights.clusters
        if clusters is not None and all(clusters.constant(a, self.rows.codes[a]) for a in attrs):
            out.update(Q_tt=out["p_tT"], Q_tc=out["p_tN"], Q_cc=out["p_cN"])
        elif clusters is not None:
            if key_all is None:
                key_all = np.zeros(self.rows.n, dtype=np.int64)
                for a, base in zip(attrs, radix, strict=True):
                    key_all = key_all * base + self.all_rows(a)
            out.update(self.weights.clusters.grouped(key_all, keys, size))
        return out
