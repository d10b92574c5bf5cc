"""ONNX export of the cascade's models and an ONNX Runtime runner with the same API.

scikit-learn models go through skl2onnx, LightGBM through onnxmltools, torch
modules through torch.onnx. Every export is checked numerically against the
native model before it is trusted. The runner takes a device: 'cpu', or 'cuda'
where ONNX Runtime has the CUDA provider (falling back to CPU with a warning).
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

#: largest absolute difference in probabilities accepted between native and ONNX models
ONNX_ATOL = 1e-4
#: rows per ONNX Runtime call (sparse inputs are densified chunk by chunk)
ONNX_CHUNK_ROWS = 2048
INPUT_NAME = "input"


def to_onnx(model: Any, n_features: int, target_opset: int | None = None) -> bytes:
    """Serialized ONNX model computing class probabilities from float32 features."""
    from ._extras import require
    from ._models import TorchClassifier

    require("onnx", "ONNX export")

    name = type(model).__module__
    if isinstance(model, TorchClassifier):
        return _torch_to_onnx(model, n_features)
    if name.startswith("lightgbm"):
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        onx = onnxmltools.convert_lightgbm(
            model, initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))],
            zipmap=False, target_opset=target_opset,
        )
        return onx.SerializeToString()
    if name.startswith("sklearn"):
        from skl2onnx import to_onnx as skl_to_onnx
        from skl2onnx.common.data_types import FloatTensorType

        onx = skl_to_onnx(
            model, initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))],
            options={id(model): {"zipmap": False}}, target_opset=target_opset,
        )
        return onx.SerializeToString()
    raise TypeError(f"no ONNX converter for {type(model).__name__}")


def _torch_to_onnx(model: Any, n_features: int) -> bytes:
    import torch

    wrapped = torch.nn.Sequential(model.module_, torch.nn.Softmax(dim=1)).to("cpu").eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapped, (torch.zeros(2, n_features),), buffer, dynamo=False,
            input_names=[INPUT_NAME], output_names=["probabilities"],
            dynamic_axes={INPUT_NAME: {0: "rows"}, "probabilities": {0: "rows"}},
        )
    model.module_.to(model.device_)
    return buffer.getvalue()


def providers_for(device: str) -> list[str]:
    """ONNX Runtime providers for a device, CPU last as the fallback (an OnnxModel checks
    which one the session really took: :func:`fallback_reason`)."""
    from ._extras import require

    require("onnxruntime", "runtime='onnx'")
    import onnxruntime as ort

    if device.startswith("cuda"):
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


#: what an OnnxModel asked for a GPU does when ONNX Runtime runs it on the CPU instead
FALLBACK_POLICIES = ("warn", "error")


def fallback_reason(device: str, providers: list[str]) -> str | None:
    """Why a session asked to run on ``device`` is not on it (ONNX Runtime's CUDA provider
    falls back to the CPU quietly when it cannot load CUDA), or None when it is."""
    if not device.startswith("cuda"):
        return None
    if providers and providers[0] == "CUDAExecutionProvider":
        return None
    return (f"ONNX Runtime was asked for {device!r} but runs on {providers[0] if providers else 'nothing'} "
            "(no CUDAExecutionProvider in this onnxruntime, or it could not load CUDA)")


def inference_session(onnx_bytes: bytes, device: str = "cpu") -> Any:
    """An ONNX Runtime session on ``device``'s providers, its notes on the graph (unused
    constants and the like) silenced: they are not the user's to act on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(onnx_bytes, sess_options=options, providers=providers_for(device))


class OnnxModel:
    """predict_proba through ONNX Runtime; drop-in for a native model in a Level."""

    def __init__(self, onnx_bytes: bytes, classes: Any, device: str = "cpu", *, on_fallback: str = "warn"):
        if on_fallback not in FALLBACK_POLICIES:
            raise ValueError(f"on_fallback must be one of {FALLBACK_POLICIES}, got {on_fallback!r}")
        self.onnx_bytes = onnx_bytes
        self.classes_ = np.asarray(classes)
        self.device = device
        self.on_fallback = on_fallback
        self._open()

    def _open(self) -> None:
        self._session = inference_session(self.onnx_bytes, self.device)
        #: why the session runs on the CPU although a GPU was asked for (None when it does not)
        self.fallback = fallback_reason(self.device, self._session.get_providers())
        if self.fallback is not None:
            if self.on_fallback == "error":
                raise RuntimeError(self.fallback)
            warnings.warn(self.fallback, stacklevel=3)
        outputs = [o.name for o in self._session.get_outputs()]
        self._output = "probabilities" if "probabilities" in outputs else outputs[-1]
        self._input = self._session.get_inputs()[0].name

    @property
    def providers(self) -> list[str]:
        return self._session.get_providers()

    def predict_proba(self, X: Any) -> np.ndarray:
        parts = []
        for start in range(0, X.shape[0], ONNX_CHUNK_ROWS):
            chunk = X[start : start + ONNX_CHUNK_ROWS]
            dense = chunk.toarray() if sp.issparse(chunk) else np.asarray(chunk)
            feed = {self._input: np.ascontiguousarray(dense, dtype=np.float32)}
            parts.append(np.asarray(self._session.run([self._output], feed)[0], dtype=np.float64))
        if not parts:
            return np.zeros((0, len(self.classes_)))
        return np.vstack(parts)

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def __getstate__(self) -> dict[str, Any]:
        return {"onnx_bytes": self.onnx_bytes, "classes_": self.classes_, "device": self.device,
                "on_fallback": self.on_fallback}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"on_fallback": "warn", **state})
        self._open()


def check_onnx(native: Any, onnx_model: OnnxModel, X: Any, atol: float = ONNX_ATOL) -> float:
    """Largest probability difference on X; raises ValueError beyond ``atol``."""
    expected = np.asarray(native.predict_proba(X), dtype=np.float64)
    got = onnx_model.predict_proba(X)
    if expected.shape != got.shape:
        raise ValueError(f"ONNX output shape {got.shape} differs from native {expected.shape}")
    diff = float(np.max(np.abs(expected - got))) if expected.size else 0.0
    if diff > atol:
        raise ValueError(f"ONNX probabilities differ from the native model by {diff:.2e} > {atol:.0e}")
    return diff


def routing_warning(opt: Any, diff: float) -> str | None:
    """A message when a served runtime's probabilities differ from the certified models' by
    more than the plan's certified ``routing_tolerance`` (rows near a threshold, or with two
    classes nearly tied, could then be answered otherwise than certified); None when covered."""
    report = opt.report()
    tolerance = getattr(report, "routing_tolerance", 0.0) if report is not None else 0.0
    if not opt.is_cascade or diff <= tolerance:
        return None
    return (f"the served runtime's probabilities differ from the certified models' by up to "
            f"{diff:.1e}, more than the routing_tolerance {tolerance:g} the bound was certified with; "
            f"re-run willump.optimize(..., routing_tolerance={max(diff, ONNX_ATOL):.0e}) so the bound "
            "covers every routing the runtime may choose")


def export_onnx(opt: Any, directory: Any, X_check: Any, atol: float = ONNX_ATOL) -> dict[str, Any]:
    """Export every level's model to ``directory``/level_<i>.onnx, checked on rows ``X_check``,
    and, where every group is a scikit-learn featurizer skl2onnx converts
    (:func:`willump.from_sklearn`), the whole cascade (features, levels, routing) to
    ``directory``/cascade.onnx (:mod:`willump._onnx_cascade`), checked the same way.

    Returns (and writes as onnx.json) per level: file, max difference, feature count; under
    ``cascade``: its file, max difference, the share of rows it routes to the same level, or,
    where it cannot be exported, ``exported: False`` and why, per group. Warns
    (WillumpWarning) when the differences exceed the plan's certified routing tolerance.
    """
    from ._blocks import hstack

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    blocks, _ = opt.pipeline.compute(X_check, opt.pipeline.graph.groups)
    summary: dict[str, Any] = {"levels": []}
    for i, level in enumerate(opt.levels):
        X = hstack([blocks[g] for g in level.groups])
        data = to_onnx(level.model, X.shape[1])
        runner = OnnxModel(data, opt.classes_)
        diff = check_onnx(level.model, runner, X, atol)
        (root / f"level_{i}.onnx").write_bytes(data)
        summary["levels"].append({"file": f"level_{i}.onnx", "max_abs_diff": diff, "features": int(X.shape[1])})
    summary["cascade"] = _export_cascade(opt, root, X_check)
    (root / "onnx.json").write_text(json.dumps(summary, indent=2))
    diffs = [lv["max_abs_diff"] for lv in summary["levels"]] + [summary["cascade"].get("max_abs_diff", 0.0)]
    message = routing_warning(opt, max(diffs))
    if message is not None:
        from .errors import WillumpWarning

        summary["routing_warning"] = message
        warnings.warn(message, WillumpWarning, stacklevel=2)
    return summary


def _export_cascade(opt: Any, root: Path, X_check: Any) -> dict[str, Any]:
    """cascade.onnx where the pipeline allows it, checked on ``X_check``; else why not. Rows
    routed to another level than willump's (a probability on a threshold) are counted and
    warned about; the difference is measured on the rows routed alike."""
    from ._onnx_cascade import LEVEL, PROBA, approximate, cascade_model, feeds, unexportable

    why = unexportable(opt)
    if why:
        return {"exported": False, "why": why}
    try:
        model = cascade_model(opt, X_check[:5])
        data = model.SerializeToString()
        proba, level = inference_session(data).run(None, feeds(model, X_check))
    except Exception as exc:  # a converter or ONNX Runtime refused: the per-level files stand
        return {"exported": False, "why": {"conversion": f"{type(exc).__name__}: {exc}"}}
    native, native_level = opt.predict_with_levels(X_check)
    alike = level == native_level
    (root / "cascade.onnx").write_bytes(data)
    out = {"exported": True, "file": "cascade.onnx",
           "max_abs_diff": float(np.abs(proba[alike] - native[alike]).max()) if alike.any() else 0.0,
           "same_level_share": float(alike.mean()), "rows_routed_differently": int((~alike).sum()),
           "inputs": [i.name for i in model.graph.input], "outputs": [PROBA, LEVEL],
           "rows_checked": len(level), "approximate": approximate(opt)}
    if not alike.all():
        from .errors import WillumpWarning

        warnings.warn(f"cascade.onnx routes {out['rows_routed_differently']} of {len(level)} check rows to another "
                      "level than willump (their probabilities sit on a threshold)", WillumpWarning, stacklevel=3)
    return out


def onnx_levels(opt: Any, directory: Any, device: str = "cpu") -> list[Any]:
    """Levels whose models run the exported ONNX files (for serving)."""
    from ._cascade import Level

    root = Path(directory)
    return [
        Level(lv.groups, OnnxModel((root / f"level_{i}.onnx").read_bytes(), opt.classes_, device), lv.threshold)
        for i, lv in enumerate(opt.levels)
    ]
