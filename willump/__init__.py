"""willump: statistically safe feature cascades and approximate top-K for inference pipelines.

Decorate feature groups with :func:`feature` and the pipeline with :func:`pipeline`
(or wrap a scikit-learn Pipeline with :func:`from_sklearn`), then call
:func:`optimize`. Load saved artifacts with :func:`load` (only trusted ones: loading
runs code stored in the artifact).
"""

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
from .errors import ArtifactError, PipelineError, WillumpError, WillumpWarning

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
