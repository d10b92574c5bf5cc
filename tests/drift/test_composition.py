"""A segment's shift that is only a change of its mix (drift._composition), and one that rides
on a better-ranked segment's rows, are named as such and not localized; a real shift is."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from drift import Monitor
from drift._composition import mix_weights

T0 = 1_700_000_040.0  # a pane's start (60 s panes)


def _rows(n: int, rng: np.random.Generator, share_y_in_a: float, shift_b: float,
          t0: float) -> pd.DataFrame:
    """seg A / B (half each); inside A, kind y (f ~ N(3, 1)) holds `share_y_in_a` of the rows,
    kind x (f ~ N(0, 1)) the rest; inside B, kind is x or y evenly and f moves by `shift_b`."""
    seg = np.where(rng.random(n) < 0.5, "A", "B")
    y = np.where(seg == "A", rng.random(n) < share_y_in_a, rng.random(n) < 0.5)
    f = rng.normal(0.0, 1.0, n) + 3.0 * y + np.where(seg == "B", shift_b, 0.0)
    return pd.DataFrame({"seg": seg, "kind": np.where(y, "y", "x"), "f": f,
                         "timestamp": t0 + np.sort(rng.random(n)) * 50.0})


def test_mix_change_is_named_and_a_real_shift_is_not() -> None:
    rng = np.random.default_rng(0)
    mon = Monitor(["seg", "kind"], ["f"], clock=None, window_panes=1)
    mon.set_reference(_rows(4000, rng, share_y_in_a=0.1, shift_b=0.0, t0=T0 - 3600))
    # inside A kind y grows from 10% to 50%: f moves there with no change inside any kind
    mon.ingest(_rows(4000, rng, share_y_in_a=0.5, shift_b=1.0, t0=T0))
    report = mon.conditional_shift(columns=["f"], segments=[{"seg": "A"}, {"seg": "B"}])
    by_seg = {r["seg"]: r for r in report}
    assert by_seg["A"]["drifted"] and by_seg["A"]["effect"] > 0.5
    assert by_seg["A"]["explained_by"] == "kind" and not by_seg["A"]["localized"]
    assert by_seg["B"]["drifted"] and by_seg["B"]["explained_by"] is None
    assert "f inside seg=A moved only with its mix of kind" in report.summary()


def test_a_real_shift_that_comes_with_a_change_of_mix_is_not_explained_away() -> None:
    """seg=A's mix of kinds changes and its f moves +1 std besides: reweighting the reference to
    the new mix leaves an effect far above the gate, so the shift is seg=A's own (a rule on the
    share of the effect reweighting removes called it mix: found in review)."""
    rng = np.random.default_rng(2)
    mon = Monitor(["seg", "kind"], ["f"], clock=None, window_panes=1)
    mon.set_reference(_rows(4000, rng, share_y_in_a=0.1, shift_b=0.0, t0=T0 - 3600))
    window = _rows(4000, rng, share_y_in_a=0.5, shift_b=0.0, t0=T0)
    window.loc[window["seg"] == "A", "f"] += 1.0
    mon.ingest(window)
    report = mon.conditional_shift(columns=["f"], segments=[{"seg": "A"}, {"seg": "B"}])
    a = next(r for r in report if r["seg"] == "A")
    assert a["drifted"] and a["explained_by"] is None and a["localized"], a


def test_shift_riding_on_a_better_segment_is_that_segments() -> None:
    """kind=y's rows shift only where they are in seg=B: seg B holds the whole change, kind=y
    half of it; kind=y's shift is gone once seg=B's rows leave."""
    rng = np.random.default_rng(1)
    mon = Monitor(["seg", "kind"], ["f"], clock=None, window_panes=1)
    mon.set_reference(_rows(6000, rng, share_y_in_a=0.5, shift_b=0.0, t0=T0 - 3600))
    mon.ingest(_rows(6000, rng, share_y_in_a=0.5, shift_b=1.5, t0=T0))
    report = mon.conditional_shift(columns=["f"],
                                   segments=[{"seg": "B"}, {"kind": "y"}, {"kind": "x"}])
    assert (report[0]["seg"], report[0]["localized"]) == ("B", True)
    riders = [r for r in report if r["kind"] is not None and r["drifted"]]
    assert riders and all(r["explained_by"] == "seg=B" and not r["localized"] for r in riders)


def test_mix_weights_give_the_reference_the_windows_mix() -> None:
    cur = np.array([0, 0, 0, 1])  # 75% / 25%
    ref = np.array([0, 1, 1, 1, 2])  # 20% / 60% / 20%; value 2 absent from the window
    w = mix_weights(cur, np.ones(4), ref, np.ones(5))
    assert w[4] == 0.0  # the window holds no row of value 2
    assert w[0] / w[1:4].sum() == pytest.approx(3.0)  # 75% / 25%, as in the window
