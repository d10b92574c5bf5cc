"""Support and risk ratio equal a brute-force pandas groupby, on raw and pre-aggregated rows."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from drift import Monitor, explain
from drift._apriori import Rows, mine

from ._helpers import MONITOR_ARGS, records

ATTRS = ["region", "version", "replica"]


def _frame(seed: int = 0, n: int = 3000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "region": rng.choice(["eu", "us", "ap"], n, p=[0.5, 0.3, 0.2]),
        "version": rng.choice(["v1", "v2"], n),
        "replica": rng.choice(["r0", "r1", "r2", "r3"], n),
    })
    p = np.where((frame.region == "ap") & (frame.version == "v2"), 0.4, 0.03)
    p = np.where(frame.replica == "r3", np.maximum(p, 0.2), p)
    frame["outlier"] = rng.random(n) < p
    return frame


def _brute(frame: pd.DataFrame, combo: dict, outlier: str = "outlier",
           count: str | None = None) -> tuple[float, float]:
    """(support, risk ratio) of one combination by pandas, same zero-cell rule."""
    weights = frame[count] if count else pd.Series(1.0, index=frame.index)
    o = frame[outlier].astype(float)
    mask = np.ones(len(frame), dtype=bool)
    for k, v in combo.items():
        mask &= (frame[k] == v).to_numpy()
    total_o, total_n = float(o.sum()), float(weights.sum())
    og, ng = float(o[mask].sum()), float(weights[mask].sum())
    a, b, c, d = og, ng - og, total_o - og, (total_n - ng) - (total_o - og)
    if c <= 0:  # documented zero-cell rule: no outliers outside the group -> infinite ratio
        return og / total_o, (np.inf if a > 0 else np.nan)
    return og / total_o, (a / (a + b)) / (c / (c + d))


def test_reported_rows_match_groupby_exactly() -> None:
    frame = _frame()
    result = explain(frame, ATTRS, outlier="outlier", min_ratio=1.5)
    assert len(result) >= 2
    for row in result:
        combo = {a: row[a] for a in ATTRS if row[a] is not None}
        support, rr = _brute(frame, combo)
        assert row["support"] == pytest.approx(support, rel=1e-12)
        assert row["risk_ratio"] == pytest.approx(rr, rel=1e-12)
        mask = np.logical_and.reduce([(frame[k] == v).to_numpy() for k, v in combo.items()])
        assert row["outlier_count"] == frame.outlier[mask].sum()
        assert row["total_count"] == mask.sum()
    tops = [{a: r[a] for a in ATTRS if r[a] is not None} for r in result]
    assert {"region": "ap", "version": "v2"} in tops
    assert {"replica": "r3"} in tops


def test_every_scored_combination_matches_groupby() -> None:
    """All candidates of the search (not only reported ones) carry exact sums."""
    frame = _frame(1, 1500)
    codes, labels = [], []
    for a in ATTRS:
        c, u = pd.factorize(frame[a])
        codes.append(c)
        labels.append(list(u))
    rows = Rows(codes=np.stack(codes), cards=[len(u) for u in labels],
                target=frame.outlier.to_numpy(dtype=float))
    found, _ = mine(rows, min_support=0.001, min_ratio=1e-9, simultaneous=False,
                    confidence=0.5)
    # min_ratio ~0 and a 50% interval: everything with some outliers and a ratio passes,
    # so compare the reported set's counts
    assert found
    for f in found:
        combo = {ATTRS[a]: labels[a][code] for a, code in f.combo}
        mask = np.logical_and.reduce([(frame[k] == v).to_numpy() for k, v in combo.items()])
        assert f.target == frame.outlier[mask].sum()
        assert f.count == mask.sum()
        assert f.extra["risk_ratio"] == pytest.approx(_brute(frame, combo)[1], rel=1e-12)


def test_pre_aggregated_cube_rows_give_the_same_answer() -> None:
    frame = _frame(2)
    raw = explain(frame, ATTRS, outlier="outlier")
    cube = (frame.assign(n=1.0, o=frame.outlier.astype(float))
            .groupby(ATTRS, as_index=False)[["n", "o"]].sum())
    agg = explain(cube, ATTRS, outlier="o", count="n")
    cols = [*ATTRS, "support", "risk_ratio", "outlier_count", "total_count"]
    pd.testing.assert_frame_equal(raw.to_frame()[cols], agg.to_frame()[cols])


def test_fractional_outlier_counts() -> None:
    cube = pd.DataFrame({
        "a": ["x", "y", "z", "w"] * 3,
        "b": ["p"] * 6 + ["q"] * 6,
        "count": [100.0] * 12,
        "outliers": [40.5, 1.25, 0.5, 1.0, 2.0, 0.75, 1.5, 0.25, 1.0, 0.5, 1.0, 0.0],
    })
    result = explain(cube, ["a", "b"], outlier="outliers", count="count")
    top = result[0]
    # rows (x, p) carry most outliers; (x, p) is not clearly stronger than {a: x} by their
    # intervals, but {a: x} has no excess once (x, p)'s rows leave (the (x, q) row sits at the
    # rest's rate): {a: x} rode on (x, p), which is reported in its place
    assert (top["a"], top["b"]) == ("x", "p")
    assert top["outlier_count"] == 42.5 and top["total_count"] == 200.0
    assert all(r["b"] is not None for r in result.rows if r["a"] == "x")
    support, rr = _brute(cube, {"a": "x", "b": "p"}, "outliers", "count")
    assert top["support"] == pytest.approx(support)
    assert top["risk_ratio"] == pytest.approx(rr)


def test_monitor_window_matches_groupby_on_small_data() -> None:
    mon = Monitor(**MONITOR_ARGS)
    mon.set_reference(records(2000, 1))
    frames = [records(800, 10 + i, t0=1_700_000_000 + 60 * i,
                      planted={"region": "ap", "version": "v2"}) for i in range(3)]
    for f in frames:
        mon.ingest(f)
    result = mon.explain(classifier="latency_ms > 40")
    assert result.info["exact"] is True
    window = pd.concat(frames)
    window["outlier"] = window.latency_ms > 40
    assert len(result) >= 1
    for row in result:
        combo = {a: row[a] for a in ATTRS if row[a] is not None}
        support, rr = _brute(window, combo)
        assert row["support"] == pytest.approx(support, rel=1e-12)
        assert row["risk_ratio"] == pytest.approx(rr, rel=1e-12)
    assert {a: result[0][a] for a in ATTRS if result[0][a]} == {"region": "ap", "version": "v2"}


def test_results_are_minimal_and_deterministic() -> None:
    frame = _frame(3)
    first = explain(frame, ATTRS, outlier="outlier")
    again = explain(frame.sample(frac=1.0, random_state=7), ATTRS, outlier="outlier")
    assert first.to_dict()["rows"] == again.to_dict()["rows"]
    combos = [frozenset((a, r[a]) for a in ATTRS if r[a] is not None) for r in first]
    for small, big in itertools.permutations(combos, 2):
        if small < big:
            lows = {c: r["ci_low"] for c, r in zip(combos, first, strict=True)}
            ratios = {c: r["ratio"] for c, r in zip(combos, first, strict=True)}
            assert lows[big] > ratios[small]  # a superset is reported only if clearly stronger
    lows = [r["ci_low"] for r in first]
    assert lows == sorted(lows, reverse=True)


def test_mean_shift_finds_the_slow_combination() -> None:
    frame = records(6000, 4, planted={"region": "sa", "version": "v3"}, factor=5.0)
    result = explain(frame, ATTRS, metric="latency_ms", ratio_metric="mean_shift")
    top = {a: result[0][a] for a in ATTRS if result[0][a] is not None}
    assert top == {"region": "sa", "version": "v3"}
    assert result[0]["ratio"] == pytest.approx(5.0, rel=0.15)
    assert result[0]["risk_ratio"] is None
