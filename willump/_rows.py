"""Row containers the pipelines accept: DataFrame, Series, ndarray, or a list.

The optimizer only needs three things from the input: its length, a row subset
in the original order, and (for DataFrames) its columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd


def n_rows(rows: Any, name: str = "rows") -> int:
    """Number of rows, with a clear error for inputs that have none."""
    if rows is None:
        raise TypeError(f"{name} must be a DataFrame, Series, array or list of rows, got None")
    if isinstance(rows, (pd.DataFrame, pd.Series, np.ndarray)):
        if isinstance(rows, np.ndarray) and rows.ndim == 0:
            raise TypeError(f"{name} must have a row dimension, got a 0-d array")
        return int(rows.shape[0])
    if isinstance(rows, (str, bytes)):
        raise TypeError(f"{name} must be a collection of rows, got a single {type(rows).__name__}")
    if isinstance(rows, Sequence):
        return len(rows)
    raise TypeError(
        f"{name} must be a DataFrame, Series, array or list of rows, got {type(rows).__name__}"
    )


def take(rows: Any, index: np.ndarray) -> Any:
    """The rows at the given positions, keeping the container type (and pandas labels)."""
    index = np.asarray(index, dtype=np.intp)
    if isinstance(rows, (pd.DataFrame, pd.Series)):
        return rows.iloc[index]
    if isinstance(rows, np.ndarray):
        return rows[index]
    if isinstance(rows, tuple):
        return tuple(rows[i] for i in index)
    return [rows[i] for i in index]


def columns_of(rows: Any) -> list[str]:
    """Input column names; a non-tabular input counts as one column named '<input>'."""
    if isinstance(rows, pd.DataFrame):
        return [str(c) for c in rows.columns]
    if isinstance(rows, pd.Series) and rows.name is not None:
        return [str(rows.name)]
    return ["<input>"]
