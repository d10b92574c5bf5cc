"""Per-pane scalar series (rows, p99 latency, error rate, expensive-level share ...) and the
change-point detector that reads them.

Why scalars per pane: they are tiny, so a day of them stays in memory and on disk after the
panes themselves have rolled up, and change detection replays them deterministically (the same
answer before and after a restart). A pane that closed with no traffic records rows = 0, so a
stop shows in the `rows` series and is detected like any other change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from drift._changepoint import DEFAULT_BURN_IN, DEFAULT_DELTA, DEFAULT_THRESHOLD, PageHinkley
from drift._classify import Classifier
from drift._config import Config
from drift._errors import SchemaError
from drift._ingest import Schema
from drift._results import ChangePoints
from drift._summary import Summary
from drift._view import View

__all__ = ["DEFAULT_BURN_IN", "DEFAULT_DELTA", "DEFAULT_THRESHOLD", "change_points",
           "pane_scalars", "series_frame"]

#: Quantiles recorded per metric per pane.
SERIES_QUANTILES = {"p50": 0.5, "p99": 0.99}


def pane_scalars(config: Config, schema: Schema, classifiers: Mapping[str, Classifier],
                 cheap: int | None, s: Summary) -> dict[str, float]:
    out: dict[str, float] = {"rows": float(s.n)}
    for j, m in enumerate(schema.metrics):
        sk = s.nums[j]
        for name, q in SERIES_QUANTILES.items():
            out[f"{m}.{name}"] = float(sk.quantile(q)) if sk.count else math.nan
        out[f"{m}.mean"] = float(sk.mean) if sk.count else math.nan
    for k, (name, clf) in enumerate(classifiers.items()):
        out[f"flagged.{name}"] = float(s.flagged[k] / s.n) if (s.n and clf.fitted) else math.nan
    if config.error_column is not None:
        out["error_rate"] = out[f"{config.error_column}.mean"]
    if config.level_column is not None:
        i = list(schema.cat_columns).index(config.level_column)
        codes, counts = s.cats[i].items()
        cheap_rows = float(counts[codes == cheap].sum()) if cheap is not None else math.nan
        out["cheap_fraction"] = cheap_rows / s.n if s.n else math.nan
        out["expensive_fraction"] = 1.0 - out["cheap_fraction"]
    return out


def default_series(view: View) -> list[str]:
    """Series watched by default: traffic, p99 per metric (mean for flags/confidence), rates."""
    cfg = view.config
    names = ["rows"]
    for m in view.schema.metrics:
        if m == cfg.error_column:
            names.append("error_rate")
        elif m == cfg.confidence_column:
            names.append(f"{m}.mean")
        else:
            names.append(f"{m}.p99")
    if cfg.level_column is not None:
        names.append("expensive_fraction")
    names += [f"flagged.{n}" for n in view.classifiers if n not in view.schema.metrics]
    return names


def series_frame(view: View, names: Sequence[str] | None = None) -> pd.DataFrame:
    panes = sorted(view.series)
    if not panes:
        return pd.DataFrame(columns=list(names or []))
    data = pd.DataFrame([view.series[p] for p in panes], index=panes)
    if names is not None:
        unknown = [n for n in names if n not in data.columns]
        if unknown:
            raise SchemaError(f"unknown series {unknown}; have {sorted(data.columns)}")
        data = data[list(names)]
    full = np.arange(panes[0], panes[-1] + 1)
    data = data.reindex(full)  # panes never recorded (before retention, restarts) are NaN
    data.index = pd.to_datetime(full * view.config.pane_seconds, unit="s", utc=True)
    data.index.name = "pane_start"
    return data


def change_points(
    view: View,
    names: Sequence[str] | None,
    detector: PageHinkley,
) -> ChangePoints:
    wanted = default_series(view) if names is None else list(names)
    frame = series_frame(view)
    unknown = [n for n in wanted if names is not None and n not in frame.columns]
    if unknown:
        raise SchemaError(f"unknown series {unknown}; have {sorted(frame.columns)}")
    ps = view.config.pane_seconds
    first = min(view.series) if view.series else 0
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
            "params": {"delta": detector.delta, "threshold": detector.threshold,
                       "burn_in": detector.burn_in, "long_run_variance": detector.long_run}}
    return ChangePoints(rows, columns, info)
