"""credit: will a card holder default next month? Who are the k riskiest? (Willump's Credit
analogue, on the UCI Default of Credit Card Clients data)

Four feature groups of engineered aggregates feed LightGBM:

- ``profile``: credit limit, sex, education, marriage, age (as given);
- ``repayment_status``: the six monthly repayment statuses (PAY_0, PAY_2..PAY_6) and their
  aggregates: worst and latest delay, months late, months 2+ late, trend, months paid duly;
- ``bills``: the six bill amounts and their aggregates: mean, spread, utilisation of the
  limit (latest, mean, max), trend (least-squares slope), months with a credit balance;
- ``payments``: the six payments and their aggregates: total, spread, months without a
  payment, and how much of each previous bill was paid (mean, min).

Top-K: the k customers most likely to default (a collections team's morning list).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

import willump

# small_model: the cheap levels' LightGBM, the same for every LightGBM workload (see _lgbm)
from ._lgbm import lgbm
from ._lgbm import small_lgbm as small_model
from .datasets import load_credit
from .workload import Workload, split, subsample

#: AUC the cascade may lose against the full pipeline
MAX_LOSS = 0.005
PROFILE_COLUMNS = ["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE"]
#: repayment status, latest month first (the data set has no PAY_1)
PAY_COLUMNS = ["PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6"]
#: bill and payment amounts, latest month first
BILL_COLUMNS = [f"BILL_AMT{i}" for i in range(1, 7)]
PAYMENT_COLUMNS = [f"PAY_AMT{i}" for i in range(1, 7)]
#: request columns (everything but ID and the label)
REQUEST_COLUMNS = PROFILE_COLUMNS + PAY_COLUMNS + BILL_COLUMNS + PAYMENT_COLUMNS
#: months, oldest = 0, for trend slopes
_MONTHS = np.arange(6, dtype=np.float64)[::-1]  # column 0 is the latest month (5)


def _matrix(df: pd.DataFrame, columns: list[str]) -> np.ndarray:
    return df[columns].to_numpy(dtype=np.float64)


def _slope(values: np.ndarray) -> np.ndarray:
    """Least-squares slope over the six months, per row."""
    x = _MONTHS - _MONTHS.mean()
    return (values - values.mean(axis=1, keepdims=True)) @ x / (x @ x)


def repayment_features(df: pd.DataFrame) -> np.ndarray:
    pay = _matrix(df, PAY_COLUMNS)
    return np.column_stack([
        pay,
        pay.max(axis=1),
        (pay > 0).sum(axis=1),
        (pay >= 2).sum(axis=1),
        (pay <= -1).sum(axis=1),
        _slope(pay),
    ])


def bill_features(df: pd.DataFrame) -> np.ndarray:
    bills = _matrix(df, BILL_COLUMNS)
    limit = np.maximum(df["LIMIT_BAL"].to_numpy(dtype=np.float64), 1.0)[:, None]
    use = bills / limit
    return np.column_stack([
        bills,
        bills.mean(axis=1),
        bills.std(axis=1),
        use[:, 0],
        use.mean(axis=1),
        use.max(axis=1),
        _slope(bills),
        (bills < 0).sum(axis=1),
    ])


def payment_features(df: pd.DataFrame) -> np.ndarray:
    paid = _matrix(df, PAYMENT_COLUMNS)
    bills = _matrix(df, BILL_COLUMNS)
    # PAY_AMTi pays the bill of the month before, BILL_AMT(i+1); no bill -> fully paid
    previous = bills[:, 1:]
    share = np.where(previous > 0, paid[:, :-1] / np.where(previous > 0, previous, 1.0), 1.0)
    return np.column_stack([
        paid,
        paid.sum(axis=1),
        paid.std(axis=1),
        (paid == 0).sum(axis=1),
        np.minimum(share, 10.0).mean(axis=1),
        share.min(axis=1),
    ])


def make_pipeline() -> willump.Pipeline:
    """The decorated pipeline over the credit columns."""

    @willump.feature
    def profile(df):
        return _matrix(df, PROFILE_COLUMNS)

    @willump.feature
    def repayment_status(df):
        return repayment_features(df)

    @willump.feature
    def bills(df):
        return bill_features(df)

    @willump.feature
    def payments(df):
        return payment_features(df)

    @willump.pipeline
    def credit(df):
        return [profile(df), repayment_status(df), bills(df), payments(df)]

    return credit


def model(seed: int = 0) -> Any:
    """The LightGBM classifier (shared defaults, see pipelines._lgbm)."""
    return lgbm(seed)



GROUPS = {
    "profile": "limit, sex, education, marriage, age",
    "repayment_status": "6 monthly repayment statuses + worst, months late, months 2+ late, "
    "months paid duly, trend",
    "bills": "6 bill amounts + mean, spread, utilisation (latest/mean/max), trend, credit months",
    "payments": "6 payments + total, spread, months unpaid, share of previous bill paid (mean/min)",
}


def build(data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None) -> Workload:
    """Credit default workload: label 1 = default next month; metric ROC AUC; top-K of 1."""
    df = load_credit(data_dir)
    X, y = subsample(df[REQUEST_COLUMNS], df["default"].to_numpy(dtype=np.int64), n_rows, seed=seed)
    X_train, y_train, X_test, y_test = split(X, y, seed=seed)
    return Workload(
        name="credit",
        description="UCI credit card default; profile + repayment / bill / payment aggregates -> "
        "LightGBM; top-K riskiest",
        pipeline=make_pipeline(),
        model=model(seed),
        small_model=small_model(seed),
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        metric="roc_auc",
        max_loss=MAX_LOSS,
        groups=dict(GROUPS),
        seed=seed,
        topk_label=1,
    )
