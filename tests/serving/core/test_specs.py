"""The typed specs at serving's edge: an app spec from a Serve config file is validated once,
and a misspelt, missing or out-of-range field is refused by name; the ingress config's JSON
form is what /plan, /report and the dashboard read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serving.core.specs import AppSpec, IngressConfig
from serving.launch.graph import app_spec

SPEC = {"name": "toxic", "artifact": {"version": "v1", "path": "/a"}, "plan": {"layout": "staged"}}


def test_a_spec_from_a_config_file_is_validated_with_its_defaults():
    spec = app_spec(dict(SPEC))
    assert isinstance(spec, AppSpec) and spec.runtime == "native" and spec.max_rows == 10_000
    assert app_spec(spec) is spec  # validated once
    assert AppSpec.model_validate(spec.model_dump()) == spec  # what `willump build` writes reads back


@pytest.mark.parametrize(("change", "field"), [
    ({"max_rowz": 5}, "max_rowz"),                 # a typo is not silently ignored
    ({"runtime": "tensorrt"}, "runtime"),
    ({"max_rows": 0}, "max_rows"),
    ({"deadline_ms": -1}, "deadline_ms"),
    ({"name": ""}, "name"),
])
def test_a_bad_field_is_refused_by_name(change, field):
    with pytest.raises(ValidationError, match=field):
        app_spec({**SPEC, **change})


def test_a_missing_field_is_refused_by_name():
    with pytest.raises(ValidationError, match="plan"):
        app_spec({k: v for k, v in SPEC.items() if k != "plan"})


def test_the_ingress_config_json_form():
    config = IngressConfig(name="a", model_version="v", classes=[0, 1], levels=[["g"]], stages=["model"],
                           row_schema={"columns": []}, deadline_s=1.0, max_in_flight=8)
    info = config.info()
    assert info["schema"] == {"columns": []} and "row_schema" not in info and info["layout"] == "staged"
    with pytest.raises(ValidationError, match="deadline_s"):
        IngressConfig(**{**config.model_dump(), "deadline_s": 0})


def test_configs_written_before_the_wings_still_import():
    """A Serve config from an earlier `willump build` names serving.graph:app_builder."""
    import serving.graph
    import serving.launch.graph

    assert serving.graph.app_builder is serving.launch.graph.app_builder
    assert serving.graph.monitor_builder is serving.launch.graph.monitor_builder
