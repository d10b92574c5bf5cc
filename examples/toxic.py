"""Toxic tweets: word TF-IDF answers most tweets; character n-grams only for the unsure ones.

    .venv/bin/python examples/toxic.py [--rows N]      (needs ../shared/datasets)
"""

import argparse

from sklearn.linear_model import LogisticRegression

import willump
from pipelines.compare import compare
from pipelines.datasets import load_davidson
from pipelines.toxic import fit_vectorizers
from pipelines.workload import split, subsample

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=None, help="use a sample of this many tweets")
args = parser.parse_args()

# 1. load: Davidson tweets, offensive-or-hate (1) vs neither (0); 25% held out for the comparison
tweets = load_davidson()
X, y = subsample(tweets[["tweet"]], (tweets["class"] != 2).astype(int).to_numpy(), args.rows, seed=0)
X_train, y_train, X_test, y_test = split(X, y, seed=0)
vocabularies = {}  # feature state, fitted by the fit hook below


# 2. decorate: one feature group per vectorizer, the pipeline returns them in model order
@willump.feature
def word_tfidf(df):
    return vocabularies["word"].transform(df["tweet"])


@willump.feature
def char_tfidf(df):
    return vocabularies["char"].transform(df["tweet"])


@willump.pipeline
def toxic(df):
    return [word_tfidf(df), char_tfidf(df)]


@toxic.fit  # willump calls it with the rows it trains on, never the rows that certify
def fit_vocabularies(X, y):
    vocabularies["word"], vocabularies["char"] = fit_vectorizers(X["tweet"])  # 10k words, 50k char n-grams


# 3. optimize: profile, build the cascade, certify accuracy loss <= 0.005 at 95% confidence
opt = willump.optimize(toxic, LogisticRegression(C=4.0, max_iter=1000), X_train, y_train,
                       metric="accuracy", max_loss=0.005, top_k=100, seed=0, verbose=False)

# 4. the report, then 5. compare with the unoptimized pipeline on the held-out tweets
print(opt.report())
print(compare(opt, X_test, y_test, "accuracy", k=100, label=1))
