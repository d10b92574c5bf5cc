"""Credit default: aggregates of payment history, bills and payments -> LightGBM; the riskiest k.

    .venv/bin/python examples/credit.py                (needs ../shared/datasets)
"""

import willump
from pipelines import credit
from pipelines.compare import compare
from pipelines.datasets import load_credit
from pipelines.workload import split

# 1. load: 30,000 card holders, label 1 = default next month
cards = load_credit()
X_train, y_train, X_test, y_test = split(cards[credit.REQUEST_COLUMNS], cards["default"].to_numpy(), seed=0)


# 2. decorate: four groups of engineered aggregates
@willump.feature
def profile(df):
    return df[credit.PROFILE_COLUMNS].to_numpy(dtype=float)  # limit, sex, education, marriage, age


@willump.feature
def repayment_status(df):
    return credit.repayment_features(df)  # monthly statuses, worst delay, months late, trend


@willump.feature
def bills(df):
    return credit.bill_features(df)  # amounts, utilisation of the limit, trend


@willump.feature
def payments(df):
    return credit.payment_features(df)  # amounts, months unpaid, share of the bill paid


@willump.pipeline
def credit_default(df):
    return [profile(df), repayment_status(df), bills(df), payments(df)]


# 3. optimize for ROC AUC (loss <= 0.005) and plan top-K for k=100. Here the model, not the
#    features, dominates the cost, so the cheap levels get a smaller LightGBM (40 trees, 15
#    leaves); willump keeps the full pipeline unless the cascade measures faster
opt = willump.optimize(credit_default, credit.model(seed=0), X_train, y_train,
                       metric="roc_auc", max_loss=0.005, top_k=100,
                       small_model=credit.small_model(seed=0), seed=0, verbose=False)

# 4. report, 5. compare: the 100 customers most likely to default
print(opt.report())
print(compare(opt, X_test, y_test, "roc_auc", k=100, label=1))
