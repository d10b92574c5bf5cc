"""What the dashboard shows from the monitor, gathered in one call inside the monitor replica.

Why one call: the dashboard refreshes every few seconds while someone watches it; one
round trip that runs every query on the monitor's snapshots costs the monitor a few
milliseconds to a few hundred, and nothing on the app's request path. Each part is computed
on its own, so a part that cannot be answered yet (a reference still being collected, no
traffic) carries its error and the others still show.

Distributions are drawn from the monitor's own sketches and value counts (reference against
the current window), and per-level latency per pane from its row samples, so what the page
draws is what the drift and explanation verdicts were computed on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from serving.core.jsonsafe import clean

#: explanation / drift / cascade rows kept per part
TOP_ROWS = 8
#: columns whose reference and current distributions are drawn (drifted first, then by effect)
DISTRIBUTION_COLUMNS = 6
#: bins of a numeric distribution, between the 0.5% and 99.5% quantiles of both sides
DISTRIBUTION_BINS = 40
#: categorical values drawn per column (largest shares of either side); the rest as "other"
DISTRIBUTION_VALUES = 8
#: closed panes of per-pane series returned
SERIES_PANES = 120
#: seconds of per-level latency drawn, ending with the newest pane (the app's own plots show
#: minutes too); never fewer than LEVEL_MIN_PANES panes
LEVEL_SPAN_S = 600.0
#: fewest panes of per-level latency drawn, whatever the pane length
LEVEL_MIN_PANES = 30
#: most points per level: longer spans group consecutive panes into bins of whole panes, and a
#: bin's quantiles are computed over the union of its panes' row samples
LEVEL_POINTS = 40
#: per-pane series the page plots (those the monitor has)
SERIES = ("rows", "latency_ms.p50", "latency_ms.p99", "expensive_fraction", "cheap_fraction",
          "error_rate", "confidence.mean")


def _error(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"error": str(exc) or type(exc).__name__, "kind": type(exc).__name__}
    to_http = getattr(exc, "to_http", None)
    if callable(to_http):
        try:
            http = to_http()
            out.update({k: http[k] for k in ("status", "reason", "retry_after_s") if k in http})
        except Exception:  # the error's own description failed: keep the message
            pass
    return out


def _result(result: Any, top: int) -> dict[str, Any]:
    data = result.to_dict()
    data["rows_total"] = len(data.get("rows", []))
    data["rows"] = data.get("rows", [])[:top]
    return data


#: snapshots kept per monitor process: (monitor id, options) -> (monotonic time taken, snapshot)
_SNAPSHOTS: dict[tuple[int, str], tuple[float, dict[str, Any]]] = {}
#: distinct (monitor, options) snapshots kept
_SNAPSHOTS_KEPT = 8


def monitor_snapshot(monitor: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every part of the dashboard that comes from the monitor, JSON-ready.

    options: ``slo_ms`` (also explain the requests above it), ``top`` (rows per part),
    ``distributions`` (columns drawn), ``series_panes``, ``level_span_s``, and ``max_age_s``: a
    snapshot computed for the same options less than this long ago is answered again, with its
    age in ``age_s``. Why: every ingress replica keeps the page's monitor answers fresh on its own;
    with this, the monitor computes them at most once per ``max_age_s`` for the whole app, however
    many replicas ask (each ask then costs the monitor a lookup, not a query).
    """
    options = dict(options or {})
    max_age_s = float(options.pop("max_age_s", 0.0) or 0.0)
    key = (id(monitor), repr(sorted(options.items())))
    now = time.monotonic()
    kept = _SNAPSHOTS.get(key)
    if kept is not None and now - kept[0] < max_age_s:
        return {**kept[1], "age_s": now - kept[0], "shared": True}
    snapshot = _compute_snapshot(monitor, options)
    if max_age_s > 0:
        _SNAPSHOTS[key] = (now, snapshot)
        for old in list(_SNAPSHOTS)[:-_SNAPSHOTS_KEPT]:
            _SNAPSHOTS.pop(old, None)
    return {**snapshot, "age_s": time.monotonic() - now, "shared": False}


def _compute_snapshot(monitor: Any, options: dict[str, Any]) -> dict[str, Any]:
    top = int(options.get("top", TOP_ROWS))
    started, cpu0 = time.perf_counter(), time.thread_time()
    out: dict[str, Any] = {"taken_at": time.time(), "errors": {}}

    def part(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # shown on the page next to the part it concerns
            out["errors"][name] = _error(exc)

    part("stats", lambda: _stats(monitor))
    part("window", monitor.window_info)
    part("explain_latency", lambda: _result(monitor.explain(metric="latency_ms"), top))
    slo = options.get("slo_ms")
    if slo:
        part("explain_slo", lambda: _result(monitor.explain(classifier=f"latency_ms > {float(slo):g}"), top))
    part("mix", lambda: _result(monitor.mix_shift(), top))
    part("drift", lambda: _result(monitor.drift(), 10_000))
    part("conditional", lambda: _result(monitor.conditional_shift(), top))
    part("changes", lambda: _result(monitor.change_points(), 50))
    part("cascade", lambda: _result(monitor.cascade_health(), top))
    part("series", lambda: _series(monitor, int(options.get("series_panes", SERIES_PANES))))
    part("levels", lambda: level_latency(monitor, float(options.get("level_span_s", LEVEL_SPAN_S))))
    if "drift" in out:
        part("distributions", lambda: distributions(
            monitor, out["drift"]["rows"], int(options.get("distributions", DISTRIBUTION_COLUMNS))))
    out["elapsed_ms"] = 1e3 * (time.perf_counter() - started)
    out["cpu_ms"] = 1e3 * (time.thread_time() - cpu0)
    return clean(out)


def _stats(monitor: Any) -> dict[str, Any]:
    stats = monitor.stats()
    keep = ("rows_ingested", "rows_retained", "late_dropped", "quarantined", "quarantine_held",
            "skewed_batches", "frontier", "newest_pane_start", "clock",
            "memory_bytes", "disk_bytes", "overflowed_values", "invalid_unicode_values", "truncated_values",
            "non_finite_values", "missing_values")
    out = {k: stats.get(k) for k in keep}
    out["references"] = {name: {k: ref.get(k) for k in ("source", "pending", "rows", "start", "end",
                                                          "panes_needed") if k in ref}
                         for name, ref in (stats.get("references") or {}).items()}
    out["pane_seconds"] = float(monitor.config.pane_seconds)
    out["window_panes"] = int(monitor.config.window_panes)
    return out


def _series(monitor: Any, panes: int) -> dict[str, Any]:
    import pandas as pd

    frame = monitor.series()
    if frame.empty:
        return {"t": [], "series": {}}
    frame = frame.iloc[-panes:]
    # epoch seconds whatever the index's unit (pandas may keep datetime64[us])
    t = (frame.index - pd.Timestamp(0, tz=frame.index.tz)) / pd.Timedelta(seconds=1)
    t = np.asarray(t, dtype=float) + float(monitor.config.pane_seconds)
    return {"t": t.tolist(), "series": {c: frame[c].tolist() for c in SERIES if c in frame.columns}}


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    if cum.size == 0 or cum[-1] <= 0:
        return math.nan
    return float(v[min(int(np.searchsorted(cum, q * cum[-1], side="left")), v.size - 1)])


def level_latency(monitor: Any, span_s: float = LEVEL_SPAN_S, points: int = LEVEL_POINTS) -> dict[str, Any]:
    """Per cascade level, over the last ``span_s`` seconds (from the first pane with rows when that
    is later; at least LEVEL_MIN_PANES panes) up to and including the newest pane: estimated rows and weighted p50 / p99 of latency_ms per bin of
    consecutive panes, from the panes' row samples (exact where a pane kept all its rows).

    Why a span of time, binned, and the newest pane included: this used to be the 30 closed panes
    before the newest one, one query per pane. Traffic that comes in bursts further apart than 30
    panes (a slow client, a loaded machine: the browser test's reloads took longer than that
    under a CPU hog) left it with one pane of rows or none (a burst still in the newest pane), so
    the plot was empty, or had one point per level, while every other plot drew."""
    config = monitor.config
    level_column = config.level_column
    empty: dict[str, Any] = {"t": [], "levels": {}, "bin_seconds": None}
    if level_column is None or "latency_ms" not in monitor.schema.num_columns:
        return empty
    li = list(monitor.schema.cat_columns).index(level_column)
    mi = list(monitor.schema.num_columns).index("latency_ms")
    window = monitor.window_info()  # a view: a live clock's idle time has moved the newest pane on
    if not window.get("end"):
        return empty
    import pandas as pd

    ps = float(config.pane_seconds)
    end = round(pd.Timestamp(window["end"]).timestamp() / ps)  # one past the newest pane
    # from the first pane with rows (an app that started a minute ago fills its plot), at most span_s
    start = max(end - math.ceil(span_s / ps - 1e-9), _first_pane_with_rows(monitor, ps, end - 1))
    panes = max(LEVEL_MIN_PANES, end - start)
    width = max(1, math.ceil(panes / max(1, points)))  # panes per bin
    bins = math.ceil(panes / width)
    times: list[float] = []
    per: dict[str, dict[str, list[float]]] = {}
    for k in range(bins):
        hi = end - (bins - 1 - k) * width  # bin k covers panes [hi - width, hi)
        sample = monitor.window_sample(window=((hi - width) * ps, hi * ps))
        times.append(hi * ps)
        if not sample.size:
            continue
        codes, values = sample.cat[li], sample.num[mi]
        for code in np.unique(codes):
            label = str(monitor.label(li, int(code)))
            series = per.setdefault(label, {"rows": [math.nan] * bins, "p50": [math.nan] * bins,
                                            "p99": [math.nan] * bins})
            mask = (codes == code) & np.isfinite(values)
            w = sample.weight[mask]
            series["rows"][k] = float(sample.weight[codes == code].sum())
            if mask.any():
                series["p50"][k] = _weighted_quantile(values[mask], w, 0.5)
                series["p99"][k] = _weighted_quantile(values[mask], w, 0.99)
    return {"t": times, "levels": dict(sorted(per.items())), "bin_seconds": width * ps}


def _first_pane_with_rows(monitor: Any, ps: float, newest: int) -> int:
    """The first closed pane that holds rows (the monitor's per-pane series), else `newest`."""
    import pandas as pd

    frame = monitor.series(["rows"])
    if frame.empty:
        return newest
    have = frame.index[np.asarray(frame["rows"].fillna(0.0), dtype=float) > 0]
    if not len(have):
        return newest
    return min(newest, round((have[0] - pd.Timestamp(0, tz=have.tz)) / pd.Timedelta(seconds=1) / ps))


def distributions(monitor: Any, drift_rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """Reference and current-window distributions of the most drifted columns, from the
    sketches (numeric: share of rows per bin) and value counts (categorical: share per value)."""
    try:
        ref = monitor.reference("default")
    except Exception:
        return {}
    if getattr(ref, "pending", False):
        return {}
    current = monitor.window_summary()
    if current is None:
        return {}
    schema = monitor.schema
    cats, nums = list(schema.cat_columns), list(schema.num_columns)

    def rank(row: dict[str, Any]) -> tuple:
        effect = row.get("effect")
        effect = effect if isinstance(effect, (int, float)) else 0.0
        return (not row.get("drifted"), not row.get("drifted_now"), -effect)

    out: dict[str, Any] = {}
    for row in sorted(drift_rows, key=rank)[:limit]:
        column = row["column"]
        if column in nums:
            j = nums.index(column)
            out[column] = _numeric(ref.summary.nums[j], current.nums[j])
        elif column in cats:
            i = cats.index(column)
            out[column] = _categorical(monitor, i, ref.summary.cats[i], current.cats[i])
        if column in out:
            out[column].update(drifted=bool(row.get("drifted")), effect=row.get("effect"),
                               effect_name=row.get("effect_name"))
    return out


def _numeric(ref: Any, cur: Any) -> dict[str, Any]:
    if not ref.count or not cur.count:
        return {"kind": "numeric", "edges": [], "reference": [], "current": []}
    qs = np.array([0.005, 0.995])
    lo = float(min(np.min(ref.quantile(qs)), np.min(cur.quantile(qs))))
    hi = float(max(np.max(ref.quantile(qs)), np.max(cur.quantile(qs))))
    if not hi > lo:
        hi = lo + max(abs(lo) * 0.01, 1e-9)
    edges = np.linspace(lo, hi, DISTRIBUTION_BINS + 1)

    def shares(sketch: Any) -> np.ndarray:
        cdf = np.asarray(sketch.cdf(edges), dtype=float)
        return np.clip(np.diff(cdf), 0.0, None)

    return {"kind": "numeric", "edges": edges, "reference": shares(ref), "current": shares(cur),
            "n_reference": ref.count, "n_current": cur.count,
            "median_reference": float(ref.quantile(0.5)), "median_current": float(cur.quantile(0.5))}


def _categorical(monitor: Any, i: int, ref: Any, cur: Any) -> dict[str, Any]:
    def shares(counts: Any) -> dict[str, float]:
        codes, n = counts.items()
        total = float(np.sum(n)) + float(getattr(counts, "other_mass", 0.0))
        if total <= 0:
            return {}
        out = {str(monitor.label(i, int(c))): float(v) / total for c, v in zip(codes, n, strict=True)}
        other = float(getattr(counts, "other_mass", 0.0))
        if other > 0:
            out["<other>"] = out.get("<other>", 0.0) + other / total
        return out

    r, c = shares(ref), shares(cur)
    values = sorted(set(r) | set(c), key=lambda v: -max(r.get(v, 0.0), c.get(v, 0.0)))
    shown, rest = values[:DISTRIBUTION_VALUES], values[DISTRIBUTION_VALUES:]
    ref_shares = [r.get(v, 0.0) for v in shown]
    cur_shares = [c.get(v, 0.0) for v in shown]
    if rest:
        shown = [*shown, "(others)"]
        ref_shares.append(sum(r.get(v, 0.0) for v in rest))
        cur_shares.append(sum(c.get(v, 0.0) for v in rest))
    return {"kind": "categorical", "values": shown, "reference": ref_shares, "current": cur_shares}
