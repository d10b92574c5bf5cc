"""The pipeline app's FastAPI application, on which the ingress (serving.runtime.ingress) and its
Open Inference Protocol routes (serving.runtime.oip) declare their routes.

The OpenAPI document and /docs are served by the ingress itself (not FastAPI's defaults) because
they carry the per-pipeline row schema, known only once the artifact is loaded. POST /predict and
/top_k skip FastAPI's per-request machinery (serving.runtime.front).
"""

from __future__ import annotations

from serving.runtime.edge import install_error_handlers
from serving.runtime.front import LeanFastAPI

app = LeanFastAPI(
    title="willump serving",
    description="Cascaded ML inference: predictions, top-K, the optimizer's report, and the monitor.",
    openapi_url=None, docs_url=None, redoc_url=None,
    hot_routes={("POST", "/predict"): "predict", ("POST", "/top_k"): "top_k"},
)
install_error_handlers(app)
