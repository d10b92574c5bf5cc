"""The library stands on its own: no installed package imports the benchmarks, and the optimizer,
server and monitor do not import the workloads. Read from the code's own imports (AST), so a
lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

#: package -> top-level packages it must never import
FORBIDDEN = {
    "willump": {"benchmarks", "pipelines", "serving", "drift"},
    "drift": {"benchmarks", "pipelines", "serving"},
    "serving": {"benchmarks", "pipelines"},
    "pipelines": {"benchmarks"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_above_it(package):
    offenders = {str(p.relative_to(REPO_ROOT)): sorted(imported_roots(p) & FORBIDDEN[package])
                 for p in sorted((REPO_ROOT / package).rglob("*.py"))}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_benchmarks_are_not_installed():
    text = (REPO_ROOT / "pyproject.toml").read_text()
    include = text[text.index("[tool.setuptools.packages.find]"):].split("\n")[1]
    assert "benchmarks" not in include and "willump*" in include


def private_willump_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("willump._"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("willump._")]
    return found


@pytest.mark.parametrize("package", ["serving", "drift", "pipelines"])
def test_the_server_reaches_the_optimizer_through_its_public_seam(package):
    """willump.runtime (and willump's top level) is the seam: no private willump module."""
    offenders = {str(p.relative_to(REPO_ROOT)): private_willump_imports(p)
                 for p in sorted((REPO_ROOT / package).rglob("*.py"))}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


@pytest.mark.parametrize("package", ["willump", "serving", "drift", "pipelines", "benchmarks"])
def test_every_module_imports(package):
    """A move that leaves a relative import behind (pipelines.compare imported the benchmark it
    once sat beside) fails here, not in the example that happens to use it."""
    import importlib
    import pkgutil

    top = importlib.import_module(package)
    failed = {}
    for info in pkgutil.walk_packages(top.__path__, prefix=f"{package}."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed
