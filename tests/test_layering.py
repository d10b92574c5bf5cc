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


#: serving's wings, each with the wings it may import (its own always). Read as floors: a wing
#: imports only wings below it, so no arrow runs back up. partition and core are the ground.
WINGS = {
    "core": set(),
    "partition": set(),
    "runtime": {"core"},
    "planning": {"core"},
    "model_app": {"core", "partition", "runtime"},
    "measure": {"core", "runtime", "planning"},
    "emulation": {"core", "runtime", "planning", "measure"},
    "launch": {"core", "runtime", "planning", "measure", "partition", "model_app"},
}


def serving_imports(path: Path) -> set[str]:
    """Every serving module (dotted) that ``path`` imports, lazy imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("serving"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from serving.x import module`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("serving"))
    modules = {_module_name(p) for p in (REPO_ROOT / "serving").rglob("*.py")}
    return {m for m in found if m in modules and m != "serving"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in WINGS) else None


def test_serving_wings_import_only_the_wings_below_them():
    offenders = {}
    for path in sorted((REPO_ROOT / "serving").rglob("*.py")):
        wing = _wing(_module_name(path))
        if wing is None:
            continue  # serving/__init__.py, cli.py, graph.py: the face, above every wing
        assert wing in WINGS, f"{path}: a wing this test does not know ({wing}); add it to WINGS"
        bad = sorted(m for m in serving_imports(path) if _wing(m) not in WINGS[wing] | {wing})
        if bad:
            offenders[str(path.relative_to(REPO_ROOT))] = bad
    assert not offenders, offenders


def test_no_import_loop_inside_serving():
    graph = {_module_name(p): serving_imports(p) for p in (REPO_ROOT / "serving").rglob("*.py")}
    for m in graph:  # a package's face imports its modules; count a module's arrows, not its face's
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".") and d != m}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import loop: " + " -> ".join([*path[path.index(dep):], dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_request_path_visits_no_planning_module():
    """From the ingress to the answer (the runtime wing and what it imports, transitively)."""
    graph = {_module_name(p): serving_imports(p) for p in (REPO_ROOT / "serving").rglob("*.py")}
    seen, todo = set(), ["serving.runtime.ingress", "serving.runtime.replicas"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    assert not sorted(m for m in seen if _wing(m) in ("planning", "measure", "launch", "emulation")), seen


def test_a_replica_imports_none_of_the_optimizer():
    """What an ingress or stage replica imports before it answers (every cold start pays it):
    ``willump``'s public names load on first use, so the optimizer's modules (its phases, model
    selection, the scikit-learn adapter) stay out; they cost 0.2 s of the ingress's 1.6 s."""
    import subprocess
    import sys

    code = ("import sys, serving.runtime.ingress, serving.runtime.replicas; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('willump._optimize', 'willump._sklearn', "
            "'willump._split', 'sklearn.model_selection')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"a replica imports the optimizer: {out.stdout}"


def test_every_public_willump_name_resolves():
    """``willump``'s public names load on first use (``willump._LAZY``): every name in
    ``__all__`` is importable and is either loaded lazily or defined in the package itself."""
    import willump

    eager = {"ArtifactError", "PipelineError", "WillumpError", "WillumpWarning", "__version__"}
    assert set(willump.__all__) == set(willump._LAZY) | eager
    for name in willump.__all__:
        assert getattr(willump, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        willump.nothing  # noqa: B018
