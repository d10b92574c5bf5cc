"""Certified top-K on fresh pools of 1,000-100,000 rows (the top-K part of ``benchmarks.guarantee``).

Scores are simulated (a full score z and a cheap score that tracks it with noise, or that cannot
see what makes the top 0.3% top); planning and the certificate are the library's own
(``willump._topk``). Per query: fresh selection rows plan the ratio, fresh calibration rows
certify, a fresh pool is filtered and checked against its exact top k. Work is counted in full
scores, a cheap score costing ``CHEAP_SHARE`` of one; an uncertified answer pays for the exact
rescoring too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from willump._topk import TOPK_RATIOS, RatioPlan, Scores, certify

PRECISION = 0.95
CONFIDENCE = 0.95
#: a cheap score's cost in full scores (toxic's word level against its whole pipeline: ~1/26)
CHEAP_SHARE = 0.04
#: (calibration rows, k, pool, filter, queries)
CONFIGS = (
    (2400, 100, 1000, "tracks", 60), (2400, 100, 2400, "tracks", 60), (2400, 10, 100_000, "tracks", 30),
    (10_000, 100, 5000, "tracks", 60), (10_000, 100, 10_000, "tracks", 60), (10_000, 100, 100_000, "tracks", 30),
    (10_000, 1000, 100_000, "tracks", 30), (10_000, 100, 10_000, "misranks the top 0.3%", 60),
)


def _scores(n: int, rng: np.random.Generator, trap: bool) -> tuple[np.ndarray, np.ndarray]:
    z = rng.normal(size=n)
    cheap = z + 0.5 * rng.normal(size=n)
    if trap:
        top = z > 2.75
        cheap[top] = rng.normal(size=top.sum())
    return cheap, z


def _one(calibration_rows: int, k: int, pool: int, trap: bool, rng: np.random.Generator) -> dict[str, Any]:
    plan = RatioPlan(Scores.of(*_scores(calibration_rows, rng, trap)), calibration_rows,
                     np.asarray(TOPK_RATIOS, dtype=np.float64))
    ratio = plan.ratio_for(k, pool, PRECISION, CONFIDENCE)
    if ratio is None:
        return {"ratio": None, "certified": False, "precision": 1.0, "work": 1.0}
    calibration = Scores.of(*_scores(calibration_rows, rng, trap))
    cheap, full = _scores(pool, rng, trap)
    m = math.ceil(ratio * k)
    kept = np.lexsort((np.arange(pool), -cheap))[:m]
    cutoff = cheap[kept].min()
    below = int(np.sum(cheap < cutoff))
    kappa = np.sort(full[kept])[::-1][k - 1]
    cert = certify(calibration, k, below, pool - m - below, cutoff, kappa, PRECISION, CONFIDENCE)
    precision = float(np.isin(np.argsort(-full)[:k], kept).mean()) if cert.certified else 1.0
    work = CHEAP_SHARE + m / pool + (0.0 if cert.certified else 1.0)
    return {"ratio": ratio, "certified": cert.certified, "precision": precision, "work": work}


def topk_section(seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for calibration_rows, k, pool, kind, queries in CONFIGS:
        runs = [_one(calibration_rows, k, pool, kind != "tracks", rng) for _ in range(queries)]
        certified = [r for r in runs if r["certified"]]
        below = sum(r["precision"] < PRECISION for r in certified)
        ratios = [r["ratio"] for r in runs if r["ratio"] is not None]
        out.append({"calibration": calibration_rows, "k": k, "pool": pool, "filter": kind, "queries": queries,
                    "certified": len(certified), "certified_below_target": below, "below_share": below / queries,
                    "median_ratio": float(np.median(ratios)) if ratios else None,
                    "work_vs_exact": float(np.mean([r["work"] for r in runs]))})
    return out
