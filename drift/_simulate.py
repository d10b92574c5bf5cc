"""Interval coverage of the ratio statistics under row sampling, checked by simulation.

Why here (not only in a test): the benchmark reports coverage at nominal 95% with many
repetitions, and the tests run a smaller but still discriminating version of the same code.
Each repetition draws a fresh population of panes from a known superpopulation (a group with a
known true ratio), samples them with the monitor's own reservoirs (priority sampling, flagged
stratum, Horvitz-Thompson weights, merges across panes), and asks whether the interval the
explainer reports contains the true ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drift._apriori import Rows, score_group
from drift._reservoir import Reservoir
from drift._sample import Sample


@dataclass(frozen=True)
class Coverage:
    """Share of repetitions whose interval held the true ratio, and on which side it missed."""

    statistic: str
    repetitions: int
    covered: float
    missed_low: float  # interval entirely above the truth
    missed_high: float  # interval entirely below the truth
    median_width: float  # median of upper / lower

    def to_dict(self) -> dict[str, float | int | str]:
        return {"statistic": self.statistic, "repetitions": self.repetitions,
                "covered": self.covered, "missed_low": self.missed_low,
                "missed_high": self.missed_high, "median_width": self.median_width}


def _score(sample_rows: Rows, metric: str, mask: np.ndarray, confidence: float) -> tuple:
    res = score_group(sample_rows, metric, mask, 1.0 - confidence)
    return float(res["ratio"][0]), float(res["ci_low"][0]), float(res["ci_high"][0])


def request_sizes(rng: np.random.Generator, n: int, request_rows: int | tuple[int, int]
                  ) -> np.ndarray:
    """Row counts of requests holding about `n` rows: a fixed size, or uniform on (lo, hi)."""
    if isinstance(request_rows, tuple):
        lo, hi = request_rows
        sizes = rng.integers(lo, hi + 1, size=max(1, 2 * n // (lo + hi)))
    else:
        sizes = np.full(max(1, n // int(request_rows)), int(request_rows))
    return sizes


def _panes(rng: np.random.Generator, panes: int, rows: int, share: float, p_in: float,
           p_out: float, capacity: tuple[int, int], flag_outliers: bool,
           request_rows: int | tuple[int, int] = 1) -> Sample:
    """Sampled panes whose rows come in requests of `request_rows` rows: the group and the
    outcome are the request's (all rows of a slow request are outliers), and a request's
    rows share one priority, as the monitor gives them."""
    parts = []
    for _ in range(panes):
        sizes = request_sizes(rng, int(rng.poisson(rows)), request_rows)
        m = sizes.size
        g = np.repeat(rng.random(m) < share, sizes)
        out = np.repeat(rng.random(m), sizes) < np.where(g, p_in, p_out)
        prio = np.repeat(rng.random(m), sizes)
        n = g.size
        res = Reservoir(2, 0, capacity)
        flags = out.astype(np.uint32) if flag_outliers else np.zeros(n, dtype=np.uint32)
        res.add(np.vstack((g, out)).astype(np.int32), np.zeros((0, n)), flags, prio)
        parts.append(res)
    return Sample.from_reservoirs(parts, 2, 0, clustered=request_rows != 1)


def risk_ratio_coverage(
    repetitions: int = 400,
    seed: int = 0,
    panes: int = 10,
    rows_per_pane: int = 120_000,
    capacity: tuple[int, int] = (20_000, 10_000),
    share: float = 0.05,
    base_rate: float = 0.01,
    true_ratio: float = 3.0,
    flag_outliers: bool = True,
    confidence: float = 0.95,
    request_rows: int | tuple[int, int] = 1,
) -> Coverage:
    """Coverage of the risk-ratio interval of one group on sampled windows.

    `request_rows` > 1: rows come in requests sharing group and outcome (the monitor's
    request keys then make the interval count requests, drift._clusters).

    Defaults are the monitor's defaults at 2,000 rows/s with 1-minute panes: 120k rows a pane,
    20k unflagged + 10k flagged rows kept. `flag_outliers=False` puts the outliers in the
    unflagged stratum (a query classifier other than the ones run at ingest), so they are
    sampled too.
    """
    rng = np.random.default_rng([seed, 17])
    hits = lows = highs = 0
    widths = []
    for _ in range(repetitions):
        s = _panes(rng, panes, rows_per_pane, share, base_rate * true_ratio, base_rate,
                   capacity, flag_outliers, request_rows)
        o = s.cat[1] == 1
        rows = Rows(codes=s.cat[:1], cards=[2], target=s.weight * o, count=s.weight,
                    target_var=s.sampling_var * o, count_var=s.sampling_var,
                    target_floor=s.zero_cell_floor(o), count_floor=s.zero_cell_floor(),
                    cluster=s.cluster)
        _, lo, hi = _score(rows, "risk_ratio", s.cat[0] == 1, confidence)
        hits += lo <= true_ratio <= hi
        lows += lo > true_ratio
        highs += hi < true_ratio
        widths.append(hi / lo if lo > 0 else np.inf)
    return Coverage("risk_ratio", repetitions, hits / repetitions, lows / repetitions,
                    highs / repetitions, float(np.median(widths)))


def share_ratio_coverage(
    repetitions: int = 400,
    seed: int = 0,
    panes: int = 10,
    rows_per_pane: int = 120_000,
    capacity: tuple[int, int] = (20_000, 10_000),
    reference_rows: int = 600_000,
    reference_capacity: int = 100_000,
    share: float = 0.02,
    true_ratio: float = 1.0,
    confidence: float = 0.95,
    request_rows: int | tuple[int, int] = 1,
) -> Coverage:
    """Coverage of the share-ratio interval (mix shift) when both the window and the reference
    are sampled: window panes at `capacity`, a reference of `reference_rows` rows kept at
    `reference_capacity` rows per stratum."""
    rng = np.random.default_rng([seed, 29])
    hits = lows = highs = 0
    widths = []
    for _ in range(repetitions):
        cur = _panes(rng, panes, rows_per_pane, share * true_ratio, 0.01, 0.01, capacity, True,
                     request_rows)
        ref = _panes(rng, 1, reference_rows, share, 0.01, 0.01,
                     (reference_capacity, reference_capacity), True, request_rows)
        codes = np.concatenate((cur.cat[:1], ref.cat[:1]), axis=1)
        zeros = np.zeros(ref.size)
        rows = Rows(codes=codes, cards=[2], target=np.concatenate((cur.weight, zeros)),
                    count=np.concatenate((cur.weight, ref.weight)),
                    target_var=np.concatenate((cur.sampling_var, zeros)),
                    count_var=np.concatenate((cur.sampling_var, ref.sampling_var)),
                    target_floor=cur.zero_cell_floor(), count_floor=ref.zero_cell_floor(),
                    cluster=None if cur.cluster is None else np.concatenate(
                        (cur.cluster, ref.cluster + 2.0)))  # references' keys kept apart
        _, lo, hi = _score(rows, "share_ratio", codes[0] == 1, confidence)
        hits += lo <= true_ratio <= hi
        lows += lo > true_ratio
        highs += hi < true_ratio
        widths.append(hi / lo if lo > 0 else np.inf)
    return Coverage("share_ratio", repetitions, hits / repetitions, lows / repetitions,
                    highs / repetitions, float(np.median(widths)))
