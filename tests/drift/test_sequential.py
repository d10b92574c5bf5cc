"""Sequential column drift (drift._sequential): quiet on a null stream, a first alarm within a
pane or two of a +1 std shift and long before `drift()`'s 2-of-3 disjoint windows, the same
answer after a restart; and the effect gate's blind spot (a 10% move to rare clients) in
numbers. Seeded, no timing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from drift import EffectGate, Monitor
from drift._column_tests import categorical_test
from drift._sequential import effect_cusum, threshold_for
from drift._synthetic import Stream, monitor_kwargs

REFERENCE_PANES = 30
#: First pane the detector watches: 30 reference panes, then a 30-pane burn-in.
CHANGE = 60


def _monitor(**kw) -> Monitor:
    return Monitor(**monitor_kwargs(auto_reference_panes=REFERENCE_PANES, window_panes=10,
                                    clock=None, **kw))


def _pane(stream: Stream, p: int, shift: float = 0.0):
    frame = stream.pane(p)
    if shift and p >= CHANGE:
        frame["f_num"] = frame["f_num"] + shift
    return frame


def test_threshold_follows_the_false_alarm_rate() -> None:
    # 13 columns, 1-minute panes, 0.1 false alarms a day: run length 13 * 1440 / 0.1 panes
    assert threshold_for(0.1, 13, 60.0) == pytest.approx(math.log(13 * 1440 / 0.1))
    assert threshold_for(1.0, 13, 60.0) < threshold_for(0.1, 13, 60.0)
    with pytest.raises(ValueError, match="false_alarms_per_day"):
        threshold_for(0.0, 1, 60.0)


def test_cusum_dates_a_step_and_ignores_noise() -> None:
    rng = np.random.default_rng(0)
    sizes = np.full(200, 3000.0)
    noise = 0.02 + 0.008 * rng.standard_normal(200)
    quiet = effect_cusum(noise, sizes, gate=0.1, threshold=12.0, burn_in=30)
    assert quiet is not None and quiet.alarms == [] and not quiet.drifted
    stepped = noise.copy()
    stepped[120:] += 0.1  # the effect rises by the gate at index 120
    run = effect_cusum(stepped, sizes, gate=0.1, threshold=12.0, burn_in=30)
    assert run is not None and run.drifted
    start, detected = run.alarms[0]
    assert start == 120 and 120 <= detected <= 121
    assert effect_cusum(noise[:30], sizes[:30], 0.1, 12.0, 30) is None  # still calibrating


def test_no_alarm_on_a_null_stream() -> None:
    stream = Stream("null_iid", 3)
    mon = _monitor()
    for p in range(130):
        mon.ingest(stream.pane(p))
        if p >= CHANGE and p % 10 == 0:
            assert mon.sequential_drift().drifted_columns == []
    res = mon.sequential_drift()
    assert not res.info["calibrating"]
    watched = [r for r in res.rows if not r["undetectable"]]
    assert watched and all(r["panes_monitored"] >= 30 for r in watched)
    assert sum(r["alarms"] for r in res.rows) == 0  # none anywhere in the held panes
    assert res.drifted_columns == [] and "crossed" in res.summary()


def test_alarm_within_two_panes_of_a_one_std_shift_and_before_drift() -> None:
    stream = Stream("null_iid", 4)
    mon = _monitor()
    first_seq = first_default = None
    for p in range(CHANGE + 15):
        mon.ingest(_pane(stream, p, shift=1.0))
        if p < CHANGE:
            continue
        if first_seq is None and "f_num" in mon.sequential_drift().drifted_columns:
            first_seq = p
            row = next(r for r in mon.sequential_drift().rows if r["column"] == "f_num")
            pane0 = int(stream.t0 // stream.pane_seconds)
            assert row["start_pane"] == pane0 + CHANGE  # when the change began
            assert row["delay_panes"] <= 2 and row["effect"] > 0.5  # two panes: MAX_PANE_SHARE
        if first_default is None and "f_num" in mon.drift().drifted_columns:
            first_default = p
    assert first_seq is not None and first_seq - CHANGE + 1 <= 2
    # drift() needs 2 of 3 disjoint 10-pane windows: the earlier window must hold the change
    assert first_default is None or first_default - first_seq >= 9


def test_a_restart_gives_the_same_answer(tmp_path: Path) -> None:
    stream = Stream("null_iid", 5)
    mon = _monitor(directory=tmp_path)
    for p in range(CHANGE + 4):
        mon.ingest(_pane(stream, p, shift=1.0))
    mon.flush()
    before = mon.sequential_drift().to_dict()
    mon.close()
    again = Monitor.open(tmp_path, clock=None)
    assert again.sequential_drift().to_dict() == before
    assert "f_num" in before["drifted_columns"]
    again.close()


def test_the_effect_gate_lets_a_ten_percent_move_to_rare_clients_through() -> None:
    # 10 heavy clients hold 8% of traffic each, 10 rare ones 2% each; the window moves 10% of
    # traffic to the rare ones (their share 20% -> 30%). Reference: 30 panes at 50 rows/s;
    # window: 10 panes.
    codes = np.arange(20)
    ref = np.r_[np.full(10, 0.08), np.full(10, 0.02)] * 90_000
    cur = np.r_[np.full(10, 0.07), np.full(10, 0.03)] * 30_000
    r = categorical_test(codes, cur, 0.0, codes, ref, 0.0)
    assert r["effect"] == pytest.approx(0.0976, abs=5e-4)  # Jensen-Shannon, under the 0.1 gate
    assert r["p_value"] < 1e-250  # chi-squared rejects at once
    gate = EffectGate()
    assert not gate.passes({**r, "p_adjusted": r["p_value"]}, "categorical")
    # one 3,000-row pane alone reads 0.092: far above a null pane's ~0.01, so the sequential
    # detector (which accumulates effect above its in-control level + half the gate) sees it
    one = categorical_test(codes, cur / 10, 0.0, codes, ref, 0.0)
    assert 0.09 < one["effect"] < 0.1
    rng = np.random.default_rng(1)
    null = np.abs(rng.normal(0.0, 0.008, 40))  # a stable column's per-pane JS
    effects = np.r_[null, np.full(5, one["effect"])]
    run = effect_cusum(effects, np.full(45, 3000.0), gate=0.1, threshold=12.0, burn_in=30)
    assert run is not None and run.alarms and run.alarms[0][0] == 40
    assert run.alarms[0][1] - 40 + 1 <= 2
