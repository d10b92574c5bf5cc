"""Does the optimizer's guarantee hold where users go, and how many rows does it need? Simulated.

    python -m benchmarks.guarantee [--seeds 20] [--hard-seeds 30] [--workers 2] [--json PATH]
                                        [--only validity,hard,power,user,topk,bounds] [--bounds-seeds 30]

Every run optimizes through the public API on rows a user would have (``benchmarks._guarantee_tasks``:
two synthetic tasks and UCI Adult), then measures the served plan's loss against the full pipeline
on fresh rows. A run *exceeds* when that loss is above ``max_loss``; the guarantee allows
``1 - confidence`` (5%) of runs to. Rules, each on the same draws (seed by seed):

- ``default``: today's defaults (exact bounds, ``holdout``/``certify_share`` "auto");
- ``product``: the earlier rowwise rule (Clopper-Pearson x2) with the earlier fixed split
  (``holdout=0.4, certify_share=0.6``);
- ``bootstrap``: the earlier default of ROC AUC and F1 (guarded paired bootstrap), earlier split.

Sections:

- **validity**: tasks x metrics (accuracy, ROC AUC, F1) x labelled rows {500, 1,000, 2,000, 5,000}
  x ``max_loss`` {0.005, 0.01, 0.02}, default rule; and a ladder of gears.
- **hard**: the rare pattern at 300-1,500 certification rows and ``max_loss`` 0.002-0.005, the
  default rule beside the earlier one.
- **power**: the fewest labelled rows at which half the seeds certify a cascade, default against
  product (accuracy); and at 1,200 rows and ``max_loss=0.02`` the share of seeds certified, where
  an oracle cascade (the cheap level answering 30% of rows) loses at most ``max_loss / 2``.
- **user**: Davidson's tweets through ``pipelines.toxic``'s pipeline at 4,000 labelled rows (a
  user's data size) and ``max_loss=0.005``: certified or not, the bound, the expected speedup,
  the loss on the other 20,783 tweets, and top-K@100 on a 1,000-tweet pool, both rules.
- **topk**: certified top-K on pools of 1,000-100,000 rows (``benchmarks._guarantee_topk``).
- **bounds** (not in the default run): the toxic ladder the serving benchmarks deploy
  (``max_loss`` 0.005 with gears 0.01 and 0.02, ``BOUNDS_ROWS`` labelled tweets), each gear's
  loss on the rest of the file against its ``max_loss`` (the certificate) and against the
  ``loss_bound`` it reports. That bound is computed at the gear's threshold as if the threshold
  had been fixed in advance; the fixed-sequence search picked the threshold, so the bound is no
  95% statement (every table's "gears over their reported bound" column counts how often fresh
  rows read more).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import willump
from benchmarks._guarantee_tasks import FRESH_ROWS, fresh_loss, task
from benchmarks._guarantee_topk import topk_section

METRICS = ("accuracy", "roc_auc", "f1")
ROWS = (500, 1000, 2000, 5000)
MAX_LOSSES = (0.005, 0.01, 0.02)
#: labelled rows of the hard regime: about 300, 700 and 1,500 certification rows ("auto" split)
HARD_ROWS = (860, 2000, 4800)
#: labelled tweets of the bounds section: the serving benchmarks' toxic training rows (8,000 x 0.75)
BOUNDS_ROWS = 6000
HARD_MAX_LOSSES = (0.002, 0.005)
#: labelled rows of the power section: steps of about 12%
POWER_ROWS = (400, 450, 500, 560, 630, 700, 790, 880, 1000, 1120, 1200, 1400, 1580, 1770, 2000, 2240, 2500,
              2800)
POWER_MAX_LOSSES = (0.01, 0.02)
RULES = {
    "default": {},
    "product": {"bound": "product", "holdout": 0.4, "certify_share": 0.6},
    "bootstrap": {"bound": "bootstrap", "holdout": 0.4, "certify_share": 0.6},
}


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One (task, metric, rows, max_loss, rule) over its seeds."""
    t = task(cell["task"])
    runs = []
    first = cell.get("first_seed", 0)
    for seed in range(first, first + cell["seeds"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", willump.WillumpWarning)
            opt = t.optimize(cell["rows"], seed, metric=cell["metric"], max_loss=cell["max_loss"],
                             gears=tuple(cell.get("gears", ())), **RULES[cell["rule"]])
        X, y = t.fresh(seed)
        report = opt.report()
        losses = [fresh_loss(opt, cell["metric"], X, y, gear=i) for i in range(len(opt.gears_))] \
            if opt.is_cascade else [0.0]
        over = [loss - g.max_loss for loss, g in zip(losses, opt.gears_, strict=True)] if opt.is_cascade else [-1.0]
        # each gear's fresh loss against the bound it reports (a bound at its threshold alone: the
        # search over thresholds makes it no 95% bound; the certificate is max_loss)
        bounds = [g.loss_bound for g in opt.gears_] if opt.is_cascade else []
        runs.append({"seed": seed, "certified": opt.is_cascade, "fresh_loss": losses[0],
                     "fresh_losses": losses if opt.is_cascade else [], "bounds": bounds,
                     "exceeded": bool(max(over) > 0), "bound": report.loss_bound,
                     "gears_over_bound": sum(loss > b for loss, b in zip(losses, bounds, strict=False) if b is not None),
                     "cert_rows": report.splits["certification"], "gears": len(opt.gears_) - 1})
    certified = [r for r in runs if r["certified"]]
    return {**{k: cell[k] for k in ("section", "task", "metric", "rows", "max_loss", "rule", "seeds")},
            "gears": list(cell.get("gears", ())),
            "cert_rows": int(np.median([r["cert_rows"] for r in runs])),
            "certified": len(certified), "exceeded": sum(r["exceeded"] for r in runs),
            "exceeded_share": sum(r["exceeded"] for r in runs) / len(runs),
            "gears_certified": sum(len(r["bounds"]) for r in runs),
            "gears_over_bound": sum(r["gears_over_bound"] for r in runs),
            "mean_fresh_loss_certified": float(np.mean([r["fresh_loss"] for r in certified])) if certified else None,
            "median_bound": float(np.median([r["bound"] for r in certified])) if certified else None,
            "runs": runs}


def oracle_loss(task_name: str, rows: int, seed: int, early: float = 0.3) -> float:
    """Fresh-data accuracy loss of a cascade whose cheap level (fitted on the rows optimize would
    train on) answers the ``early`` share of rows it is most sure of: does a cascade losing
    little exist for this draw?"""
    from sklearn.linear_model import LogisticRegression

    t = task(task_name)
    X, y = t.draw(rows, seed)
    cheap = LogisticRegression().fit(X[["a"]], y)
    full = LogisticRegression().fit(X[[c for c in X.columns]], y)
    Xf, yf = t.fresh(seed)
    pc, pf = cheap.predict_proba(Xf[["a"]]), full.predict_proba(Xf)
    sure = pc.max(1) >= np.quantile(pc.max(1), 1 - early)
    served = np.where(sure, pc.argmax(1), pf.argmax(1))
    return float(np.mean(pf.argmax(1) == yf) - np.mean(served == yf))


def user_section(seeds: int, rows: int = 4000, max_loss: float = 0.005, pool: int = 1000,
                 first_seed: int = 0) -> list[dict[str, Any]]:
    """The toxic pipeline at a user's data size, both rules on the same draws."""
    t = task("toxic")
    out = []
    for rule in ("default", "product"):
        for seed in range(first_seed, first_seed + seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", willump.WillumpWarning)
                opt = t.optimize(rows, seed, metric="accuracy", max_loss=max_loss, top_k=100, **RULES[rule])
            report = opt.report()
            X, y = t.fresh(seed)
            rows_pool = X.iloc[:pool]
            answer, exact = opt.top_k(rows_pool, 100), opt.baseline.top_k(rows_pool, 100)
            out.append({"rule": rule, "seed": seed, "rows": rows, "max_loss": max_loss,
                        "cert_rows": report.splits["certification"], "certified": opt.is_cascade,
                        "bound": report.loss_bound, "expected_speedup": report.expected_speedup if opt.is_cascade else 1.0,
                        "fresh_loss": fresh_loss(opt, "accuracy", X, y) if opt.is_cascade else 0.0,
                        "topk_certified": bool(answer.certificate is not None and answer.certificate.certified),
                        "topk_precision": len(set(answer.indices.tolist()) & set(exact.indices.tolist())) / 100,
                        "topk_kept": int((~answer.approximate).sum())})
    return out


def _print_user(user: list[dict[str, Any]]) -> None:
    if not user:
        return
    print("\n| rule | seed | cert rows | certified | bound | expected speedup | fresh loss | top-K@100 of 1,000: "
          "certified (precision, rows fully scored) |")
    print("|---|---|---|---|---|---|---|---|")
    for u in user:
        bound = "-" if u["bound"] is None else f"{u['bound']:.4f}"
        print(f"| {u['rule']} | {u['seed']} | {u['cert_rows']:,} | {u['certified']} | {bound} | "
              f"{u['expected_speedup']:.2f}x | {u['fresh_loss']:+.4f} | {u['topk_certified']} "
              f"({u['topk_precision']:.2f}, {u['topk_kept']}) |")


def _cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    sections = set(args.only.split(","))
    if "validity" in sections:
        for name in ("logistic", "rare", "adult"):
            for metric in METRICS:
                for rows in ROWS:
                    for max_loss in MAX_LOSSES:
                        cells.append({"section": "validity", "task": name, "metric": metric, "rows": rows,
                                      "max_loss": max_loss, "rule": "default", "seeds": args.seeds})
        cells.append({"section": "validity", "task": "logistic", "metric": "accuracy", "rows": 2000,
                      "max_loss": 0.01, "rule": "default", "seeds": args.seeds, "gears": (0.02, 0.04)})
    if "bounds" in sections:  # the bench's toxic ladder (benchmarks._gears), on the rest of the file
        cells.append({"section": "bounds", "task": "toxic", "metric": "accuracy", "rows": BOUNDS_ROWS,
                      "max_loss": 0.005, "rule": "default", "seeds": args.bounds_seeds, "gears": (0.01, 0.02)})
    if "hard" in sections:
        for metric in METRICS:
            for rows in HARD_ROWS:
                for max_loss in HARD_MAX_LOSSES:
                    for rule in ("default", "product" if metric == "accuracy" else "bootstrap"):
                        cells.append({"section": "hard", "task": "rare", "metric": metric, "rows": rows,
                                      "max_loss": max_loss, "rule": rule, "seeds": args.hard_seeds})
    if "power" in sections:
        for max_loss in POWER_MAX_LOSSES:
            for rows in POWER_ROWS:
                for rule in ("default", "product"):
                    cells.append({"section": "power", "task": "logistic", "metric": "accuracy", "rows": rows,
                                  "max_loss": max_loss, "rule": rule, "seeds": args.seeds})
    return cells


def _rows_for_half(cells: list[dict[str, Any]], rule: str, max_loss: float) -> int | None:
    mine = sorted((c for c in cells if c["section"] == "power" and c["rule"] == rule and c["max_loss"] == max_loss),
                  key=lambda c: c["rows"])
    return next((c["rows"] for c in mine if c["certified"] >= c["seeds"] / 2), None)


def summarize(cells: list[dict[str, Any]], seeds: int, first_seed: int = 0) -> dict[str, Any]:
    power = []
    for max_loss in POWER_MAX_LOSSES:
        new, old = _rows_for_half(cells, "default", max_loss), _rows_for_half(cells, "product", max_loss)
        power.append({"max_loss": max_loss, "rows_default": new, "rows_product": old,
                      "ratio": None if not (new and old) else new / old})
    at_1200 = None
    if any(c["section"] == "power" for c in cells):
        oracle = [oracle_loss("logistic", 1200, s) for s in range(first_seed, first_seed + seeds)]
        exists = [i for i, loss in enumerate(oracle) if loss <= 0.01]
        cell = next((c for c in cells if c["section"] == "power" and c["rule"] == "default" and c["rows"] == 1200
                     and c["max_loss"] == 0.02), None)
        if cell is not None:
            certified = sum(cell["runs"][i]["certified"] for i in exists)
            at_1200 = {"seeds_with_an_oracle_cascade": len(exists), "certified_among_them": certified,
                       "share": certified / max(len(exists), 1), "oracle_losses": oracle}
    validity = [c for c in cells if c["section"] in ("validity", "hard") and c["rule"] == "default"]
    worst = max((c["exceeded_share"] for c in validity), default=None)
    runs = [r for c in validity for r in c["runs"] if r["certified"]]
    pooled = {"certified_runs": len(runs), "exceeded": sum(r["exceeded"] for r in runs),
              "share": sum(r["exceeded"] for r in runs) / max(len(runs), 1)}
    return {"power": power, "at_1200_rows_max_loss_0.02": at_1200, "worst_exceeded_share_default": worst,
            "pooled_default": pooled}


def grid_markdown(cells: list[dict[str, Any]]) -> str:
    """The validity section as one table: per task and metric, per (rows, max_loss) the seeds
    certified and, in brackets, those over max_loss on fresh data."""
    mine = [c for c in cells if c["section"] == "validity" and not c["gears"]]
    columns = [(rows, m) for rows in ROWS for m in MAX_LOSSES]
    lines = ["| task | metric | " + " | ".join(f"{rows:,} / {m}" for rows, m in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for name in dict.fromkeys(c["task"] for c in mine):
        for metric in METRICS:
            row = {(c["rows"], c["max_loss"]): c for c in mine if c["task"] == name and c["metric"] == metric}
            if row:
                lines.append(f"| {name} | {metric} | " + " | ".join(
                    f"{row[k]['certified']} ({row[k]['exceeded']})" if k in row else "-" for k in columns) + " |")
    return "\n".join(lines)


def _print(cells: list[dict[str, Any]], summary: dict[str, Any], topk: list[dict[str, Any]]) -> None:
    if any(c["section"] == "validity" for c in cells):
        print("Validity: seeds certified (over max_loss on fresh data), by labelled rows / max_loss\n")
        print(grid_markdown(cells) + "\n")
    head = ("| section | task | metric | rows (cert) | max_loss | rule | seeds | over max_loss | certified "
            "| median bound | mean fresh loss | gears over their reported bound |")
    print(head)
    print("|" + "---|" * 12)
    for c in cells:
        if c["section"] == "power":
            continue
        gears = f" (gears {', '.join(map(str, c['gears']))})" if c["gears"] else ""
        bound = "-" if c["median_bound"] is None else f"{c['median_bound']:.4f}"
        loss = "-" if c["mean_fresh_loss_certified"] is None else f"{c['mean_fresh_loss_certified']:+.4f}"
        print(f"| {c['section']} | {c['task']} | {c['metric']} | {c['rows']:,} ({c['cert_rows']:,}) | "
              f"{c['max_loss']}{gears} | {c['rule']} | {c['seeds']} | {c['exceeded']} ({c['exceeded_share']:.0%}) | "
              f"{c['certified']} | {bound} | {loss} | {c['gears_over_bound']} of {c['gears_certified']} |")
    power = [c for c in cells if c["section"] == "power"]
    if power:
        print("\n| max_loss | labelled rows | certified: default | certified: product |")
        print("|---|---|---|---|")
        for max_loss in POWER_MAX_LOSSES:
            for rows in POWER_ROWS:
                pair = {c["rule"]: c for c in power if c["max_loss"] == max_loss and c["rows"] == rows}
                if pair:
                    print(f"| {max_loss} | {rows:,} | {pair['default']['certified']}/{pair['default']['seeds']} | "
                          f"{pair['product']['certified']}/{pair['product']['seeds']} |")
        for p in summary["power"]:
            ratio = "-" if p["ratio"] is None else f"{p['ratio']:.2f}"
            print(f"max_loss {p['max_loss']}: half the seeds certify from {p['rows_default']} rows (default) "
                  f"vs {p['rows_product']} (product): ratio {ratio}")
        if summary["at_1200_rows_max_loss_0.02"]:
            a = summary["at_1200_rows_max_loss_0.02"]
            print(f"1,200 rows, max_loss 0.02: {a['certified_among_them']} of {a['seeds_with_an_oracle_cascade']} "
                  f"seeds with an oracle cascade losing <= 0.01 certified ({a['share']:.0%})")
    if topk:
        print("\n| calibration rows | k | pool | filter | queries | certified | certified below target "
              "| median ratio | work vs exact |")
        print("|---|---|---|---|---|---|---|---|---|")
        for t in topk:
            ratio = "-" if t["median_ratio"] is None else f"{t['median_ratio']:g}"
            print(f"| {t['calibration']:,} | {t['k']} | {t['pool']:,} | {t['filter']} | {t['queries']} | "
                  f"{t['certified']} | {t['certified_below_target']} ({t['below_share']:.1%}) | {ratio} | "
                  f"{t['work_vs_exact']:.3f} |")


class _Serial:
    """The executor interface, in this process (``--workers 1``)."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def map(fn, items):
        return map(fn, items)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per validity and power cell")
    parser.add_argument("--hard-seeds", type=int, default=30, help="seeds per hard-regime cell")
    parser.add_argument("--workers", type=int, default=1, help="processes running cells side by side")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="first seed of every cell (another value: an independent replication)")
    parser.add_argument("--only", default="validity,hard,power,user,topk",
                        help="comma-separated sections: validity, hard, power, user, topk, bounds")
    parser.add_argument("--bounds-seeds", type=int, default=30, help="seeds of the bounds section")
    parser.add_argument("--user-seeds", type=int, default=5, help="seeds of the user section")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cells = [c | {"first_seed": args.first_seed} for c in _cells(args)]
    done = []
    with ProcessPoolExecutor(args.workers) if args.workers > 1 else _Serial() as pool:
        for i, out in enumerate(pool.map(run_cell, cells)):
            done.append(out)
            print(f"[{i + 1}/{len(cells)} {time.perf_counter() - started:.0f}s] {out['section']} {out['task']} "
                  f"{out['metric']} rows={out['rows']} max_loss={out['max_loss']} {out['rule']}: "
                  f"{out['certified']}/{out['seeds']} certified, {out['exceeded']} over", file=sys.stderr, flush=True)
    topk = topk_section(seed=0) if "topk" in args.only.split(",") else []
    user = user_section(args.user_seeds, first_seed=args.first_seed) if "user" in args.only.split(",") else []
    summary = summarize(done, args.seeds, args.first_seed)
    result = {"cells": done, "summary": summary, "user": user, "topk": topk, "fresh_rows": FRESH_ROWS,
              "seconds": time.perf_counter() - started}
    _print(done, summary, topk)
    _print_user(user)
    pooled = summary["pooled_default"]
    print(f"\nworst share of runs over max_loss in a cell (default rule): {summary['worst_exceeded_share_default']}; "
          f"pooled: {pooled['exceeded']} of {pooled['certified_runs']} certified runs ({pooled['share']:.2%})")
    print(f"{result['seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=lambda v: None if isinstance(v, float) and
                                        not math.isfinite(v) else v))
    return result


if __name__ == "__main__":
    main()
