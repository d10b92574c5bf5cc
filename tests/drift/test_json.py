"""to_dict() is JSON-ready: plain Python values only, no NaN or infinity."""

from __future__ import annotations

import json
import math

import numpy as np

from drift import Monitor, explain
from drift._synthetic import Stream, monitor_kwargs

from ._helpers import records


def _plain(value) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str
            _plain(v)
    elif isinstance(value, list):
        for v in value:
            _plain(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), type(value)
        if type(value) is float:
            assert math.isfinite(value)


def test_every_result_is_json_ready() -> None:
    stream = Stream("latency_combo", 1, rate=30.0, change_pane=30)
    mon = Monitor(**monitor_kwargs(auto_reference_panes=15, window_panes=5))
    for p in range(40):
        mon.ingest(stream.pane(p))
    results = [
        mon.explain(metric="latency_ms"),
        mon.explain(metric="latency_ms", ratio_metric="mean_shift"),
        mon.explain(classifier="error", ratio_metric="global_ratio"),
        mon.mix_shift(),
        mon.conditional_shift(),
        mon.drift(),
        mon.sequential_drift(),
        mon.change_points(),
        mon.cascade_health(),
    ]
    for r in results:
        payload = r.to_dict()
        _plain(payload)
        json.dumps(payload, allow_nan=False)
        frame = r.to_frame()
        assert list(frame.columns) == payload["columns"]
        assert len(frame) == len(payload["rows"])
    _plain(mon.stats())
    json.dumps(mon.stats(), allow_nan=False)


def test_contract_columns() -> None:
    f = records(3000, 2, planted={"region": "sa"}, factor=4.0)
    f["o"] = f.latency_ms > 60
    exp = explain(f, ["region", "version"], outlier="o")
    for col in ("region", "version", "support", "risk_ratio", "outlier_count", "total_count"):
        assert col in exp.to_frame().columns
    mon = Monitor(["region"], ["latency_ms"])
    mon.set_reference(records(1000, 3))
    mon.ingest(records(1000, 4))
    frame = mon.drift().to_frame()
    for col in ("column", "test", "statistic", "p_value", "effect", "drifted"):
        assert col in frame.columns
    assert frame["drifted"].dtype == bool


def test_inf_and_nan_become_none() -> None:
    mon = Monitor(["region"], ["const"])
    ref = records(500, 1).assign(const=1.0)
    mon.set_reference(ref)
    mon.ingest(records(500, 2).assign(const=np.where(np.arange(500) < 250, 1.0, 2.0)))
    rows = mon.drift(min_samples=10).to_dict()["rows"]
    row = next(r for r in rows if r["column"] == "const")
    assert row["effect"] == "inf"  # reference std is 0: infinite effect
    json.dumps(rows, allow_nan=False)
