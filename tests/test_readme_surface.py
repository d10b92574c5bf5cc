"""The README's install, command-line and HTTP sections say what the code does: every option
the README names exists on that command, every command and every required option is in the
README, its exit codes are the CLI's, every route it names is served and every route served is
in it, and the install paragraph names the core's dependencies and the extras pyproject.toml
declares. Read from the README, the argparse parsers and the app's own routes (no Ray)."""

from __future__ import annotations

import argparse
import re

import pytest

from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
#: the app's routes the README leaves out on purpose: the root redirects to /ui, and /docs
#: fetches its own script files from /docs/assets
UNDOCUMENTED_ROUTES = {("GET", "/"), ("GET", "/docs/assets/{}")}


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def first_cells(text: str) -> list[str]:
    """The first cell of each row of the section's tables (header and rule left out)."""
    cells = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("|")]
    return [c for c in cells if c and not set(c) <= set("-:") and c not in ("command", "route")]


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", text))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def parsers() -> dict[tuple[str, bool], argparse.ArgumentParser]:
    """(subcommand, torch-model form) -> its parser."""
    from serving.cli import build_parser
    from serving.model_app import cli as model_cli

    out = {(name, False): p for name, p in subcommands(build_parser()).items()}
    out.update({(name, True): p for name, p in subcommands(model_cli.build_parser()).items()})
    return out


def readme_commands() -> list[tuple[str, bool, str]]:
    """(subcommand, torch-model form, the README's synopsis) for each `willump ...` span of the
    command table."""
    found = []
    for cell in first_cells(section("Command line")):
        for span in code_spans(cell):
            words = span.split()
            if words[0] == "willump" and len(words) > 1:
                found.append((words[1], len(words) > 2 and words[2].endswith(".pt"), span))
    return found


def test_every_option_the_readme_names_exists_on_its_command():
    known = parsers()
    unknown = {}
    for name, model_form, span in readme_commands():
        parser = known.get((name, model_form))
        assert parser is not None, f"README names `willump {name}`{' (torch model)' * model_form}, which the CLI lacks"
        missing = sorted(options(span) - set(parser._option_string_actions))
        if missing:
            unknown[span] = missing
    assert not unknown, f"README options the CLI does not have: {unknown}"


def test_every_command_and_required_option_is_in_the_readme():
    named: dict[tuple[str, bool], set[str]] = {}
    for name, model_form, span in readme_commands():
        named.setdefault((name, model_form), set()).update(options(span))
    missing = sorted(f"willump {n}{' MODEL.pt' * m}" for n, m in parsers() if (n, m) not in named)
    assert not missing, f"commands the README's table leaves out: {missing}"
    required = {f"willump {n}{' MODEL.pt' * m}": [a.option_strings[0] for a in p._actions
                                                   if a.required and a.option_strings
                                                   and not set(a.option_strings) & named[(n, m)]]
                for (n, m), p in parsers().items()}
    required = {k: v for k, v in required.items() if v}
    assert not required, f"required options the README's synopsis leaves out: {required}"


def test_the_exit_codes_are_the_clis():
    from serving.cli import EXIT_ERROR, EXIT_NO_PLAN, EXIT_USAGE, build_parser
    from serving.cli_recertify import EXIT_NOT_CERTIFIED

    text = " ".join(section("Command line").split())
    for code, what in ((EXIT_ERROR, "an error"), (EXIT_USAGE, "a usage error"), (EXIT_NO_PLAN, "(`plan`) no plan"),
                       (EXIT_NOT_CERTIFIED, "(`recertify`) the plan does not hold")):
        assert f"{code} {what}" in text, f"the README's exit codes lack '{code} {what}'"
    epilog = build_parser().epilog
    for code in (EXIT_ERROR, EXIT_USAGE, EXIT_NO_PLAN, EXIT_NOT_CERTIFIED):
        assert f" {code} " in epilog, f"--help's exit codes lack {code}"


def served_routes() -> set[tuple[str, str]]:
    """(method, path with its parameters written {}) for every route of the pipeline app."""
    import serving.runtime.ingress  # noqa: F401  (declares the routes on the app)
    from serving.runtime.ingress_app import app

    def walk(routes):
        for route in routes:
            inner = getattr(route, "original_router", None)  # FastAPI's included router
            if inner is not None:
                yield from walk(inner.routes)
            elif getattr(route, "methods", None):
                for method in route.methods - {"HEAD", "OPTIONS"}:
                    yield method, re.sub(r"\{[^}]*\}", "{}", route.path)

    found = set(walk(app.routes))
    assert ("POST", "/predict") in found, "the app's routes could not be read"
    return found


def readme_routes() -> set[tuple[str, str]]:
    """The routes of the HTTP table's first column: `GET /a`, `POST /b`; a method carries to the
    paths after it, and `.../x` extends the path before it."""
    found, method, last = set(), "GET", ""
    for cell in first_cells(section("HTTP API")):
        for span in code_spans(cell):
            match = re.fullmatch(r"(?:(GET|POST|PUT|DELETE|PATCH) )?((?:\.\.\.)?/[^\s?]*)(?:\?.*)?", span)
            if match is None:
                continue  # a body, not a route
            method = match.group(1) or method
            path = match.group(2)
            if path.startswith("..."):
                path = last + path[3:]
            last = path
            found.add((method, re.sub(r"\{[^}]*\}", "{}", path)))
    return found


def test_the_readmes_routes_are_the_apps():
    served, documented = served_routes(), readme_routes()
    assert not documented - served, f"README routes the app does not serve: {sorted(documented - served)}"
    missing = served - documented - UNDOCUMENTED_ROUTES
    assert not missing, f"routes the app serves that the README's HTTP table leaves out: {sorted(missing)}"


def test_the_readmes_routes_are_in_the_openapi_document():
    """Every documented route but the documentation's own pages is in /openapi.json."""
    import pandas as pd

    import serving.runtime.ingress  # noqa: F401  (declares the routes on the app)
    from serving.core.schema import RowSchema
    from serving.runtime.http_support import openapi_document
    from serving.runtime.ingress_app import app

    schema = RowSchema.from_sample(pd.DataFrame({"a": [1.0], "b": ["x"]}), required=["a", "b"])
    doc = openapi_document(app, schema, monitor=True)
    listed = {(m.upper(), re.sub(r"\{[^}]*\}", "{}", p)) for p, ops in doc["paths"].items() for m in ops}
    pages = {("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/ui")}
    assert readme_routes() - pages <= listed, sorted(readme_routes() - pages - listed)
    for route in ("explain", "drift"):  # "query parameters are the drift.Monitor method's arguments"
        assert doc["paths"][f"/{route}"]["get"]["parameters"], f"/{route} lists no query parameter"


def install_paragraph() -> str:
    text = " ".join(section("Set up").split())
    return text[text.index("As a library"):]


def test_the_install_paragraph_names_the_core_dependencies_and_the_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!;\[ ]", d)[0] for d in project["dependencies"]}
    paragraph = install_paragraph()
    listed = paragraph[paragraph.index("with "):paragraph.index(" only")]
    named = {w.strip() for w in re.split(r",| and ", listed[len("with "):]) if w.strip()}
    assert named == core, f"README's core {sorted(named)} vs pyproject's {sorted(core)}"
    extras = set(re.findall(r"`\[(\w+)\]`", paragraph)) | set(re.search(r"`\.\[([\w,]+)\]`", paragraph)
                                                               .group(1).split(","))
    assert extras == set(project["optional-dependencies"]), (
        f"README's extras {sorted(extras)} vs pyproject's {sorted(project['optional-dependencies'])}")
