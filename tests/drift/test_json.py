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
    # reference std is 0: an infinite effect is None in a number column, named in `infinite`
    assert row["effect"] is None and row["infinite"] == ["effect"]
    json.dumps(rows, allow_nan=False)


def test_a_cause_holding_every_outlier_is_quoted_by_its_lower_bound() -> None:
    """Every outlier shares one value (none outside it): the point risk ratio is infinite. JSON
    keeps number columns numbers (None, named in `infinite`), never the string "inf", and the
    summary quotes the finite lower bound the ranking uses: "ratio >= <ci_low>x"."""
    import pandas as pd

    from drift._text import num

    frame = pd.DataFrame({"client": ["c7"] * 40 + [f"c{i % 6}" for i in range(960)],
                          "slow": [True] * 30 + [False] * 970})
    result = explain(frame, ["client"], outlier="slow")
    top = result[0]
    assert top["client"] == "c7" and math.isinf(top["ratio"]) and math.isfinite(top["ci_low"])
    row = result.to_dict()["rows"][0]
    numbers = [c for c in result.numeric_columns if c in row]
    assert all(row[c] is None or type(row[c]) in (int, float) for c in numbers)
    assert row["ratio"] is None and {"ratio", "risk_ratio", "ci_high"} <= set(row["infinite"])
    assert row["ci_low"] == float(f"{top['ci_low']:.6g}") and row["ci_low"] > 3
    assert f"ratio >= {num(top['ci_low'])}x" in result.summary()
    assert "inf" not in json.dumps(result.to_dict()["rows"], allow_nan=False).replace(
        '"infinite"', "")

    from serving.runtime.dashboard.page import explanation_sentences

    sentence = explanation_sentences(result.to_dict(), "slow")[0]
    assert "at least" in sentence and "None" not in sentence
