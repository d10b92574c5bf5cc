"""A finite-sample bound on the ROC AUC an approximation loses, valid at any n.

AUC is a mean over (positive, negative) pairs, not over rows, so neither a rowwise exact test
nor a bootstrap applies: the bootstrap is only asymptotic and over-certified at small n (a rare
pattern the cheap level misses was certified in 25-39% of runs at 300-500 rows against 5%).

**Pairs made independent.** Each row of the minority class is given ``r = majority // minority``
rows of the majority class of its own (a seeded random partition, no row used twice), and its
value ``h`` is the mean over its r pairs of ``full ordered the pair right - approximation did``
(ties count half). The h of different minority rows share no row, so they are independent,
bounded in [-1, 1], with mean exactly the AUC loss: every row takes part and no pair is counted
twice. A minority row the cascade pushes below many negatives gets a large h.

**A betting bound on their mean** (Waudby-Smith & Ramdas, "Estimating means of bounded random
variables by betting", JRSS-B 2023): the capital ``prod (1 + lambda_i (m - h_i))`` is a
nonnegative supermartingale when the mean is at least m, so by Ville's inequality it reaches
``1 / alpha`` with probability at most alpha. The bets ``lambda_i`` are predictable (each from
the h before it, in a seeded order) and variance-adaptive, capped below 1 so one fully discordant
row costs the capital but does not zero it. The bound is the smallest m the capital rejects
(bisection: the capital grows with m). With nothing discordant it certifies about
``log(1 / alpha) / minority rows``: the AUC floor is the rowwise floor scaled by the minority
share, as it must be (a pattern in a few minority rows is invisible with fewer of them).

Macro AUC over classes bounds each class's one-vs-rest loss at ``alpha / classes``.
"""

from __future__ import annotations

import math

import numpy as np

from ._metrics import Labels

#: largest bet per row (a bet of 1 would let one fully discordant row zero the capital)
MAX_BET = 0.95
#: variance the bets assume before any row is seen (the widest a [-1, 1] mean-zero value has / 4)
PRIOR_VARIANCE = 0.25
#: bisection precision of the bound
BOUND_TOL = 1e-6
#: most majority rows given to each minority row (bounds the memory of one evaluation)
MAX_PARTNERS = 64


def betting_upper(h: np.ndarray, confidence: float, seed: int = 0) -> float:
    """Upper confidence bound on the mean of independent values in [-1, 1]."""
    h = np.asarray(h, dtype=np.float64)
    n = len(h)
    if n == 0:
        return 1.0
    alpha = 1.0 - confidence
    h = h[np.random.default_rng(seed).permutation(n)]
    steps = np.arange(1, n + 1)
    running_mean = np.cumsum(h) / steps
    deviations = (h - np.r_[0.0, running_mean[:-1]]) ** 2
    variance = np.r_[PRIOR_VARIANCE, (PRIOR_VARIANCE + np.cumsum(deviations)[:-1]) / (steps[:-1] + 1)]
    bets = np.minimum(MAX_BET, np.sqrt(2.0 * math.log(1.0 / alpha) / (n * variance)))
    target = math.log(1.0 / alpha)

    def rejects(m: float) -> bool:
        return float(np.cumsum(np.log1p(bets * (m - h))).max()) >= target

    lo, hi = max(float(h.mean()), 0.0), 1.0
    if lo > 0 and rejects(lo):
        return lo
    if not rejects(hi):
        return 1.0
    while hi - lo > BOUND_TOL:
        mid = (lo + hi) / 2.0
        if rejects(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _ordered(si: np.ndarray, sj: np.ndarray) -> np.ndarray:
    """1 when the first score is higher, 1/2 on a tie, else 0."""
    return (si > sj) + 0.5 * (si == sj)


def pair_means(positive: np.ndarray, full: np.ndarray, approx: np.ndarray, seed: int) -> np.ndarray:
    """One value per minority row: its pairs' mean AUC loss (see the module docstring)."""
    pos, neg = np.flatnonzero(positive), np.flatnonzero(~positive)
    if len(pos) == 0 or len(neg) == 0:
        return np.zeros(0)
    minority, majority = (pos, neg) if len(pos) <= len(neg) else (neg, pos)
    r = min(MAX_PARTNERS, len(majority) // len(minority))
    partners = majority[np.random.default_rng(seed).permutation(len(majority))[: len(minority) * r]]
    partners = partners.reshape(len(minority), r)
    own = minority[:, None]
    if len(pos) <= len(neg):
        g = _ordered(full[own], full[partners]) - _ordered(approx[own], approx[partners])
    else:
        g = _ordered(full[partners], full[own]) - _ordered(approx[partners], approx[own])
    return g.mean(axis=1)


def auc_upper(labels: Labels, full: np.ndarray, approx: np.ndarray, confidence: float,
              seed: int = 0) -> float:
    """Upper confidence bound on ROC AUC (binary, or macro one-vs-rest) lost by ``approx``."""
    targets = [1] if full.shape[1] == 2 else list(range(full.shape[1]))
    level = 1.0 - (1.0 - confidence) / len(targets)
    bounds = []
    for index, c in enumerate(targets):
        h = pair_means(labels.index == c, full[:, c], approx[:, c], seed + index)
        bounds.append(betting_upper(h, level, seed + 7919 * (index + 1)) if len(h) else 1.0)
    return float(min(1.0, np.mean(bounds)))


def auc_floor(labels: Labels, n_classes: int, confidence: float) -> float:
    """Smallest AUC loss certifiable with these labels (no pair ordered differently)."""
    targets = [1] if n_classes == 2 else list(range(n_classes))
    level = 1.0 - (1.0 - confidence) / len(targets)
    bounds = []
    for c in targets:
        k = int(np.sum(labels.index == c))
        minority = min(k, len(labels) - k)
        bounds.append(betting_upper(np.zeros(minority), level) if minority else 1.0)
    return float(np.mean(bounds))
