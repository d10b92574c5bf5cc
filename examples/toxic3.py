"""Toxic tweets, three classes (hate / offensive / neither): a multiclass cascade.

    .venv/bin/python examples/toxic3.py [--rows N]     (needs ../shared/datasets)
"""

import argparse

from sklearn.linear_model import LogisticRegression

import willump
from pipelines.compare import compare
from pipelines.datasets import load_davidson
from pipelines.toxic import CLASS_NAMES, fit_vectorizers
from pipelines.workload import split, subsample

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=None, help="use a sample of this many tweets")
args = parser.parse_args()

# 1. load: labels 'hate', 'offensive', 'neither'
tweets = load_davidson()
labels = tweets["class"].map(CLASS_NAMES).to_numpy(dtype=object)
X, y = subsample(tweets[["tweet"]], labels, args.rows, seed=0)
X_train, y_train, X_test, y_test = split(X, y, seed=0)
vocabularies = {}  # feature state, fitted by the fit hook below


# 2. decorate
@willump.feature
def word_tfidf(df):
    return vocabularies["word"].transform(df["tweet"])


@willump.feature
def char_tfidf(df):
    return vocabularies["char"].transform(df["tweet"])


@willump.pipeline
def toxic3(df):
    return [word_tfidf(df), char_tfidf(df)]


@toxic3.fit  # willump fits the vocabularies on its training rows only
def fit_vocabularies(X, y):
    vocabularies["word"], vocabularies["char"] = fit_vectorizers(X["tweet"])


# 3. optimize: a row exits early when the word model's top class probability passes the threshold
opt = willump.optimize(toxic3, LogisticRegression(C=4.0, max_iter=1000), X_train, y_train,
                       metric="accuracy", max_loss=0.005, seed=0, verbose=False)

# 4. report and 5. compare; top-K asks for the tweets most likely to be hate speech
print(opt.report())
print(compare(opt, X_test, y_test, "accuracy", k=100, label="hate"))
