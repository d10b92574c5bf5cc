"""`willump recertify --config`: a Serve config `willump build` wrote, pointed at a re-certified
artifact (path and version of every willump application, nothing else), without Ray."""

from __future__ import annotations

import copy

import pytest

from serving.core.artifacts import path_version
from serving.launch.config import BUILDERS, retarget_config


def test_every_willump_application_and_only_it_serves_the_new_artifact(synth_opt, tmp_path):
    old, new = tmp_path / "old.willump", tmp_path / "new.willump"
    synth_opt.save(old)
    synth_opt.save(new)
    ref = {"version": path_version(old), "path": str(old), "holder": None}
    config = {"http_options": {"port": 8000}, "applications": [
        {"name": "a-monitor", "import_path": BUILDERS[1], "args": {"artifact": dict(ref), "name": "a"}},
        {"name": "a", "import_path": BUILDERS[0], "args": {"artifact": dict(ref), "name": "a"},
         "deployments": [{"name": "a-ingress", "user_config": {"deadline_ms": 500.0}}]},
        {"name": "other", "import_path": "mine:app", "args": {"artifact": "untouched"}},
    ]}
    before = copy.deepcopy(config)
    out, changed = retarget_config(config, new)
    assert changed == ["a-monitor", "a"] and config == before  # the given config is not modified
    for app in out["applications"][:2]:
        assert app["args"]["artifact"] == {"version": path_version(new), "path": str(new.resolve()), "holder": None}
    assert out["applications"][2] == before["applications"][2]
    assert out["applications"][1]["deployments"] == before["applications"][1]["deployments"]
    with pytest.raises(ValueError, match="no application"):
        retarget_config({"applications": [before["applications"][2]]}, new)
