"""The live guarantee on served traffic: how soon the audit's alarm sees a rise, how quiet it stays
when nothing changes, and what it says on a real cascade under a covariate shift.

    python -m benchmarks.guarantee_live [--json PATH] [--quick] [--seed N]
                                        [--sections rise,null,shift]

The served cascade's cheap level answers a share of the rows (0.8 in the simulations); 1% of
those are audited (also run through the full pipeline), and an audited row *disagrees* when the
two predicted classes differ. ``drift._guarantee.GuaranteeLedger`` keeps the counts and raises
its alarm when the served disagreement rate is, with confidence 95% over unlimited time, above
the upper bound of the rate certification saw (``cert_disagreed`` of ``cert_rows``). Rates below
are served rates (cheap share x the cheap rows' disagreement rate), the unit of
``cert_disagreed / cert_rows``.

Sections:

- **rise**: a planted 2x rise of the disagreement rate from the first served row, at served rates
  0.5%-10% and 2,000 / 4,000 / 20,000 certification rows; the alarm checked after every 20
  audited rows: audited rows to the first alarm (median, p90) and the share of runs alarmed
  within 2,000 audited rows (target from the issue: within 2,000). Also the same rise after a
  quiet stretch (the ledger's counts are cumulative, so older rows dilute a late rise).
- **null**: 30 days of stationary traffic at 10 rows/s (~6,900 audits a day), checked every
  minute (every 10th minute with ``--quick``): the share of runs with any alarm (target at most
  ``1 - confidence`` = 5%), and how tight the upper bound on the served disagreement rate (the
  label-free loss bound) is after a day and after 30 days, and whether it covers the truth.
- **shift**: UCI Adult through ``pipelines.adult``, optimized with willump (6,000 certification
  rows passed as ``cert=``); the held-out test rows are replayed as a stream whose share of one
  segment (an attribute value where the cheap level disagrees more and the cascade loses more
  than ``max_loss``) grows until the true accuracy loss (served vs full, with labels) passes
  ``max_loss``: audited rows to the alarm (target from the issue: before 5,000) beside the
  audited rows at which the true loss crossed ``max_loss``; also the segment where the cascade
  loses most, and a stationary replay.

The rise and null sections evaluate the alarm through ``drift._confseq.rejects_at_most`` (the
ledger's own test, 40x cheaper than a verdict: ``share x lower > reference`` exactly when the
one-sided mixture rejects ``rate <= reference / share``); every run's first alarm, the check
before it, and the last check of a run without one are re-read with ``GuaranteeLedger.verdict``
and the mismatches printed (0 expected).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._guarantee_live_shift import print_shift, shift_section
from drift._confseq import rejects_at_most, tuned_prior
from drift._guarantee import AuditCounts, GearTerms, GuaranteeLedger, _clip

SECTIONS = ("rise", "null", "shift")
#: targets from the issue
TARGET_DETECT_AUDITS = 2_000
TARGET_NULL_ALARM_SHARE = 0.05
RATES = (0.005, 0.01, 0.02, 0.05, 0.10)
CERT_ROWS = (2_000, 4_000, 20_000)
SHARE = 0.8
AUDIT_RATE = 0.01
#: audited rows per alarm check in the rise section
BATCH_AUDITS = 20
#: audited rows a rise is followed for after its onset
RISE_CAP = 20_000
#: the late rise: served rate, certification rows, audited rows of quiet traffic before it
LATE_RATE = 0.02
LATE_CERT_ROWS = (4_000, 20_000)
LATE_ONSETS = (2_000, 10_000, 50_000)
#: the null section's traffic
ROWS_PER_S = 10.0
DAYS = 30
MINUTES_PER_DAY = 1_440


# ====================================================================== the alarm, fast
def first_alarm(ledger: GuaranteeLedger, n: np.ndarray, s: np.ndarray, served: np.ndarray,
                cheap: np.ndarray, start: int = 0) -> int | None:
    """Index of the first check (from ``start``) at which gear 0's alarm is up, given the
    cumulative audited rows ``n``, disagreements ``s``, served and cheap rows at each check;
    the ledger's verdict, computed as the one test it makes."""
    reference, source = ledger.reference_rate(0)
    if reference is None:
        return None
    alpha = ledger.alpha_gear / 2.0 if source == "certification" else ledger.alpha_gear
    share = cheap / np.maximum(served, 1)
    with np.errstate(divide="ignore"):
        rate = reference / share
    # share x lower > reference needs the estimate above reference / share, a rate below 1
    for k in np.flatnonzero((s > rate * n) & (rate < 1.0) & (np.arange(len(n)) >= start)):
        centre = _clip(reference / max(float(share[k]), 1e-9))
        prior = tuned_prior(_clip(ledger.rise * centre), ledger.horizon)
        if rejects_at_most(int(n[k]), int(s[k]), float(rate[k]), alpha, prior):
            return int(k)
    return None


def _verdict_alarm(ledger: GuaranteeLedger, n, s, served, cheap, k: int) -> bool:
    return bool(ledger.verdict(0, AuditCounts(int(served[k]), int(cheap[k]), int(n[k]), int(s[k])))["alarm"])


def cross_check(ledger: GuaranteeLedger, n, s, served, cheap, k: int | None, start: int = 0) -> int:
    """Mismatches between :func:`first_alarm` and the ledger's verdict around its answer."""
    bad = 0
    if k is None:
        return int(_verdict_alarm(ledger, n, s, served, cheap, len(n) - 1))
    bad += not _verdict_alarm(ledger, n, s, served, cheap, k)
    if k > start:
        bad += _verdict_alarm(ledger, n, s, served, cheap, k - 1)
    return bad


def _ledger(cert_rows: int, cert_disagreed: int) -> GuaranteeLedger:
    return GuaranteeLedger([GearTerms(0, None, cert_rows, cert_disagreed)])


# ====================================================================== rise
def _rise_run(rng: np.random.Generator, rate: float, cert_rows: int,
              onset: int) -> tuple[int | None, bool, int, float]:
    """One run: (audited rows from onset to the first alarm or None, alarmed before onset,
    verdict mismatches, the alarm's reference rate)."""
    ledger = _ledger(cert_rows, int(rng.binomial(cert_rows, rate)))
    checks = (onset + RISE_CAP) // BATCH_AUDITS
    d_cheap = rate / SHARE
    n = np.arange(1, checks + 1) * BATCH_AUDITS
    p = np.where(n <= onset, d_cheap, min(2 * d_cheap, 1.0))
    s = rng.binomial(BATCH_AUDITS, p).cumsum()
    per_batch = round(BATCH_AUDITS / (SHARE * AUDIT_RATE))
    served = np.arange(1, checks + 1) * per_batch
    cheap = rng.binomial(per_batch, SHARE, checks).cumsum()
    k = first_alarm(ledger, n, s, served, cheap)
    bad = cross_check(ledger, n, s, served, cheap, k)
    reference = float(ledger.reference_rate(0)[0])
    if k is not None and n[k] <= onset:
        return None, True, bad, reference
    return (None if k is None else int(n[k]) - onset), False, bad, reference


def _delays(delays: list[int | None], cap: int) -> dict[str, Any]:
    """Median and p90 of the delays, an undetected run counting as beyond ``cap``."""
    filled = np.array([math.inf if d is None else d for d in delays] or [math.inf])
    q = {name: (None if not math.isfinite(v) else float(v))
         for name, v in (("median", np.quantile(filled, 0.5, method="higher")),
                         ("p90", np.quantile(filled, 0.9, method="higher")))}
    return {"delay_median": q["median"], "delay_p90": q["p90"],
            "detected_within_target": float(np.mean(filled <= TARGET_DETECT_AUDITS)),
            "detected_within_cap": float(np.mean(np.isfinite(filled))), "cap": cap}


def rise_section(runs: int, seed: int) -> dict[str, Any]:
    cells, late, mismatches = [], [], 0
    for i, rate in enumerate(RATES):
        for j, cert_rows in enumerate(CERT_ROWS):
            rng = np.random.default_rng([seed, 1, i, j])
            out = [_rise_run(rng, rate, cert_rows, 0) for _ in range(runs)]
            mismatches += sum(o[2] for o in out)
            cells.append({"rate": rate, "risen_rate": 2 * rate, "cert_rows": cert_rows, "runs": runs,
                          "reference_median": float(np.median([o[3] for o in out])),
                          **_delays([o[0] for o in out], RISE_CAP)})
    for j, cert_rows in enumerate(LATE_CERT_ROWS):
        for m, onset in enumerate(LATE_ONSETS):
            rng = np.random.default_rng([seed, 2, j, m])
            out = [_rise_run(rng, LATE_RATE, cert_rows, onset) for _ in range(runs)]
            mismatches += sum(o[2] for o in out)
            early = sum(o[1] for o in out)
            kept = [o[0] for o in out if not o[1]]
            late.append({"rate": LATE_RATE, "cert_rows": cert_rows, "onset_audits": onset, "runs": runs,
                         "alarmed_before_onset": early, **_delays(kept, RISE_CAP)})
    within = [c for c in cells if c["delay_median"] is not None and c["delay_median"] <= TARGET_DETECT_AUDITS]
    within90 = [c for c in cells if c["delay_p90"] is not None and c["delay_p90"] <= TARGET_DETECT_AUDITS]
    return {"cells": cells, "late": late, "batch_audits": BATCH_AUDITS, "verdict_mismatches": mismatches,
            "target_audits": TARGET_DETECT_AUDITS, "cells_median_within_target": len(within),
            "cells_p90_within_target": len(within90),
            "cells_missing_target_median": [(c["rate"], c["cert_rows"]) for c in cells if c not in within]}


def _fmt_delay(v: float | None, cap: int) -> str:
    return f"> {cap:,}" if v is None else f"{v:,.0f}"


def print_rise(r: dict[str, Any]) -> None:
    print(f"\n== rise: a 2x rise from the first row; alarm checked every {r['batch_audits']} audited rows "
          f"(target: alarm within {r['target_audits']:,} audited rows) ==\n")
    print("| served rate -> 2x | cert rows | reference (median) | runs | audited rows to alarm: median | p90 "
          "| alarmed within 2,000 | within 20,000 |")
    print("|---|---|---|---|---|---|---|---|")
    for c in r["cells"]:
        print(f"| {c['rate']:.1%} -> {c['risen_rate']:.1%} | {c['cert_rows']:,} | {c['reference_median']:.2%} | "
              f"{c['runs']} | {_fmt_delay(c['delay_median'], c['cap'])} | {_fmt_delay(c['delay_p90'], c['cap'])} | "
              f"{c['detected_within_target']:.0%} | {c['detected_within_cap']:.0%} |")
    missed = ", ".join(f"{rate:.1%} at {rows:,}" for rate, rows in r["cells_missing_target_median"])
    print(f"target (alarm within {r['target_audits']:,} audited rows): median met in "
          f"{r['cells_median_within_target']} of {len(r['cells'])} cells, p90 in {r['cells_p90_within_target']}; "
          f"median missed at {missed or 'none'} (served rate at certification rows)")
    print("\nThe same 2x rise after a quiet stretch (the counts are cumulative since deployment):\n")
    print("| served rate -> 2x | cert rows | quiet audited rows before | alarmed before the rise | audited rows "
          "after the rise to alarm: median | p90 | within 2,000 | within 20,000 |")
    print("|---|---|---|---|---|---|---|---|")
    for c in r["late"]:
        print(f"| {c['rate']:.1%} -> {2 * c['rate']:.1%} | {c['cert_rows']:,} | {c['onset_audits']:,} | "
              f"{c['alarmed_before_onset']}/{c['runs']} | {_fmt_delay(c['delay_median'], c['cap'])} | "
              f"{_fmt_delay(c['delay_p90'], c['cap'])} | {c['detected_within_target']:.0%} | "
              f"{c['detected_within_cap']:.0%} |")
    print(f"verdict cross-check mismatches: {r['verdict_mismatches']}")


# ====================================================================== null
def _null_run(rng: np.random.Generator, rate: float, cert_rows: int, every: int) -> dict[str, Any]:
    minutes = DAYS * MINUTES_PER_DAY
    per_minute = round(ROWS_PER_S * 60)
    ledger = _ledger(cert_rows, int(rng.binomial(cert_rows, rate)))
    cheap_m = rng.binomial(per_minute, SHARE, minutes)
    audited_m = rng.binomial(cheap_m, AUDIT_RATE)
    disagreed_m = rng.binomial(audited_m, rate / SHARE)
    at = np.arange(every - 1, minutes, every)
    served = (np.arange(1, minutes + 1) * per_minute)[at]
    cheap, n, s = cheap_m.cumsum()[at], audited_m.cumsum()[at], disagreed_m.cumsum()[at]
    k = first_alarm(ledger, n, s, served, cheap)
    bad = cross_check(ledger, n, s, served, cheap, k)
    out: dict[str, Any] = {"alarm": k is not None, "mismatches": bad, "audits": int(n[-1])}
    for day in (1, DAYS):
        i = np.searchsorted(at, day * MINUTES_PER_DAY - 1)
        v = ledger.verdict(0, AuditCounts(int(served[i]), int(cheap[i]), int(n[i]), int(s[i])))
        out[f"upper_day{day}"] = v["disagreement_upper"]
        out[f"lower_day{day}"] = v["disagreement_lower"]
    return out


def null_section(runs: int, seed: int, every: int) -> dict[str, Any]:
    cells, mismatches = [], 0
    for i, rate in enumerate(RATES):
        for j, cert_rows in enumerate(CERT_ROWS):
            rng = np.random.default_rng([seed, 3, i, j])
            out = [_null_run(rng, rate, cert_rows, every) for _ in range(runs)]
            mismatches += sum(o["mismatches"] for o in out)
            cells.append({
                "rate": rate, "cert_rows": cert_rows, "runs": runs, "checks_per_run": DAYS * MINUTES_PER_DAY // every,
                "audits_per_day": float(np.mean([o["audits"] for o in out]) / DAYS),
                "alarm_share": float(np.mean([o["alarm"] for o in out])),
                "upper_day1_median": float(np.median([o["upper_day1"] for o in out])),
                "upper_day30_median": float(np.median([o[f"upper_day{DAYS}"] for o in out])),
                "upper_below_truth_day30": float(np.mean([o[f"upper_day{DAYS}"] < rate for o in out])),
                "lower_above_truth_day30": float(np.mean([o[f"lower_day{DAYS}"] > rate for o in out]))})
    worst = max(c["alarm_share"] for c in cells)
    return {"cells": cells, "every_minutes": every, "days": DAYS, "rows_per_s": ROWS_PER_S, "cheap_share": SHARE,
            "audit_rate": AUDIT_RATE, "worst_alarm_share": worst, "target_alarm_share": TARGET_NULL_ALARM_SHARE,
            "verdict_mismatches": mismatches}


def print_null(r: dict[str, Any]) -> None:
    every = "every minute" if r["every_minutes"] == 1 else f"every {r['every_minutes']} minutes"
    print(f"\n== null: {r['days']} days at {r['rows_per_s']:g} rows/s, cheap share {r['cheap_share']}, audit "
          f"{r['audit_rate']:.0%}, checked {every} (target: runs with any alarm <= "
          f"{r['target_alarm_share']:.0%}) ==\n")
    print("| served rate | cert rows | runs | audits/day | runs with any alarm | disagreement upper bound, "
          "median: day 1 | day 30 | upper below the truth, day 30 | lower above it |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in r["cells"]:
        print(f"| {c['rate']:.1%} | {c['cert_rows']:,} | {c['runs']} | {c['audits_per_day']:,.0f} | "
              f"{c['alarm_share']:.1%} | {c['upper_day1_median']:.3%} | {c['upper_day30_median']:.3%} | "
              f"{c['upper_below_truth_day30']:.1%} | {c['lower_above_truth_day30']:.1%} |")
    print(f"worst share of runs with an alarm: {r['worst_alarm_share']:.1%} (target <= "
          f"{r['target_alarm_share']:.0%}); verdict cross-check mismatches: {r['verdict_mismatches']}")


# ====================================================================== main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.guarantee_live", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write all figures as JSON here")
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs and seeds, the null section checked every 10th minute")
    parser.add_argument("--seed", type=int, default=0, help="seed of every section (another: a replication)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    started = time.perf_counter()
    result: dict[str, Any] = {"quick": args.quick, "seed": args.seed}
    if "rise" in sections:
        result["rise"] = rise_section(50 if args.quick else 200, args.seed)
        result["rise"]["seconds"] = time.perf_counter() - started
        print_rise(result["rise"])
        print(f"[rise done {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    if "null" in sections:
        t = time.perf_counter()
        result["null"] = null_section(40 if args.quick else 200, args.seed, 10 if args.quick else 1)
        result["null"]["seconds"] = time.perf_counter() - t
        print_null(result["null"])
        print(f"[null done {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    if "shift" in sections:
        t = time.perf_counter()
        result["shift"] = shift_section(8 if args.quick else 40, args.seed)
        result["shift"]["seconds"] = time.perf_counter() - t
        print_shift(result["shift"])
    result["seconds"] = time.perf_counter() - started
    print(f"\n{result['seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, allow_nan=False,
                                        default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))
    return result


if __name__ == "__main__":
    main()
