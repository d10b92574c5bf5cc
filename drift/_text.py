"""Plain-language summaries of results (`Result.summary()`).

Why: an on-call engineer reading `/explain` at 3 a.m. should not have to know what a risk
ratio's lower confidence bound is. Each summary says what was found, how strongly (the ratio
and the bound the rules used), against what (which classifier and cut-off, which reference or
time range) and how much of the traffic it concerns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from drift._results import Result

#: Rows described in a summary.
MAX_ROWS = 3


def num(x: Any, digits: int = 3) -> str:
    """A number for prose: 3 significant digits, thousands separators, 'infinite'."""
    if x is None:
        return "n/a"
    f = float(x)
    if math.isnan(f):
        return "n/a"
    if math.isinf(f):
        return "infinitely" if f > 0 else "-infinitely"
    if abs(f) >= 1000:
        return f"{f:,.0f}"
    return f"{f:.{digits}g}"


def pval(p: Any) -> str:
    if p is None:
        return "n/a"
    p = float(p)
    return "p<1e-12" if p < 1e-12 else (f"p={p:.1e}" if p < 1e-3 else f"p={p:.3f}")


def pct(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    f = 100.0 * float(x)
    if f == 0:
        return "0%"
    return f"{f:.2g}%" if f < 10 else f"{f:.0f}%"


def _when(info: Mapping[str, Any], key: str = "window") -> str:
    w = info.get(key)
    if not isinstance(w, Mapping) or not w.get("start"):
        return ""
    start, end = pd.Timestamp(w["start"]), pd.Timestamp(w["end"])
    if start.date() == (end - pd.Timedelta(seconds=1)).date():
        return f" in {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC"
    return f" in {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC"


def _combo(row: Mapping[str, Any], attributes: list[str]) -> str:
    parts = [f"{a}={row[a]}" for a in attributes if row.get(a) is not None]
    return " and ".join(parts) if parts else "all rows"


def _level(info: Mapping[str, Any]) -> str:
    conf = (info.get("params") or {}).get("confidence")
    unit = " counting requests" if info.get("unit") == "requests" else ""
    return f"{100 * conf:.0f}% simultaneous CI{unit}" if conf else f"CI{unit}"


def _cutoff(clf: Mapping[str, Any] | None) -> str:
    """'latency_ms above 412 (p99 of the reference 'default')' and the like."""
    if not clf:
        return "outliers"
    kind = clf.get("kind")
    source = clf.get("fitted_on", "")
    source = "the window itself" if source == "window" else source
    metric = clf.get("metric", clf.get("name"))
    if kind == "percentile":
        lo, hi = clf.get("lower_threshold"), clf.get("upper_threshold")
        ql, qu = clf.get("lower"), clf.get("upper")
        if ql is None:
            return f"{metric} above {num(hi)} (p{100 * qu:g} of {source})"
        if qu is None:
            return f"{metric} below {num(lo)} (p{100 * ql:g} of {source})"
        return (f"{metric} outside [{num(lo)}, {num(hi)}] (p{100 * ql:g} / p{100 * qu:g} of "
                f"{source})")
    if kind == "mad":
        return (f"{metric} more than {num(clf.get('threshold'))} robust sds from its median "
                f"{num(clf.get('median'))} ({source})")
    if kind == "error":
        return f"{metric} errors"
    if kind == "predicate":
        return f"rows matching '{clf.get('expression')}'"
    return f"{clf.get('name', 'the classifier')} outliers"


def _times(ratio: Any, lo: Any, info: Mapping[str, Any]) -> str:
    """'3.2x (>= 2.1x, <level>)', or for an infinite point ratio its finite lower bound alone:
    'ratio >= 2.1x (<level>)' (an infinite ratio says only that nothing fell outside)."""
    if ratio is not None and math.isinf(float(ratio)):
        return f"ratio >= {num(lo)}x ({_level(info)})"
    return f"{num(ratio)}x (>= {num(lo)}x, {_level(info)})"


def _anomaly(result: Result) -> str:
    info = result.info
    attrs = list(info.get("attributes", []))
    when = _when(info)
    clf = info.get("classifier")
    metric = info.get("ratio_metric")
    total_rows = info.get("total_rows") or 0.0
    if metric == "mean_shift":
        m = info.get("metric")
        if not result.rows:
            return f"no attribute combination has a clearly higher mean {m}{when}."
        out = []
        for r in result.rows[:MAX_ROWS]:
            share = (r.get("total_count") or 0.0) / total_rows if total_rows else None
            out.append(f"{m} averages {_times(r['ratio'], r['ci_low'], info)} for "
                       f"{_combo(r, attrs)}: {num(r.get('mean_in'))} vs "
                       f"{num(r.get('mean_out'))} elsewhere; {pct(share)} of traffic{when}.")
        return " ".join(out)
    what = _cutoff(clf) if clf else "outliers"
    outliers = info.get("total_outliers") or 0.0
    if not result.rows:
        share = f"{pct(outliers / total_rows)} of {num(total_rows)} rows" if total_rows else \
            "no rows"
        return (f"no attribute combination explains the outliers ({what}; {share}){when}.")
    out = []
    for r in result.rows[:MAX_ROWS]:
        share = (r.get("total_count") or 0.0) / total_rows if total_rows else None
        ratio, lo = r.get("ratio"), r.get("ci_low")
        base = "as the rest" if metric == "risk_ratio" else "as average"
        if ratio is not None and math.isinf(ratio):
            strength = (f"hold every outlier ({what}), none is outside them: ratio >= "
                        f"{num(lo)}x ({_level(info)}; the point ratio is infinite)")
        else:
            strength = (f"are {num(ratio)}x (>= {num(lo)}x, {_level(info)}) as likely {base} "
                        f"to be {what}")
        out.append(f"rows with {_combo(r, attrs)} {strength}; {pct(r.get('support'))} of the "
                   f"outliers and {pct(share)} of traffic{when}.")
    return " ".join(out)


def _difference(result: Result) -> str:
    info = result.info
    attrs = list(info.get("attributes", []))
    when = _when(info)
    ref = info.get("reference") or {}
    against = f"the reference {ref.get('name')!r}" if ref else "the control"
    if result.kind == "diff" and "test_rows" in info:
        against = "the control table"
    grew = info.get("direction", "grew") == "grew"
    if not result.rows:
        verb = "grew" if grew else "shrank"
        return f"no attribute combination's share of traffic {verb} against {against}{when}."
    out = []
    for r in result.rows[:MAX_ROWS]:
        ratio, lo = r.get("ratio"), r.get("ci_low")
        cur, old = r.get("current_share"), r.get("reference_share")
        if info.get("ratio_metric") == "risk_ratio":
            out.append(f"{_combo(r, attrs)} is {_times(ratio, lo, info)} as likely in the window as in {against} ({pct(cur)} vs {pct(old)} of "
                       f"rows){when}.")
            continue
        verb = "grew" if grew else "shrank"
        if ratio is not None and math.isinf(ratio):
            change = (f"is new: {pct(cur)} of traffic, absent from {against} (ratio >= "
                      f"{num(lo)}x, {_level(info)})")
        else:
            change = (f"{verb} from {pct(old)} to {pct(cur)} of traffic ({num(ratio)}x, "
                      f">= {num(lo)}x, {_level(info)}) against {against}")
        out.append(f"{_combo(r, attrs)} {change}{when}.")
    return " ".join(out)


def _drift(result: Result) -> str:
    info = result.info
    when = _when(info)
    ref = (info.get("reference") or {}).get("name")
    against = f" against the reference {ref!r}" if ref else ""
    if result.kind == "conditional_shift":
        hits = [r for r in result.rows if r.get("localized")]
        if not result.rows:
            return f"no feature drifted inside a single segment{against}{when}."
        attrs = [k for k in result.columns if k not in ("column",) and k in
                 result.rows[0] and k not in _CONDITIONAL_TAIL]
        out = [] if hits else [f"no feature drifted inside a single segment{against}{when}."]
        for r in hits[:MAX_ROWS]:
            out.append(f"{r['column']} shifted inside {_combo(r, attrs)} (effect "
                       f"{num(r.get('effect'))} vs {num(r.get('effect_outside'))} outside)"
                       f"{against}{when}.")
        for r in [r for r in result.rows if r.get("drifted") and r.get("explained_by")
                  ][:MAX_ROWS]:
            cause = r["explained_by"]
            how = f"with {cause}'s rows" if "=" in cause else f"with its mix of {cause}"
            out.append(f"{r['column']} inside {_combo(r, attrs)} moved only {how}.")
        return " ".join(out)
    drifted = [r for r in result.rows if r.get("drifted")]
    n = len(result.rows)
    params = info.get("params") or {}
    k, m = (params.get("persistence") or [2, 3])[:2]
    parts = []
    if drifted:
        descr = []
        for r in drifted[:MAX_ROWS]:
            unit = ("robust std (winsorised Wasserstein)" if r.get("kind") == "numeric"
                    else "(Jensen-Shannon)")
            descr.append(f"{r['column']} (effect {num(r.get('effect'))} {unit}, "
                         f"{pval(r.get('p_adjusted'))}, in {r.get('windows_drifted')} of "
                         f"{m} windows)")
        parts.append(f"{len(drifted)} of {n} columns drifted{against}{when}: "
                     + "; ".join(descr) + ".")
    else:
        parts.append(f"none of {n} columns drifted{against}{when} (a drift must hold in {k} of "
                     f"the last {m} windows).")
    lost = info.get("undetectable_columns") or []
    if lost:
        reasons = info.get("undetectable_reasons") or {}
        parts.append("Undetectable at this gate: " + "; ".join(
            f"{c} ({reasons[c]})" if reasons.get(c) else c for c in lost) + ".")
    return " ".join(parts)


def _sequential(result: Result) -> str:
    info = result.info
    ref = (info.get("reference") or {}).get("name")
    against = f" against the reference {ref!r}" if ref else ""
    if info.get("calibrating"):
        need = (info.get("params") or {}).get("burn_in")
        return (f"sequential drift is calibrating: it needs more than {need} closed panes "
                f"(have {(info.get('panes') or {}).get('held', 0)}).")
    drifted = [r for r in result.rows if r.get("drifted")]
    if not drifted:
        return (f"no column's cumulative effect{against} crossed its threshold "
                f"({len(result.rows)} columns).")
    out = []
    for r in drifted[:MAX_ROWS]:
        start = pd.Timestamp(r["start"]) if r.get("start") else None
        when = f" starting {start:%Y-%m-%d %H:%M} UTC" if start is not None else ""
        out.append(f"{r['column']} drifted{against}{when} (alarm after {r.get('delay_panes')} "
                   f"pane(s); newest pane's effect {num(r.get('effect'))}, in-control "
                   f"{num(r.get('baseline'))}).")
    return " ".join(out)


_CONDITIONAL_TAIL = {"test", "statistic", "p_value", "p_adjusted", "effect", "effect_outside",
                     "localized", "drifted", "n_current", "n_reference", "mean_current",
                     "mean_reference", "design_effect", "explained_by"}


def _changes(result: Result) -> str:
    if not result.rows:
        return f"no change points in {len(result.info.get('series', []))} series."
    out = []
    for r in result.rows[:MAX_ROWS]:
        verb = "rose" if r.get("direction") == "up" else "fell"
        start = pd.Timestamp(r["start"])
        detected = pd.Timestamp(r["detected"])
        out.append(f"{r['series']} {verb} from {num(r.get('before'))} to "
                   f"{num(r.get('after'))} starting {start:%Y-%m-%d %H:%M} UTC (detected "
                   f"{detected:%H:%M}).")
    return " ".join(out)


def _cascade(result: Result) -> str:
    info = result.info
    overall = next((r for r in result.rows if all(
        r.get(k) is None for k in result.columns if k not in _CASCADE_TAIL)), None)
    head = ""
    if overall is not None and overall.get("cheap_fraction") is not None:
        head = (f"the cheap level answers {pct(overall['cheap_fraction'])} of rows (reference "
                f"{pct(overall.get('reference_cheap_fraction'))}){_when(info)}")
    if result.healthy:
        return (head + ": healthy." if head else "cascade healthy.")
    bad = [r for r in result.rows if r.get("degraded")]
    attrs = [k for k in result.columns if k not in _CASCADE_TAIL]
    where = "; ".join(f"{_combo(r, attrs)}: {r['message'].split(': ', 1)[-1]}"
                      for r in bad[:MAX_ROWS])
    return f"{info.get('message')} ({where})." + (f" Overall, {head}." if head else "")


_CASCADE_TAIL = {"n_current", "n_reference", "cheap_fraction", "reference_cheap_fraction",
                 "cheap_fraction_change", "p_value", "p_adjusted", "confidence_median",
                 "reference_confidence_median", "confidence_effect", "confidence_p_value",
                 "degraded", "message"}


def summarize(result: Result) -> str:
    kind = result.kind
    if kind == "anomaly":
        return _anomaly(result)
    if kind in ("mix_shift", "diff"):
        return _difference(result)
    if kind in ("drift", "conditional_shift"):
        return _drift(result)
    if kind == "sequential_drift":
        return _sequential(result)
    if kind == "change_points":
        return _changes(result)
    if kind == "cascade_health":
        return _cascade(result)
    return f"{len(result)} row(s)."
