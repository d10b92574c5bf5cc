"""Per-pane scalar series (p99 latency, error rate, expensive-level share ...) and change points.

Why scalars per pane: they are tiny, so a day of them stays in memory and on disk after the
panes themselves have rolled up, and change detection replays them deterministically (the same
answer before and after a restart).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from drift._changepoint import DEFAULT_BURN_IN, DEFAULT_DELTA, DEFAULT_THRESHOLD, PageHinkley
from drift._errors import SchemaError
from drift._results import ChangePoints

if TYPE_CHECKING:
    from drift._monitor import Monitor
    from drift._summary import Summary

__all__ = ["DEFAULT_BURN_IN", "DEFAULT_DELTA", "DEFAULT_THRESHOLD", "change_points",
           "pane_scalars", "series_frame"]

#: Quantiles recorded per metric per pane.
SERIES_QUANTILES = {"p50": 0.5, "p99": 0.99}


def cheap_code(monitor: Monitor) -> int | None:
    """Code of the cheap cascade level: configured, else the lowest level in the reference."""
    cfg = monitor.config
    if cfg.level_column is None:
        return None
    i = list(monitor.schema.cat_columns).index(cfg.level_column)
    enc = monitor._encoders[i]
    if cfg.cheap_level is not None:
        code = enc.code_of(cfg.cheap_level)
        if code is None:  # "0" configured, 0 sent (or the reverse): match by text
            text = str(cfg.cheap_level)
            code = next((c for c in range(len(enc)) if str(enc.label(c)) == text), None)
        return code
    ref = monitor._refs.get("default")
    source = ref.summary if ref is not None else None
    codes = source.cats[i].items()[0].tolist() if source is not None else list(range(len(enc)))
    if not codes:
        return None
    labels = [(enc.label(c), c) for c in codes]
    try:
        return min(labels, key=lambda lc: float(lc[0]))[1]
    except (TypeError, ValueError):
        return min(labels, key=lambda lc: str(lc[0]))[1]


def pane_scalars(monitor: Monitor, s: Summary) -> dict[str, float]:
    cfg = monitor.config
    schema = monitor.schema
    out: dict[str, float] = {"rows": float(s.n)}
    for j, m in enumerate(schema.metrics):
        sk = s.nums[j]
        for name, q in SERIES_QUANTILES.items():
            out[f"{m}.{name}"] = float(sk.quantile(q)) if sk.count else math.nan
        out[f"{m}.mean"] = float(sk.mean) if sk.count else math.nan
    for k, (name, clf) in enumerate(monitor.classifiers.items()):
        out[f"flagged.{name}"] = float(s.flagged[k] / s.n) if (s.n and clf.fitted) else math.nan
    if cfg.error_column is not None:
        out["error_rate"] = out[f"{cfg.error_column}.mean"]
    code = cheap_code(monitor)
    if cfg.level_column is not None:
        i = list(schema.cat_columns).index(cfg.level_column)
        codes, counts = s.cats[i].items()
        cheap = float(counts[codes == code].sum()) if code is not None else math.nan
        out["cheap_fraction"] = cheap / s.n if s.n else math.nan
        out["expensive_fraction"] = 1.0 - out["cheap_fraction"]
    return out


def default_series(monitor: Monitor) -> list[str]:
    """Series watched by default: p99 per metric (mean for flags/confidence), rates."""
    cfg = monitor.config
    names = []
    for m in monitor.schema.metrics:
        if m == cfg.error_column:
            names.append("error_rate")
        elif m == cfg.confidence_column:
            names.append(f"{m}.mean")
        else:
            names.append(f"{m}.p99")
    if cfg.level_column is not None:
        names.append("expensive_fraction")
    names += [f"flagged.{n}" for n in monitor.classifiers if n not in monitor.schema.metrics]
    return names


def series_frame(monitor: Monitor, names: Sequence[str] | None = None) -> pd.DataFrame:
    panes = sorted(monitor._series)
    if not panes:
        return pd.DataFrame(columns=list(names or []))
    data = pd.DataFrame([monitor._series[p] for p in panes], index=panes)
    if names is not None:
        unknown = [n for n in names if n not in data.columns]
        if unknown:
            raise SchemaError(f"unknown series {unknown}; have {sorted(data.columns)}")
        data = data[list(names)]
    full = np.arange(panes[0], panes[-1] + 1)
    data = data.reindex(full)  # panes without traffic appear as NaN rows
    data.index = pd.to_datetime(full * monitor.config.pane_seconds, unit="s", utc=True)
    data.index.name = "pane_start"
    return data


def change_points(
    monitor: Monitor,
    names: Sequence[str] | None,
    delta: float,
    threshold: float,
    burn_in: int,
) -> ChangePoints:
    detector = PageHinkley(delta=delta, threshold=threshold, burn_in=burn_in)
    wanted = default_series(monitor) if names is None else list(names)
    frame = series_frame(monitor)
    unknown = [n for n in wanted if names is not None and n not in frame.columns]
    if unknown:
        raise SchemaError(f"unknown series {unknown}; have {sorted(frame.columns)}")
    ps = monitor.config.pane_seconds
    first = sorted(monitor._series)[0] if monitor._series else 0
    rows: list[dict[str, Any]] = []
    for name in wanted:
        if name not in frame.columns:
            continue
        for ch in detector.run(frame[name].to_numpy(dtype=np.float64)):
            start_pane, det_pane = first + ch.start, first + ch.detected
            rows.append({
                "series": name,
                "direction": ch.direction,
                "start": pd.Timestamp(start_pane * ps, unit="s", tz="UTC").isoformat(),
                "detected": pd.Timestamp((det_pane + 1) * ps, unit="s", tz="UTC").isoformat(),
                "start_pane": start_pane,
                "detected_pane": det_pane,
                "before": ch.before,
                "after": ch.after,
                "magnitude": ch.after - ch.before,
            })
    rows.sort(key=lambda r: (-r["start_pane"], r["series"]))
    columns = ["series", "direction", "start", "detected", "start_pane", "detected_pane",
               "before", "after", "magnitude"]
    info = {"series": wanted, "panes": len(frame),
            "params": {"delta": delta, "threshold": threshold, "burn_in": burn_in}}
    return ChangePoints(rows, columns, info)
