"""Adult income: numeric and one-hot categorical groups -> LightGBM.

    .venv/bin/python examples/adult.py                 (needs ../shared/datasets)
"""

import numpy as np

import willump
from pipelines import adult
from pipelines.compare import compare
from pipelines.datasets import load_adult
from pipelines.workload import split

# 1. load: UCI Adult, label '<=50K' / '>50K'; 25% held out for the comparison
people = load_adult()
X_train, y_train, X_test, y_test = split(people[adult.REQUEST_COLUMNS],
                                         people["income"].to_numpy(dtype=object), seed=0)
encoders = {}  # one-hot encoders: feature state, fitted by the fit hook below


def one_hot(df, group):
    return encoders[group].transform(adult.categories(df, adult.CATEGORICAL_GROUPS[group]))


# 2. decorate
@willump.feature
def numeric(df):
    return df[adult.NUMERIC_COLUMNS].to_numpy(dtype=float)


@willump.feature
def capital(df):
    values = df[adult.CAPITAL_COLUMNS].to_numpy(dtype=float)
    return np.column_stack([np.log1p(np.maximum(values, 0)), (values > 0).any(axis=1)])


@willump.feature
def household(df):
    return one_hot(df, "household")  # marital status, relationship, sex


@willump.feature
def work(df):
    return one_hot(df, "work")  # workclass, occupation, education


@willump.feature
def origin(df):
    return one_hot(df, "origin")  # race, native country


@willump.pipeline
def income(df):
    return [numeric(df), capital(df), household(df), work(df), origin(df)]


@income.fit  # willump calls it with the rows it trains on
def fit_encoders(X, y):
    encoders.update(adult.fit_encoders(X))


# 3. optimize for accuracy (loss <= 0.005); the cheap levels get a smaller LightGBM (40 trees,
#    15 leaves), and willump keeps the full pipeline unless the cascade measures faster
opt = willump.optimize(income, adult.model(seed=0), X_train, y_train,
                       metric="accuracy", max_loss=0.005, small_model=adult.small_model(seed=0),
                       seed=0, verbose=False)

# 4. report, 5. compare: top-K asks for the people most likely to earn > 50K
print(opt.report())
print(compare(opt, X_test, y_test, "accuracy", k=100, label=">50K"))
