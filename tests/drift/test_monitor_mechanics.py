"""Pane closing, references, heavy hitters inside the monitor, change-point detector."""

from __future__ import annotations

import numpy as np
import pytest

from drift import Monitor, PageHinkley

from ._helpers import MONITOR_ARGS, T0, records


def test_advance_closes_idle_panes_slides_the_window_and_records_zero_traffic() -> None:
    mon = Monitor(**MONITOR_ARGS)
    mon.ingest(records(300, 1, t0=T0, seconds=30))
    assert mon.series().empty
    closed = mon.advance(now=T0 + 3600)
    rows = mon.series()["rows"]
    assert closed and rows.iloc[0] == 300
    # every idle pane closed with zero rows (a stop is visible), and the window moved on
    assert len(rows) == 59 and (rows.iloc[1:] == 0).all()
    assert mon.window_info()["rows"] == 0
    assert mon.window_info()["end"] == "2023-11-14T23:15:00+00:00"  # the pane holding now


def test_auto_reference_from_first_panes_fits_classifiers() -> None:
    mon = Monitor(**MONITOR_ARGS, auto_reference_panes=3)
    for i in range(3):
        mon.ingest(records(500, i, t0=T0 + 60 * i))
    assert mon.references == []
    mon.ingest(records(500, 9, t0=T0 + 300))
    assert mon.references == ["default"]
    info = mon.stats()["references"]["default"]
    assert info["rows"] == 1500 and not info["pending"]
    assert mon.classifiers["latency_ms"].fitted


def test_set_reference_append_and_named_references() -> None:
    mon = Monitor(**MONITOR_ARGS)
    mon.set_reference(records(400, 1))
    info = mon.set_reference(records(600, 2), append=True)
    assert info["rows"] == 1000
    mon.set_reference(records(300, 3), name="training")
    assert mon.references == ["default", "training"]
    mon.ingest(records(500, 4))
    assert mon.drift(reference="training").info["reference"]["rows"] == 300
    with pytest.raises(ValueError, match="at least one"):
        mon.set_reference(records(0, 5))


def test_high_cardinality_attribute_uses_heavy_hitters() -> None:
    mon = Monitor(["client"], ["latency_ms"], max_values=8, window_panes=2)
    rng = np.random.default_rng(0)

    def frame(seed: int, t0: float):
        f = records(3000, seed, t0=t0)
        heavy = rng.random(3000) < 0.5
        f["client"] = np.where(heavy, "big", [f"c{i}" for i in rng.integers(0, 500, 3000)])
        return f

    mon.set_reference(frame(1, T0 - 3600))
    current = frame(2, T0)
    mon.ingest(current)
    summary = mon.window_summary()
    counts = summary.cats[0]
    assert not counts.exact and counts.items()[0].size <= 8
    big = mon._encoders[0].code_of("big")
    codes, values = counts.items()
    assert big in codes.tolist()
    kept = values[codes.tolist().index(big)]
    true_big = int((current["client"] == "big").sum())
    assert true_big - counts.error <= kept <= true_big  # a lower bound within the stated error
    assert counts.error <= counts.total / 9
    row = next(r for r in mon.drift(min_samples=10) if r["column"] == "client")
    assert row["effect_error"] >= 0 and not row["drifted"]  # unreliable levels pooled


def test_page_hinkley_finds_step_start_and_stays_quiet_on_noise() -> None:
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(10, 1, 120), rng.normal(13, 1, 60)]
    changes = PageHinkley().run(x)
    assert len(changes) == 1
    ch = changes[0]
    assert ch.direction == "up" and abs(ch.start - 120) <= 2 and ch.detected < 130
    assert ch.after == pytest.approx(13, abs=0.6)
    quiet = PageHinkley().run(np.random.default_rng(4).normal(0, 1, 2000))
    assert quiet == []
    with pytest.raises(ValueError, match="burn_in"):
        PageHinkley(burn_in=1)


def test_ingest_receipt_in_memory() -> None:
    mon = Monitor(**MONITOR_ARGS)
    receipt = mon.ingest(records(100, 1, t0=T0, seconds=120))
    assert receipt.rows == 100 and len(receipt.panes) == 2
    assert receipt.durable is False and receipt.durable_through is None
