"""Which passing combinations an explanation reports: minimal ones, and not riders.

Why apart from the search (drift._apriori): the search scores every candidate; these rules then
decide which of the passing ones a person reads. A superset is reported only when clearly
stronger than its passing parts (its lower bound above their ratios), or, for outlier ratios,
when those parts have no excess once its rows leave the population (they rode on it). A
reported combination whose excess disappears once better-ranked overlapping ones are removed
is dropped. Ranking is deterministic across processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from drift._apriori import Found, Rows, Scorer
    from drift._counting import Weights


def passes_one(ratio: float, lo: float, min_ratio: float) -> bool:
    """Ratio at least `min_ratio` (an infinite ratio counts) and lower bound above 1."""
    return (not math.isnan(ratio)) and ratio >= min_ratio and math.isfinite(lo) and lo > 1.0


def subsets(combo: tuple) -> list[tuple]:
    return [s for k in range(1, len(combo)) for s in itertools.combinations(combo, k)]


#: Dominated combinations re-tested for whether the parts dominating them only rode on them.
MAX_RIDER_CHECKS = 50


def minimal(scored: dict[tuple, Found], metric: str,
            stands_without: Callable[[Found, Found], bool]) -> list[Found]:
    """Passing combinations not dominated by a passing part (unless clearly stronger).

    A part dominates when its ratio reaches the combination's lower bound. With honest (wide)
    intervals, few requests or few rows, a true 2-attribute cause is always so dominated by
    its parts, which pass on its rows alone. So for outlier ratios a dominated combination is
    still reported when none of the parts dominating it passes once its rows leave the
    population: they rode on it (then `_drop_riders` keeps the combination, not the parts).
    """
    out = []
    dominated: list[tuple[Found, list[Found]]] = []
    for combo, found in scored.items():
        if not found.passes:
            continue
        parts = [scored[s] for s in subsets(combo) if s in scored and scored[s].passes]
        blockers = [p for p in parts if not found.ci_low > p.ratio]
        if not blockers:
            out.append(found)
        else:
            dominated.append((found, blockers))
    if metric not in ("risk_ratio", "global_ratio"):
        # share ratios: two parts that both grew make their pair's ratio the product of theirs,
        # and the pair holds every window row of a part whenever the other part holds every
        # window row; the parts are the answer there
        return out
    dominated.sort(key=lambda fb: (-fb[0].ci_low, -fb[0].ratio, fb[0].order, fb[0].combo))
    checks = 0
    for found, blockers in dominated:
        if checks + len(blockers) > MAX_RIDER_CHECKS:
            break
        rode = True
        for part in blockers:
            checks += 1
            if stands_without(part, found):
                rode = False
                break
        if rode:
            out.append(found)
    return out


#: Reported combinations re-tested against each other on residual rows (best ranked first).
MAX_RESIDUAL_CHECKS = 100


def residual_passes(
    weights: Weights,
    scorer: Scorer,
    inside: np.ndarray,
    removed: np.ndarray,
    min_t: float,
    min_ratio: float,
    alpha: float,
) -> tuple[bool, float]:
    """Does the group `inside` still pass once the rows `removed` leave the population?"""
    sums = weights.over(inside & ~removed)
    gone = weights.over(removed, grouped=False)
    totals = {name: scorer.totals[name] - float(gone[name][0]) for name in weights.names}
    res = scorer.score(sums, alpha, totals)
    ratio, lo = float(res["ratio"][0]), float(res["ci_low"][0])
    ok = bool(sums["target"][0] >= min_t and passes_one(ratio, lo, min_ratio))
    return ok, ratio


def drop_riders(
    rows: Rows,
    reported: list[Found],
    stands: Callable[[Found, np.ndarray, np.ndarray], bool],
) -> list[Found]:
    """Keep only combinations whose excess survives removing overlapping, better ones.

    Walks the reported combinations best first. A combination f whose rows overlap accepted
    ones (supersets, parts, or nested attributes such as region=ap holding replica=r7) is
    re-tested on the residual: the population without those combinations' rows. If it still
    passes it stands on its own. Otherwise, if some overlapping g still passes without f's
    rows, f only rode on g and is dropped; if neither stands without the other (they share one
    excess), the more concentrated one (higher ratio) is kept. `stands(f, inside, removed)`:
    does f, whose rows are `inside`, still pass once the rows `removed` leave?
    """
    if len(reported) <= 1:
        return reported
    ordered = sorted(reported, key=lambda f: rank_key(f, tuple(str(v) for _, v in f.combo)))
    head, tail = ordered[:MAX_RESIDUAL_CHECKS], ordered[MAX_RESIDUAL_CHECKS:]
    masks = {f.combo: row_mask(rows, f.combo) for f in head}
    accepted: list[Found] = []
    for f in head:
        mf = masks[f.combo]
        overlapping = [g for g in accepted if (mf & masks[g.combo]).any()]
        if not overlapping:
            accepted.append(f)
            continue
        union = np.zeros(rows.n, dtype=bool)
        for g in overlapping:
            union |= masks[g.combo]
        if stands(f, mf, union):
            accepted.append(f)
            continue
        others_stand = [stands(g, masks[g.combo], mf) for g in overlapping]
        if any(others_stand):
            continue  # f's excess is explained by a combination that stands without it
        if all(f.ratio > g.ratio for g in overlapping):
            gone = {g.combo for g in overlapping}
            accepted = [g for g in accepted if g.combo not in gone]
            accepted.append(f)
    return accepted + tail


def row_mask(rows: Rows, combo: tuple[tuple[int, int], ...]) -> np.ndarray:
    m = np.ones(rows.n, dtype=bool)
    for a, v in combo:
        m &= rows.codes[a] == v
    return m


def rank_key(found: Found, value_text: tuple[str, ...]) -> tuple:
    """Best first: lower confidence bound, ratio, support, then lower order, then values.

    `value_text` holds the combination's values as text, so ties break the same way in every
    process (codes may differ between monitors; values do not).
    """
    lo = found.ci_low if math.isfinite(found.ci_low) else -math.inf
    ratio = -math.inf if math.isnan(found.ratio) else found.ratio
    attrs = tuple(a for a, _ in found.combo)
    return (-lo, -ratio, -found.target, found.order, attrs, value_text)
