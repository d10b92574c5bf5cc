"""Planted causes are found; nulls stay quiet; persistence and cascade rules hold."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from drift import Monitor
from drift._synthetic import Stream, monitor_kwargs

from ._helpers import MONITOR_ARGS, T0, records

RATE = 30.0


def _run(kind: str, seed: int, panes: int, **kw) -> tuple[Stream, Monitor]:
    stream = Stream(kind, seed, rate=RATE, change_pane=40)
    mon = Monitor(**monitor_kwargs(auto_reference_panes=20, window_panes=10, **kw))
    for p in range(panes):
        mon.ingest(stream.pane(p))
    return stream, mon


def _top(rows: list[dict], attrs: list[str]) -> dict:
    return {a: rows[0][a] for a in attrs if rows[0].get(a) is not None} if rows else {}


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_latency_combination_is_top_explanation(seed: int) -> None:
    stream, mon = _run("latency_combo", seed, 55)
    result = mon.explain(metric="latency_ms")
    assert _top(result.rows, mon.attributes) == stream.planted["attributes"]
    assert result[0]["risk_ratio"] >= 3 and result[0]["support"] >= 0.05


def test_planted_mix_shift_is_found_and_null_is_quiet() -> None:
    stream, mon = _run("mix_shift", 3, 55)
    result = mon.mix_shift()
    assert _top(result.rows, mon.attributes) == stream.planted["attributes"]
    assert result[0]["current_share"] == pytest.approx(0.2, abs=0.05)
    assert result[0]["reference_share"] == pytest.approx(0.02, abs=0.01)
    assert result[0]["ratio"] > 3
    shrank = mon.mix_shift(direction="shrank")
    assert all(r["current_share"] < r["reference_share"] for r in shrank)


def test_planted_conditional_shift_is_localized() -> None:
    stream, mon = _run("conditional", 2, 55)
    report = mon.conditional_shift()
    top = report[0]
    assert top["localized"] and top["column"] == "f_num"
    assert _top([top], mon.attributes) == stream.planted["attributes"]
    assert top["effect"] >= 2 * (top["effect_outside"] or 0)


def test_null_stream_raises_no_explanations() -> None:
    _, mon = _run("null_heavy", 5, 45)
    assert len(mon.explain(metric="latency_ms")) == 0
    assert len(mon.explain(classifier="error")) == 0
    assert len(mon.mix_shift()) == 0
    assert mon.drift().drifted_columns == []
    assert mon.cascade_health().healthy


def test_drift_needs_two_of_three_windows() -> None:
    mon = Monitor(**MONITOR_ARGS, window_panes=1, allowed_lateness_seconds=0)
    mon.set_reference(records(3000, 0, t0=T0 - 3600))
    mon.ingest(records(2000, 1, t0=T0))
    spike = records(2000, 2, t0=T0 + 60)
    spike["f1"] += 2.0
    mon.ingest(spike)
    report = mon.drift()
    row = next(r for r in report if r["column"] == "f1")
    assert row["drifted_now"] and row["windows_drifted"] == 1 and not row["drifted"]
    again = records(2000, 3, t0=T0 + 120)
    again["f1"] += 2.0
    mon.ingest(again)
    row = next(r for r in mon.drift() if r["column"] == "f1")
    assert row["drifted"] and row["windows_drifted"] == 2
    assert row["effect"] == pytest.approx(2.0, rel=0.1)
    assert row["test"] == "ks" and row["p_value"] < 1e-6


def test_large_samples_do_not_flag_tiny_differences() -> None:
    mon = Monitor(**MONITOR_ARGS, window_panes=3)
    mon.set_reference(records(60_000, 0, t0=T0 - 3600))
    for i in range(3):
        f = records(60_000, 10 + i, t0=T0 + 60 * i)
        f["f1"] += 0.03  # significant at this n, but a meaningless effect
        mon.ingest(f)
    row = next(r for r in mon.drift() if r["column"] == "f1")
    assert row["p_value"] < 0.01 and row["effect"] < 0.1 and not row["drifted"]


def test_categorical_drift_counts_new_categories() -> None:
    mon = Monitor(**MONITOR_ARGS, window_panes=2)
    mon.set_reference(records(4000, 0, t0=T0 - 3600))
    for i in range(3):
        f = records(3000, 20 + i, t0=T0 + 60 * i)
        f.loc[f.index[:900], "region"] = "mars"
        mon.ingest(f)
    row = next(r for r in mon.drift() if r["column"] == "region")
    assert row["test"] == "chi2" and row["drifted"]
    assert row["new_categories"] == 1 and row["new_category_share"] == pytest.approx(0.3)


def test_change_point_says_when_p99_latency_changed() -> None:
    stream, mon = _run("latency_combo", 4, 80)
    cps = mon.change_points(series=["latency_ms.p99"])
    assert len(cps) >= 1
    first = cps.rows[-1]
    assert first["direction"] == "up"
    assert abs(first["start_pane"] - (stream.change_pane + _first_pane(mon))) <= 2


def _first_pane(mon: Monitor) -> int:
    return int(mon.series().index[0].timestamp() // mon.config.pane_seconds)


def test_cascade_health_reports_a_drop_in_a_segment() -> None:
    mon = Monitor(["region", "version"], ["latency_ms"], level_column="level",
                  confidence_column="confidence", window_panes=5)
    rng = np.random.default_rng(0)

    def frame(n: int, t0: float, degrade: bool) -> pd.DataFrame:
        region = rng.choice(["eu", "us", "ap"], n)
        conf = rng.beta(8, 2, n)
        if degrade:
            conf = np.where(region == "ap", rng.beta(3, 3, n), conf)
        return pd.DataFrame({"timestamp": t0 + rng.random(n) * 60, "region": region,
                             "version": rng.choice(["v1", "v2"], n),
                             "latency_ms": rng.lognormal(3, 0.4, n), "confidence": conf,
                             "level": np.where(conf >= 0.6, 0, 1)})

    mon.set_reference(frame(20_000, T0 - 7200, False))
    for i in range(5):
        mon.ingest(frame(4000, T0 + 60 * i, False))
    assert mon.cascade_health().healthy
    for i in range(5, 10):
        mon.ingest(frame(4000, T0 + 60 * i, True))
    health = mon.cascade_health()
    assert not health.healthy
    assert health.message == "the approximation is being used outside the data it was validated on"
    top = health[0]
    assert top["region"] == "ap" and top["degraded"]
    assert top["cheap_fraction"] < top["reference_cheap_fraction"] - 0.2
    assert "outside the data it was validated on" in top["message"]


def test_sampling_beyond_reservoir_keeps_estimates_unbiased() -> None:
    mon = Monitor(**MONITOR_ARGS, reservoir_size=500, flagged_reservoir_size=2000,
                  classifiers={"slow": "latency_ms > 45"})
    mon.set_reference(records(2000, 0, t0=T0 - 3600))
    frames = [records(6000, 30 + i, t0=T0 + 60 * i, planted={"region": "ap", "version": "v2"})
              for i in range(3)]
    for f in frames:
        mon.ingest(f)
    result = mon.explain(classifier="slow")
    assert not result.info["exact"]
    window = pd.concat(frames)
    truth = (window.latency_ms > 45).sum()
    assert result.info["total_outliers"] == pytest.approx(truth, rel=1e-9)  # flagged kept whole
    assert result.info["total_rows"] == pytest.approx(len(window), rel=1e-9)
    assert _top(result.rows, mon.attributes) == {"region": "ap", "version": "v2"}


def test_memory_is_bounded_by_rollups() -> None:
    mon = Monitor(**MONITOR_ARGS, window_panes=3, detail_panes=4, rollup_panes=5,
                  retention_panes=20, reservoir_size=200, flagged_reservoir_size=100)
    mon.set_reference(records(500, 0, t0=T0 - 3600))
    sizes = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(60):
            mon.ingest(records(400, i, t0=T0 + 60 * i))
            sizes.append(mon.memory_bytes())
    stats = mon.stats()
    assert stats["panes_full"] <= 3 + 2 + 1 and stats["panes_detail"] <= 4
    assert stats["rollups"] <= 20 // 5 + 1 and stats["series_panes"] <= 21
    assert max(sizes[40:]) <= 1.2 * max(sizes[20:40])  # plateau, not growth


def test_cheap_level_matches_by_text() -> None:
    mon = Monitor(["region"], ["latency_ms"], level_column="level", cheap_level="0",
                  confidence_column="confidence")
    rng = np.random.default_rng(1)
    n = 2000
    frame = pd.DataFrame({"timestamp": T0 + rng.random(n) * 60,
                          "region": rng.choice(["eu", "us"], n),
                          "latency_ms": rng.lognormal(3, 0.4, n),
                          "confidence": rng.random(n), "level": rng.choice([0, 1], n)})
    mon.set_reference(frame)
    mon.ingest(frame)
    health = mon.cascade_health()
    overall = next(r for r in health if r["region"] is None)
    assert overall["cheap_fraction"] == pytest.approx((frame.level == 0).mean())
    assert health.info["cheap_level"] == 0
