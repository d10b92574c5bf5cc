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
- ``clear_row_caches()``: empty every feature group's row cache in this process.
"""

from ._artifact import artifact_version, read_manifest
from ._blocks import Block, hstack, take_rows
from ._capture import clear_row_caches
from ._cascade import Level
from ._models import predict_proba

__all__ = ["Block", "Level", "artifact_version", "clear_row_caches", "hstack", "predict_proba", "read_manifest",
           "take_rows"]
