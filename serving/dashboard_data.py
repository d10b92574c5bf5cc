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
#: closed panes of per-level latency returned (computed from each pane's row sample)
LEVEL_PANES = 30
#: per-pane series the page plots (those the monitor has)
SERIES = ("rows", "latency_ms.p50", "latency_ms.p99", "expensive_fraction", "cheap_fraction",
          "error_rate", "confidence.mean")


def clean(value: Any) -> Any:
    """JSON-safe plain Python (NaN -> None, inf -> "inf", numpy -> Python)."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return None
        return ("inf" if f > 0 else "-inf") if math.isinf(f) else f
    return value if value is None or isinstance(value, str) else str(value)


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


def monitor_snapshot(monitor: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every part of the dashboard that comes from the monitor, JSON-ready.

    options: ``slo_ms`` (also explain the requests above it), ``top`` (rows per part),
    ``distributions`` (columns drawn), ``series_panes``, ``level_panes``.
    """
    options = dict(options or {})
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
    part("levels", lambda: level_latency(monitor, int(options.get("level_panes", LEVEL_PANES))))
    if "drift" in out:
        part("distributions", lambda: distributions(
            monitor, out["drift"]["rows"], int(options.get("distributions", DISTRIBUTION_COLUMNS))))
    out["elapsed_ms"] = 1e3 * (time.perf_counter() - started)
    out["cpu_ms"] = 1e3 * (time.thread_time() - cpu0)
    return clean(out)


def _stats(monitor: Any) -> dict[str, Any]:
    stats = monitor.stats()
    keep = ("rows_ingested", "rows_retained", "late_dropped", "quarantined", "newest_pane_start", "clock",
            "memory_bytes", "disk_bytes", "overflowed_values", "non_finite_values", "missing_values")
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


def level_latency(monitor: Any, panes: int) -> dict[str, Any]:
    """Per closed pane and cascade level: estimated rows and weighted p50 / p99 of latency_ms,
    from each pane's row sample (exact where a pane kept all its rows)."""
    config = monitor.config
    schema = monitor.schema
    level_column = config.level_column
    if level_column is None or "latency_ms" not in schema.num_columns:
        return {"t": [], "levels": {}}
    li = list(schema.cat_columns).index(level_column)
    mi = list(schema.num_columns).index("latency_ms")
    newest = monitor.stats().get("newest_pane_start")
    if newest is None:
        return {"t": [], "levels": {}}
    ps = float(config.pane_seconds)
    import pandas as pd

    last = round(pd.Timestamp(newest).timestamp() / ps) - 1  # the newest pane is still open
    times: list[float] = []
    per: dict[str, dict[str, list[float]]] = {}
    for k, p in enumerate(range(last - panes + 1, last + 1)):
        sample = monitor.window_sample(window=(p * ps, (p + 1) * ps))
        times.append((p + 1) * ps)
        codes = sample.cat[li] if sample.size else np.zeros(0, dtype=np.int64)
        values = sample.num[mi] if sample.size else np.zeros(0)
        for code in np.unique(codes):
            label = str(monitor.label(li, int(code)))
            series = per.setdefault(label, {"rows": [math.nan] * panes, "p50": [math.nan] * panes,
                                            "p99": [math.nan] * panes})
            mask = (codes == code) & np.isfinite(values)
            w = sample.weight[mask]
            series["rows"][k] = float(w.sum())
            if mask.any():
                series["p50"][k] = _weighted_quantile(values[mask], w, 0.5)
                series["p99"][k] = _weighted_quantile(values[mask], w, 0.99)
    return {"t": times, "levels": dict(sorted(per.items()))}


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
