"""The live guarantee on served traffic: how soon the audit's alarm sees a rise, how quiet it stays
when nothing changes, what it says on a real cascade under a covariate shift, and how close the
label-free accuracy estimate comes to the labelled one.

    python -m benchmarks.guarantee_live [--json PATH] [--quick] [--seed N]
                                        [--sections rise,null,shift,cbpe,hold]

The served cascade's cheap level answers a share of the rows (0.8 in the simulations); 1% of
those are audited (also run through the full pipeline), and an audited row *disagrees* when the
two predicted classes differ. ``drift._guarantee.GuaranteeLedger`` keeps the counts, in total and
per *epoch* of about 2,000 audited rows, and raises its alarm when, for some run of epochs ending
now (from the newest start back to the whole history; the run from epoch j spends ``alpha x 6 /
(pi^2 (j + 1)^2)``), the served disagreement rate is, with confidence 95% over unlimited time,
above the upper bound of the rate certification saw (``cert_disagreed`` of ``cert_rows``). Rates
below are served rates (cheap share x the cheap rows' disagreement rate), the unit of
``cert_disagreed / cert_rows``.

Sections:

- **rise**: a planted 2x rise of the disagreement rate from the first served row, at served rates
  0.5%-10% and 2,000 / 4,000 / 20,000 certification rows; one ``add`` and one alarm check per 20
  audited rows: audited rows to the first alarm (median, p90) and the share of runs alarmed
  within 2,000 audited rows (target from the issue: within 2,000). Also the same rise after a
  quiet stretch, beside the ledger's former alarm (one test of the cumulative counts since
  deployment, which older rows dilute): ``first_alarm_cumulative``.
- **null**: 30 days of stationary traffic at 10 rows/s (~6,900 audits a day), one ``add`` a minute,
  checked every minute (every 10th minute with ``--quick``): the share of runs with any alarm
  (target at most ``1 - confidence`` = 5%), and how tight the upper bound on the served
  disagreement rate (the label-free loss bound, over the cumulative counts) is after a day and
  after 30 days, and whether it covers the truth.
- **shift**: UCI Adult through ``pipelines.adult``, optimized with willump (6,000 certification
  rows passed as ``cert=``); the held-out test rows are replayed as a stream whose share of one
  segment (an attribute value where the cheap level disagrees more and the cascade loses more
  than ``max_loss``) grows until the true accuracy loss (served vs full, with labels) passes
  ``max_loss``: audited rows to the alarm (target from the issue: before 5,000) beside the
  audited rows at which the true loss crossed ``max_loss``; also the segment where the cascade
  loses most, and a stationary replay. A real ledger, its verdict read after every batch.
- **cbpe**: ``drift.LabelJoin``'s label-free accuracy estimate (the served confidence through the
  certification rows' calibration map, averaged; the raw mean confidence beside it)
  against the labelled accuracy of the served answers on held-out rows, for Adult's cascade and
  the Davidson tweets' (``pipelines.toxic``), and on a planted segment alone (its share grown to
  100%) (target from the issue: within 2 points on held-out rows).
- **hold**: ``deploy(on_alarm="step")``'s ledger (``GuaranteeLedger(hold=True)``): audited rows
  until a 2x rise holds gear 0, served rows in full until the hold is released once the rise is
  gone, the share of runs released while it persists, and the share held again over quiet days
  after a release (``benchmarks._guarantee_live_hold``).

The rise and null sections evaluate the alarm with ``first_alarm``: the ledger's test of every run
of epochs, vectorised over the checks and screened (only candidates reach
``drift._confseq.rejects_at_most``, the ledger's own test, with its budgets and priors). Every run
of the rise section, and every alarmed run and the first 10 of each cell (4 with ``--quick``) of
the null section, is replayed batch by batch into a ``GuaranteeLedger``: ``verdict(0)["alarm"]``
after the first alarm's batch and after the check before it (after the last batch for a run
without one), and the replayed epochs against ``epoch_starts``; the mismatches are printed (0
expected). The former cumulative alarm is checked against ``verdict(0, counts)`` likewise.
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

from benchmarks._guarantee_live_cbpe import cbpe_section, print_cbpe
from benchmarks._guarantee_live_hold import hold_section, print_hold
from benchmarks._guarantee_live_shift import print_shift, shift_section
from drift._confseq import rejects_at_most, tuned_prior
from drift._guarantee import DEFAULT_EPOCH_ROWS, AuditCounts, GearTerms, GuaranteeLedger, _clip

SECTIONS = ("rise", "null", "shift", "cbpe", "hold")
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
#: (the last two in mid-epoch; seeds follow the position here, so the first three replay the former runs)
LATE_ONSETS = (2_000, 10_000, 50_000, 11_000, 51_000)
#: the null section's traffic
ROWS_PER_S = 10.0
DAYS = 30
MINUTES_PER_DAY = 1_440


# ====================================================================== the alarm, fast
def _alpha(ledger: GuaranteeLedger) -> tuple[float | None, float]:
    """Gear 0's alarm reference and the live sequence's share of its error budget."""
    reference, source = ledger.reference_rate(0)
    return reference, (ledger.alpha_gear / 2.0 if source == "certification" else ledger.alpha_gear)


def epoch_starts(n: np.ndarray, epoch_rows: int) -> np.ndarray:
    """The batches (indices) that open an epoch, as ``GuaranteeLedger.add`` forms them from one
    ``add`` per batch: the first batch, then the first batch after the open epoch reached
    ``epoch_rows`` audited rows (``n``: cumulative audited rows after each batch)."""
    starts, base = [0], 0
    while True:
        full = int(np.searchsorted(n, base + epoch_rows, side="left"))  # the batch that fills the open epoch
        if full + 1 >= len(n):
            return np.asarray(starts)
        starts.append(full + 1)
        base = int(n[full])


def first_alarm(ledger: GuaranteeLedger, n: np.ndarray, s: np.ndarray, served: np.ndarray, cheap: np.ndarray,
                checks: np.ndarray | None = None) -> int | None:
    """The first batch, among ``checks`` (batch indices; default every batch), after which gear
    0's alarm (``GuaranteeLedger._alarm``) is up, given the cumulative audited rows ``n``,
    disagreements ``s``, served and cheap rows after each batch, one ``add`` per batch.

    The ledger's test, vectorised: for the run of epochs from each epoch start j, the counts
    since it at every later check; a check is a candidate when the run's estimate is above
    ``rate = reference / share`` (``rate < 1``) and ``n x KL(estimate, rate)`` reaches
    ``log(1 / budget_j)`` (the one-sided mixture never exceeds the maximum likelihood ratio, so
    this screen drops no alarm); ``rejects_at_most`` decides the candidates, with the ledger's
    budget and prior."""
    reference, alpha = _alpha(ledger)
    if reference is None:
        return None
    checks = np.arange(len(n)) if checks is None else np.asarray(checks)
    # cumulative counts before each batch (index b: before batch b) and after each check, as
    # floats (exact below 2**53) so that the screen below is a handful of passes over slices
    before = [np.concatenate(([0.0], np.asarray(a, dtype=float))) for a in (n, s, served, cheap)]
    after = [b[checks + 1] for b in before]
    best = len(checks)  # position in checks of the earliest alarm found so far
    for j, b in enumerate(epoch_starts(np.asarray(n), ledger.epoch_rows)):
        lo = int(np.searchsorted(checks, b))
        if lo >= best:
            break  # later starts open later still
        nn, ss, vv, cc = (a[lo:best] - c[b] for a, c in zip(after, before, strict=True))
        budget = alpha * 6.0 / (math.pi ** 2 * (j + 1) ** 2)  # the ledger's expression, to the last bit
        # rate = reference x served / cheap under the estimate and below 1 (slack: floats decide below)
        rv = reference * vv
        cand = np.flatnonzero(ss * cc * (1 + 1e-9) > rv * nn)
        cand = cand[rv[cand] < cc[cand] * (1 + 1e-9)]
        if not cand.size:
            continue
        p = np.minimum(reference * vv[cand] / cc[cand], 1.0 - 1e-12)
        q, m = ss[cand] / nn[cand], nn[cand]
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = q * np.log(q / p) + np.where(q < 1.0, (1.0 - q) * np.log((1.0 - q) / (1.0 - p)), 0.0)
        cand = cand[~(m * kl < math.log(1.0 / budget) - 1e-6)]
        for i in cand:
            share = int(cc[i]) / int(vv[i])  # the ledger's share and rate, from the same integers
            rate = reference / share
            prior = tuned_prior(_clip(ledger.rise * rate), ledger.horizon)
            if rate < 1.0 and rejects_at_most(int(nn[i]), int(ss[i]), rate, budget, prior):
                best = lo + int(i)
                break
    return None if best == len(checks) else int(checks[best])


def first_alarm_cumulative(ledger: GuaranteeLedger, n: np.ndarray, s: np.ndarray, served: np.ndarray,
                           cheap: np.ndarray, checks: np.ndarray | None = None) -> int | None:
    """The same, for the ledger's former alarm: one test of the cumulative counts since
    deployment (``share x lower > reference`` at the whole live budget; what ``verdict(gear,
    counts)`` still computes for a segment's counts)."""
    reference, alpha = _alpha(ledger)
    if reference is None:
        return None
    checks = np.arange(len(n)) if checks is None else np.asarray(checks)
    share = cheap[checks] / np.maximum(served[checks], 1)
    with np.errstate(divide="ignore"):
        rate = reference / share
    # share x lower > reference needs the estimate above reference / share, a rate below 1
    for i in np.flatnonzero((s[checks] > rate * n[checks]) & (rate < 1.0)):
        k = int(checks[i])
        centre = _clip(reference / max(float(share[i]), 1e-9))
        prior = tuned_prior(_clip(ledger.rise * centre), ledger.horizon)
        if rejects_at_most(int(n[k]), int(s[k]), float(rate[i]), alpha, prior):
            return k
    return None


def cross_check(ledger: GuaranteeLedger, n, s, served, cheap, k: int | None,
                checks: np.ndarray | None = None) -> dict[str, Any]:
    """Replays the batches into a fresh ledger of the same terms (one ``add`` per batch) and
    reads ``verdict(0)["alarm"]`` after the first alarm's batch ``k`` and after the check before
    it (after the last batch when :func:`first_alarm` found none): mismatches (0 expected), and
    the audited rows of the run of epochs that fired (``alarm_audited_rows``). Also compares the
    replayed epochs with :func:`epoch_starts`."""
    checks = np.arange(len(n)) if checks is None else np.asarray(checks)
    replay = GuaranteeLedger(ledger.gears, confidence=ledger.confidence, rise=ledger.rise, horizon=ledger.horizon,
                             epoch_rows=ledger.epoch_rows)
    d = [np.diff(np.asarray(a, dtype=np.int64), prepend=0) for a in (served, cheap, n, s)]
    batches = list(zip(*(x.tolist() for x in d), strict=True))
    added = 0

    def upto(b: int) -> dict[str, Any]:
        nonlocal added
        for v, c, a, x in batches[added:b + 1]:
            replay.add(0, v, c, a, x)
        added = b + 1
        return replay.verdict(0)

    bad, rows = 0, None
    if k is None:
        bad += upto(int(checks[-1]))["alarm"]
    else:
        pos = int(np.searchsorted(checks, k))
        if pos:
            bad += upto(int(checks[pos - 1]))["alarm"]
        v = upto(k)
        bad += not v["alarm"]
        rows = v["alarm_audited_rows"]
    upto(len(batches) - 1)
    got = [e.audited for e in replay.epochs.get(0, [])]
    starts = epoch_starts(np.asarray(n), ledger.epoch_rows)
    want = np.diff(np.asarray(n)[np.append(starts[1:], len(n)) - 1], prepend=0).tolist()
    return {"mismatches": int(bad), "epoch_mismatch": got != want, "alarm_audited_rows": rows}


def cross_check_cumulative(ledger: GuaranteeLedger, n, s, served, cheap, k: int | None,
                           checks: np.ndarray | None = None) -> int:
    """Mismatches between :func:`first_alarm_cumulative` and ``verdict(0, counts)`` (the
    cumulative test) after its first alarm's batch and the check before (the last check if none)."""
    checks = np.arange(len(n)) if checks is None else np.asarray(checks)

    def alarm(b: int) -> bool:
        return bool(ledger.verdict(0, AuditCounts(int(served[b]), int(cheap[b]), int(n[b]), int(s[b])))["alarm"])

    if k is None:
        return int(alarm(int(checks[-1])))
    pos = int(np.searchsorted(checks, k))
    return int(not alarm(k)) + (int(alarm(int(checks[pos - 1]))) if pos else 0)


def _ledger(cert_rows: int, cert_disagreed: int) -> GuaranteeLedger:
    return GuaranteeLedger([GearTerms(0, None, cert_rows, cert_disagreed)])


# ====================================================================== rise
def _rise_run(rng: np.random.Generator, rate: float, cert_rows: int, onset: int) -> dict[str, Any]:
    """One run, a batch of ``BATCH_AUDITS`` audited rows per ``add``: for the ledger's alarm and
    for the former cumulative one, the audited rows from onset to the first alarm (None: none
    within ``RISE_CAP``) and whether it came before the onset; the cross-checks."""
    ledger = _ledger(cert_rows, int(rng.binomial(cert_rows, rate)))
    batches = (onset + RISE_CAP) // BATCH_AUDITS
    d_cheap = rate / SHARE
    n = np.arange(1, batches + 1) * BATCH_AUDITS
    p = np.where(n <= onset, d_cheap, min(2 * d_cheap, 1.0))
    s = rng.binomial(BATCH_AUDITS, p).cumsum()
    per_batch = round(BATCH_AUDITS / (SHARE * AUDIT_RATE))
    served = np.arange(1, batches + 1) * per_batch
    cheap = rng.binomial(per_batch, SHARE, batches).cumsum()
    out: dict[str, Any] = {"reference": float(ledger.reference_rate(0)[0])}
    for name, find in (("epoch", first_alarm), ("cumulative", first_alarm_cumulative)):
        k = find(ledger, n, s, served, cheap)
        early = k is not None and n[k] <= onset
        out[name] = None if k is None or early else int(n[k]) - onset
        out[f"{name}_early"] = bool(early)
        if name == "epoch":
            check = cross_check(ledger, n, s, served, cheap, k)
            out.update(mismatches=check["mismatches"], epoch_mismatch=check["epoch_mismatch"],
                       alarm_run=None if early else check["alarm_audited_rows"])
        else:
            out["mismatches_cumulative"] = cross_check_cumulative(ledger, n, s, served, cheap, k)
    return out


def _delays(delays: list[int | None], cap: int) -> dict[str, Any]:
    """Median and p90 of the delays, an undetected run counting as beyond ``cap``."""
    filled = np.array([math.inf if d is None else d for d in delays] or [math.inf])
    q = {name: (None if not math.isfinite(v) else float(v))
         for name, v in (("median", np.quantile(filled, 0.5, method="higher")),
                         ("p90", np.quantile(filled, 0.9, method="higher")))}
    return {"delay_median": q["median"], "delay_p90": q["p90"],
            "detected_within_target": float(np.mean(filled <= TARGET_DETECT_AUDITS)),
            "detected_within_cap": float(np.mean(np.isfinite(filled))), "cap": cap}


def _tally(out: list[dict[str, Any]], counts: dict[str, int]) -> None:
    counts["mismatches"] += sum(o["mismatches"] for o in out)
    counts["mismatches_cumulative"] += sum(o["mismatches_cumulative"] for o in out)
    counts["epoch_mismatches"] += sum(o["epoch_mismatch"] for o in out)
    counts["runs_replayed"] += len(out)


def rise_section(runs: int, seed: int) -> dict[str, Any]:
    cells, late = [], []
    counts = dict.fromkeys(("mismatches", "mismatches_cumulative", "epoch_mismatches", "runs_replayed"), 0)
    for i, rate in enumerate(RATES):
        for j, cert_rows in enumerate(CERT_ROWS):
            rng = np.random.default_rng([seed, 1, i, j])
            out = [_rise_run(rng, rate, cert_rows, 0) for _ in range(runs)]
            _tally(out, counts)
            cells.append({"rate": rate, "risen_rate": 2 * rate, "cert_rows": cert_rows, "runs": runs,
                          "reference_median": float(np.median([o["reference"] for o in out])),
                          **_delays([o["epoch"] for o in out], RISE_CAP),
                          "cumulative": _delays([o["cumulative"] for o in out], RISE_CAP)})
    for j, cert_rows in enumerate(LATE_CERT_ROWS):
        for m, onset in sorted(enumerate(LATE_ONSETS), key=lambda x: x[1]):
            rng = np.random.default_rng([seed, 2, j, m])
            out = [_rise_run(rng, LATE_RATE, cert_rows, onset) for _ in range(runs)]
            _tally(out, counts)
            runs_fired = [o["alarm_run"] for o in out if o["alarm_run"] is not None]
            late.append({"rate": LATE_RATE, "cert_rows": cert_rows, "onset_audits": onset, "runs": runs,
                         "onset_in_epoch": onset % DEFAULT_EPOCH_ROWS,
                         "alarmed_before_onset": sum(o["epoch_early"] for o in out),
                         **_delays([o["epoch"] for o in out if not o["epoch_early"]], RISE_CAP),
                         "alarm_run_median": float(np.median(runs_fired)) if runs_fired else None,
                         "cumulative": {"alarmed_before_onset": sum(o["cumulative_early"] for o in out),
                                        **_delays([o["cumulative"] for o in out if not o["cumulative_early"]],
                                                  RISE_CAP)}})
    within = [c for c in cells if c["delay_median"] is not None and c["delay_median"] <= TARGET_DETECT_AUDITS]
    within90 = [c for c in cells if c["delay_p90"] is not None and c["delay_p90"] <= TARGET_DETECT_AUDITS]
    return {"cells": cells, "late": late, "batch_audits": BATCH_AUDITS, "epoch_rows": DEFAULT_EPOCH_ROWS,
            "verdict_mismatches": counts["mismatches"], "verdict_mismatches_cumulative": counts["mismatches_cumulative"],
            "epoch_mismatches": counts["epoch_mismatches"], "runs_replayed": counts["runs_replayed"],
            "target_audits": TARGET_DETECT_AUDITS, "cells_median_within_target": len(within),
            "cells_p90_within_target": len(within90),
            "cells_missing_target_median": [(c["rate"], c["cert_rows"]) for c in cells if c not in within]}


def _fmt_delay(v: float | None, cap: int) -> str:
    return f"> {cap:,}" if v is None else f"{v:,.0f}"


def print_rise(r: dict[str, Any]) -> None:
    print(f"\n== rise: a 2x rise from the first row; alarm checked every {r['batch_audits']} audited rows "
          f"(target: alarm within {r['target_audits']:,} audited rows) ==\n")
    print("| served rate -> 2x | cert rows | reference (median) | runs | audited rows to alarm: median | p90 "
          "| alarmed within 2,000 | within 20,000 | former cumulative alarm: median | p90 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in r["cells"]:
        o = c["cumulative"]
        print(f"| {c['rate']:.1%} -> {c['risen_rate']:.1%} | {c['cert_rows']:,} | {c['reference_median']:.2%} | "
              f"{c['runs']} | {_fmt_delay(c['delay_median'], c['cap'])} | {_fmt_delay(c['delay_p90'], c['cap'])} | "
              f"{c['detected_within_target']:.0%} | {c['detected_within_cap']:.0%} | "
              f"{_fmt_delay(o['delay_median'], o['cap'])} | {_fmt_delay(o['delay_p90'], o['cap'])} |")
    missed = ", ".join(f"{rate:.1%} at {rows:,}" for rate, rows in r["cells_missing_target_median"])
    print(f"target (alarm within {r['target_audits']:,} audited rows): median met in "
          f"{r['cells_median_within_target']} of {len(r['cells'])} cells, p90 in {r['cells_p90_within_target']}; "
          f"median missed at {missed or 'none'} (served rate at certification rows)")
    print(f"\nThe same 2x rise after a quiet stretch: the ledger's alarm (every run of {r['epoch_rows']:,}-row epochs "
          "ending now) beside the former one (the cumulative counts since deployment); an onset at a multiple "
          f"of {r['epoch_rows']:,} opens an epoch, one in mid-epoch shares it with quiet rows:\n")
    print("| served rate -> 2x | cert rows | quiet audited rows before | alarmed before the rise | audited rows "
          "after the rise to alarm: median | p90 | within 2,000 | within 20,000 | run that fired (median audited rows) "
          "| former cumulative alarm: before the rise | median | p90 | within 20,000 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in r["late"]:
        o = c["cumulative"]
        fired = "-" if c["alarm_run_median"] is None else f"{c['alarm_run_median']:,.0f}"
        print(f"| {c['rate']:.1%} -> {2 * c['rate']:.1%} | {c['cert_rows']:,} | {c['onset_audits']:,} | "
              f"{c['alarmed_before_onset']}/{c['runs']} | {_fmt_delay(c['delay_median'], c['cap'])} | "
              f"{_fmt_delay(c['delay_p90'], c['cap'])} | {c['detected_within_target']:.0%} | "
              f"{c['detected_within_cap']:.0%} | {fired} | {o['alarmed_before_onset']}/{c['runs']} | "
              f"{_fmt_delay(o['delay_median'], o['cap'])} | {_fmt_delay(o['delay_p90'], o['cap'])} | "
              f"{o['detected_within_cap']:.0%} |")
    print(f"cross-checks over {r['runs_replayed']:,} runs (every run replayed into a GuaranteeLedger, one add per "
          f"batch): alarm mismatches {r['verdict_mismatches']}, epoch mismatches {r['epoch_mismatches']}; former "
          f"cumulative alarm vs verdict(0, counts): {r['verdict_mismatches_cumulative']}")


# ====================================================================== null
def _null_run(rng: np.random.Generator, rate: float, cert_rows: int, every: int, replay: bool) -> dict[str, Any]:
    """One 30-day run, one ``add`` a minute, the alarm read every ``every`` minutes; ``replay``:
    cross-check it against a replayed ledger (every alarmed run is)."""
    minutes = DAYS * MINUTES_PER_DAY
    per_minute = round(ROWS_PER_S * 60)
    ledger = _ledger(cert_rows, int(rng.binomial(cert_rows, rate)))
    cheap_m = rng.binomial(per_minute, SHARE, minutes)
    audited_m = rng.binomial(cheap_m, AUDIT_RATE)
    disagreed_m = rng.binomial(audited_m, rate / SHARE)
    at = np.arange(every - 1, minutes, every)
    served = np.arange(1, minutes + 1) * per_minute
    cheap, n, s = cheap_m.cumsum(), audited_m.cumsum(), disagreed_m.cumsum()
    k = first_alarm(ledger, n, s, served, cheap, at)
    out: dict[str, Any] = {"alarm": k is not None, "audits": int(n[-1]), "replayed": False, "mismatches": 0,
                           "epoch_mismatch": False, "alarm_day": None if k is None else (k + 1) / MINUTES_PER_DAY}
    if replay or k is not None:
        check = cross_check(ledger, n, s, served, cheap, k, at)
        out.update(replayed=True, mismatches=check["mismatches"], epoch_mismatch=check["epoch_mismatch"],
                   alarm_run=check["alarm_audited_rows"])
    for day in (1, DAYS):
        i = day * MINUTES_PER_DAY - 1
        v = ledger.verdict(0, AuditCounts(int(served[i]), int(cheap[i]), int(n[i]), int(s[i])))
        out[f"upper_day{day}"] = v["disagreement_upper"]
        out[f"lower_day{day}"] = v["disagreement_lower"]
    return out


def null_section(runs: int, seed: int, every: int, replayed: int) -> dict[str, Any]:
    """``replayed``: runs per cell cross-checked against a replayed ledger besides the alarmed ones."""
    cells = []
    counts = dict.fromkeys(("mismatches", "epoch_mismatches", "runs_replayed"), 0)
    for i, rate in enumerate(RATES):
        for j, cert_rows in enumerate(CERT_ROWS):
            rng = np.random.default_rng([seed, 3, i, j])
            out = [_null_run(rng, rate, cert_rows, every, r < replayed) for r in range(runs)]
            counts["mismatches"] += sum(o["mismatches"] for o in out)
            counts["epoch_mismatches"] += sum(o["epoch_mismatch"] for o in out)
            counts["runs_replayed"] += sum(o["replayed"] for o in out)
            cells.append({
                "rate": rate, "cert_rows": cert_rows, "runs": runs, "checks_per_run": DAYS * MINUTES_PER_DAY // every,
                "audits_per_day": float(np.mean([o["audits"] for o in out]) / DAYS),
                "alarm_share": float(np.mean([o["alarm"] for o in out])),
                "alarm_days": sorted(round(o["alarm_day"], 2) for o in out if o["alarm"]),
                "upper_day1_median": float(np.median([o["upper_day1"] for o in out])),
                "upper_day30_median": float(np.median([o[f"upper_day{DAYS}"] for o in out])),
                "upper_below_truth_day30": float(np.mean([o[f"upper_day{DAYS}"] < rate for o in out])),
                "lower_above_truth_day30": float(np.mean([o[f"lower_day{DAYS}"] > rate for o in out]))})
    worst = max(c["alarm_share"] for c in cells)
    return {"cells": cells, "every_minutes": every, "days": DAYS, "rows_per_s": ROWS_PER_S, "cheap_share": SHARE,
            "audit_rate": AUDIT_RATE, "epoch_rows": DEFAULT_EPOCH_ROWS, "worst_alarm_share": worst,
            "target_alarm_share": TARGET_NULL_ALARM_SHARE, "verdict_mismatches": counts["mismatches"],
            "epoch_mismatches": counts["epoch_mismatches"], "runs_replayed": counts["runs_replayed"],
            "replayed_per_cell": replayed}


def print_null(r: dict[str, Any]) -> None:
    every = "every minute" if r["every_minutes"] == 1 else f"every {r['every_minutes']} minutes"
    print(f"\n== null: {r['days']} days at {r['rows_per_s']:g} rows/s, cheap share {r['cheap_share']}, audit "
          f"{r['audit_rate']:.0%}, one add a minute, the ledger's alarm ({r['epoch_rows']:,}-row epochs) checked "
          f"{every} (target: runs with any alarm <= {r['target_alarm_share']:.0%}) ==\n")
    print("| served rate | cert rows | runs | audits/day | runs with any alarm | disagreement upper bound, "
          "median: day 1 | day 30 | upper below the truth, day 30 | lower above it |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in r["cells"]:
        print(f"| {c['rate']:.1%} | {c['cert_rows']:,} | {c['runs']} | {c['audits_per_day']:,.0f} | "
              f"{c['alarm_share']:.1%} | {c['upper_day1_median']:.3%} | {c['upper_day30_median']:.3%} | "
              f"{c['upper_below_truth_day30']:.1%} | {c['lower_above_truth_day30']:.1%} |")
    print(f"worst share of runs with an alarm: {r['worst_alarm_share']:.1%} (target <= "
          f"{r['target_alarm_share']:.0%}); cross-checks (every alarmed run and the first {r['replayed_per_cell']} "
          f"of each cell, {r['runs_replayed']:,} runs, replayed into a GuaranteeLedger): alarm mismatches "
          f"{r['verdict_mismatches']}, epoch mismatches {r['epoch_mismatches']}")


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
    runs = {
        "rise": (lambda: rise_section(50 if args.quick else 200, args.seed), print_rise),
        "null": (lambda: null_section(40 if args.quick else 200, args.seed, 10 if args.quick else 1,
                                      4 if args.quick else 10), print_null),
        "shift": (lambda: shift_section(8 if args.quick else 40, args.seed), print_shift),
        "cbpe": (lambda: cbpe_section(args.seed), print_cbpe),
        "hold": (lambda: hold_section(20 if args.quick else 100, args.seed), print_hold),
    }
    for name in SECTIONS:
        if name not in sections:
            continue
        t = time.perf_counter()
        compute, show = runs[name]
        result[name] = compute()
        result[name]["seconds"] = time.perf_counter() - t
        show(result[name])
        print(f"[{name} done {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    result["seconds"] = time.perf_counter() - started
    print(f"\n{result['seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, allow_nan=False,
                                        default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))
    return result


if __name__ == "__main__":
    main()
