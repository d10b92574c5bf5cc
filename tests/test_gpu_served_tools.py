"""The served GPU run's tools: ``benchmarks.deep``'s device flag and ``benchmarks.gpu_carry``'s
slimmed Ray wheel (the figures themselves are in docs/benchmarks.md)."""

from __future__ import annotations

import zipfile

import pytest

from benchmarks import deep, gpu_carry


def test_deep_on_a_gpu_measures_the_apps_one_after_the_other():
    args = deep.parse_args(["--device", "gpu", "--port", "1"])
    assert args.device == "gpu" and args.one_at_a_time
    assert deep.torch_device(args.device) == "cuda"
    args = deep.parse_args(["--port", "1"])
    assert args.device == "cpu" and not args.one_at_a_time
    with pytest.raises(SystemExit):
        deep.parse_args(["--device", "tpu"])


def test_slim_ray_drops_what_serve_never_imports(tmp_path):
    wheel = tmp_path / "ray-0-cp312-cp312-manylinux2014_x86_64.whl"
    keep = ["ray/__init__.py", "ray/serve/api.py", "ray/dashboard/modules/x.py", "ray-0.dist-info/RECORD"]
    drop = ["ray/jars/ray_dist.jar", "ray/rllib/algo.py", "ray/data/dataset.py",
            "ray/dashboard/client/build/static/js/main.js", "ray/dashboard/client/main.js.map"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in keep + drop:
            z.writestr(name, b"x" * 100)
    gpu_carry.slim_ray(wheel)
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == sorted(keep)
        assert z.read("ray/serve/api.py") == b"x" * 100
