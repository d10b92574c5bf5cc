"""The routing rule of a cascade, in one place: certification and serving both use it.

A non-final level answers a row when its highest class probability reaches the
level's threshold; otherwise the row goes on. The final level answers every row
that reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def is_confident(proba: np.ndarray, threshold: float | None) -> np.ndarray:
    """Rows a level answers: all of them for the final level (threshold None)."""
    if threshold is None:
        return np.ones(proba.shape[0], dtype=bool)
    return proba.max(axis=1) >= threshold


def answer_levels(level_probas: Sequence[np.ndarray], threshold: float) -> np.ndarray:
    """Index of the level that answers each row: the first confident one, else the last."""
    n = level_probas[0].shape[0]
    answered = np.full(n, len(level_probas) - 1, dtype=np.int64)
    open_rows = np.ones(n, dtype=bool)
    for index, proba in enumerate(level_probas[:-1]):
        done = open_rows & is_confident(proba, threshold)
        answered[done] = index
        open_rows &= ~done
    return answered


def combine(level_probas: Sequence[np.ndarray], levels: np.ndarray) -> np.ndarray:
    """Each row's probabilities from the level that answered it."""
    stacked = np.stack(level_probas)  # levels x rows x classes
    return stacked[levels, np.arange(stacked.shape[1])]


def route(level_probas: Sequence[np.ndarray], threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(answering level per row, the cascade's probabilities)."""
    levels = answer_levels(level_probas, threshold)
    return levels, combine(level_probas, levels)
