"""drift.LabelJoin: served rows wait for labels within a retention window and a row bound;
labels are accepted, duplicates and unknowns counted, bad bodies refused naming the field;
accuracy per gear and segment with an anytime-valid interval, the certified floor, and the
label-free (CBPE) estimate; everything survives a restart with the file."""

from __future__ import annotations

import numpy as np
import pytest

from drift import LabelError, LabelJoin


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _join(path=None, clock=None, **kw) -> LabelJoin:
    return LabelJoin(path, ["neg", "pos"], certified=[{"max_loss": 0.02, "baseline_score": 0.9}],
                     segments=["client"], clock=clock or Clock(), **kw)


def _serve(join: LabelJoin, rid: str, served: list[int], client: str = "a", conf: float = 0.8, gear=None) -> None:
    n = len(served)
    join.served([rid] * n, list(range(n)), served, gear, np.full(n, conf), {"client": [client] * n})


def _label(rid: str, row: int, label) -> dict:
    return {"request_id": rid, "row": row, "label": label}


def test_labels_are_accepted_counted_and_give_accuracy_per_segment():
    join = _join()
    _serve(join, "r1", [0, 1, 0, 1], client="a")
    _serve(join, "r2", [1, 1], client="b", conf=0.6)
    out = join.label({"labels": [_label("r1", 0, "neg"), _label("r1", 1, "neg"), _label("r1", 0, "pos"),
                                 _label("nope", 0, "neg"), _label("r2", 5, "neg"), _label("r2", 0, "pos")]})
    assert out == {"accepted": 3, "unknown": 2, "duplicate": 1}
    report = join.report("client")
    gear = report["gears"][0]
    assert (gear["served_rows"], gear["labelled_rows"]) == (6, 3)
    assert gear["accuracy"] == pytest.approx(2 / 3)
    assert gear["accuracy_lower"] < 2 / 3 < gear["accuracy_upper"]
    assert gear["certified_bound"] == {"max_loss": 0.02, "baseline_score": 0.9, "floor": pytest.approx(0.88)}
    assert gear["estimate_without_labels"] == pytest.approx((4 * 0.8 + 2 * 0.6) / 6)
    lo, hi = gear["estimate_interval"]
    assert lo < gear["estimate_without_labels"] < hi
    segments = {s["value"]: s for s in gear["segments"]}
    assert segments["a"]["labelled_rows"] == 2 and segments["b"]["labelled_rows"] == 1
    assert (report["accepted"], report["unknown"], report["duplicate"]) == (3, 2, 1)


def test_labels_name_classes_by_value_as_json_sends_them():
    join = LabelJoin(None, [0, 1], clock=Clock())
    join.served(["r"] * 3, [0, 1, 2], [0, 1, 1], None, np.full(3, 0.9))
    assert join.label({"labels": [_label("r", 0, 0), _label("r", 1, 1.0), _label("r", 2, "1")]})["accepted"] == 3
    assert join.report()["gears"][0]["accuracy"] == 1.0


def test_a_served_accuracy_below_the_certified_floor_is_flagged():
    join = _join()
    served = [0] * 2000
    _serve(join, "big", served)
    join.label({"labels": [_label("big", i, "pos" if i % 5 == 0 else "neg") for i in range(2000)]})  # 80% right
    gear = join.report()["gears"][0]
    assert gear["accuracy"] == pytest.approx(0.8) and gear["accuracy_upper"] < 0.88 and gear["below_certified"]


@pytest.mark.parametrize(("body", "field"), [
    ([], "body"), ({"labels": []}, "labels"), ({"labels": "x"}, "labels"), ({"labels": [1]}, "labels[0]"),
    ({"labels": [], "extra": 1}, "body"),
    ({"labels": [{"request_id": "r", "row": 0}]}, "labels[0]"),
    ({"labels": [_label("bad id!", 0, "neg")]}, "labels[0].request_id"),
    ({"labels": [_label("r", -1, "neg")]}, "labels[0].row"),
    ({"labels": [_label("r", True, "neg")]}, "labels[0].row"),
    ({"labels": [_label("r", 1.5, "neg")]}, "labels[0].row"),
    ({"labels": [_label("r", 0, "maybe")]}, "labels[0].label"),
    ({"labels": [_label("r", 0, "neg")] * 10_001}, "labels"),
])
def test_bad_bodies_name_the_field_and_change_nothing(body, field):
    join = _join()
    _serve(join, "r", [0])
    with pytest.raises(LabelError) as err:
        join.label(body)
    assert err.value.field == field
    assert join.report()["accepted"] == 0 and join.report()["gears"][0]["labelled_rows"] == 0


def test_rows_past_the_retention_window_or_the_row_bound_are_dropped_and_counted():
    clock = Clock()
    join = _join(clock=clock, retention_s=100.0, max_rows=50)
    _serve(join, "old", [0] * 10)
    clock.t += 200.0
    _serve(join, "new", [0] * 10)
    assert join.report()["expired_rows"] == 10 and join.report()["waiting_rows"] == 10
    assert join.label({"labels": [_label("old", 0, "neg"), _label("new", 0, "neg")]}) == {
        "accepted": 1, "unknown": 1, "duplicate": 0}
    _serve(join, "flood", [0] * 60)
    assert join.report()["waiting_rows"] == 50  # the oldest went first
    assert join.report()["gears"][0]["labelled_rows"] == 1  # what labels taught outlives the rows


def test_everything_survives_a_restart_with_the_file(tmp_path):
    path = tmp_path / "labels.sqlite"
    join = _join(path)
    _serve(join, "r1", [0, 1], gear=[0, 1])
    join.label({"labels": [_label("r1", 0, "neg")]})
    join.close()
    again = _join(path)
    assert again.label({"labels": [_label("r1", 0, "neg"), _label("r1", 1, "pos")]}) == {
        "accepted": 1, "unknown": 0, "duplicate": 1}
    report = again.report()
    assert [g["gear"] for g in report["gears"]] == [0, 1] and report["labelled_rows"] == 2
    assert report["gears"][1]["certified_bound"]["floor"] is None  # no certificate given for gear 1
    again.close()


def test_arguments_are_checked():
    for kwargs, word in (({"confidence": 1.0}, "confidence"), ({"retention_s": 0}, "retention_s"),
                         ({"max_rows": 0}, "max_rows")):
        with pytest.raises(ValueError, match=word):
            LabelJoin(None, ["a"], **kwargs)
    with pytest.raises(ValueError, match="classes"):
        LabelJoin(None, [])
    with pytest.raises(ValueError, match="segment"):
        _join().report("nosuch")


def test_the_estimate_reads_confidence_through_the_certification_rows_map():
    """With a gear's calibration map (willump's Gear.calibration), the label-free estimate is
    the mean mapped confidence: an under-confident level reads as the accuracy it has."""
    cal = {"x": [0.5, 0.7, 0.9], "y": [0.6, 0.9, 0.99]}
    join = LabelJoin(None, ["neg", "pos"], clock=Clock(), calibration=[cal, None])
    join.served(["r"] * 4, [0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 1, 1], [0.7, 0.9, 0.7, 0.9])
    gears = {g["gear"]: g for g in join.report()["gears"]}
    assert gears[0]["estimate_without_labels"] == pytest.approx((0.9 + 0.99) / 2) and gears[0]["estimate_calibrated"]
    assert gears[1]["estimate_without_labels"] == pytest.approx(0.8) and not gears[1]["estimate_calibrated"]


def test_the_estimates_interval_carries_the_maps_own_error():
    """The map was fitted on its certification rows: however many rows are served, the estimate
    is no surer than those rows make it (a(1-a)/rows), where the outcomes' noise alone shrinks."""
    n = 50_000
    cal = {"x": [0.5, 0.9], "y": [0.5, 0.9], "rows": 1_000}
    joins = [LabelJoin(None, ["neg", "pos"], clock=Clock(), calibration=[c]) for c in (cal, {**cal, "rows": None})]
    for join in joins:
        join.served([f"r{i}" for i in range(n)], [0] * n, [1] * n, [0] * n, [0.9] * n)
    with_map, without = (j.report()["gears"][0]["estimate_interval"] for j in joins)
    half = (with_map[1] - with_map[0]) / 2
    assert half == pytest.approx(1.959964 * np.sqrt(0.9 * 0.1 / n + 0.9 * 0.1 / 1_000), rel=1e-3)
    assert (without[1] - without[0]) / 2 == pytest.approx(1.959964 * np.sqrt(0.9 * 0.1 / n), rel=1e-3)


def test_what_the_labels_review_found_is_refused_counted_once_or_bounded():
    """A row index past SQLite's integers is the client's mistake (422, not 500); a confidence
    that is not a number keeps its batch (SQLite refused the whole batch: every row then lost for
    labels); a batch served again is counted once; a label past the retention window is unknown
    though no sweep ran since; the clients' segment values past the bound share one count."""
    clock = Clock()
    join = _join(clock=clock, retention_s=60.0, max_segment_values=3)
    with pytest.raises(LabelError) as refused:
        join.parse({"labels": [_label("r", 2**63, "neg")]})
    assert refused.value.field == "labels[0].row"
    join.served(["n"] * 2, [0, 1], [0, 1], None, np.array([np.nan, 0.7]), {"client": ["a", "a"]})
    assert join.label({"labels": [_label("n", 0, "neg")]})["accepted"] == 1
    gear = join.report()["gears"][0]
    assert gear["served_rows"] == 2 and gear["estimate_without_labels"] == pytest.approx(0.35)
    _serve(join, "twice", [0, 1, 0])
    _serve(join, "twice", [0, 1, 0])  # sent again: a restart forgot the batch's id
    join.served([None] * 2, [0, 1], [0, 0], None, np.full(2, 0.9), repeat=True)  # seen before, no ids
    assert join.report()["gears"][0]["served_rows"] == 5 and join.report()["repeated_rows"] == 3
    clock.t += 61.0  # past the window, and less than a sweep's period since the last
    assert join.label({"labels": [_label("twice", 1, "pos")]}) == {"accepted": 0, "unknown": 1, "duplicate": 0}
    for i in range(6):
        _serve(join, f"c{i}", [0], client=f"client-{i}")
    values = {s["value"] for s in join.report("client")["gears"][0]["segments"]}
    assert "<other>" in values and len(values - {"<other>"}) == 3
    join.close()


def test_rows_the_full_pipeline_answered_are_reported_apart_from_the_gears():
    """While the alarm holds a gear the full pipeline answers its rows, recorded under gear -1
    (serving.runtime.records.FULL_PIPELINE_GEAR): their labels do not count as the gear's own."""
    join = _join()
    join.served(["g"] * 2, [0, 1], [0, 0], np.array([0, 0]), np.full(2, 0.9))
    join.served(["f"] * 2, [0, 1], [1, 1], np.array([-1, -1]), np.full(2, 0.9))
    join.label({"labels": [_label("g", 0, "neg"), _label("f", 0, "pos"), _label("f", 1, "pos")]})
    gears = {g["gear"]: g for g in join.report()["gears"]}
    assert gears[0]["labelled_rows"] == 1 and gears[-1]["labelled_rows"] == 2
    assert gears[-1]["certified_bound"]["floor"] is None and not gears[-1]["estimate_calibrated"]
    join.close()

