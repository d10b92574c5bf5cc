"""Feature blocks: the validated, model-ready form of one feature group's output.

A block is either a 2-D float ndarray or a CSR matrix, with one row per input row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .errors import PipelineError

Block = np.ndarray | sp.csr_matrix


def to_block(value: Any, expected_rows: int, group: str) -> Block:
    """Validate a feature group's output and convert it to a block.

    Raises PipelineError naming the group for a wrong row count, non-numeric
    values, a missing output or more than two dimensions.
    """
    if value is None:
        raise PipelineError(f"feature group '{group}' returned None; it must return a 2-D array")
    if sp.issparse(value):
        block = sp.csr_matrix(value)
        if not (np.issubdtype(block.dtype, np.number) or block.dtype == bool):
            raise PipelineError(
                f"feature group '{group}' returned a sparse matrix of non-numeric dtype {block.dtype}"
            )
        block = block.astype(np.float64, copy=False)
    elif isinstance(value, (pd.DataFrame, pd.Series)):
        frame = value.to_frame() if isinstance(value, pd.Series) else value
        bad = [str(c) for c, t in frame.dtypes.items() if not _numeric_dtype(t)]
        if bad:
            raise PipelineError(
                f"feature group '{group}' returned non-numeric columns {bad[:5]}; "
                "encode them as numbers inside the group"
            )
        block = frame.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        try:
            block = np.asarray(value)
        except Exception as exc:
            raise PipelineError(
                f"feature group '{group}' returned {type(value).__name__}, "
                "which is not an array, sparse matrix or DataFrame"
            ) from exc
        if block.dtype == object or not (np.issubdtype(block.dtype, np.number) or block.dtype == bool):
            raise PipelineError(
                f"feature group '{group}' returned non-numeric values (dtype {block.dtype})"
            )
        if block.ndim == 1:
            block = block.reshape(-1, 1)
        if block.ndim != 2:
            raise PipelineError(
                f"feature group '{group}' returned a {block.ndim}-D array; it must be 2-D (rows x features)"
            )
        block = np.ascontiguousarray(block, dtype=np.float64)
    if block.shape[0] != expected_rows:
        raise PipelineError(
            f"feature group '{group}' returned {block.shape[0]} rows for {expected_rows} input rows; "
            "a feature group must return exactly one row per input row, in order"
        )
    return block


def _numeric_dtype(dtype: Any) -> bool:
    return bool(pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype))


def hstack(blocks: Sequence[Block]) -> Block:
    """Side-by-side blocks: CSR if any block is sparse, else a dense float array."""
    if not blocks:
        raise ValueError("no feature blocks to stack")
    if len(blocks) == 1:
        return blocks[0]
    if any(sp.issparse(b) for b in blocks):
        return sp.hstack([sp.csr_matrix(b) for b in blocks], format="csr")
    return np.hstack(blocks)


def take_rows(block: Block, index: np.ndarray) -> Block:
    """Rows of a block at the given positions."""
    return block[index]


def n_features(block: Block) -> int:
    return int(block.shape[1])


def blocks_equal(a: Block, b: Block) -> bool:
    """Exact equality of two blocks (NaNs equal), dense or sparse."""
    if a.shape != b.shape:
        return False
    if sp.issparse(a) or sp.issparse(b):
        da, db = sp.csr_matrix(a), sp.csr_matrix(b)
        return (da != db).nnz == 0
    return bool(np.array_equal(a, b, equal_nan=True))
