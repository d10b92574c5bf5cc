"""Does the optimizer's guarantee hold where users go? Measured by simulation.

    python -m pipelines.bench_guarantee [--seeds 30] [--rows 1000] [--json PATH]

- **coverage**: over many seeds of a synthetic task with ``--rows`` labelled rows (the default
  bound, the default splits), how often the certified plan's loss on fresh rows exceeds
  ``max_loss`` (the guarantee allows ``1 - confidence``), and how often a cascade is certified
  at all; for accuracy (exact bound) and ROC AUC (guarded bootstrap), and for a ladder of gears
  (any gear over its own ``max_loss`` counts).
- **top-K**: how often the ratio table approves a filter, and in what share of fresh pools the
  approved ratio reaches precision@k >= 0.95 (target: 99% of pools), for pools much larger than
  the held-out rows, with a filter that tracks the full score and one that misranks the very
  top rows.

Costs are fixed (``fixed_costs``), so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

import willump
from willump._topk import build_ratio_table

#: label weights of the synthetic columns a (cheap group), b and c (expensive group)
WEIGHTS = (2.0, 1.0, 1.0)
FRESH_ROWS = 100_000


def synthetic(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({c: rng.normal(size=n) for c in "abc"})
    logit = WEIGHTS[0] * X.a + WEIGHTS[1] * X.b + WEIGHTS[2] * X.c
    return X, (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int).to_numpy()


@willump.feature
def cheap_a(df):
    return df[["a"]].to_numpy()


@willump.feature
def costly_bc(df):
    return df[["b", "c"]].to_numpy()


@willump.pipeline
def two_groups(df):
    return [cheap_a(df), costly_bc(df)]


COSTS = {"cheap_a": 1e-6, "costly_bc": 1e-4}


def _loss(opt: Any, metric: str, X: pd.DataFrame, y: np.ndarray) -> float:
    if metric == "accuracy":
        return float(np.mean(opt.baseline.predict(X) == y) - np.mean(opt.predict(X) == y))
    return float(roc_auc_score(y, opt.baseline.predict_proba(X)[:, 1]) - roc_auc_score(y, opt.predict_proba(X)[:, 1]))


def coverage(metric: str, rows: int, seeds: int, max_loss: float, gears: tuple[float, ...] = ()) -> dict:
    exceeded, cascades, geared, losses = 0, 0, 0, []
    for seed in range(seeds):
        X, y = synthetic(rows, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", willump.WillumpWarning)
            opt = willump.optimize(two_groups, LogisticRegression(), X, y, metric=metric, max_loss=max_loss,
                                   gears=gears, seed=seed, top_k=None, verbose=False, fixed_costs=COSTS)
        X_new, y_new = synthetic(FRESH_ROWS, 10_000 + seed)
        worst = [_loss(opt.gear(i), metric, X_new, y_new) - opt.gears_[i].max_loss for i in range(len(opt.gears_))] \
            if opt.is_cascade else [-1.0]
        losses.append(_loss(opt, metric, X_new, y_new))
        exceeded += max(worst) > 0
        cascades += opt.is_cascade
        geared += len(opt.gears_) > 1
    out = {"metric": metric, "rows": rows, "seeds": seeds, "max_loss": max_loss, "gears": list(gears),
           "exceeded": exceeded, "exceeded_share": exceeded / seeds, "cascades": cascades,
           "mean_fresh_loss": float(np.mean(losses))}
    if gears:
        out["runs_with_a_looser_gear"] = geared
    return out


def _scores(n: int, rng: np.random.Generator, trap: bool) -> tuple[np.ndarray, np.ndarray]:
    z = rng.normal(size=n)
    cheap = z + 0.5 * rng.normal(size=n)
    if trap:  # the cheap groups cannot see what makes the top 0.3% top
        top = z > 2.75
        cheap[top] = rng.normal(size=top.sum())
    return cheap, z


def topk(held: int, k: int, pool: int, trap: bool, tables: int, pools: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    approved, covered, ratios = 0, [], []
    for _ in range(tables):
        table = build_ratio_table(*_scores(held, rng, trap))
        ratio = table.ratio_for(k, pool, 0.95, 0.99)
        if ratio is None:
            continue
        approved += 1
        ratios.append(ratio)
        kept = math.ceil(ratio * k)
        hits = 0
        for _ in range(pools):
            cheap, full = _scores(pool, rng, trap)
            top = np.argpartition(-full, k)[:k]
            hits += np.isin(top, np.argpartition(-cheap, kept)[:kept]).mean() >= 0.95
        covered.append(hits / pools)
    return {"held_out": held, "k": k, "pool": pool, "filter": "misranks the top 0.3%" if trap else "tracks",
            "approved": approved, "tables": tables, "median_ratio": float(np.median(ratios)) if ratios else None,
            "pool_coverage": float(np.mean(covered)) if covered else None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--max-loss", type=float, default=0.03)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = {"coverage": [coverage("accuracy", args.rows, args.seeds, args.max_loss),
                           coverage("roc_auc", args.rows, args.seeds, args.max_loss),
                           coverage("accuracy", args.rows, args.seeds, args.max_loss, gears=(0.05, 0.08))],
              "topk": [topk(2400, 10, 100_000, False, 20, 40), topk(24_000, 100, 100_000, False, 10, 40),
                       topk(24_000, 1000, 100_000, False, 10, 40), topk(2400, 100, 2400, False, 20, 40),
                       topk(2400, 100, 10_000, True, 20, 40), topk(24_000, 100, 100_000, True, 10, 40)]}
    result["seconds"] = time.perf_counter() - started
    print("| metric | rows | seeds | max_loss (gears) | runs over max_loss | cascades | mean fresh loss |")
    print("|---|---|---|---|---|---|---|")
    for c in result["coverage"]:
        gears = "" if not c["gears"] else f" ({', '.join(map(str, c['gears']))})"
        print(f"| {c['metric']} | {c['rows']} | {c['seeds']} | {c['max_loss']}{gears} | {c['exceeded']} "
              f"({c['exceeded_share']:.0%}) | {c['cascades']} | {c['mean_fresh_loss']:+.4f} |")
    print("\n| held-out rows | k | pool | filter | ratios approved | median ratio | pools reaching precision 0.95 |")
    print("|---|---|---|---|---|---|---|")
    for t in result["topk"]:
        cov = "-" if t["pool_coverage"] is None else f"{t['pool_coverage']:.1%}"
        print(f"| {t['held_out']:,} | {t['k']} | {t['pool']:,} | {t['filter']} | {t['approved']}/{t['tables']} | "
              f"{t['median_ratio'] or '-'} | {cov} |")
    print(f"\n{result['seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
