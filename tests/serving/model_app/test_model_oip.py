"""The torch-model app's Open Inference Protocol parsing and answers, without Ray: tensors by
name in the forward's order, each datatype and shape checked against the example's, the same
arrays as the native body, and every bad request a 4xx naming its field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.model_app.inputs import BadInput, InputSpec, parse_inputs
from serving.model_app.oip import (
    declared_datatype,
    infer_answer,
    infer_inputs,
    metadata,
    output_specs,
)

IDS, MASK = InputSpec((4,), "int64"), InputSpec((4,), "int64")
X = InputSpec((3,), "float32")


def _tensor(name, shape, datatype, data):
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def test_tensors_become_the_native_bodys_arrays_in_the_forwards_order():
    ids = np.arange(8).reshape(2, 4)
    mask = np.ones((2, 4), dtype=int)
    body = {"id": "r1", "inputs": [_tensor("input__1", [2, 4], "INT64", mask.ravel().tolist()),
                                   _tensor("input__0", [2, 4], "INT32", ids.tolist())]}  # nested data too
    native, rid = infer_inputs(body, [IDS, MASK])
    assert rid == "r1"
    got = parse_inputs(native, [IDS, MASK], 100)
    want = parse_inputs({"inputs": [ids.tolist(), mask.tolist()]}, [IDS, MASK], 100)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    one, _ = infer_inputs({"inputs": [_tensor("input__0", [2, 3], "FP32", [0.5] * 6)]}, [X])
    assert parse_inputs(one, [X], 100)[0].shape == (2, 3)


@pytest.mark.parametrize(("body", "field", "text"), [
    ([1], "body", "JSON object"),
    ({"inputs": []}, "inputs", "non-empty"),
    ({"inputs": [], "extra": 1}, "extra", "unknown field"),
    ({"id": 3, "inputs": []}, "id", "string"),
    ({"inputs": [5]}, "inputs[0]", "object"),
    ({"inputs": [_tensor("x", [1, 3], "FP32", [1, 2, 3])]}, "inputs[0].name", "input__0"),
    ({"inputs": [_tensor("input__0", [1, 3], "BYTES", ["a", "b", "c"])]}, "inputs[0].datatype", "FP32"),
    ({"inputs": [_tensor("input__0", [1, 4], "FP32", [1, 2, 3, 4])]}, "inputs[0].shape", "expected [n, 3]"),
    ({"inputs": [_tensor("input__0", "1x3", "FP32", [1, 2, 3])]}, "inputs[0].shape", "list of sizes"),
    ({"inputs": [_tensor("input__0", [2, 3], "FP32", [1, 2, 3])]}, "inputs[0].data", "needs 6"),
    ({"inputs": [_tensor("input__0", [1, 3], "FP32", ["a", "b", "c"])]}, "inputs[0].data", "numbers"),
    ({"inputs": [{**_tensor("input__0", [1, 3], "FP32", [1, 2, 3]), "extra": 1}]}, "inputs[0].extra", "not a field"),
    ({"inputs": [_tensor("input__0", [1, 3], "FP32", [1, 2, 3])] * 2}, "inputs[1].name", "twice"),
])
def test_a_bad_infer_request_names_its_field(body, field, text):
    with pytest.raises(BadInput) as err:
        infer_inputs(body, [X])
    assert err.value.status == 422 and err.value.field == field and text in err.value.message
    assert err.value.body()["fields"][0]["field"] == field


def test_integers_keep_their_value_and_a_wrong_kind_of_data_is_named():
    big = 2**60 + 1  # beyond float64's integers
    native, _ = infer_inputs({"inputs": [_tensor("input__0", [1, 4], "INT64", [big, 1, 2, 3]),
                                         _tensor("input__1", [1, 4], "INT64", [1, 1, 1, 1])]}, [IDS, MASK])
    assert parse_inputs(native, [IDS, MASK], 10)[0][0, 0] == big
    for datatype, data in (("INT64", [1.5, 1, 1, 1]), ("INT32", ["1", "2", "3", "4"])):
        with pytest.raises(BadInput, match=f"numbers of {datatype}"):
            infer_inputs({"inputs": [_tensor("input__0", [1, 4], datatype, data)]}, [IDS])


def test_a_missing_input_is_named_and_integer_arguments_refuse_floats():
    with pytest.raises(BadInput, match=r"missing input\(s\) \['input__1'\]"):
        infer_inputs({"inputs": [_tensor("input__0", [1, 4], "INT64", [1, 2, 3, 4])]}, [IDS, MASK])
    with pytest.raises(BadInput, match="datatype"):
        infer_inputs({"inputs": [_tensor("input__0", [1, 4], "FP32", [1, 2, 3, 4]),
                                 _tensor("input__1", [1, 4], "INT64", [1, 1, 1, 1])]}, [IDS, MASK])


def test_answers_and_metadata_name_every_output_with_its_datatype_and_shape():
    net = torch.nn.Linear(3, 2).eval()
    outputs = output_specs(net, torch.zeros(1, 3))
    assert outputs == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 2]}]
    meta = metadata("m", [X], outputs)
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 3]}]
    out = (np.array([[1.0, np.nan], [np.inf, 2.0]], dtype=np.float32), np.array([1, 0]))
    answer = infer_answer("m", out, "r7")
    assert answer["id"] == "r7" and answer["model_name"] == "m"
    assert answer["outputs"][0] == {"name": "output__0", "shape": [2, 2], "datatype": "FP32",
                                    "data": [1.0, None, None, 2.0]}
    assert answer["outputs"][1]["datatype"] == "INT64" and answer["outputs"][1]["data"] == [1, 0]
    assert [declared_datatype(t) for t in ("float64", "torch.float16", "uint8", "bool", "bfloat16")] == [
        "FP64", "FP16", "UINT8", "BOOL", "FP32"]
