"""Numeric drift is robust to extreme values: one 1e12 or 1e300 in the reference or the window
neither hides a +3 sigma shift nor raises a false alarm, and a column whose spread outliers
dominate is reported `undetectable` with a reason (never silently quiet)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from drift import Monitor
from drift._column_tests import numeric_sketch_test
from drift._sketch import QuantileSketch

from ._helpers import T0


def _frame(n: int, seed: int, t0: float, shift: float, extreme: float | None = None,
           share: float = 0.0) -> pd.DataFrame:
    """N(shift, 1) rows; `extreme` replaces one row (share 0) or a `share` of the rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(shift, 1.0, n)
    if extreme is not None:
        if share:
            x[rng.random(n) < share] = extreme
        else:
            x[n // 2] = extreme
    return pd.DataFrame({"timestamp": t0 + np.sort(rng.random(n)) * 60,
                         "region": rng.choice(["a", "b"], n), "x": x})


def _drift_row(reference: pd.DataFrame, shift: float, extreme: float | None = None,
               share: float = 0.0) -> tuple[dict, object]:
    mon = Monitor(["region"], [], features={"x": "numeric"}, window_panes=2, clock=None)
    mon.set_reference(reference)
    for i in range(6):
        one = extreme if (share or i % 2 == 0) else None  # one value every other pane
        mon.ingest(_frame(5_000, 10 + i, T0 + 60 * i, shift, one, share))
    report = mon.drift()
    return next(r for r in report if r["column"] == "x"), report


@pytest.mark.parametrize("extreme", [1e12, 1e300])
@pytest.mark.parametrize("where", ["reference", "window"])
@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_one_extreme_value_neither_hides_nor_raises_drift(extreme: float, where: str,
                                                          shift: float) -> None:
    """Before: one 1e12 in the reference read a +3 sigma shift as effect 0.007 (quiet, not
    undetectable); one 1e300 anywhere flagged a stationary column (effect inf or 1.5e296)."""
    ref = _frame(20_000, 1, T0 - 3600, 0.0, extreme if where == "reference" else None)
    row, _ = _drift_row(ref, shift, extreme if where == "window" else None)
    assert not row["undetectable"]
    assert row["effect_name"] == "wasserstein_robust"
    if shift:
        assert row["drifted"]
        assert row["effect"] == pytest.approx(3.0, abs=0.2)
        assert row["effect_error"] < 0.1
    else:
        assert not row["drifted"] and row["windows_drifted"] == 0
        assert row["effect"] < 0.06 and row["effect_error"] < 0.05


def test_a_column_dominated_by_outliers_is_undetectable_with_a_reason() -> None:
    """30% of the reference at 1e12 inflates the IQR itself: a +3 sigma shift of the rest
    cannot reach the gate, so the column says so instead of staying quiet."""
    ref = _frame(20_000, 1, T0 - 3600, 0.0, 1e12, share=0.3)
    row, report = _drift_row(ref, 3.0, 1e12, share=0.3)
    assert row["undetectable"] and not row["drifted"]
    reason = report.info["undetectable_reasons"]["x"]
    assert "dominated by outliers" in reason
    assert "x" in report.info["undetectable_columns"]
    assert "Undetectable" in report.summary() and "outliers" in report.summary()


def test_a_reference_with_no_robust_spread_is_undetectable_with_a_reason() -> None:
    """99% of the reference is one value: no robust spread to scale an effect by."""
    ref = _frame(20_000, 1, T0 - 3600, 0.0)
    ref["x"] = np.where(np.random.default_rng(3).random(len(ref)) < 0.99, 5.0, 1e9)
    row, report = _drift_row(ref, 0.0)
    assert row["undetectable"] and row["effect"] is None and not row["drifted"]
    assert "no robust spread" in report.info["undetectable_reasons"]["x"]


def test_effect_definition_on_sketches() -> None:
    """The effect is W1 of both samples winsorised to [Q1 - 3 IQR, Q3 + 3 IQR] of the reference,
    over IQR / 1.349; it is bounded, and a shift far beyond the fences still reads large."""
    rng = np.random.default_rng(4)
    ref, cur = QuantileSketch(), QuantileSketch()
    a = rng.normal(0, 2, 20_000)
    b = rng.normal(1, 2, 10_000)
    ref.update(a)
    cur.update(b)
    out = numeric_sketch_test(cur, ref)
    q1, q3 = np.quantile(a, [0.25, 0.75])
    iqr = q3 - q1
    lo, hi = q1 - 3 * iqr, q3 + 3 * iqr
    grid = np.linspace(lo, hi, 20_001)
    fa = np.searchsorted(np.sort(a), grid, side="right") / a.size
    fb = np.searchsorted(np.sort(b), grid, side="right") / b.size
    exact = float(np.sum(np.abs(fa - fb)[:-1] * np.diff(grid))) / (iqr / 1.3489795)
    assert out["effect"] == pytest.approx(exact, abs=out["effect_error"] + 0.01)
    assert out["effect"] == pytest.approx(0.5, abs=0.05)
    far = QuantileSketch()
    far.update(rng.normal(1e6, 2, 10_000))
    bounded = numeric_sketch_test(far, ref)["effect"]
    assert 4.0 < bounded <= (1 + 2 * 3) * 1.3489795 + 0.05
