"""APriori search for attribute combinations that explain outliers (MacroBase DIFF style).

Why this shape: support is anti-monotone (a combination never has more outliers than any of its
parts), so values below the minimum outlier support are dropped before any combination is formed
(support pushdown) and an order-k candidate needs all its (k-1)-parts supported. Ratios only
accept. Counting is vectorized: codes of kept values are relabelled to small integers, rows are
filtered attribute by attribute, and one `np.bincount` per attribute set yields every combination's
sums at once. Outlier support is counted on outlier rows only (usually ~1% of the rows).

Minimality: a combination is reported only if no reported part of it explains as well: when a
part passes, the superset must be clearly stronger (its lower confidence bound above the part's
ratio). A reported part whose excess disappears once its reported supersets' rows are removed
(it only rode on them) is dropped.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from drift import _ratios
from drift._clusters import ROW_WEIGHTS, TARGET_ROW_WEIGHTS, Clusters, design_effect
from drift._minimality import (
    drop_riders,
    minimal,
    passes_one,
    residual_passes,
    row_mask,
)

#: MacroBase defaults: a combination must hold >= 1% of outliers and a ratio >= 3.
DEFAULT_MIN_SUPPORT = 0.01
DEFAULT_MIN_RATIO = 3.0
DEFAULT_MAX_ORDER = 3
#: Simultaneous confidence of the intervals (Bonferroni over the search space): a window
#: without any cause yields a false explanation at most 1% of the time.
DEFAULT_CONFIDENCE = 0.99

RATIO_METRICS = ("risk_ratio", "global_ratio", "mean_shift", "share_ratio")
_MAIN = ("ratio", "ci_low", "ci_high")


@dataclass
class Rows:
    """Explainer input: encoded rows with weights.

    target: outlier weight (risk/global ratio), test-row weight (share ratio) or row weight
    (mean shift); support is measured on it. count: weight of the row (None: 1 each); for share
    ratio it is test + control weight. *_var: Horvitz-Thompson sampling variance contributions.
    """

    codes: np.ndarray  # (d, n) non-negative integer codes
    cards: list[int]
    target: np.ndarray
    count: np.ndarray | None = None
    target_var: np.ndarray | None = None
    count_var: np.ndarray | None = None
    value: np.ndarray | None = None
    #: zero-cell variance floors of sampled sides (drift._ratios): target sums, and count sums
    #: (the control side for share ratios)
    target_floor: float = 0.0
    count_floor: float = 0.0
    #: request key per row (equal within a request): intervals then count requests, not rows
    #: (drift._clusters); None: independent rows
    cluster: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.target.size)


@dataclass
class Found:
    """One scored combination: ((attribute index, code), ...) and its statistics."""

    combo: tuple[tuple[int, int], ...]
    target: float
    count: float
    ratio: float
    ci_low: float
    ci_high: float
    passes: bool
    extra: dict = field(default_factory=dict)

    @property
    def order(self) -> int:
        return len(self.combo)


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


def _group_sums(
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


class _Relabelled:
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

    def sums(self, attrs: tuple[int, ...], keys: np.ndarray) -> dict[str, np.ndarray]:
        """Every weight's sum for each combination given by its local key."""
        radix = self.radix(attrs)
        size = int(np.prod(radix, dtype=np.float64))
        if size > _DENSE_KEY_LIMIT:
            return _group_sums(self.rows, self.weights, attrs, self.decode(attrs, keys))
        out = {}
        key_all = None
        key_t = None
        for name, arr in zip(self.weights.names, self.weights.arrays, strict=True):
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
        clusters = self.weights.clusters
        if clusters is not None and all(clusters.constant(a, self.rows.codes[a]) for a in attrs):
            out.update(Q_tt=out["p_tT"], Q_tc=out["p_tN"], Q_cc=out["p_cN"])
        elif clusters is not None:
            if key_all is None:
                key_all = np.zeros(self.rows.n, dtype=np.int64)
                for a, base in zip(attrs, radix, strict=True):
                    key_all = key_all * base + self.all_rows(a)
            out.update(self.weights.clusters.grouped(key_all, keys, size))
        return out


class Scorer:
    """Turns per-combination sums into the chosen ratio with its confidence interval."""

    def __init__(self, rows: Rows, weights: Weights, metric: str) -> None:
        if metric not in RATIO_METRICS:
            raise ValueError(f"ratio_metric must be one of {RATIO_METRICS}, got {metric!r}")
        if metric == "mean_shift" and rows.value is None:
            raise ValueError("ratio_metric='mean_shift' needs metric values")
        self.metric = metric
        self.floors = (float(rows.target_floor), float(rows.count_floor))
        self.clustered = weights.clusters is not None
        self.totals = {}
        for name, arr in zip(weights.names, weights.arrays, strict=True):
            self.totals[name] = float(rows.n if arr is None else arr.sum())

    def design_effect(self, sums: dict[str, np.ndarray], tot: dict[str, float],
                      metric: str | None = None) -> np.ndarray | float:
        """Each group's design effect for `metric` (drift._clusters); 1 for independent rows."""
        if not self.clustered:
            return 1.0
        metric = metric or self.metric
        t_name = "x" if metric == "mean_shift" else "target"
        totals = {"t": tot[t_name], "c": tot["count"],
                  **{name: tot[name] for name in ROW_WEIGHTS}}
        return design_effect(metric, sums, totals, sums[t_name], sums["count"])

    def score(
        self, sums: dict[str, np.ndarray], alpha: float, totals: dict[str, float] | None = None
    ) -> dict[str, np.ndarray]:
        """Ratio and bounds at two-sided miscoverage `alpha` for each group's sums."""
        tot = self.totals if totals is None else totals
        t, c = sums["target"], sums["count"]
        tv, cv = sums.get("target_var", 0.0), sums.get("count_var", 0.0)
        conf = alpha
        deff = self.design_effect(sums, tot, "risk_ratio" if self.metric == "global_ratio"
                                  else None)
        out: dict[str, np.ndarray] = {}
        if self.clustered:
            out["design_effect"] = np.broadcast_to(deff, np.shape(t)).astype(np.float64)
        if self.metric == "mean_shift":
            out["ratio"], out["ci_low"], out["ci_high"] = _ratios.mean_shift(
                c, sums["x"], sums["x2"], tot["count"], tot["x"], tot["x2"], conf,
                sums.get("w2"), tot.get("w2"), deff,
            )
            with np.errstate(divide="ignore", invalid="ignore"):
                out["mean_in"] = sums["x"] / c
                out["mean_out"] = (tot["x"] - sums["x"]) / (tot["count"] - c)
            return out
        f_t, f_c = self.floors
        if self.metric == "share_ratio":
            r = c - t
            rv = np.asarray(cv, dtype=np.float64) - np.asarray(tv, dtype=np.float64)
            out["ratio"], out["ci_low"], out["ci_high"] = _ratios.share_ratio(
                t, r, tot["target"], tot["count"] - tot["target"], conf, tv, rv, f_t, f_c, deff
            )
            out["risk_ratio"] = out["ratio"]
            return out
        rr = _ratios.risk_ratio(
            t, c, tot["target"], tot["count"], conf, tv, cv,
            tot.get("target_var", 0.0), tot.get("count_var", 0.0), f_t, f_c, deff,
        )
        gr_deff = self.design_effect(sums, tot, "global_ratio")
        gr = _ratios.global_ratio(t, c, tot["target"], tot["count"], conf, tv, cv,
                                  tot.get("target_var", 0.0), f_t, f_c, gr_deff)
        chosen = rr if self.metric == "risk_ratio" else gr
        out["ratio"], out["ci_low"], out["ci_high"] = chosen
        out["risk_ratio"], out["global_ratio"] = rr[0], gr[0]
        return out


def mine(
    rows: Rows,
    metric: str = "risk_ratio",
    min_support: float = DEFAULT_MIN_SUPPORT,
    min_ratio: float = DEFAULT_MIN_RATIO,
    max_order: int = DEFAULT_MAX_ORDER,
    confidence: float = DEFAULT_CONFIDENCE,
    simultaneous: bool = True,
) -> tuple[list[Found], dict[str, float]]:
    """All reported combinations (unsorted) and the population totals.

    With `simultaneous` (default) every interval is a Bonferroni-simultaneous interval over the
    search space: the m combinations (orders 1..max_order) that can be formed from values that
    passed the order-1 support pushdown, i.e. every combination the search could have reported.
    The noise filter (lower bound above 1) then holds for the whole search with probability
    `confidence`, not just for one combination; otherwise intervals are per combination.
    `totals["candidates"]` reports the combinations scored, `totals["search_space"]` m.
    """
    if not 0.0 < min_support <= 1.0:
        raise ValueError(f"min_support must be in (0, 1], got {min_support!r}")
    if not min_ratio > 0:
        raise ValueError(f"min_ratio must be > 0, got {min_ratio!r}")
    if int(max_order) != max_order or not 1 <= max_order <= 3:
        raise ValueError(f"max_order must be 1, 2 or 3, got {max_order!r}")
    weights = Weights(rows)
    scorer = Scorer(rows, weights, metric)
    d = rows.codes.shape[0]
    t = rows.target
    total_t = scorer.totals["target"]
    if rows.n == 0 or total_t <= 0 or d == 0:
        return [], scorer.totals
    min_t = min_support * total_t * (1.0 - 1e-12)
    tidx = np.flatnonzero(t > 0)

    # order 1: support pushdown on single values
    kept: list[np.ndarray] = []
    for a in range(d):
        sums = np.bincount(rows.codes[a][tidx], weights=t[tidx], minlength=rows.cards[a])
        kept.append(np.flatnonzero(sums >= min_t))

    relabel = _Relabelled(rows, weights, kept, tidx)
    supported_sets: dict[tuple[int, ...], set] = {}

    chunks: list[tuple[list[tuple], dict[str, np.ndarray]]] = []

    def evaluate(attrs: tuple[int, ...], keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        combos = relabel.decode(attrs, keys)
        sums = relabel.sums(attrs, keys)
        supported_sets[attrs] = {tuple(row) for row in combos.tolist()}
        chunks.append(([tuple(zip(attrs, row, strict=True)) for row in combos.tolist()], sums))

    for a in range(d):
        if kept[a].size:
            evaluate((a,), np.arange(1, kept[a].size + 1))
    active = [a for a in range(d) if kept[a].size]
    for order in range(2, int(max_order) + 1):
        for attrs in itertools.combinations(active, order):
            parents = [attrs[:j] + attrs[j + 1 :] for j in range(order)]
            if order > 2 and any(not supported_sets.get(p) for p in parents):
                continue
            keys = relabel.supported(attrs, min_t)
            if order > 2 and keys.size:
                combos = relabel.decode(attrs, keys)
                ok = np.ones(keys.size, dtype=bool)
                for j, p in enumerate(parents):
                    sub = np.delete(combos, j, axis=1)
                    have = supported_sets.get(p, set())
                    ok &= np.fromiter((tuple(r) in have for r in sub.tolist()), bool, sub.shape[0])
                keys = keys[ok]
            evaluate(attrs, keys)

    m = max(_search_space([kept[a].size for a in active], int(max_order)), 1.0)
    alpha = (1.0 - confidence) / m if simultaneous else (1.0 - confidence)
    scored: dict[tuple[tuple[int, int], ...], Found] = {}
    sums: dict[str, np.ndarray] = {}
    position: dict[tuple[tuple[int, int], ...], int] = {}
    if chunks:
        names = list(chunks[0][1])
        sums = {k: np.concatenate([s[k] for _, s in chunks]) for k in names}
        combos = [c for cs, _ in chunks for c in cs]
        res = scorer.score(sums, alpha)
        extras = {k: v.tolist() for k, v in res.items() if k not in _MAIN}
        ratio, lo, hi = res["ratio"].tolist(), res["ci_low"].tolist(), res["ci_high"].tolist()
        tsum, csum = sums["target"].tolist(), sums["count"].tolist()
        for i, combo in enumerate(combos):
            position[combo] = i
            scored[combo] = Found(
                combo=combo, target=tsum[i], count=csum[i], ratio=ratio[i], ci_low=lo[i],
                ci_high=hi[i], passes=passes_one(ratio[i], lo[i], min_ratio),
                extra={k: v[i] for k, v in extras.items()},
            )
    def part_stands_without(part: Found, found: Found) -> bool:
        """Does `part` still pass once `found`'s rows (a subset of its rows) leave?"""
        if weights.clusters is None:  # sums are additive: no pass over the rows
            ip, i_f = position[part.combo], position[found.combo]
            rest = {k: v[ip:ip + 1] - v[i_f:i_f + 1] for k, v in sums.items()}
            totals = {k: scorer.totals[k] - float(sums[k][i_f]) if k in sums else scorer.totals[k]
                      for k in scorer.totals}
            res = scorer.score(rest, alpha, totals)
            ratio, lo = float(res["ratio"][0]), float(res["ci_low"][0])
            return bool(rest["target"][0] >= min_t and passes_one(ratio, lo, min_ratio))
        return residual_passes(rows, weights, scorer, row_mask(rows, part.combo),
                                row_mask(rows, found.combo), min_t, min_ratio, alpha)[0]

    reported = minimal(scored, scorer.metric, part_stands_without)
    reported = drop_riders(rows, weights, scorer, reported, min_t, min_ratio, alpha)
    totals = dict(scorer.totals)
    totals["candidates"] = float(len(scored))
    totals["search_space"] = float(m)
    totals["interval_level"] = 1.0 - alpha
    return reported, totals


def _search_space(sizes: list[int], max_order: int) -> float:
    """Combinations of order 1..max_order with one value from each of distinct attributes:
    the elementary symmetric polynomials e_1..e_max_order of the per-attribute value counts."""
    e = [1.0] + [0.0] * max_order
    for k in sizes:
        for j in range(max_order, 0, -1):
            e[j] += e[j - 1] * k
    return float(sum(e[1:]))
