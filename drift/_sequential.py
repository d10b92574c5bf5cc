"""Sequential column drift: a one-sided CUSUM on each column's per-pane effect, for a first
alarm sooner than `Monitor.drift`'s 2-of-3 disjoint windows.

Why a CUSUM (Page 1954) and not a confidence sequence (Howard et al. 2021): the question is
"has the effect risen from its in-control level to the gate?", a change from one known level
to another, for which Page's CUSUM of log-likelihood ratios is the fastest detector at a given
false-alarm rate (Lorden 1971; Moustakides 1986), and its threshold follows from that rate with
no tuning: with increments whose exponential has mean 1 under no change, the average run length
to a false alarm is at least e**h (Lorden's bound). A confidence sequence on the effect would
answer "is the effect now above the gate?" at any stopping time, but it needs a bounded or
sub-Gaussian per-pane effect with a known scale, and its width shrinks only as the change
accumulates panes, so at equal false-alarm rates it alarms later on a sudden change.

The statistic per pane is the same effect `drift()` judges (robust Wasserstein for numeric
columns, bias-corrected Jensen-Shannon for categorical ones), of that pane alone against the
reference. Its null distribution has no closed form (it depends on the sketch, the pane size,
clustering and pane-to-pane load), so it is calibrated on the first `burn_in` held panes, as
NannyML calibrates thresholds on reference chunks: effects are scaled by sqrt(rows) (sampling
noise shrinks like 1 / sqrt(n), so seasonal volume does not move the scale), the baseline is the
median and the scale the AR(1) long-run robust scale (drift._changepoint.long_run_scale), so
autocorrelated load widens it. Each later pane adds the Gaussian log-likelihood ratio of
"baseline + gate" against "baseline" (at most MAX_PANE_SHARE of the threshold, so an alarm
needs two panes); the CUSUM alarms when the sum passes h = log(average run length), the run
length set from `false_alarms_per_day` split evenly over the columns (a union bound). The
change began where the sum last left zero (the classic CUSUM estimate).

What it trades: it alarms on any lasting effect above the baseline + half the gate (a 10% move
to rare clients, JS 0.098, which `drift()`'s gate never flags), and the rate holds only as far
as 30 burn-in panes describe the in-control effect. Load that wanders slowly (AR(1), phi 0.8)
and itself moves the effect near the gate is under-described by them: null_ar1 raises 0.41
false alarms an hour against the 0.1 a day asked (benchmarks._drift_sequential), where
`drift()` raises none.

State: none beyond the stored panes. The run is replayed over the per-pane summaries the monitor
holds (the window plus two panes, then `detail_panes` detail panes: 72 panes at the defaults),
so a restarted monitor gives the same answer. A CUSUM forgets everything before its last zero,
so starting it at the oldest held pane changes nothing once it has been at zero since.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from drift._changepoint import long_run_scale
from drift._drift import column_test, tested_columns
from drift._results import SequentialDrift
from drift._rules import EffectGate
from drift._summary import Summary
from drift._view import View

#: False alarms per day, over all the columns tested together (split evenly between them).
#: One in ten days keeps a sooner first alarm from paging anyone for noise.
DEFAULT_FALSE_ALARMS_PER_DAY = 0.1
#: Held panes the baseline and scale are learned from (the first ones after the reference,
#: oldest first). 30 of the 72 panes held at the defaults, as Page-Hinkley's burn-in: the
#: long-run scale of autocorrelated load needs them (20 gave more false alarms on null_ar1),
#: and 42 panes are left to watch.
DEFAULT_SEQUENTIAL_BURN_IN = 30
#: Floor on the per-pane scale at the median pane size, as a fraction of the gate: a column
#: whose burn-in effects are all zero (a stable categorical column) still gets a usable scale;
#: a pane then needs an effect above about half the gate to count.
SCALE_FLOOR_FRACTION = 0.05
#: Standardized effects are clipped to at most max(this, the gate's own z): one wild pane adds
#: no more than a pane exactly at the gate would, and never more than this many sds beyond.
Z_CLIP = 4.0
#: One pane adds at most this share of the threshold, so an alarm needs two panes: with a
#: large z per gate (busy panes) the CUSUM would otherwise alarm on any one pane above the
#: baseline + half the gate, and a heavy-tailed column's effect does that by chance (latency
#: on null_iid, seed 2: one pane at 0.075 against a baseline of 0.02).
MAX_PANE_SHARE = 0.6
SECONDS_PER_DAY = 86_400.0

SEQUENTIAL_COLUMNS = [
    "column", "kind", "effect_name", "effect", "baseline", "scale", "statistic", "threshold",
    "drifted", "start", "detected", "start_pane", "detected_pane", "delay_panes", "alarms",
    "panes_monitored", "n_current", "undetectable",
]


@dataclass(frozen=True)
class CusumRun:
    """One column's CUSUM over its panes (indices into the effects given)."""

    baseline: float  # in-control effect at the median burn-in pane size
    scale: float  # its long-run robust scale there
    statistic: np.ndarray  # the CUSUM after each monitored pane
    alarms: list[tuple[int, int]]  # (start, detected) of each alarm, oldest first
    drifted: bool  # the latest alarm's sum has not returned to zero
    #: the burn-in's own effect reaches the gate: not an alarm (the burn-in slides with the
    #: held panes, so it would re-fire every pane; load that wanders, as null_ar1's, gets
    #: there), but `drift()`, which compares each window with the reference, is the verdict
    calibration_drifted: bool


def threshold_for(false_alarms_per_day: float, columns: int, pane_seconds: float) -> float:
    """h = log(average run length in panes): Lorden's bound makes the run length to a false
    alarm at least e**h for each column, so the rate over all columns is at most the target."""
    if not false_alarms_per_day > 0:
        raise ValueError(f"false_alarms_per_day must be > 0, got {false_alarms_per_day!r}")
    panes_per_day = SECONDS_PER_DAY / pane_seconds
    arl = max(columns, 1) * panes_per_day / false_alarms_per_day
    return math.log(max(arl, math.e))


def effect_cusum(effects: np.ndarray, sizes: np.ndarray, gate: float, threshold: float,
                 burn_in: int) -> CusumRun | None:
    """The CUSUM of per-pane effects (rows per pane in `sizes`); None when fewer than
    burn_in + 1 panes."""
    e = np.asarray(effects, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)
    if e.size <= burn_in:
        return None
    root = np.sqrt(n)
    u = e[:burn_in] * root[:burn_in]
    center = float(np.median(u))
    scale = 1.4826 * float(np.median(np.abs(u - center)))
    if scale == 0.0:
        scale = float(np.std(u))
    n_med = float(np.median(n[:burn_in]))
    scale = max(long_run_scale(u, center, scale) if scale > 0 else 0.0,
                SCALE_FLOOR_FRACTION * gate * math.sqrt(n_med))
    base = center / root[burn_in:]
    sd = scale / root[burn_in:]
    delta = gate / sd
    z = np.minimum((e[burn_in:] - base) / sd, np.maximum(Z_CLIP, delta))
    llr = np.minimum(delta * z - delta * delta / 2.0, MAX_PANE_SHARE * threshold)
    stat = np.empty(llr.size)
    alarms: list[tuple[int, int]] = []
    s, last_zero, alarmed = 0.0, -1, False
    for i, x in enumerate(llr.tolist()):
        s = max(0.0, s + x)
        stat[i] = s
        if s == 0.0:
            last_zero, alarmed = i, False
        elif s > threshold and not alarmed:
            alarms.append((burn_in + last_zero + 1, burn_in + i))
            alarmed = True
    baseline = center / math.sqrt(n_med)
    return CusumRun(baseline, scale / math.sqrt(n_med), stat, alarms, alarmed,
                    baseline >= gate)


class PaneEffects:
    """Per-pane effects against one reference, memoized (a closed pane never changes; a late
    row changes its row count, which is in the key). Memory only: the values are recomputed
    from the stored panes after a restart, so they are no persisted state. Queries run
    concurrently: each reads and writes the dictionary of its own reference, swapped whole."""

    def __init__(self) -> None:
        self._state: tuple[Any, dict[tuple[int, int, int, int], dict[str, Any]]] = (None, {})

    def get(self, ref_summary: Summary, token: Any, col: tuple[str, str, int], pane: int,
            summary: Summary) -> dict[str, Any]:
        held, values = self._state
        if held != token:
            values = {}
            self._state = (token, values)
        _, kind, i = col
        key = (0 if kind == "numeric" else 1, i, pane, summary.n)
        hit = values.get(key)
        if hit is None:
            r = column_test(kind, i, summary, ref_summary)
            hit = {k: r.get(k) for k in ("effect", "effect_error", "effect_name", "n_current")}
            values[key] = hit
        return hit

    def prune(self, token: Any, panes: set[int]) -> None:
        held, values = self._state
        if held == token:
            self._state = (held, {k: v for k, v in values.items() if k[2] in panes})


def held_panes(view: View, reference: Summary | None = None) -> list[tuple[int, Summary]]:
    """Closed panes with their own summary (full and detail tiers) up to the view's end, and
    none inside the reference's time span: a pane the reference holds reads closer to it than
    any later pane (and load that wandered during the reference is absorbed in it), so a
    burn-in on the reference's own panes sets the baseline and scale too low (false alarms on
    null_ar1 as soon as the load wandered after the reference)."""
    if view.range is None or view.closed_upto is None:
        return []
    end = min(view.range[1], view.closed_upto - 1)
    lo, hi = math.inf, -math.inf
    if reference is not None and reference.n and math.isfinite(reference.t_min):
        ps = view.config.pane_seconds
        lo, hi = math.floor(reference.t_min / ps), math.floor(reference.t_max / ps)
    panes = {**view.detail, **view.full}
    return [(p, panes[p]) for p in sorted(panes) if p <= end and not lo <= p <= hi]


def sequential_drift(
    view: View,
    reference: Any,
    columns: Sequence[str] | None,
    gate: EffectGate,
    false_alarms_per_day: float,
    burn_in: int,
    cache: PaneEffects | None = None,
) -> SequentialDrift:
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 3:
        raise ValueError(f"burn_in must be an integer >= 3, got {burn_in!r}")
    ref = view.reference(reference)
    cols = tested_columns(view, columns)
    ps = view.config.pane_seconds
    h = threshold_for(false_alarms_per_day, len(cols), ps)
    info: dict[str, Any] = {
        "reference": dict(ref.info),
        "params": {"false_alarms_per_day": false_alarms_per_day, "burn_in": burn_in,
                   "numeric_effect": gate.numeric_effect,
                   "categorical_effect": gate.categorical_effect,
                   "min_samples": gate.min_samples, "threshold": h,
                   "average_run_length_panes": math.exp(h)},
        "unit": "rows",
    }
    panes = [(p, s) for p, s in held_panes(view, ref.summary) if s.n >= gate.min_samples]
    cache = PaneEffects() if cache is None else cache
    token = (ref.name, id(ref.summary), ref.summary.n, ref.summary.t_min, ref.summary.t_max)
    pane_ids = [p for p, _ in panes]
    info["panes"] = {"held": len(panes), "first": pane_ids[0] if panes else None,
                     "last": pane_ids[-1] if panes else None}
    rows: list[dict[str, Any]] = []
    early: list[str] = []
    for col in cols:
        name, kind, _ = col
        vals = [cache.get(ref.summary, token, col, p, s) for p, s in panes]
        keep = [j for j, v in enumerate(vals) if v["effect"] is not None
                and math.isfinite(v["effect"])]
        ids = [pane_ids[j] for j in keep]
        last = vals[-1] if vals else {}
        threshold = gate.threshold(kind)
        err = last.get("effect_error")
        row: dict[str, Any] = {
            "column": name, "kind": kind,
            "effect_name": last.get("effect_name") or (
                "wasserstein_robust" if kind == "numeric" else "jensen_shannon"),
            "effect": last.get("effect"), "n_current": last.get("n_current"),
            "threshold": h, "drifted": False, "alarms": 0, "undetectable": bool(
                (err is not None and math.isfinite(err) and err >= threshold)
                or (vals and not keep)),
            "panes_monitored": max(len(keep) - burn_in, 0),
        }
        run = effect_cusum(np.array([vals[j]["effect"] for j in keep]),
                           np.array([panes[j][1].n for j in keep]), threshold, h, burn_in)
        if run is not None:
            row.update(baseline=run.baseline, scale=run.scale,
                       statistic=float(run.statistic[-1]), alarms=len(run.alarms),
                       drifted=run.drifted and not row["undetectable"])
            if run.calibration_drifted:
                early.append(name)
            if run.alarms:
                a, b = run.alarms[-1]
                start, det = ids[a], ids[b]
                row.update(start_pane=start, detected_pane=det, delay_panes=det - start + 1,
                           start=pd.Timestamp(start * ps, unit="s", tz="UTC").isoformat(),
                           detected=pd.Timestamp((det + 1) * ps, unit="s", tz="UTC").isoformat())
        rows.append(row)
    cache.prune(token, set(pane_ids))
    rows.sort(key=lambda r: (not r["drifted"], -(r.get("statistic") or 0.0), r["column"]))
    info["calibrating"] = not panes or len(panes) <= burn_in
    info["drifted_columns"] = [r["column"] for r in rows if r["drifted"]]
    info["undetectable_columns"] = [r["column"] for r in rows if r["undetectable"]]
    info["drifted_before_burn_in"] = early
    return SequentialDrift(rows, SEQUENTIAL_COLUMNS, info)

