"""Every hostile body is a 4xx naming what is wrong, at the parser (no Ray): huge integer
literals, integers beyond int64 or float, deep nesting, lone UTF-16 surrogates anywhere, too
many or too long request attributes. The same bodies over HTTP: tests/serving/launch/test_api.py."""

from __future__ import annotations

import json

import pytest

from serving.core.schema import ColumnSpec, PredictRequest, RequestError, RowSchema, parse_request

SCHEMA = RowSchema([ColumnSpec("x", "number", False, "float64"), ColumnSpec("n", "integer", False, "int64"),
                    ColumnSpec("s", "string", False, "object")])
ROW = '"x": 1.5, "n": 2, "s": "ok"'


@pytest.mark.parametrize(("body", "status", "field"), [
    ('{"rows": [{"x": ' + "9" * 5000 + ', "n": 2, "s": "ok"}]}', 400, None),
    ('{"rows": [{"x": 1' + "0" * 400 + ', "n": 2, "s": "ok"}]}', 422, "rows[0].x"),
    ('{"rows": [{"x": 1.5, "n": 9223372036854775808, "s": "ok"}]}', 422, "rows[0].n"),
    ('{"rows": [{"x": 1.5, "n": -9223372036854775809, "s": "ok"}]}', 422, "rows[0].n"),
    ('{"rows": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, None),
    ('{"rows": [{' + ROW + '}], "attributes": {"src": "\\ud800"}}', 422, "body.attributes.src"),
    ('{"rows": [{"x": 1.5, "n": 2, "s": "a\\udfffb"}]}', 422, "body.rows[0].s"),
    ('{"rows": [{' + ROW + ', "\\ud800": 1}]}', 422, "body.rows[0]"),
    ('{"rows": [{' + ROW + '}], "attributes": ' + json.dumps({f"k{i}": 1 for i in range(33)}) + "}", 422,
     "attributes"),
    ('{"rows": [{' + ROW + '}], "attributes": {"src": "' + "x" * 257 + '"}}', 422, "attributes.src"),
    ('{"rows": [{' + ROW + '}], "attributes": {"' + "k" * 65 + '": 1}}', 422, "attributes"),
], ids=["huge-literal", "beyond-float", "int64-over", "int64-under", "deep-nesting", "surrogate-attribute",
        "surrogate-value", "surrogate-key", "too-many-attributes", "long-attribute", "long-attribute-name"])
def test_a_hostile_body_is_a_4xx_naming_the_field(body, status, field):
    with pytest.raises(RequestError) as caught:
        parse_request(body.encode(), PredictRequest, SCHEMA)
    assert caught.value.status == status, caught.value.message
    json.dumps(caught.value.body()).encode("utf-8")  # the answer itself is sendable text
    if field is not None:
        assert any(f["field"].startswith(field) for f in caught.value.fields), caught.value.fields


def test_what_stays_accepted():
    """A surrogate pair is one ordinary character; int64's own bounds and long floats pass."""
    body = ('{"rows": [{"x": 1e300, "n": 9223372036854775807, "s": "\\ud83d\\ude00"}], '
            '"attributes": {"src": "' + "x" * 256 + '"}}')
    parsed, frame = parse_request(body.encode(), PredictRequest, SCHEMA)
    assert frame["s"][0] == "\U0001F600" and frame["n"][0] == 2**63 - 1 and parsed.attributes["src"] == "x" * 256
