"""The hold section of ``python -m benchmarks.guarantee_live`` (``deploy(on_alarm="step")``,
:mod:`serving.runtime.hold`): a real ``GuaranteeLedger(hold=True)`` fed batch by batch.

Per run, at a served disagreement rate ``rate`` that certification saw (``cert_rows`` rows):

1. **hold**: the rate doubles from the first row; 1% of the cheap rows (share 0.8) are audited,
   one ``add`` per 20 audited rows (2,500 served rows): audited rows until gear 0 is held.
2. **release** (the rise was transient: the rate is back at the certified one from the hold on):
   the full pipeline serves, so every row gear 0's cheap level would have answered is audited
   (one ``add`` per ``HELD_BATCH`` served rows, about a 2-second flush at 500 rows/s): served rows
   until the hold is released. **stays held** (the rise persists): the share of runs released
   within ``HELD_CAP`` served rows (a false release; at most the live level is expected).
3. **after the release**: stationary traffic at the certified rate, 1% audited, ``QUIET_DAYS``
   days at 10 rows/s checked once per ``QUIET_BATCH`` audited rows: the share of runs held again
   (a false alarm after the restart; at most ``1 - confidence`` expected, checks this coarse
   can only miss alarms, see the null section for minute-by-minute checks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drift._guarantee import GearTerms, GuaranteeLedger

SHARE = 0.8
AUDIT_RATE = 0.01
#: served rows per add while held (every cheap row audited)
HELD_BATCH = 1_000
#: served rows a persisting rise is watched for a false release
HELD_CAP = 500_000
#: audited rows per add before the hold, and the most watched
RISE_BATCH, RISE_CAP = 20, 40_000
#: days of quiet traffic after the release, at 10 rows/s, and audited rows per check
QUIET_DAYS, QUIET_BATCH = 30, 2_000
CELLS = ((0.02, 4_000), (0.02, 20_000), (0.05, 4_000))


def _add(ledger: GuaranteeLedger, rng: np.random.Generator, served: int, audit_rate: float, d_cheap: float) -> int:
    cheap = int(rng.binomial(served, SHARE))
    audited = cheap if audit_rate >= 1.0 else int(rng.binomial(cheap, audit_rate))
    ledger.add(0, served, cheap, audited, int(rng.binomial(audited, min(d_cheap, 1.0))))
    return audited


def _run(rng: np.random.Generator, rate: float, cert_rows: int, persist: bool) -> dict[str, Any]:
    ledger = GuaranteeLedger([GearTerms(0, None, cert_rows, int(rng.binomial(cert_rows, rate)))], hold=True)
    d_cheap = rate / SHARE
    audited = 0
    while not ledger.held and audited < RISE_CAP:
        audited += _add(ledger, rng, round(RISE_BATCH / (SHARE * AUDIT_RATE)), AUDIT_RATE, 2 * d_cheap)
    out: dict[str, Any] = {"held_after_audits": audited if ledger.held else None}
    if not ledger.held:
        return out
    served = 0
    while ledger.held and served < HELD_CAP:
        _add(ledger, rng, HELD_BATCH, 1.0, 2 * d_cheap if persist else d_cheap)
        served += HELD_BATCH
    out["released_after_served"] = None if ledger.held else served
    if persist or ledger.held:
        return out
    quiet = 0
    total = QUIET_DAYS * 86_400 * 10 * SHARE * AUDIT_RATE
    while quiet < total and not ledger.held:
        quiet += _add(ledger, rng, round(QUIET_BATCH / (SHARE * AUDIT_RATE)), AUDIT_RATE, d_cheap)
    out["held_again"] = bool(ledger.held)
    return out


def _quantiles(values: list[int | None]) -> dict[str, Any]:
    found = np.array([v for v in values if v is not None], dtype=float)
    return {"median": None if not found.size else float(np.median(found)),
            "p90": None if not found.size else float(np.quantile(found, 0.9)),
            "found": int(found.size), "runs": len(values)}


def hold_section(runs: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    cells = []
    for rate, cert_rows in CELLS:
        transient = [_run(rng, rate, cert_rows, persist=False) for _ in range(runs)]
        persistent = [_run(rng, rate, cert_rows, persist=True) for _ in range(runs)]
        held_persistent = [r for r in persistent if r["held_after_audits"] is not None]
        cells.append({
            "rate": rate, "cert_rows": cert_rows, "runs": runs,
            "held_after_audits": _quantiles([r["held_after_audits"] for r in transient + persistent]),
            "released_after_served": _quantiles([r.get("released_after_served") for r in transient
                                                 if r["held_after_audits"] is not None]),
            "false_release_share": (sum(r["released_after_served"] is not None for r in held_persistent)
                                    / max(len(held_persistent), 1)),
            "held_again_share": (sum(r.get("held_again", False) for r in transient)
                                 / max(sum("held_again" in r for r in transient), 1)),
        })
    return {"cells": cells, "held_batch": HELD_BATCH, "held_cap": HELD_CAP, "quiet_days": QUIET_DAYS,
            "quiet_batch": QUIET_BATCH}


def print_hold(r: dict[str, Any]) -> None:
    def q(d: dict[str, Any]) -> str:
        if d["median"] is None:
            return f"none of {d['runs']}"
        return f"{d['median']:,.0f} / {d['p90']:,.0f} ({d['found']} of {d['runs']})"

    print("\nhold (on_alarm='step'): a 2x rise holds gear 0; the full pipeline serves and audits every cheap row")
    print(f"| served rate | cert rows | audited rows to the hold: median / p90 | served rows held, rise gone: "
          f"median / p90 | released while the rise persists (within {r['held_cap']:,} rows) | held again in "
          f"{r['quiet_days']} quiet days |")
    print("|---|---|---|---|---|---|")
    for c in r["cells"]:
        print(f"| {c['rate']:.0%} | {c['cert_rows']:,} | {q(c['held_after_audits'])} | "
              f"{q(c['released_after_served'])} | {c['false_release_share']:.1%} | {c['held_again_share']:.1%} |")
