"""The live audit's automatic response (``deploy(on_alarm="step")``): a gear whose audit alarms
is held, and the app serves a more conservative gear, or the full pipeline when gear 0 is held.

The monitor's ledger decides (:class:`drift.GuaranteeLedger` with ``hold=True``: it holds a gear
when its alarm rings and releases it once the rows audited since pass an anytime-valid release
test), and answers every count the ingress sends with the gears held now; the ingress serves
below the lowest held gear from then on (:class:`serving.runtime.gears.GearSwitch`). One ledger
for every ingress replica, kept on disk with the monitor's state: replicas agree within one
flush of the audit's counts, and a restarted replica learns the hold from its first flush.

While gear 0 is held, a request runs gear 0's cascade as before and then the full pipeline on
every row the cascade answered below its full level; the answer is the full pipeline's for
every row (``full_pipeline: true``, each row's level the full one). Those rows are gear 0's
audits at rate 1, paid for by serving them: comparing the class gear 0 would have served with
the full pipeline's is what lets the ledger release the hold without anyone serving gear 0's
answers meanwhile. A held cheaper gear (1 and up) is not served, so nothing audits it: it
stays held until the app is re-certified (a new certificate starts the ledger over).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pandas as pd

from serving.runtime.calls import (
    Deadline,
    DeadlineExceeded,
    StageOverloaded,
    call_stage,
    call_stage_compatible,
)

#: ``deploy(on_alarm=...)``: "alert" keeps serving and raises the alarm (metric, route, dashboard,
#: alert rule); "step" also holds the alarmed gear (module docstring)
ON_ALARM = ("alert", "step")


def check_on_alarm(on_alarm: Any, audit_rate: float) -> str:
    """``deploy(on_alarm=...)`` checked against the audit it needs (ValueError naming the argument)."""
    if on_alarm not in ON_ALARM:
        raise ValueError(f"on_alarm must be one of {ON_ALARM}, got {on_alarm!r}")
    if on_alarm == "step" and not audit_rate:
        raise ValueError("on_alarm='step' acts on the live audit's alarm: it needs audit_rate > 0 and the monitor "
                         "(deploy with monitor=... and a cascade)")
    return on_alarm


def held_gear(gear: int, held: frozenset[int]) -> tuple[int, bool]:
    """The gear to serve instead of ``gear`` while ``held`` gears are held, and whether the
    full pipeline answers (gear 0 held): never a held gear, never one cheaper than a held gear."""
    if not held or gear < min(held):
        return gear, False
    lowest = min(held)
    return (0, True) if lowest == 0 else (lowest - 1, False)


def _with_thread_cpu(fn: Any, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the CPU seconds the thread that ran it spent on it."""
    start = time.thread_time()
    out = fn(*args)
    return out, time.thread_time() - start


def _heard_cpu(done: asyncio.Future, on_cpu: Any) -> None:
    """Hand a finished thread's CPU seconds to ``on_cpu`` (its failure is the caller's, if one waits)."""
    if done.cancelled() or done.exception() is not None:
        return
    if on_cpu is not None:
        on_cpu(done.result()[1])


def full_model_stage(ingress: Any) -> str | None:
    """The stage whose replicas hold the full model (the live audit's and a held gear 0's calls
    go there); None where the ingress runs every level itself."""
    if ingress.second is not None:
        return ingress.stage_names[1]
    return None if ingress.local else ingress.stage_names[0]


async def full_proba(ingress: Any, rows: pd.DataFrame, deadline: Deadline | None,
                     on_cpu: Any = None, request_path: bool = False, on_busy: Any = None) -> np.ndarray:
    """The full pipeline's probabilities for ``rows``, from the stage that holds the full model
    (a thread of the ingress when every level runs there: then ``on_cpu(seconds)`` hears what
    that thread spent on it). The stage's busy seconds on it are load the gears' step back counts
    (serving.runtime.stage_load): ``request_path``, a request waits on the call (a held gear 0),
    else the live audit's, which ``on_busy(seconds)`` also hears (None where the stage did not
    time the call; not called where the ingress keeps no StageLoad, whose apps do not pace the
    audit: serving.runtime.audit_pace)."""
    stage = full_model_stage(ingress)
    if stage is None:  # within the deadline (a thread cannot be stopped: it runs on, its CPU still heard)
        timeout_s = None if deadline is None else max(deadline.remaining(), 0.0)
        work = asyncio.ensure_future(asyncio.to_thread(_with_thread_cpu, ingress.first.runner.full_proba, rows))
        work.add_done_callback(lambda done: _heard_cpu(done, on_cpu))
        try:
            proba, _ = await asyncio.wait_for(asyncio.shield(work), timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(ingress.stage_names[-1], deadline.budget_s) from None
        return proba
    target = ingress.second if ingress.second is not None else ingress.first
    load = getattr(ingress, "stage_load", None)
    if load is None:
        return np.asarray(await call_stage(target, "full_proba", (rows,), deadline, stage))
    # timed: the stage's busy seconds come back with the answer, for the gears' step back; the
    # audit's call in pieces that take turns with the cascade's batches, a request's whole (a
    # replica of earlier code takes the rows alone and answers the array)
    args = (rows, True) if request_path else (rows, True, True)
    answer = await call_stage_compatible(target, "full_proba", args, ((rows,),), deadline, stage)
    busy = answer.get("busy_s") if isinstance(answer, dict) else None
    if isinstance(answer, dict):
        (load.extra if request_path else load.audited)(stage, busy)
        answer = answer["proba"]
    if on_busy is not None:
        on_busy(busy)
    return np.asarray(answer)


async def answer_in_full(ingress: Any, frame: pd.DataFrame, proba: np.ndarray, level: np.ndarray,
                         replica: np.ndarray, degraded: np.ndarray, final: int,
                         deadline: Deadline) -> tuple[int, int]:
    """Replace, in place, the answers of the rows the cascade answered below ``final`` with the
    full pipeline's. Returns gear 0's shadow audit: rows its cheap levels decided (degraded
    rows are not its decisions) and how many of those the full pipeline answers differently.
    Past the deadline with ``degrade``, the cascade's answers stay, marked degraded, and
    nothing is counted."""
    below = np.flatnonzero(level != final)
    if below.size == 0:
        return 0, 0
    decided = below[~degraded[below]]
    served = proba[decided].argmax(axis=1)
    try:
        full = await full_proba(ingress, frame.iloc[below].reset_index(drop=True), deadline, request_path=True)
    except (DeadlineExceeded, StageOverloaded):
        if not ingress.degrade:
            raise
        ingress.metrics.count("willump_degraded_rows", int(below.size))
        degraded[below] = True
        return 0, 0
    disagreed = int(np.count_nonzero(full[~degraded[below]].argmax(axis=1) != served))
    proba[below] = full
    level[below] = final
    degraded[below] = False
    replica[below] = "full"
    return int(decided.size), disagreed
