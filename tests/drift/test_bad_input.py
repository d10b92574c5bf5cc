"""Bad input raises a clear exception naming the argument or column, before state changes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from drift import DataWarning, Monitor, NoReferenceError, SchemaError, explain

from ._helpers import MONITOR_ARGS, T0, records


@pytest.fixture
def mon() -> Monitor:
    m = Monitor(**MONITOR_ARGS)
    m.set_reference(records(500, 0, t0=T0 - 3600))
    return m


def test_missing_column_names_it(mon: Monitor) -> None:
    with pytest.raises(SchemaError, match="latency_ms"):
        mon.ingest(records(10, 1).drop(columns=["latency_ms"]))
    assert mon.stats()["rows_ingested"] == 0


def test_non_numeric_metric_names_column_and_value(mon: Monitor) -> None:
    bad = records(10, 1).astype({"latency_ms": object})
    bad.loc[3, "latency_ms"] = "slow"
    with pytest.raises(SchemaError, match=r"latency_ms.*'slow'"):
        mon.ingest(bad)
    ok = records(10, 1).astype({"latency_ms": str})  # numeric text is accepted
    assert mon.ingest(ok).rows == 10


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda f: f.assign(timestamp=f.timestamp * 1000), "milliseconds"),
        (lambda f: f.assign(timestamp=np.where(f.index == 2, np.nan, f.timestamp)),
         "missing or non-finite"),
        (lambda f: f.assign(timestamp="yesterday-ish"), "could not parse"),
        (lambda f: f.assign(timestamp=pd.to_datetime(f.timestamp, unit="s").where(
            f.index != 1)), "missing timestamp"),
        (lambda f: f.assign(timestamp=True), "bool"),
    ],
)
def test_bad_timestamps(mon: Monitor, change, pattern: str) -> None:
    with pytest.raises(SchemaError, match=pattern):
        mon.ingest(change(records(10, 1)))


def test_timestamp_forms_accepted(mon: Monitor) -> None:
    f = records(10, 1)
    as_dt = f.assign(timestamp=pd.to_datetime(f.timestamp, unit="s"))
    as_tz = f.assign(timestamp=pd.to_datetime(f.timestamp, unit="s", utc=True).dt.tz_convert(
        "Europe/Paris"))
    as_text = f.assign(timestamp=pd.to_datetime(f.timestamp, unit="s").astype(str))
    panes = {mon.ingest(x).panes for x in (f, as_dt, as_tz, as_text)}
    assert len(panes) == 1
    no_ts = mon.ingest(f.drop(columns=["timestamp"]))  # ingest time is used
    assert no_ts.rows == 10


def test_unhashable_attribute(mon: Monitor) -> None:
    f = records(5, 1).astype({"region": object})
    f.at[2, "region"] = ["eu"]
    with pytest.raises(SchemaError, match="region.*unhashable"):
        mon.ingest(f)


@pytest.mark.parametrize("batch", [42, "rows", None, np.zeros((3, 3))])
def test_wrong_batch_type(mon: Monitor, batch) -> None:
    with pytest.raises(TypeError, match="batch"):
        mon.ingest(batch)


def test_list_with_non_dict(mon: Monitor) -> None:
    rows = records(3, 1).to_dict("records")
    rows.append(("not", "a", "dict"))
    with pytest.raises(TypeError, match="element 3"):
        mon.ingest(rows)


def test_list_of_dicts_and_dict_of_columns(mon: Monitor) -> None:
    f = records(20, 1)
    assert mon.ingest(f.to_dict("records")).rows == 20
    assert mon.ingest({c: f[c].to_numpy() for c in f.columns}).rows == 20
    assert mon.ingest([]).rows == 0


def test_duplicate_columns(mon: Monitor) -> None:
    f = records(5, 1)
    f = pd.concat([f, f[["region"]]], axis=1)
    with pytest.raises(SchemaError, match="duplicate"):
        mon.ingest(f)


def test_missing_and_non_finite_values_are_counted_not_dropped_silently(mon: Monitor) -> None:
    f = records(10, 1)
    f.loc[0, "latency_ms"] = np.nan
    f.loc[1, "latency_ms"] = np.inf
    f.loc[2, "region"] = None
    mon.ingest(f)
    stats = mon.stats()
    assert stats["missing_values"]["latency_ms"] == 1
    assert stats["non_finite_values"]["latency_ms"] == 1
    assert stats["rows_ingested"] == 10
    assert "<missing>" in [mon.label(0, c) for c in range(stats["distinct_values"]["region"])]


def test_very_late_rows_are_reported(mon: Monitor) -> None:
    mon.ingest(records(10, 1, t0=T0 + 3600))
    with pytest.warns(DataWarning, match="late"):
        receipt = mon.ingest(records(10, 2, t0=T0))
    assert receipt.late_dropped == 10 and mon.stats()["late_dropped"] == 10


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"attributes": "region", "metrics": ["x"]}, TypeError, "attributes"),
        ({"attributes": [], "metrics": ["x"]}, ValueError, "attributes"),
        ({"attributes": ["a", "a"], "metrics": ["x"]}, ValueError, "more than once"),
        ({"attributes": ["a"], "metrics": ["a"]}, ValueError, "more than one"),
        ({"attributes": ["a"], "metrics": ["x"], "pane_seconds": 0}, ValueError, "pane_seconds"),
        ({"attributes": ["a"], "metrics": ["x"], "window_panes": 0}, ValueError, "window_panes"),
        ({"attributes": ["a"], "metrics": ["x"], "durability": "never"}, ValueError,
         "durability"),
        ({"attributes": ["a"], "metrics": ["x"], "classifiers": {"c": "y > 1"}}, SchemaError,
         "classifiers"),
        ({"attributes": ["a"], "metrics": ["x"], "classifiers": {"c": 3}}, TypeError,
         "classifiers"),
        ({"attributes": ["a"], "metrics": ["x"], "features": {"f": "text"}}, ValueError,
         "features"),
        ({"attributes": ["timestamp"], "metrics": ["x"]}, ValueError, "timestamp"),
        ({"attributes": ["a"], "metrics": ["x"], "seed": -1}, ValueError, "seed"),
    ],
)
def test_constructor_validation(kwargs, error, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        Monitor(**kwargs)


def test_query_validation(mon: Monitor) -> None:
    mon.ingest(records(200, 1))
    with pytest.raises(SchemaError, match="nope"):
        mon.explain(metric="nope")
    with pytest.raises(ValueError, match="metric"):
        mon.explain()
    with pytest.raises(SchemaError, match="undefined_metric"):
        mon.explain(classifier="undefined_metric > 3")
    with pytest.raises(ValueError, match="min_support"):
        mon.explain(metric="latency_ms", min_support=0)
    with pytest.raises(ValueError, match="max_order"):
        mon.explain(metric="latency_ms", max_order=4)
    with pytest.raises(NoReferenceError, match="other"):
        mon.drift(reference="other")
    with pytest.raises(SchemaError, match="columns"):
        mon.drift(columns=["ghost"])
    with pytest.raises(ValueError, match="persistence"):
        mon.drift(persistence=(3, 2))
    with pytest.raises(ValueError, match="level_column"):
        mon.cascade_health()
    with pytest.raises(SchemaError, match="unknown series"):
        mon.change_points(series=["ghost.p99"])


def test_percentile_explain_without_reference_says_what_to_do() -> None:
    """Too few rows for the window to judge itself: the error says what to do, in query
    parameters (which also work over HTTP), with the Python calls in `hint`."""
    m = Monitor(**MONITOR_ARGS)
    m.ingest(records(100, 1))
    with pytest.raises(NoReferenceError, match="reference=-1h") as info:
        m.explain(metric="latency_ms")
    assert "set_reference" not in str(info.value) and "set_reference" in info.value.hint
    assert len(m.explain(classifier="latency_ms > 1000")) == 0  # predicates need no reference
    m.ingest(records(400, 2))  # enough rows: the window judges itself
    assert m.explain(metric="latency_ms").info["classifier"]["fitted_on"] == "window"


def test_explain_table_validation() -> None:
    f = records(50, 1).assign(o=True)
    with pytest.raises(SchemaError, match="ghost"):
        explain(f, ["ghost"], outlier="o")
    with pytest.raises(ValueError, match="count"):
        explain(f.assign(o=2.0), ["region"], outlier="o")
    with pytest.raises(ValueError, match="exceeds"):
        explain(f.assign(o=2.0, n=1.0), ["region"], outlier="o", count="n")
    with pytest.raises(ValueError, match="count column"):
        explain(f.assign(n=-1.0), ["region"], outlier="o", count="n")
    with pytest.raises(ValueError, match="outlier"):
        explain(f, ["region"])
    with pytest.raises(TypeError, match="attributes"):
        explain(f, "region", outlier="o")
    with pytest.raises(ValueError, match="not fitted"):
        from drift import Percentile

        explain(f, ["region"], classifier=Percentile("latency_ms"))
