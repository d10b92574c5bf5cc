"""willump: statistically safe feature cascades and approximate top-K for inference pipelines.

Decorate feature groups with :func:`feature` and the pipeline with :func:`pipeline`
(or wrap a scikit-learn Pipeline with :func:`from_sklearn`), then call
:func:`optimize`. Load saved artifacts with :func:`load` (only trusted ones: loading
runs code stored in the artifact).
"""

from typing import TYPE_CHECKING

from .errors import ArtifactError, PipelineError, WillumpError, WillumpWarning

#: public name -> the module that defines it, imported on first use (PEP 562): a serving replica
#: imports ``willump.runtime`` and loads an artifact, and should not pay for the optimizer's
#: imports (model selection, metrics, the scikit-learn adapter) on every cold start
_LAZY = {
    "load": "._artifact",
    "FeatureError": "._capture", "FeatureGroup": "._capture", "Pipeline": "._capture",
    "feature": "._capture", "pipeline": "._capture",
    "BaselinePipeline": "._cascade", "Gear": "._cascade", "Level": "._cascade",
    "OptimizedPipeline": "._cascade", "TopKResult": "._cascade",
    "Graph": "._graph",
    "Metric": "._metrics",
    "TorchClassifier": "._models",
    "ModuleFeature": "._module_feature", "module_feature": "._module_feature",
    "OnnxModel": "._onnx", "check_onnx": "._onnx", "export_onnx": "._onnx",
    "routing_warning": "._onnx", "to_onnx": "._onnx",
    "optimize": "._optimize",
    "Report": "._report",
    "SklearnPipeline": "._sklearn", "from_sklearn": "._sklearn",
}

if TYPE_CHECKING:  # what static tools read; at run time the names come from __getattr__
    from ._artifact import load
    from ._capture import FeatureError, FeatureGroup, Pipeline, feature, pipeline
    from ._cascade import BaselinePipeline, Gear, Level, OptimizedPipeline, TopKResult
    from ._graph import Graph
    from ._metrics import Metric
    from ._models import TorchClassifier
    from ._module_feature import ModuleFeature, module_feature
    from ._onnx import OnnxModel, check_onnx, export_onnx, routing_warning, to_onnx
    from ._optimize import optimize
    from ._report import Report
    from ._sklearn import SklearnPipeline, from_sklearn


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'willump' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "ArtifactError",
    "BaselinePipeline",
    "FeatureError",
    "FeatureGroup",
    "Gear",
    "Graph",
    "Level",
    "Metric",
    "ModuleFeature",
    "OnnxModel",
    "OptimizedPipeline",
    "Pipeline",
    "PipelineError",
    "Report",
    "SklearnPipeline",
    "TopKResult",
    "TorchClassifier",
    "WillumpError",
    "WillumpWarning",
    "__version__",
    "check_onnx",
    "export_onnx",
    "feature",
    "from_sklearn",
    "load",
    "module_feature",
    "optimize",
    "pipeline",
    "routing_warning",
    "to_onnx",
]
