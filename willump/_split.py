"""Which rows train, which choose the plan, and which certify it.

The guarantee needs certification rows that nothing fitted has seen: not the full model,
not the small models, not any feature state (vocabularies, lookup tables built from labels).
willump fits all of those on its *train* rows only, chooses the plan on *selection* rows and
computes the bound on *certification* rows. How the rows are divided:

- ``split="random"`` (default): stratified by label, seeded.
- ``split="ordered"``: rows are in time order (or sorted by ``order_by``); train is the
  oldest part, selection the next, certification the newest, so the bound speaks about
  data later than anything fitted, as serving will see it.
- ``split="group"``: rows sharing a ``groups`` value (a user, a session, a patient) stay in
  one part, so no group's rows both fit and certify.
- ``cert=(X_cert, y_cert)``: the user's own certification rows; ``X`` then only trains and
  selects (its ``holdout`` share selects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupShuffleSplit, train_test_split

#: ways of dividing the rows
SPLITS = ("random", "ordered", "group")
#: with ``holdout="auto"`` and ``certify_share="auto"``: at or below SMALL_ROWS labelled rows the
#: split gives certification SMALL_SHARES (held out, certifying part of it), at or above
#: LARGE_ROWS it gives LARGE_SHARES, and between them it moves with log(rows). At a few thousand
#: rows the certification floor (about log(1 / alpha) / rows) is what stops a cascade, so more rows
#: certify; the selection split predicts what certification will show (``Evaluator.project_to``)
#: and can be smaller. With ``cert=`` rows, ``holdout`` is the selection share: LARGE_SHARES[0].
SMALL_ROWS = 2_000
LARGE_ROWS = 20_000
SMALL_SHARES = (0.5, 0.7)
LARGE_SHARES = (0.4, 0.6)


def auto_shares(n: int, external_cert: bool = False) -> tuple[float, float]:
    """(holdout, certify_share) the "auto" split uses for n labelled rows."""
    if external_cert or n >= LARGE_ROWS:
        return LARGE_SHARES
    if n <= SMALL_ROWS:
        return SMALL_SHARES
    w = (np.log(n) - np.log(SMALL_ROWS)) / (np.log(LARGE_ROWS) - np.log(SMALL_ROWS))
    return tuple(float(s + w * (t - s)) for s, t in zip(SMALL_SHARES, LARGE_SHARES, strict=True))  # type: ignore[return-value]


@dataclass
class Splits:
    """Positions of the train / selection / certification rows and how they were chosen.

    With user-supplied certification rows, ``cert`` indexes those rows, not ``X``."""

    train: np.ndarray
    select: np.ndarray
    cert: np.ndarray
    how: str
    external_cert: bool = False

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "selection": len(self.select), "certification": len(self.cert)}


def _column_or_array(X: Any, value: Any, name: str, n: int) -> np.ndarray:
    if isinstance(value, str):
        columns = getattr(X, "columns", None)
        if columns is None or value not in columns:
            raise ValueError(f"{name}={value!r} names no column of X")
        return np.asarray(X[value])
    array = np.asarray(value)
    if array.shape != (n,):
        raise ValueError(f"{name} must be a column name of X or hold one value per row of X "
                         f"({n}); got shape {array.shape}")
    return array


def make_splits(
    X: Any,
    labels: np.ndarray,
    *,
    split: str,
    holdout: float,
    certify_share: float,
    seed: int,
    order_by: Any = None,
    groups: Any = None,
    external_cert_rows: int | None = None,
) -> Splits:
    """Divide ``len(labels)`` rows as ``split`` says (see the module docstring)."""
    n = len(labels)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "group" and groups is None:
        raise ValueError("split='group' needs groups= (a column name of X or one value per row)")
    if split != "group" and groups is not None:
        raise ValueError("groups= is only used with split='group'")
    if split != "ordered" and order_by is not None:
        raise ValueError("order_by= is only used with split='ordered'")
    parts = 2 if external_cert_rows is not None else 3
    shares = ([1 - holdout, holdout] if parts == 2
              else [1 - holdout, holdout * (1 - certify_share), holdout * certify_share])
    if split == "ordered":
        key = np.arange(n) if order_by is None else _column_or_array(X, order_by, "order_by", n)
        if pd.isna(pd.Series(key)).any():
            raise ValueError("order_by has missing values: rows without a time cannot be ordered "
                             "(they would all sort last and certify)")
        order = np.argsort(key, kind="stable")
        bounds = np.round(np.cumsum(shares)[:-1] * n).astype(int)
        pieces = np.split(order, bounds)
        how = "ordered" + ("" if order_by is None else f" by {order_by if isinstance(order_by, str) else 'order_by'}")
    elif split == "group":
        keys = _column_or_array(X, groups, "groups", n)
        distinct = len(pd.unique(pd.Series(keys)))
        if distinct < len(shares):
            raise ValueError(f"groups has {distinct} distinct value(s); split='group' needs at least "
                             f"{len(shares)} (one per part)")
        pieces = _group_pieces(keys, shares, seed)
        how = f"by group ({len(np.unique(keys))} groups)"
    else:
        pieces = _random_pieces(labels, shares, seed)
        how = "random, stratified"
    pieces = [np.sort(p) for p in pieces]
    if parts == 2:
        return Splits(pieces[0], pieces[1], np.arange(external_cert_rows), how + "; certification rows "
                      "supplied (cert=)", external_cert=True)
    return Splits(pieces[0], pieces[1], pieces[2], how)


def _random_pieces(labels: np.ndarray, shares: list[float], seed: int) -> list[np.ndarray]:
    positions = np.arange(len(labels))
    stratify = labels if np.unique(labels, return_counts=True)[1].min() >= 4 else None
    train, rest = train_test_split(positions, test_size=1 - shares[0], random_state=seed,
                                   stratify=stratify)
    if len(shares) == 2:
        return [train, rest]
    cert_share = shares[2] / (shares[1] + shares[2])
    try:
        select, cert = train_test_split(rest, test_size=cert_share, random_state=seed + 1,
                                        stratify=None if stratify is None else labels[rest])
    except ValueError:  # a class too rare to stratify the second cut
        select, cert = train_test_split(rest, test_size=cert_share, random_state=seed + 1)
    return [train, select, cert]


def _group_pieces(keys: np.ndarray, shares: list[float], seed: int) -> list[np.ndarray]:
    positions = np.arange(len(keys))
    first = GroupShuffleSplit(n_splits=1, train_size=shares[0], random_state=seed)
    train, rest = next(first.split(positions, groups=keys))
    if len(shares) == 2:
        return [train, rest]
    cert_share = shares[2] / (shares[1] + shares[2])
    second = GroupShuffleSplit(n_splits=1, test_size=cert_share, random_state=seed + 1)
    select, cert = next(second.split(rest, groups=keys[rest]))
    return [train, rest[select], rest[cert]]
