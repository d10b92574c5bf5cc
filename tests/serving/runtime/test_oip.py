"""The Open Inference Protocol v2 translation (serving.runtime.oip), in this process: a body of
one tensor per column becomes the same checked frame as the native body, every mistake is a 4xx
naming its field in the protocol's terms, and the answer carries the outputs asked for."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from serving.core.schema import RequestError, RowSchema
from serving.runtime.oip import (
    OUTPUTS,
    InferRequest,
    check_model,
    infer_answer,
    metadata,
    parse_infer,
)

SAMPLE = pd.DataFrame({"a": [0.5, 1.0], "n": [1, 2], "s": ["x", "y"], "t": [True, False]})
SCHEMA = RowSchema.from_sample(SAMPLE, ["a", "n", "s", "t"])


def _body(**over) -> bytes:
    body = {"id": "r1", "inputs": [
        {"name": "a", "shape": [3], "datatype": "FP64", "data": [0.1, 0.2, 0.3]},
        {"name": "n", "shape": [3, 1], "datatype": "INT64", "data": [[1], [2], [3]]},
        {"name": "s", "shape": [3], "datatype": "BYTES", "data": ["p", "q", "r"]},
        {"name": "t", "shape": [3], "datatype": "BOOL", "data": [True, False, True]}]}
    body.update(over)
    return json.dumps(body).encode()


def _error(body: bytes) -> tuple[int, list[str]]:
    with pytest.raises(RequestError) as info:
        parse_infer(body, SCHEMA, 100)
    return info.value.status, [f["field"] for f in info.value.fields]


def test_columns_become_the_frame_the_native_body_gives():
    parsed = parse_infer(_body(parameters={"attributes": {"region": "eu"}}), SCHEMA, 100)
    native = SCHEMA.to_frame([{"a": 0.1, "n": 1, "s": "p", "t": True}, {"a": 0.2, "n": 2, "s": "q", "t": False},
                              {"a": 0.3, "n": 3, "s": "r", "t": True}])
    pd.testing.assert_frame_equal(parsed.frame, native)
    assert parsed.id == "r1" and parsed.attributes == {"region": "eu"} and parsed.outputs == OUTPUTS
    assert parse_infer(_body(outputs=[{"name": "probabilities"}]), SCHEMA, 100).outputs == ("probabilities",)


@pytest.mark.parametrize("change, status, field", [
    (lambda b: b.pop("inputs"), 422, "inputs"),
    (lambda b: b["inputs"].pop(1), 422, "inputs"),                                   # a column missing
    (lambda b: b["inputs"].append({**b["inputs"][0], "name": "zz"}), 422, "inputs[4].name"),
    (lambda b: b["inputs"].append(dict(b["inputs"][0])), 422, "inputs[4].name"),    # sent twice
    (lambda b: b["inputs"][0].update(datatype="BYTES"), 422, "inputs[0].datatype"),
    (lambda b: b["inputs"][1].update(datatype="FP32"), 422, "inputs[1].datatype"),   # an integer column
    (lambda b: b["inputs"][0].update(shape=[3, 2]), 422, "inputs[0].shape"),
    (lambda b: b["inputs"][0].update(shape=[4]), 422, "inputs[0].data"),
    (lambda b: b["inputs"][0].update(data=[0.1, "x", 0.3]), 422, "inputs[0].data[1]"),
    (lambda b: b["inputs"][2].update(data=["p", None, "r"]), 422, "inputs[2].data[1]"),
    (lambda b: b["inputs"][0].update(bogus=1), 422, "inputs[0].bogus"),
    (lambda b: b.update(inputs=[{**t, "shape": [2], "data": t["data"][:2]} for t in b["inputs"][:3]]
                        + b["inputs"][3:]), 422, "inputs"),                          # 2 rows and 3
    (lambda b: b.update(outputs=[{"name": "everything"}]), 422, "outputs[0].name"),
    (lambda b: b.update(id=7), 422, "id"),
    (lambda b: b.update(extra=1), 422, "extra"),
    (lambda b: b.update(parameters={"attributes": {"region": "x" * 10_000}}), 422, "parameters.attributes.region"),
])
def test_every_mistake_names_its_field(change, status, field):
    body = json.loads(_body())
    change(body)
    got, fields = _error(json.dumps(body).encode())
    assert got == status and any(f == field or f.startswith(field + ".") for f in fields), (got, fields)


def test_too_many_rows_empty_and_not_json():
    body = json.loads(_body())
    assert _error(b"not json")[0] == 400
    with pytest.raises(RequestError) as info:
        parse_infer(json.dumps(body).encode(), SCHEMA, 2)
    assert info.value.status == 413
    empty = {"inputs": [{**t, "shape": [0], "data": []} for t in body["inputs"]]}
    assert _error(json.dumps(empty).encode())[0] == 422


def test_the_answer_and_the_metadata():
    request = InferRequest(pd.DataFrame(), None, "r1", ("predictions", "probabilities"))
    proba = np.array([[0.8, 0.2], [0.3, 0.7]])
    out = json.loads(infer_answer("m", "v1", request, np.array(["neg", "pos"]), proba, np.array([0, 1]),
                                  np.array([False, False]), {"gear": 0, "full_pipeline": False}))
    assert out["model_name"] == "m" and out["model_version"] == "v1" and out["id"] == "r1"
    assert out["outputs"] == [{"name": "predictions", "datatype": "BYTES", "shape": [2], "data": ["neg", "pos"]},
                              {"name": "probabilities", "datatype": "FP64", "shape": [2, 2],
                               "data": [0.8, 0.2, 0.3, 0.7]}]
    assert out["parameters"] == {"gear": 0, "full_pipeline": False}
    ints = json.loads(infer_answer("m", "v1", InferRequest(pd.DataFrame(), None, None, ("predictions",)),
                                   np.array([0, 1]), proba, np.array([0, 1]), np.array([False, True]), {}))
    assert ints["outputs"][0]["datatype"] == "INT64" and ints["outputs"][0]["data"] == [0, 1] and "id" not in ints
    boxed = json.loads(infer_answer("m", "v1", InferRequest(pd.DataFrame(), None, None, ("predictions",)),
                                    np.array([0, 1], dtype=object), proba, np.array([0, 1]), np.zeros(2, bool), {}))
    assert boxed["outputs"][0] == {"name": "predictions", "datatype": "INT64", "shape": [2], "data": [0, 1]}
    meta = metadata("m", "v1", SCHEMA, np.array(["neg", "pos"]))
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("a", "FP64"), ("n", "INT64"), ("s", "BYTES"),
                                                                    ("t", "BOOL")]
    assert meta["outputs"][1] == {"name": "probabilities", "datatype": "FP64", "shape": [-1, 2]}
    check_model("m", "m")
    with pytest.raises(RequestError) as info:
        check_model("other", "m")
    assert info.value.status == 404
