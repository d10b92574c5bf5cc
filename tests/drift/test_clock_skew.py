"""Time that one client cannot move: a lone future row, a replica whose clock runs ahead.

Each test replays the regime where the defect was found, on explicit timestamps: a live stream
is simulated by setting the wall clock clock='auto' follows (drift._engine.wall_time) to the
end of each batch, never by waiting. Before the time frontier (drift._frontier), a lone row
dated a day ahead in a batch of its own switched the live clock off and closed every pane (60%
of the later rows were dropped as late), and a replica ten minutes ahead moved the window into
the future, where mix_shift saw it grow to 100% of the traffic.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from drift import DataWarning, Monitor, _engine
from drift._prometheus import prometheus_text

from ._helpers import MONITOR_ARGS, T0

REPLICAS = [f"r{i}" for i in range(8)]
#: rows per 10 s batch of each replica: r7 serves 6.1% of the traffic, as where it was found
SIZES = {**{r: 88 for r in REPLICAS[:7]}, "r7": 40}


def batch(t: float, seconds: float, n: int, seed: int, replica: str | None = None,
          skew: float = 0.0) -> pd.DataFrame:
    """`n` rows spread over [t, t + seconds), dated `skew` seconds late/ahead."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "timestamp": t + skew + np.sort(rng.random(n)) * seconds,
        "region": rng.choice(["eu", "us", "ap"], n),
        "version": rng.choice(["v1", "v2"], n),
        "replica": replica if replica is not None else rng.choice(REPLICAS, n),
        "latency_ms": rng.lognormal(3.0, 0.4, n),
        "f1": rng.normal(0.0, 1.0, n),
    })


@pytest.fixture
def wall(monkeypatch) -> list[float]:
    """The wall clock clock='auto' reads, set explicitly by the test."""
    now = [T0]
    monkeypatch.setattr(_engine, "wall_time", lambda: now[0])
    return now


def _lone_future_row_stream(mon: Monitor, wall: list[float]) -> tuple[int, int]:
    """60 minutes of 5 s batches (~240,000 rows); at minute 12 a batch of its own holds one
    row dated a day ahead. Returns (rows after that batch, rows before)."""
    before = after = 0
    for i in range(720):
        t = T0 + 5.0 * i
        frame = batch(t, 5.0, 333, i)
        wall[0] = t + 5.5
        mon.ingest(frame)
        if i < 144:
            before += len(frame)
        else:
            after += len(frame)
        if i == 143:
            lone = batch(t, 1.0, 1, 10_000)
            lone["timestamp"] = t + 86_400.0
            with pytest.warns(DataWarning, match="quarantined"):
                assert mon.ingest(lone).quarantined == 1
    return after, before


@pytest.mark.parametrize("clock", ["auto", None])
def test_lone_row_a_day_ahead_in_its_own_batch_keeps_every_later_row(wall, clock) -> None:
    """Found at 239,774 rows: 144,068 kept. The lone row is held, live mode stays on."""
    mon = Monitor(**MONITOR_ARGS, clock=clock)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # nothing late, nothing else quarantined
        after, before = _lone_future_row_stream(mon, wall)
    stats = mon.stats()
    assert stats["late_dropped"] == 0
    assert stats["rows_ingested"] == before + after  # every later row kept (>= 99% asked)
    assert stats["quarantined"] == stats["quarantine_held"] == 1
    assert stats["skewed_batches"] == 1 and stats["max_lead_seconds"] > 86_000
    assert stats["clock"] == ("live" if clock == "auto" else "event time")
    # the window still ends at the stream's last minute, not a day ahead
    assert mon.window_info()["rows"] > 0
    assert stats["frontier"] < "2023-11-15T00:00"
    text = prometheus_text(mon).decode()
    assert "drift_rows_quarantine_held 1.0" in text
    assert "drift_skewed_batches_total 1.0" in text


def _skewed_replica_stream(mon: Monitor, wall: list[float], minutes_before: int = 20,
                           minutes_after: int = 40) -> dict[str, int]:
    """Eight replicas send their own 10 s batches; r7 (6.1% of rows) runs 10 min ahead after
    `minutes_before` minutes. Returns row totals."""
    totals = {"before": 0, "after": 0, "r7_after": 0}
    for k in range(6 * (minutes_before + minutes_after)):
        t = T0 + 10.0 * k
        wall[0] = t + 10.5
        skewed = k >= 6 * minutes_before
        for j, r in enumerate(REPLICAS):
            ahead = 600.0 if skewed and r == "r7" else 0.0
            frame = batch(t, 10.0, SIZES[r], 100 * k + j, replica=r, skew=ahead)
            mon.ingest(frame)
            totals["after" if skewed else "before"] += len(frame)
            if ahead:
                totals["r7_after"] += len(frame)
    return totals


@pytest.mark.parametrize("clock", ["auto", None])
def test_replica_ten_minutes_ahead_moves_no_window_and_fakes_no_mix_shift(wall, clock) -> None:
    """Found as "replica=r7 grew from 6.1% to 100%" and a traffic collapse that did not
    happen. Now r7's rows wait (held) until time reaches them, then join their panes."""
    mon = Monitor(**MONITOR_ARGS, clock=clock)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # r7's rows are quarantined: warned
        totals = _skewed_replica_stream(mon, wall)
    stats = mon.stats()
    total = totals["before"] + totals["after"]
    assert stats["late_dropped"] == 0 and stats["quarantine_dropped"] == 0
    # nothing lost: accepted + still held == sent; >= 99% of the later rows already accepted
    assert stats["rows_ingested"] + stats["quarantine_held"] == total
    assert stats["rows_ingested"] - totals["before"] >= 0.99 * totals["after"]
    assert stats["quarantine_released"] > 0.7 * totals["r7_after"]
    # the skew is counted: every r7 batch after the jump, ~600 s ahead
    assert stats["skewed_batches"] == 6 * 40
    assert 590 < stats["max_lead_seconds"] < 620
    text = prometheus_text(mon).decode()
    assert "drift_skewed_batches_total 240.0" in text
    assert "drift_clock_max_lead_seconds" in text
    # the window ends at the stream's present, not ten minutes ahead
    last = T0 + 3600 - (60 if clock is None else 0)  # the last data's pane, or the clock's
    assert stats["newest_pane_start"] == pd.Timestamp(last, unit="s", tz="UTC").isoformat()
    # no replica grew to (anywhere near) 100% of the recent window: against the minutes before
    # the skew r7 keeps its share; against any earlier window it stays far below half (the
    # ten minutes right after the jump lack r7, whose rows are dated ten minutes later)
    before = mon.mix_shift(reference=(T0 + 300, T0 + 1200), attributes=["replica"],
                           min_ratio=1.0, min_support=0.01)
    r7 = [row for row in before.rows if row.get("replica") == "r7"]
    assert all(row["support"] < 0.08 and row["ratio"] < 1.5 for row in r7)
    for reference in ("-30m", "-20m", (T0 + 300, T0 + 1200)):
        shift = mon.mix_shift(reference=reference, attributes=["replica"], min_ratio=1.0)
        assert all(row["support"] < 0.5 for row in shift.rows)
    # no traffic collapse: every closed pane of the skewed half-hour holds most of the traffic
    rows = mon.series()["rows"]
    steady = rows.iloc[-30:-1]
    assert steady.min() > 0.85 * rows.iloc[5:15].median()


def test_held_rows_frontier_and_skew_counts_survive_a_restart(tmp_path: Path, wall) -> None:
    """The held panes, the frontier's recent batches and live votes are committed with every
    step: a restart rebuilds them and goes on exactly like a monitor that never stopped."""
    args = dict(MONITOR_ARGS, clock="auto")
    mon = Monitor(**args, directory=tmp_path)
    twin = Monitor(**args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        for m in (mon, twin):
            _skewed_replica_stream(m, wall, minutes_before=5, minutes_after=8)
        mon.close()
        again = Monitor(**args, directory=tmp_path)
        keys = ("rows_ingested", "quarantined", "quarantine_held", "quarantine_released",
                "skewed_batches", "max_lead_seconds", "frontier", "clock", "late_dropped")
        assert {k: again.stats()[k] for k in keys} == {k: twin.stats()[k] for k in keys}
        assert again.stats()["quarantine_held"] > 0
        for k in range(78, 90):  # time goes on: held rows are released on both
            t = T0 + 10.0 * k
            wall[0] = t + 10.5
            for m in (again, twin):
                m.ingest(batch(t, 10.0, 300, 7 * k))
        again.flush()
        assert {k: again.stats()[k] for k in keys} == {k: twin.stats()[k] for k in keys}
        assert again.series().equals(twin.series())
        assert again.mix_shift(reference="-5m").to_dict() == twin.mix_shift(
            reference="-5m").to_dict()
    again.close()


def test_a_replay_resuming_after_a_gap_moves_the_frontier_once_most_batches_agree() -> None:
    """Event time only: a jump of an hour is held until a majority of the recent batches
    reach it, then every held row joins its pane; nothing is lost or counted twice."""
    mon = Monitor(**MONITOR_ARGS, clock=None, frontier_batches=5)
    for i in range(20):
        mon.ingest(batch(T0 + 5.0 * i, 5.0, 100, i))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        receipts = [mon.ingest(batch(T0 + 3700 + 5.0 * i, 5.0, 100, 50 + i)) for i in range(6)]
    assert [r.quarantined for r in receipts[:2]] == [100, 100]  # 2 of 5 batches: not yet
    assert receipts[2].quarantined == 0  # 3 of 5: the frontier jumped, held rows released
    stats = mon.stats()
    assert stats["rows_ingested"] == 26 * 100 and stats["late_dropped"] == 0
    assert stats["quarantine_held"] == 0 and stats["quarantine_released"] == 200
    assert mon.window_info()["rows"] > 0
