"""What a user expects: answers with no reference, errors an HTTP client can act on, readable
JSON, two-relation DIFF and time ranges, verdicts in Prometheus, plain-language summaries."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from drift import (
    DriftError,
    Monitor,
    MonitorCollector,
    NoReferenceError,
    SchemaError,
    diff,
    prometheus_text,
)
from drift._synthetic import Stream, monitor_kwargs

from ._helpers import T0

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "drift-alerts.yml"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _serving_minute(seed: int = 0, rows: int = 60_000) -> pd.DataFrame:
    """A minute of served records in which client c7 sends 50x larger requests (slow)."""
    rng = np.random.default_rng(seed)
    client = rng.choice([f"c{i}" for i in range(12)], rows)
    latency = rng.lognormal(2.5, 0.3, rows)
    latency[client == "c7"] *= 8.0
    return pd.DataFrame({
        "timestamp": T0 + np.sort(rng.random(rows)) * 59.0, "client": client,
        "model_version": "v1", "replica": rng.choice(["r0", "r1"], rows),
        "latency_ms": latency, "score": rng.random(rows), "level": rng.choice(["0", "1"], rows),
        "confidence": rng.beta(6, 2, rows), "error": (rng.random(rows) < 0.001).astype(float),
    })


def _serving_monitor() -> Monitor:
    # the configuration serving.deploy builds (reference: the first panes of traffic)
    return Monitor(["model_version", "replica", "client"], ["latency_ms", "score"],
                   level_column="level", cheap_level="0", confidence_column="confidence",
                   error_column="error", auto_reference_panes=10)


def test_a_new_user_gets_answers_from_the_first_minute() -> None:
    """explain with no reference judges the window itself (MacroBase's default); with a fixed
    predicate the ratio whose complement holds no outliers reads as infinite, never as a
    13-digit number, and supports are rounded."""
    mon = _serving_monitor()
    mon.ingest(_serving_minute())
    result = mon.explain(metric="latency_ms")
    assert result[0]["client"] == "c7"
    clf = result.info["classifier"]
    assert clf["fitted_on"] == "window" and clf["tail"] == "high"
    assert "p99 of the window itself" in result.summary()
    fixed = mon.explain(classifier="latency_ms > 80").to_dict()
    top = fixed["rows"][0]
    assert top["client"] == "c7" and top["ratio"] is None and top["risk_ratio"] is None
    assert {"ratio", "risk_ratio"} <= set(top["infinite"])
    assert isinstance(top["ci_low"], float) and top["ci_low"] > 3
    assert top["support"] == 1.0 or len(repr(top["support"])) <= 9
    json.dumps(fixed, allow_nan=False)
    assert "hold every outlier" in mon.explain(classifier="latency_ms > 80").summary()


def test_errors_tell_an_http_client_what_to_do() -> None:
    mon = _serving_monitor()
    mon.ingest(_serving_minute(rows=5000))
    with pytest.raises(NoReferenceError) as info:
        mon.drift()
    body = info.value.to_http()
    assert body["status"] == 409 and body["reason"] == "reference_pending"
    assert 0 < body["retry_after_s"] <= 11 * 60
    for python_only in ("set_reference", "auto_reference_panes", "Monitor("):
        assert python_only not in body["error"]
    assert "retry in about" in body["error"] and "reference=-1h" in body["error"]
    plain = Monitor(["client"], ["latency_ms"])
    plain.ingest(_serving_minute(rows=2000))
    with pytest.raises(NoReferenceError) as missing:
        plain.mix_shift()
    body = missing.value.to_http()
    assert body["reason"] == "no_reference" and "set_reference" not in body["error"]
    assert "reference=<start>/<end>" in body["error"]
    # a time range works over HTTP where a named reference does not exist yet
    plain.ingest(_serving_minute(seed=1, rows=2000).assign(timestamp=lambda f: f.timestamp + 60))
    shifted = plain.mix_shift(reference="-1m", window="1m")
    assert shifted.info["reference"]["source"] == "time range"
    assert shifted.info["reference"]["rows"] == 2000 and shifted.info["window"]["rows"] == 2000
    with pytest.raises(NoReferenceError, match="holds no data for the reference range") as gone:
        plain.mix_shift(reference="-1d")
    assert gone.value.to_http()["reason"] == "empty_range"
    empty = Monitor(["client"], ["latency_ms"])
    with pytest.raises(DriftError) as nothing:
        empty.explain(metric="latency_ms")
    assert nothing.value.to_http()["reason"] == "no_data"
    with pytest.raises(SchemaError) as bad:
        plain.explain(metric="nope")
    assert bad.value.to_http()["status"] == 422


def test_two_relation_diff_of_tables_raw_and_preaggregated() -> None:
    rng = np.random.default_rng(3)

    def table(n: int, ap_v2: float) -> pd.DataFrame:
        region = rng.choice(["eu", "us", "ap"], n)
        version = rng.choice(["v1", "v2"], n)
        combo = (region == "ap") & (version == "v2")
        keep = ~combo | (rng.random(n) < ap_v2)
        return pd.DataFrame({"region": region[keep], "version": version[keep]})

    control = table(40_000, 0.1)
    test = table(40_000, 1.0)
    result = diff(test, control, on=["region", "version"])
    top = result[0]
    assert (top["region"], top["version"]) == ("ap", "v2") and top["ratio"] > 5
    assert top["ci_low"] <= 10.0 <= top["ci_high"] * 1.2
    assert "is over-represented" not in result.summary() and "ap" in result.summary()
    # MacroBase's risk ratio: test rows as the outliers of the union
    risk = diff(test, control, on=["region", "version"], ratio_metric="risk_ratio",
                min_ratio=1.5)
    assert (risk[0]["region"], risk[0]["version"]) == ("ap", "v2")
    # pre-aggregated cube rows give the same answer as raw rows
    cube_t = test.value_counts().rename("n").reset_index()
    cube_c = control.value_counts().rename("n").reset_index()
    cubed = diff(cube_t, cube_c, on=["region", "version"], count="n")
    assert cubed[0]["ratio"] == pytest.approx(top["ratio"], rel=1e-9)
    with pytest.raises(SchemaError, match="control"):
        diff(test, control.drop(columns=["version"]), on=["region", "version"])
    with pytest.raises(TypeError, match="on"):
        diff(test, control, on="region")


def _two_days(directory: Path) -> tuple[Monitor, float]:
    """26 hours of traffic with default horizons, persisted; from 14:00 on day 2 region ap's
    share grows fivefold. Returns the monitor and day 2 14:00 (epoch s)."""
    day2 = pd.Timestamp("2023-11-15T14:00:00Z").timestamp()
    start = day2 - 24 * 3600 - 3600
    mon = Monitor(["region", "version"], ["latency_ms"], directory=directory,
                  reservoir_size=500, flagged_reservoir_size=200)
    rng = np.random.default_rng(5)
    hour = 3600
    for h in range(25):
        t0 = start + h * hour
        n = 60 * 200  # 200 rows a minute
        ts = t0 + np.sort(rng.random(n)) * hour
        p_ap = np.where(ts >= day2, 0.25, 0.05)
        region = np.where(rng.random(n) < p_ap, "ap", rng.choice(["eu", "us"], n))
        mon.ingest(pd.DataFrame({"timestamp": ts, "region": region,
                                 "version": rng.choice(["v1", "v2"], n),
                                 "latency_ms": rng.lognormal(3, 0.4, n)}))
    tail = day2 + 10 * 60
    n = 2000
    ts = day2 + np.sort(rng.random(n)) * 600
    mon.ingest(pd.DataFrame({"timestamp": ts[ts < tail],
                             "region": np.where(rng.random(n) < 0.25, "ap", "eu")[ts < tail],
                             "version": "v1", "latency_ms": rng.lognormal(3, 0.4, n)[ts < tail]}))
    mon.advance(tail + 10)
    return mon, day2


def test_time_ranges_compare_with_the_same_time_yesterday(tmp_path: Path) -> None:
    mon, day2 = _two_days(tmp_path)
    window = (pd.Timestamp(day2, unit="s", tz="UTC").isoformat(),
              pd.Timestamp(day2 + 600, unit="s", tz="UTC").isoformat())
    shift = mon.mix_shift(reference="-1d", window=window)
    top = shift[0]
    assert top["region"] == "ap" and 3 < top["ratio"] < 8
    ref = shift.info["reference"]
    assert ref["source"] == "time range" and "rollup" in ref["tiers"]
    assert ref["covered_start"] <= "2023-11-14T14:00:00+00:00"  # answered by an hour rollup
    yesterday = (pd.Timestamp(day2 - 86400, unit="s", tz="UTC").isoformat(),
                 pd.Timestamp(day2 - 86400 + 600, unit="s", tz="UTC").isoformat())
    rep = mon.drift(window=window, reference=yesterday, persistence=(1, 1))
    assert next(r for r in rep if r["column"] == "region")["drifted"]
    earlier = mon.explain(metric="latency_ms", as_of=day2 - 7200, reference=yesterday)
    assert earlier.info["window"]["end"] == "2023-11-15T12:00:00+00:00"
    same = mon.diff("-1d", window=window).to_dict()
    mon.close()
    with Monitor.open(tmp_path) as again:  # the persisted rollups answer after a restart
        assert again.diff("-1d", window=window).to_dict() == same
        with pytest.raises(ValueError, match="before it starts"):
            again.mix_shift(window=(window[1], window[0]))
        with pytest.raises(ValueError, match="window"):
            again.drift(window="ten minutes")


def test_verdicts_are_exported_for_prometheus_and_the_alert_rules_use_them() -> None:
    stream = Stream("mix_shift", 2, rate=50.0, change_pane=30)
    mon = Monitor(**monitor_kwargs(auto_reference_panes=15, window_panes=5))
    for p in range(50):
        mon.ingest(stream.pane(p))
    (attr, _value), = stream.planted["attributes"].items()
    text = prometheus_text(mon).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("drift_column_drifted", (("column", attr),))] == 1.0
    assert samples[("drift_column_drifted", (("column", "f_num"),))] == 0.0
    assert samples[("drift_reference_ready", (("reference", "default"),))] == 1.0
    assert samples[("drift_rows_ingested_total", ())] == mon.stats()["rows_ingested"]
    assert samples[("drift_cascade_healthy", ())] == 1.0
    assert any(k[0] == "drift_cascade_cheap_share" for k in samples)
    assert ("drift_explanations", (("metric", "latency_ms"),)) in samples
    # a scrape within max_age reuses the verdicts (queries are not run per scrape)
    collector = MonitorCollector(mon, max_age_s=3600)
    calls = {"n": 0}
    original = mon.drift

    def counted(*a, **k):
        calls["n"] += 1
        return original(*a, **k)

    mon.drift = counted  # type: ignore[method-assign]
    list(collector.collect())
    list(collector.collect())
    assert calls["n"] == 1
    # every metric the example alert rules use is exported
    rules = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) >= 6
    exported = set(families) | {f"{n}_total" for n in families}
    for expr in exprs:
        for name in re.findall(r"\b(drift_[a-z_]+)\b", expr):
            assert name in exported, (name, expr)


def test_summaries_say_what_was_found_in_plain_language() -> None:
    stream = Stream("latency_combo", 1, rate=50.0, change_pane=30)
    mon = Monitor(**monitor_kwargs(auto_reference_panes=15, window_panes=5))
    for p in range(45):
        mon.ingest(stream.pane(p))
    text = mon.explain(metric="latency_ms").summary()
    a, b = (f"{k}={v}" for k, v in stream.planted["attributes"].items())
    assert a in text and b in text
    assert re.search(r"are [\d.]+x \(>= [\d.]+x, 99% simultaneous CI\) as likely as the rest "
                     r"to be latency_ms above [\d.]+ \(p99 of reference 'default'\); "
                     r"[\d.]+% of the outliers and [\d.]+% of traffic in 2023-11-14 "
                     r"\d\d:\d\d-\d\d:\d\d UTC\.", text), text
    assert mon.explain(metric="latency_ms").to_dict()["summary"] == text
    assert "none of" in mon.drift().summary() or "drifted" in mon.drift().summary()
    assert "rose" in mon.change_points(series=["latency_ms.p99"]).summary()
    assert mon.cascade_health().summary().endswith("healthy.")


def test_label_values_from_clients_are_printable_bounded_and_distinct():
    """Attribute values reach Prometheus labels (and alert text through them): control
    characters are replaced, long values cut with a digest of the whole, so two long values
    sharing a head still make two series."""
    from drift._prometheus import LABEL_VALUE_CHARS, _combo_label, _label_value

    assert _label_value("eu-west") == "eu-west" and _label_value(7) == "7"
    evil = _label_value("x\nALERT resolved\r\x1b[31m")
    assert "\n" not in evil and "\r" not in evil and "\x1b" not in evil and evil.isprintable()
    a, b = _label_value("k" * 500 + "a"), _label_value("k" * 500 + "b")
    assert a != b and len(a) <= LABEL_VALUE_CHARS + 9 and a.startswith("k" * LABEL_VALUE_CHARS)
    assert _combo_label({"client": "c\n1", "region": None}, ["client", "region"]).startswith("client=c?1~")
