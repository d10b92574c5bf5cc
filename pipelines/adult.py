"""adult: does a person earn more than $50K a year? (UCI Adult / Census Income)

Feature groups feed LightGBM:

- ``numeric``: age, years of education, hours per week, census weight;
- ``capital``: capital gain and loss (log1p) and whether there was any;
- ``household``: one-hot marital status, relationship, sex;
- ``work``: one-hot workclass, occupation, education;
- ``origin``: one-hot race and native country.

The encoders are fitted on the training split; unknown or missing categories encode as
all zeros.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
from sklearn.preprocessing import OneHotEncoder

import willump

# small_model: the cheap levels' LightGBM, the same for every LightGBM workload (see _lgbm)
from ._lgbm import lgbm
from ._lgbm import small_lgbm as small_model
from .datasets import load_adult
from .workload import Workload, split, subsample

#: accuracy the cascade may lose against the full pipeline
MAX_LOSS = 0.005
NUMERIC_COLUMNS = ["age", "education_num", "hours_per_week", "fnlwgt"]
CAPITAL_COLUMNS = ["capital_gain", "capital_loss"]
CATEGORICAL_GROUPS = {
    "household": ["marital_status", "relationship", "sex"],
    "work": ["workclass", "occupation", "education"],
    "origin": ["race", "native_country"],
}
#: request columns (everything but the label)
REQUEST_COLUMNS = NUMERIC_COLUMNS + CAPITAL_COLUMNS + [
    c for cols in CATEGORICAL_GROUPS.values() for c in cols
]
#: value used for a missing category ('?' in the file)
MISSING = "missing"


def categories(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The categorical columns as objects, missing values as the category MISSING."""
    return df[columns].astype(object).fillna(MISSING)


def fit_encoders(train: pd.DataFrame) -> dict[str, OneHotEncoder]:
    """One one-hot encoder per categorical group, fitted on the training split."""
    return {
        name: OneHotEncoder(handle_unknown="ignore", dtype=np.float64).fit(categories(train, cols))
        for name, cols in CATEGORICAL_GROUPS.items()
    }


def make_pipeline() -> willump.Pipeline:
    """The decorated pipeline over the adult columns; the one-hot encoders are feature state,
    fitted by the fit hook on the rows willump trains on."""
    encoders: dict[str, OneHotEncoder] = {}

    @willump.feature
    def numeric(df):
        return df[NUMERIC_COLUMNS].to_numpy(dtype=np.float64)

    @willump.feature
    def capital(df):
        values = df[CAPITAL_COLUMNS].to_numpy(dtype=np.float64)
        return np.column_stack([np.log1p(np.maximum(values, 0.0)), (values > 0).any(axis=1)])

    @willump.feature
    def household(df):
        return encoders["household"].transform(categories(df, CATEGORICAL_GROUPS["household"]))

    @willump.feature
    def work(df):
        return encoders["work"].transform(categories(df, CATEGORICAL_GROUPS["work"]))

    @willump.feature
    def origin(df):
        return encoders["origin"].transform(categories(df, CATEGORICAL_GROUPS["origin"]))

    @willump.pipeline
    def adult(df):
        return [numeric(df), capital(df), household(df), work(df), origin(df)]

    @adult.fit
    def fit_state(X, y):
        encoders.update(fit_encoders(X))

    return adult


def model(seed: int = 0) -> Any:
    """The LightGBM classifier (shared defaults, see pipelines._lgbm)."""
    return lgbm(seed)



GROUPS = {
    "numeric": "age, education years, hours per week, census weight",
    "capital": "log1p capital gain and loss, any capital movement",
    "household": "one-hot marital status, relationship, sex",
    "work": "one-hot workclass, occupation, education",
    "origin": "one-hot race, native country",
}


def build(data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None) -> Workload:
    """Adult income workload: labels '<=50K' / '>50K'; metric accuracy; top-K of '>50K'."""
    df = load_adult(data_dir)
    X, y = subsample(df[REQUEST_COLUMNS], df["income"].to_numpy(dtype=object), n_rows, seed=seed)
    X_train, y_train, X_test, y_test = split(X, y, seed=seed)
    return Workload(
        name="adult",
        description="UCI Adult, income > 50K; numeric + capital + one-hot categorical groups -> LightGBM",
        pipeline=make_pipeline(),
        model=model(seed),
        small_model=small_model(seed),
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        metric="accuracy",
        max_loss=MAX_LOSS,
        groups=dict(GROUPS),
        seed=seed,
        topk_label=">50K",
    )
