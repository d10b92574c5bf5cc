"""The Dockerfile and `make image`: what the image installs exists, its command is one
`willump serve` accepts and that serves beyond loopback only with a key; where a docker daemon
answers, the image builds and its `willump` runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from serving.cli import build_parser
from tests.conftest import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    """The Dockerfile's lines of one instruction (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(name + " ")]


def test_the_image_installs_what_exists_and_serves_with_a_key():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = re.search(r"ARG EXTRAS=(\S+)", DOCKERFILE).group(1).split(",")
    optional = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras and set(extras) <= set(optional), extras
    copied = [part for line in _instructions("COPY") for part in line.split()[:-1]]
    assert copied and all((REPO_ROOT / p).exists() for p in copied), copied
    ignore = (REPO_ROOT / ".dockerignore").read_text()
    assert all(f"!{p.rstrip('/')}" in ignore for p in copied), "the build context lacks a copied path"
    entry = json.loads(_instructions("ENTRYPOINT")[0])  # the exec (JSON array) form
    cmd = json.loads(_instructions("CMD")[-1])
    assert entry == ["willump"] and cmd[0] == "serve"
    args = build_parser().parse_args(cmd)  # flags `willump serve` takes
    assert args.host == "0.0.0.0" and args.require_key and args.api_key_env == "WILLUMP_API_KEY"
    assert args.name == "willump" and "/willump/healthz" in DOCKERFILE  # the health check's path
    assert f"EXPOSE {args.port}" in DOCKERFILE
    make = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^image:\n\tdocker build -t \$\(IMAGE\) \.$", make, re.M)


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


@pytest.mark.slow
def test_the_image_builds_and_its_willump_runs():
    if not _docker_daemon():
        pytest.skip("no docker daemon answers here (`docker info` fails): the image is not built")
    tag = "willump-serve:test"
    built = subprocess.run(["make", "image", f"IMAGE={tag}"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    ran = subprocess.run(["docker", "run", "--rm", tag, "--version"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "willump" in ran.stdout, ran.stdout + ran.stderr
    helped = subprocess.run(["docker", "run", "--rm", tag, "serve", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert helped.returncode == 0 and "--api-key-env" in helped.stdout, helped.stderr
