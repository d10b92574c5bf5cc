"""The willump command's surface, without Ray: --version, a --help that loads nothing heavy,
and exit codes that tell a usage error (2) from an error the message names (1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving.cli import EXIT_ERROR, EXIT_USAGE, main, version

#: starts subprocesses (a fresh interpreter, to see what --help imports): the serial scope
pytestmark = pytest.mark.starts_ray

#: what `willump --help` must not import (each takes seconds: torch, scikit-learn, Ray)
HEAVY = ("torch", "sklearn", "ray", "willump", "pandas", "scipy")


def test_version_is_the_installed_distributions():
    result = subprocess.run([sys.executable, "-m", "serving.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"willump {version()}"
    assert version()[0].isdigit()  # the package is installed (make venv installs it editable)


def test_help_loads_none_of_the_heavy_libraries():
    probe = ("import sys, serving.cli as c; c.build_parser().format_help(); "
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_named_error_exits_1_and_a_usage_error_2(tmp_path, capsys):
    assert main(["plan", str(tmp_path), "--cpus", "2"]) == EXIT_ERROR == 1
    assert "not a willump artifact" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["plan"])
    assert stop.value.code == EXIT_USAGE == 2
    with pytest.raises(SystemExit) as stop:
        main(["keygen", "--env", "1x"])
    assert stop.value.code == EXIT_USAGE
