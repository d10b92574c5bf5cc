"""Every ``ray.init`` in the project names its cluster. Without an address, Ray joins any
cluster whose processes it finds on the machine (a GCS, or a dead cluster's agents that still
carry ``--gcs-address`` for up to a minute): a test, a bench or ``willump serve`` would then
run on another process's Ray, refuse ``num_cpus``, or wait on a dead GCS."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("serving", "willump", "drift", "pipelines", "examples", "tests")


def _ray_init_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "init" and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"]


def test_every_ray_init_passes_an_address():
    unnamed = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for call in _ray_init_calls(path):
                if not any(k.arg == "address" for k in call.keywords) and not call.args:
                    unnamed.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not unnamed, f"ray.init without an address (use address='local' for a Ray of its own): {unnamed}"


def test_the_check_finds_a_call_without_an_address(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import ray\nray.init(num_cpus=2)\nray.init(address='local')\n")
    calls = _ray_init_calls(sample)
    assert [any(k.arg == "address" for k in c.keywords) for c in calls] == [False, True]
