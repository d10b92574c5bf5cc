"""The core install (``pip install willump-serve``, no extras): the optimizer and the monitor on a
scikit-learn pipeline without Ray, torch, ONNX or matplotlib, and the extra named wherever a
feature needs one (tests/install_check.py does the checking)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CHECK = REPO_ROOT / "tests" / "install_check.py"
#: the core's dependencies (pyproject.toml's `dependencies`), installed first: where they cannot
#: be installed (no package index), the clean-venv test skips with pip's answer
CORE = ("numpy", "scipy", "pandas", "scikit-learn", "cloudpickle", "tqdm", "prometheus-client")


def test_the_core_runs_with_the_extras_modules_blocked():
    """In this environment, with every module only an extra installs made unimportable."""
    out = subprocess.run([sys.executable, str(CHECK), "--block"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "core install: ok" in out.stdout, out.stdout + out.stderr


def test_the_serve_extra_serves_without_torch_or_onnx():
    """`willump serve` of a scikit-learn artifact on `pip install 'willump-serve[serve]'`: the
    serve path imported serving.partition (torch) at module level, found by installing the image's
    extras in a clean venv (2026-12-05)."""
    out = subprocess.run([sys.executable, str(CHECK), "--serve"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "serve install: ok" in out.stdout, out.stdout + out.stderr


def test_every_extras_module_is_one_the_check_blocks():
    from willump._extras import EXTRA_OF

    text = CHECK.read_text()
    assert all(f'"{module}"' in text for module in EXTRA_OF), "tests/install_check.py blocks fewer modules"


@pytest.mark.slow
def test_a_clean_venv_with_the_core_alone(tmp_path: Path):
    """``pip install .`` without extras into a new venv: nothing heavy comes with it, and the check
    runs there from outside the repository (the installed package, not the checkout)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # --no-compile: what is installed and that it runs are checked here, not its bytecode (pip
    # byte-compiling numpy, scipy, pandas and scikit-learn was about a fifth of this test's CPU)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    core = subprocess.run([*pip, *CORE], capture_output=True, text=True, timeout=600)
    if core.returncode != 0:
        pytest.skip(f"the core's dependencies cannot be installed here: {core.stderr.strip()[-300:]}")
    source = tmp_path / "source"  # built from a copy: setuptools writes build/ beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for package in ("willump", "serving", "drift", "pipelines"):
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    package = subprocess.run([*pip, str(source)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert package.returncode == 0, package.stderr[-2000:]
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            timeout=120).stdout.lower()
    for heavy in ("ray==", "torch==", "onnxruntime", "matplotlib==", "lightgbm==", "fastapi=="):
        assert heavy not in listed, f"{heavy.rstrip('=')} came with the core install"
    out = subprocess.run([str(python), str(CHECK)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "core install: ok" in out.stdout, out.stdout + out.stderr
    # an artifact saved here, where torch and lightgbm are installed, loads there without them
    from sklearn.linear_model import LogisticRegression

    import willump
    from tests.willump.synth import make_rows, three_groups

    X, y = make_rows(1500, seed=4)
    artifact = tmp_path / "synth.willump"
    willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.05, verbose=False).save(artifact)
    load = ("import sys, pandas as pd, willump; opt = willump.load(sys.argv[1]); "
            "rows = pd.DataFrame({'a': [0.1, -2.0], 'b': [0.3, 0.0], 'c': [1.0, 0.5]}); "
            "print(opt.predict_proba(rows).shape)")
    out = subprocess.run([str(python), "-c", load, str(artifact)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "(2, 2)" in out.stdout, out.stdout + out.stderr
