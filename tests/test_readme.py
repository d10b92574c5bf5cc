"""The README's tour runs as written: its Python and shell blocks, in order, in one session.

Outside the tour the README may hold only the set-up block (``make demo`` / ``make test``), so
no snippet a reader copies is left untested. The tour's port 8000 is swapped for a free one and
``curl -s`` for ``curl -sSf`` (an HTTP error fails the step).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, free_port

README = REPO_ROOT / "README.md"
TOUR_START, TOUR_END = "## A five-minute tour", "## Concepts"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def tour_and_rest() -> tuple[str, str]:
    text = README.read_text()
    start, end = text.index(TOUR_START), text.index(TOUR_END)
    return text[start:end], text[:start] + text[end:]


def tour_script(tour: str, port: int) -> str:
    """One Python script: Python blocks verbatim, shell blocks run by bash with pipefail."""
    parts = ["import subprocess"]
    for lang, code in blocks(tour.replace("8000", str(port))):
        if lang == "python":
            parts.append(code)
        elif lang == "bash":
            code = code.replace("curl -s ", "curl -sSf ")
            parts.append(f"subprocess.run(['bash', '-euo', 'pipefail', '-c', {code!r}], check=True)")
        else:
            raise AssertionError(f"tour block in language {lang!r}: neither python nor bash")
    return "\n".join(parts) + "\n"


def test_only_the_set_up_block_lies_outside_the_tour() -> None:
    tour, rest = tour_and_rest()
    outside = blocks(rest)
    assert [lang for lang, _ in outside] == ["bash"], outside
    assert all(line.startswith("make ") for line in outside[0][1].strip().splitlines())
    langs = [lang for lang, _ in blocks(tour)]
    assert "python" in langs and "bash" in langs


@pytest.mark.app_in_subprocess
@pytest.mark.slow
def test_the_tour_runs(tmp_path: Path) -> None:
    """As from a clone: the data folder holds nothing, so the tour reads the repository's copy."""
    tour, _ = tour_and_rest()
    script = tmp_path / "tour.py"
    script.write_text(tour_script(tour, free_port()))
    (tmp_path / "no-shared-data").mkdir()
    env = {**os.environ, "WILLUMP_DATASETS": str(tmp_path / "no-shared-data"), "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the tour did not finish in {exc.timeout} s:\n{textwrap.shorten(str(exc.output), 4000)}")
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert (tmp_path / "toxic.willump").exists()
    html = (tmp_path / "toxic-report.html").read_text()
    assert "<svg" in html
    assert "dashboard: http://" in done.stdout
    mix = re.search(r'"kind":"mix_shift".*?"rows":(\[.*?\])', done.stdout)
    assert mix and '"source":"app"' in mix.group(1), "the mix shift query did not name the planted source"
