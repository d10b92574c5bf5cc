"""The optimizer's public seam for code that runs optimized pipelines elsewhere (the server).

``serving`` loads artifacts, runs cascade levels on rows and hands feature blocks from one stage
to the next; it reaches willump only through these names, so willump's private modules can
change without breaking it (``tests/test_layering.py`` keeps it so).

- ``read_manifest(path)``, ``artifact_version(manifest)``: an artifact's manifest and the
  content-derived version the server reports;
- ``Block``, ``hstack(blocks)``, ``take_rows(block, index)``: feature blocks (dense or CSR) as
  stages exchange them;
- ``predict_proba(model, X)``: a level's model on its blocks, as certification ran it;
- ``Level``: one cascade level (groups, model, threshold);
- ``clear_row_caches()``: empty every feature group's row cache in this process;
- ``class_disagreement_bounds_loss(metric)``: whether the rate at which served classes differ
  from the full pipeline's bounds a metric's loss (the live audit's label-free bound);
- ``require(module, what)``, ``explain_missing(exc, what)``: an ImportError naming the extra of
  ``willump-serve`` that installs a missing module.
"""

from ._artifact import artifact_version, read_manifest
from ._blocks import Block, hstack, take_rows
from ._capture import clear_row_caches
from ._cascade import Level
from ._extras import explain_missing, require
from ._metrics import resolve_metric
from ._models import predict_proba


def class_disagreement_bounds_loss(metric: object) -> bool:
    """True for a per-row 0/1 metric that sees predicted labels only (accuracy, error rate):
    a row can change it only where the two predicted classes differ, so their disagreement rate
    bounds the loss. False for every other metric, and for a name that does not resolve."""
    try:
        m = resolve_metric(metric)
    except Exception:
        return False
    return m.kind == "rowwise" and bool(m.sees_labels_only)

__all__ = ["Block", "Level", "artifact_version", "class_disagreement_bounds_loss", "clear_row_caches",
           "explain_missing", "hstack", "predict_proba", "read_manifest", "require", "take_rows"]
