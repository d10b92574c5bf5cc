"""Column roles and the summary layout of one monitor, fixed by its first batch.

Why a module of its own: feature kinds (when not declared) are inferred from the first batch,
and each numeric column's sketch centre (`Layout.offsets`, see drift._sketch) is the median of
its first values. Both must be the same before and after a restart, so they are computed once
here and stored with the state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from drift._classify import Classifier
from drift._config import Config
from drift._encode import Encoder
from drift._errors import SchemaError
from drift._ingest import Schema
from drift._sketch import DEFAULT_MAX_BINS, DEFAULT_MIN_VALUE
from drift._summary import Layout


def infer_kinds(config: Config, frame: pd.DataFrame | None) -> dict[str, str]:
    """Feature kinds: declared ones, the rest inferred from `frame` (numeric dtype -> numeric)."""
    kinds: dict[str, str] = {}
    for name, kind in config.features.items():
        if kind is not None:
            kinds[name] = kind
            continue
        if frame is None or name not in frame.columns:
            raise SchemaError(f"batch is missing feature column {name!r} (needed to infer its kind)")
        dtype = frame[name].dtype
        numeric = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
        kinds[name] = "numeric" if numeric else "categorical"
    return kinds


def build_schema(config: Config, kinds: Mapping[str, str],
                 classifiers: Mapping[str, Classifier]) -> Schema:
    schema = Schema(
        attributes=tuple(config.attributes),
        cat_features=tuple(k for k, v in kinds.items() if v == "categorical"),
        metrics=tuple(config.metrics),
        num_features=tuple(k for k, v in kinds.items() if v == "numeric"),
        timestamp=config.timestamp_column,
        request=config.request_column,
    )
    for name, clf in classifiers.items():
        bad = [c for c in clf.columns if c not in schema.num_columns]
        if bad:
            raise SchemaError(f"classifiers[{name!r}] uses non-numeric column(s) {bad}")
    return schema


def centres(num: np.ndarray) -> tuple[float, ...]:
    """Sketch centre per numeric column: the median of its finite first values (0 if none)."""
    out = []
    for row in num:
        fin = row[np.isfinite(row)]
        out.append(float(np.median(fin)) if fin.size else 0.0)
    return tuple(c if math.isfinite(c) else 0.0 for c in out)


def build_layout(config: Config, schema: Schema, n_classifiers: int,
                 offsets: Sequence[float]) -> Layout:
    return Layout(
        n_cat=len(schema.cat_columns), n_num=len(schema.num_columns), n_clf=n_classifiers,
        max_values=config.max_values, relative_accuracy=config.relative_accuracy,
        min_value=DEFAULT_MIN_VALUE, max_bins=DEFAULT_MAX_BINS,
        offsets=tuple(float(o) for o in offsets),
    )


def build_encoders(config: Config, schema: Schema) -> list[Encoder]:
    return [Encoder(c, config.max_codes, config.max_value_length) for c in schema.cat_columns]


def layout_meta(kinds: Mapping[str, str], layout: Layout) -> dict[str, Any]:
    """What the store keeps so a restart rebuilds the same layout."""
    return {"feature_kinds": dict(kinds), "offsets": list(layout.offsets)}
