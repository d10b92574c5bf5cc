"""The request path's fast parse (serving.core.schema): msgspec's decode and the column-at-a-time
frame give exactly what json and the per-value checks give, and anything unusual falls back to
those checks, so every error answer stays as it was (tests/serving/core/test_hostile_bodies.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from serving.core.schema import (
    ColumnSpec,
    PredictRequest,
    RowSchema,
    parse_json,
    parse_request,
    predict_answer,
)


class Checked(RowSchema):
    """The same schema with the fast path switched off: the per-value checks build the frame."""

    def _fast_frame(self, rows, required=None):
        return None


SPECS = [ColumnSpec("x", "number", False, "float64"), ColumnSpec("xn", "number", True, "float64"),
         ColumnSpec("n", "integer", False, "int64"), ColumnSpec("u", "integer", False, "uint8"),
         ColumnSpec("nn", "integer", True, "float64"), ColumnSpec("s", "string", False, "str"),
         ColumnSpec("so", "string", True, "object"), ColumnSpec("b", "boolean", False, "bool"),
         ColumnSpec("bn", "boolean", True, "boolean")]


def _rows(seed: int, n: int = 17) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": float(rng.normal()) if i % 3 else int(rng.integers(-5, 5)), "xn": float(rng.normal()),
             "n": int(rng.integers(-2**62, 2**62)), "u": int(rng.integers(0, 256)),
             "nn": int(rng.integers(-10, 10)), "s": f"tweet {i} \u00e9\U0001F600", "so": str(rng.integers(9)),
             "b": bool(rng.integers(2)), "bn": bool(rng.integers(2))} for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_the_fast_frame_equals_the_checked_one(seed):
    rows = _rows(seed)
    fast = RowSchema(SPECS)._fast_frame(rows)
    assert fast is not None
    pd.testing.assert_frame_equal(fast, Checked(SPECS).to_frame(rows))


@pytest.mark.parametrize(("column", "value"), [
    ("x", None), ("x", float("nan")), ("x", 2**63), ("x", True), ("n", 1.0), ("n", 2**63), ("u", 256), ("u", -1),
    ("nn", None), ("nn", 2**63), ("s", 3), ("so", None), ("b", 1), ("bn", None), ("xn", None)])
def test_anything_unusual_takes_the_checked_path_and_gets_its_answer(column, value):
    """A null, NaN, an out-of-range integer, a value of another type: the fast path declines, and
    the per-value checks accept it (a null where allowed, 1.0 as an integer) or name the field."""
    rows = _rows(0, 4)
    rows[2][column] = value
    assert RowSchema(SPECS)._fast_frame(rows) is None
    try:
        expected = Checked(SPECS).to_frame(rows)
    except Exception as exc:  # the per-value checks refuse it: to_frame must say the same
        with pytest.raises(type(exc)) as caught:
            RowSchema(SPECS).to_frame(rows)
        assert caught.value.fields == exc.fields and caught.value.fields[0]["field"] == f"rows[2].{column}"
    else:
        pd.testing.assert_frame_equal(RowSchema(SPECS).to_frame(rows), expected)


def test_missing_unknown_and_optional_columns_take_the_checked_path():
    schema = RowSchema([ColumnSpec("x", "number", False, "float64")], optional=["note"])
    assert schema._fast_frame([{"x": 1.0, "note": "a"}]) is None
    frame = schema.to_frame([{"x": 1.0, "note": "a"}, {"x": 2.0}])
    assert list(frame.columns) == ["x", "note"] and frame["note"].tolist()[0] == "a"
    for bad in ([{}], [{"x": 1.0, "y": 2}]):
        assert schema._fast_frame(bad) is None


@pytest.mark.parametrize("body", [
    {"rows": [{"x": 0.1, "n": 2**64 - 1, "s": "\u00e9\U0001F600\\\"", "f": 1e-7, "g": 5e-324}],
     "attributes": {"a": True, "b": None, "c": -0.0}},
    {"rows": [{"x": 1e308, "n": -2**63}], "k": 3},
])
def test_msgspec_decodes_as_json_does(body):
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert parse_json(raw) == json.loads(raw)
    assert repr(parse_json(raw)) == repr(json.loads(raw))  # floats and ints alike, -0.0 kept


def test_a_toxic_body_parses_to_the_frame_the_pipeline_gets():
    schema = RowSchema([ColumnSpec("tweet", "string", False, "str")])
    rows = [{"tweet": f"@user that's #{i} \u2026 \U0001F602"} for i in range(32)]
    _, frame = parse_request(json.dumps({"rows": rows}).encode(), PredictRequest, schema)
    pd.testing.assert_frame_equal(frame, Checked(schema.columns).to_frame(rows))
    assert frame["tweet"].tolist() == [r["tweet"] for r in rows]


def test_the_answer_encodes_as_json_did():
    classes = np.asarray(["neg", "pos"], dtype=object)
    proba = np.array([[0.25, 0.75], [1 / 3, 2 / 3], [1.0, 0.0]])
    level, degraded = np.array([0, 1, 0]), np.array([False, True, False])
    body = predict_answer(classes, proba, level, degraded, "v\u00e9", {"gear": 1, "gear_max_loss": 0.01,
                                                                      "gear_loss_bound": None})
    expected = {"predictions": ["pos", "pos", "neg"], "probabilities": np.round(proba, 12).tolist(),
                "level": [0, 1, 0], "degraded": [False, True, False], "model_version": "v\u00e9", "gear": 1,
                "gear_max_loss": 0.01, "gear_loss_bound": None}
    assert json.loads(body) == expected
    with pytest.raises(ValueError, match="finite"):
        predict_answer(classes, np.array([[np.nan, 1.0]]), level[:1], degraded[:1], "v")
