"""Design effects of clustered rows: the request, not the row, as the unit of variance.

Why: serving sends rows in requests, and the rows of one request share its latency, client,
replica, model version and time. A slow request makes 20 outlier rows, not 20 independent
outliers; an interval that counts them as 20 covers its ratio far less often than it says
(56% at nominal 95% with 4-row requests). Following survey practice (Kish 1965; the
cluster-robust "sandwich" variance of a Poisson rate model), each statistic's influence is
summed per request before squaring, and the ratio of that variance to the row-wise one, the
design effect, divides the effective sample size of the interval (drift._ratios).

Every statistic the explainer scores is a ratio of two weighted means over a group g:
log ratio = log A - log E - log C + log E' with A, E sums of a target weight t and a count
weight c over g. Its influence per unit j is linear in four per-unit sums,

    h_j = k1 A_j + k2 E_j + k3 Y_j + k4 N_j,

with A_j, E_j the unit's t and c inside g, Y_j, N_j the unit's t and c in all, and k1..k4 set
by the statistic (`_coefficients`). The variance sum_j h_j^2 then needs, per group, three
grouped squares (Q: sum_j A_j^2, A_j E_j, E_j^2, grouped by unit and group), four cross sums
that are plain row weights (P: sum over g's rows of t Y_j, t N_j, c Y_j, c N_j), and totals
(sum_j Y_j^2, Y_j N_j, N_j^2, the totals of the P weights). With units = rows the same formula
gives the row-wise variance (Q and P collapse to row squares), so the design effect is one
formula evaluated twice. Rows without a request structure have deff 1 exactly.

The sandwich has a blind spot: a group whose few requests are all slow has rate 1 inside,
residuals of 0 and no variance left, so two slow 24-row requests read as 48 outliers of 48
(a "cause" with ratio 100 on a null stream). Outlier and risk ratios are conditional tests on
where the outliers fall, and outliers fall in clumps: their design effect is at least the mean
clump size seen from an outlier row, (sum_j A_j^2 + sum_j C_j^2) / sum_r t_r^2 with C_j the
request's outliers outside the group.

Keys: any per-row value that is equal within a request and differs between requests. The
monitor gives every row of a request one sampling priority (drift._engine), so a sample's
priorities are its request keys and a reservoir keeps or drops a request whole.
"""

from __future__ import annotations

import numpy as np

#: Per-row weights summed like any other (drift._apriori.Weights), by name.
ROW_WEIGHTS = ("q_tt", "q_tc", "q_cc", "p_tT", "p_tN", "p_cT", "p_cN")
#: Of those, the ones that are zero wherever the target weight is (counted on target rows).
TARGET_ROW_WEIGHTS = ("q_tt", "q_tc", "p_tT", "p_tN")
#: Sums grouped by (request, group) before squaring.
GROUPED = ("Q_tt", "Q_tc", "Q_cc")


class Clusters:
    """The request structure of explainer rows: a dense request index per row, the per-row
    weights of the variance, and the grouped squares of any set of groups."""

    def __init__(self, keys: np.ndarray, t: np.ndarray, c: np.ndarray) -> None:
        keys = np.asarray(keys)
        if keys.shape != t.shape:
            raise ValueError(f"cluster keys hold {keys.size} rows, the weights {t.size}")
        _, self.index, sizes = np.unique(keys, return_inverse=True, return_counts=True)
        self.index = self.index.astype(np.int64).ravel()
        #: rows of each request in these rows, by dense request index
        self.sizes = sizes
        self.single = sizes[self.index] == 1
        self.t = np.asarray(t, dtype=np.float64)
        self.c = np.asarray(c, dtype=np.float64)
        self.units = int(sizes.size)
        # rows of multi-row requests in request order: grouping by (request, group) is then a
        # stable sort of nearly sorted keys (a few ms for 300k rows, not a full sort)
        multi = np.flatnonzero(~self.single)
        self.multi = multi[np.argsort(self.index[multi], kind="stable")]
        y_j = np.bincount(self.index, weights=self.t, minlength=self.units)
        n_j = np.bincount(self.index, weights=self.c, minlength=self.units)
        yr, nr = y_j[self.index], n_j[self.index]
        self.row_weights = {
            "q_tt": self.t * self.t, "q_tc": self.t * self.c, "q_cc": self.c * self.c,
            "p_tT": self.t * yr, "p_tN": self.t * nr, "p_cT": self.c * yr, "p_cN": self.c * nr,
        }
        self._constant: dict[int, bool] = {}

    def constant(self, attribute: int, codes: np.ndarray) -> bool:
        """Whether the attribute holds one value within every request (client, replica ...).
        Groups made only of such attributes hold whole requests, so their grouped squares are
        the P sums already counted (A_j = Y_j, E_j = N_j for every request in the group)."""
        if attribute not in self._constant:
            self._constant[attribute] = self.within_requests_equal(codes)
        return self._constant[attribute]

    def within_requests_equal(self, values: np.ndarray, rtol: float = 0.0) -> bool:
        """Whether `values` (one per row) hold one value within every request (uncached);
        numbers within `rtol` (relative, at least absolute below 1) count as one value."""
        m = self.multi
        same_request = self.index[m[1:]] == self.index[m[:-1]]
        vals = values[m]
        a, b = vals[1:][same_request], vals[:-1][same_request]
        if rtol == 0.0:
            return bool(np.all(a == b))
        return bool(np.all(np.abs(a - b) <= rtol * np.maximum(np.abs(a), 1.0)))

    def grouped(self, key: np.ndarray, wanted: np.ndarray, size: int,
                rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Grouped squares of the groups `wanted` (values of `key`, which labels each row of
        `rows`, all rows if None, with a group number below `size`)."""
        inset = np.zeros(size, dtype=bool)
        inset[wanted] = True
        if rows is None:
            full = key
        else:
            full = np.zeros(self.t.size, dtype=np.int64)
            full[rows] = key
            member = np.zeros(self.t.size, dtype=bool)
            member[rows] = True
        ok = inset[full] if rows is None else inset[full] & member
        out = {name: np.zeros(size) for name in GROUPED}
        s_pos = np.flatnonzero(ok & self.single)
        if s_pos.size:
            s_key = full[s_pos]
            t, c = self.t[s_pos], self.c[s_pos]
            out["Q_tt"] += np.bincount(s_key, weights=t * t, minlength=size)
            out["Q_tc"] += np.bincount(s_key, weights=t * c, minlength=size)
            out["Q_cc"] += np.bincount(s_key, weights=c * c, minlength=size)
        m_pos = self.multi[ok[self.multi]]
        if m_pos.size:
            joint = self.index[m_pos] * np.int64(size) + full[m_pos]
            order = np.argsort(joint, kind="stable")
            joint = joint[order]
            starts = np.flatnonzero(np.r_[True, joint[1:] != joint[:-1]])
            a = np.add.reduceat(self.t[m_pos][order], starts)
            e = np.add.reduceat(self.c[m_pos][order], starts)
            group = joint[starts] % size
            out["Q_tt"] += np.bincount(group, weights=a * a, minlength=size)
            out["Q_tc"] += np.bincount(group, weights=a * e, minlength=size)
            out["Q_cc"] += np.bincount(group, weights=e * e, minlength=size)
        return {name: arr[wanted] for name, arr in out.items()}

    def masked(self, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Grouped squares of one group given as a row mask (one-element arrays)."""
        key = mask.astype(np.int64)
        return self.grouped(key, np.array([1]), 2)


def _coefficients(metric: str, a, e, y, n):
    """k1..k4 of the statistic's influence (module docstring), per group. Totals are numpy
    floats, so an empty side gives inf/nan (and the overall fallback), never a Python
    ZeroDivisionError."""
    y, n = np.float64(y), np.float64(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "share_ratio":  # t: test rows, c: test + control rows
            b, s = e - a, n - y
            return 1.0 / a + 1.0 / b, -1.0 / b, -1.0 / y - 1.0 / s, 1.0 / s
        lam1 = a / e
        if metric == "global_ratio":
            lam = y / n
            return 1.0 / a, -lam1 / a, -1.0 / y, lam / y
        # risk ratio, and mean shift (t = value x count): two means, inside and outside
        rest = y - a
        lam2 = rest / (n - e)
        return 1.0 / a + 1.0 / rest, -lam1 / a - lam2 / rest, -1.0 / rest, lam2 / rest


def _variance(k, q_aa, q_ae, q_ee, p_ay, p_an, p_ey, p_en, g_yy, g_yn, g_nn):
    k1, k2, k3, k4 = k
    return (k1 * k1 * q_aa + k2 * k2 * q_ee + 2 * k1 * k2 * q_ae
            + 2 * (k1 * k3 * p_ay + k1 * k4 * p_an + k2 * k3 * p_ey + k2 * k4 * p_en)
            + k3 * k3 * g_yy + 2 * k3 * k4 * g_yn + k4 * k4 * g_nn)


def overall_effect(totals: dict[str, float], metric: str) -> float:
    """Design effect of the overall rate (sum t / sum c): the fallback where a group's own
    statistic has an empty side (no outliers inside or outside)."""
    y, n = totals["t"], totals["c"]
    if not n > 0:
        return 1.0
    lam = y / n
    clustered = totals["p_tT"] - 2 * lam * totals["p_tN"] + lam * lam * totals["p_cN"]
    rowwise = totals["q_tt"] - 2 * lam * totals["q_tc"] + lam * lam * totals["q_cc"]
    if not rowwise > 0:
        return 1.0
    return float(max(clustered / rowwise, 1.0))


def design_effect(metric: str, sums: dict[str, np.ndarray], totals: dict[str, float],
                  a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per group: clustered over row-wise variance of the statistic, at least 1.

    `a`, `e`: the groups' sums of t and c; `totals` holds t, c and every ROW_WEIGHTS total.
    """
    y, n = totals["t"], totals["c"]
    k = _coefficients(metric, a, e, y, n)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        clustered = _variance(k, sums["Q_tt"], sums["Q_tc"], sums["Q_cc"], sums["p_tT"],
                              sums["p_tN"], sums["p_cT"], sums["p_cN"], totals["p_tT"],
                              totals["p_tN"], totals["p_cN"])
        rowwise = _variance(k, sums["q_tt"], sums["q_tc"], sums["q_cc"], sums["q_tt"],
                            sums["q_tc"], sums["q_tc"], sums["q_cc"], totals["q_tt"],
                            totals["q_tc"], totals["q_cc"])
        deff = clustered / rowwise
        ok = np.isfinite(deff) & (rowwise > 0)
        deff = np.where(ok, np.maximum(deff, 1.0), overall_effect(totals, metric))
        if metric in ("risk_ratio", "global_ratio") and totals["q_tt"] > 0:
            # outlier clumps: the sandwich has no variance left where a group's rate is 0 or 1
            # (every row of its few requests slow); the conditional test then counts clumps
            clumps = (2.0 * sums["Q_tt"] + totals["p_tT"] - 2.0 * sums["p_tT"]) / totals["q_tt"]
            deff = np.maximum(deff, np.nan_to_num(clumps, nan=1.0))
    return deff


def request_priorities(keys: np.ndarray, seed: int) -> np.ndarray:
    """A uniform priority in (0, 1) per request key (splitmix64 of key + seed): equal keys get
    equal priorities, distinct keys independent-looking ones (53 bits; two requests collide
    with probability ~1e-16 per pair, which merges them into one, a conservative error)."""
    z = np.asarray(keys, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


#: Levels of a column whose design effect is measured one by one (the rest pooled as one cell):
#: the common levels carry the statistic; a 5,000-level attribute stays cheap.
DEFF_LEVELS = 32
#: Quantile cuts a numeric column is binned at to measure its design effect.
DEFF_QUANTILES = (0.25, 0.5, 0.75)


def proportion_effect(cells: np.ndarray, weight: np.ndarray, cluster: np.ndarray,
                      index: np.ndarray | None = None) -> float:
    """Rao-Scott mean design effect of a column's cell proportions: per cell, the clustered
    over the row-wise variance of its estimated share; averaged with weights 1 - p (Rao and
    Scott 1981), which is what a chi-squared statistic is divided by. At least 1.
    `index`: the rows' dense request numbers, when the caller has them already."""
    if weight.size == 0:
        return 1.0
    if index is None:
        index = np.unique(cluster, return_inverse=True)[1].astype(np.int64).ravel()
    k = int(cells.max()) + 1
    units = int(index.max()) + 1
    total = float(weight.sum())
    if total <= 0 or k < 2:
        return 1.0
    share = np.bincount(cells, weights=weight, minlength=k) / total
    x = np.bincount(index * k + cells, weights=weight, minlength=units * k).reshape(units, k)
    w_j = np.bincount(index, weights=weight, minlength=units)
    clustered = ((x - w_j[:, None] * share[None, :]) ** 2).sum(axis=0)
    w2 = weight * weight
    onehot_sq = np.bincount(cells, weights=w2, minlength=k)
    rowwise = onehot_sq * (1 - share) ** 2 + (float(w2.sum()) - onehot_sq) * share ** 2
    ok = (rowwise > 0) & (share > 0) & (share < 1)
    if not ok.any():
        return 1.0
    d = clustered[ok] / rowwise[ok]
    mean = float(np.sum((1 - share[ok]) * d) / max(np.sum(1 - share[ok]), 1e-300))
    return max(mean, 1.0)


def categorical_effect(codes: np.ndarray, weight: np.ndarray, cluster: np.ndarray,
                       index: np.ndarray | None = None) -> float:
    """Design effect of one categorical column's cells (its top DEFF_LEVELS levels + the rest);
    `index`: the rows' dense request numbers, when the caller has them."""
    if weight.size == 0:
        return 1.0
    counts = np.bincount(codes, weights=weight)
    top = np.argsort(-counts)[:DEFF_LEVELS]
    lut = np.full(counts.size, top.size, dtype=np.int64)
    lut[top] = np.arange(top.size)
    return proportion_effect(lut[codes], weight, cluster, index)


def numeric_effect(x: np.ndarray, weight: np.ndarray, cluster: np.ndarray,
                   index: np.ndarray | None = None) -> float:
    """Design effect of one numeric column, binned at its DEFF_QUANTILES."""
    fin = np.isfinite(x)
    if fin.sum() < 2:
        return 1.0
    cuts = np.unique(np.quantile(x[fin], DEFF_QUANTILES))
    cells = np.searchsorted(cuts, x[fin], side="left").astype(np.int64)
    return proportion_effect(cells, weight[fin], cluster[fin],
                             None if index is None else index[fin])


def column_effects(cat: np.ndarray, num: np.ndarray, weight: np.ndarray,
                   cluster: np.ndarray | None) -> tuple[list[float], list[float]]:
    """Design effect of every categorical (top DEFF_LEVELS levels + the rest) and numeric
    (binned at DEFF_QUANTILES) column of a sample; all 1 without request keys."""
    if cluster is None or weight.size == 0:
        return [1.0] * cat.shape[0], [1.0] * num.shape[0]
    index = np.unique(cluster, return_inverse=True)[1].astype(np.int64).ravel()
    cats = [categorical_effect(codes, weight, cluster, index) for codes in cat]
    nums = [numeric_effect(x, weight, cluster, index) for x in num]
    return cats, nums
