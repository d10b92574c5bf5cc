"""APriori search for attribute combinations that explain outliers (MacroBase DIFF style).

Why this shape: support is anti-monotone (a combination never has more outliers than any of its
parts), so values below the minimum outlier support are dropped before any combination is formed
(support pushdown) and an order-k candidate needs all its (k-1)-parts supported. Ratios only
accept. Counting is vectorized (drift._counting): one `np.bincount` per attribute set yields every
combination's sums at once, outlier support on outlier rows only (usually ~1% of the rows).

Unit: where rows came in requests, a combination of request-level attributes with an outcome
that is the request's is counted in requests, each once (drift._request_units); any other
combination in rows, with the clustered (sandwich) variance of drift._clusters.

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
from drift._clusters import ROW_WEIGHTS, design_effect
from drift._counting import Relabelled, Weights
from drift._minimality import (
    drop_riders,
    minimal,
    passes_one,
    residual_passes,
    row_mask,
)
from drift._request_units import per_request

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

    by_rows = _Unit(weights, scorer, Relabelled(rows, weights, kept, tidx))
    by_requests = _request_unit(rows, weights, metric, kept, tidx)
    clusters = weights.clusters

    def unit_of(combo: tuple) -> _Unit:
        """Requests where the combination holds whole requests and the outcome is the
        request's (drift._request_units); rows otherwise."""
        if by_requests is not None and all(clusters.constant(a, rows.codes[a]) for a, _ in combo):
            return by_requests
        return by_rows

    supported_sets: dict[tuple[int, ...], set] = {}

    def evaluate(attrs: tuple[int, ...], keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        combos = by_rows.relabel.decode(attrs, keys)
        supported_sets[attrs] = {tuple(row) for row in combos.tolist()}
        named = [tuple(zip(attrs, row, strict=True)) for row in combos.tolist()]
        unit = unit_of(named[0])
        if unit is by_rows:
            sums = scored_sums = by_rows.relabel.sums(attrs, keys)
        else:  # in rows only the support shown
            sums = by_rows.relabel.sums(attrs, keys, only=("target", "count"))
            scored_sums = unit.relabel.sums(attrs, keys)
        unit.chunks.append((named, sums, scored_sums))

    for a in range(d):
        if kept[a].size:
            evaluate((a,), np.arange(1, kept[a].size + 1))
    active = [a for a in range(d) if kept[a].size]
    for order in range(2, int(max_order) + 1):
        for attrs in itertools.combinations(active, order):
            parents = [attrs[:j] + attrs[j + 1 :] for j in range(order)]
            if order > 2 and any(not supported_sets.get(p) for p in parents):
                continue
            keys = by_rows.relabel.supported(attrs, min_t)
            if order > 2 and keys.size:
                combos = by_rows.relabel.decode(attrs, keys)
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
    for unit in (by_rows, by_requests):
        if unit is None or not unit.chunks:
            continue
        parts = unit.chunks
        shown = {k: np.concatenate([s[k] for _, s, _ in parts]) for k in ("target", "count")}
        unit_sums = {k: np.concatenate([s[k] for _, _, s in parts]) for k in parts[0][2]}
        combos = [c for cs, _, _ in parts for c in cs]
        res = unit.scorer.score(unit_sums, alpha)
        if unit is by_requests:
            # how many rows one independent observation (a request) was worth in the group
            with np.errstate(divide="ignore", invalid="ignore"):
                res["design_effect"] = np.where(unit_sums["count"] > 0,
                                                shown["count"] / unit_sums["count"], 1.0)
        else:
            sums = unit_sums
            position = {combo: i for i, combo in enumerate(combos)}
        extras = {k: v.tolist() for k, v in res.items() if k not in _MAIN}
        ratio, lo, hi = res["ratio"].tolist(), res["ci_low"].tolist(), res["ci_high"].tolist()
        tsum, csum = shown["target"].tolist(), shown["count"].tolist()
        for i, combo in enumerate(combos):
            scored[combo] = Found(
                combo=combo, target=tsum[i], count=csum[i], ratio=ratio[i], ci_low=lo[i],
                ci_high=hi[i], passes=passes_one(ratio[i], lo[i], min_ratio),
                extra={k: v[i] for k, v in extras.items()},
            )

    def stands(found: Found, inside: np.ndarray, removed: np.ndarray) -> bool:
        """Does `found` still pass once the rows `removed` leave the population? Support is
        counted in rows, as the search and the result count it, whatever the unit."""
        unit = unit_of(found.combo)
        if unit is by_rows:
            return residual_passes(weights, scorer, inside, removed, min_t, min_ratio, alpha)[0]
        supported = float(t[inside & ~removed].sum()) >= min_t
        return supported and residual_passes(unit.weights, unit.scorer, inside, removed, -np.inf,
                                             min_ratio, alpha)[0]

    def part_stands_without(part: Found, found: Found) -> bool:
        """Does `part` still pass once `found`'s rows (a subset of its rows) leave?"""
        if clusters is None:  # sums are additive: no pass over the rows
            ip, i_f = position[part.combo], position[found.combo]
            rest = {k: v[ip:ip + 1] - v[i_f:i_f + 1] for k, v in sums.items()}
            totals = {k: scorer.totals[k] - float(sums[k][i_f]) if k in sums else scorer.totals[k]
                      for k in scorer.totals}
            res = scorer.score(rest, alpha, totals)
            ratio, lo = float(res["ratio"][0]), float(res["ci_low"][0])
            return bool(rest["target"][0] >= min_t and passes_one(ratio, lo, min_ratio))
        return stands(part, row_mask(rows, part.combo), row_mask(rows, found.combo))

    reported = minimal(scored, scorer.metric, part_stands_without)
    reported = drop_riders(rows, reported, stands)
    totals = dict(scorer.totals)
    totals["candidates"] = float(len(scored))
    totals["search_space"] = float(m)
    totals["interval_level"] = 1.0 - alpha
    return reported, totals


@dataclass
class _Unit:
    """What a combination is counted in: the weights of its rows, the scorer and the
    relabelled codes, all in one unit (rows, or requests). Support is always rows'."""

    weights: Weights
    scorer: Scorer
    relabel: Relabelled
    #: scored combinations: (combinations, their sums in rows, their sums in this unit)
    chunks: list[tuple[list[tuple], dict[str, np.ndarray], dict[str, np.ndarray]]] = field(
        default_factory=list)


def _request_unit(rows: Rows, weights: Weights, metric: str, kept: list[np.ndarray],
                  tidx: np.ndarray) -> _Unit | None:
    """Requests as the unit (drift._request_units), where the rows came in requests and every
    request's rows agree on the outcome; None otherwise."""
    if weights.clusters is None:
        return None
    spread = per_request(rows, weights.clusters)
    if spread is None:
        return None
    w = Weights(spread)
    scorer = Scorer(spread, w, metric)
    return _Unit(w, scorer, Relabelled(spread, w, kept, tidx))


def score_group(rows: Rows, metric: str, mask: np.ndarray, alpha: float,
                request_level: bool = True) -> dict[str, np.ndarray]:
    """One group's scores (`mask`: its rows) at two-sided miscoverage `alpha`, counted as
    `mine` counts a combination: in requests where the rows came in requests, every request's
    rows agree on the outcome and the group (`request_level`: its attributes are the
    request's) holds whole requests; in rows otherwise."""
    weights = Weights(rows)
    unit_rows, unit_weights = rows, weights
    if request_level and weights.clusters is not None:
        spread = per_request(rows, weights.clusters)
        if spread is not None and weights.clusters.within_requests_equal(mask):
            unit_rows, unit_weights = spread, Weights(spread)
    scorer = Scorer(unit_rows, unit_weights, metric)
    return scorer.score(unit_weights.over(mask), alpha)


def _search_space(sizes: list[int], max_order: int) -> float:
    """Combinations of order 1..max_order with one value from each of distinct attributes:
    the elementary symmetric polynomials e_1..e_max_order of the per-attribute value counts."""
    e = [1.0] + [0.0] * max_order
    for k in sizes:
        for j in range(max_order, 0, -1):
            e[j] += e[j - 1] * k
    return float(sum(e[1:]))
