"""toxic: is a tweet offensive or hateful? (Willump's Toxic analogue, on Davidson et al. 2017)

Two feature groups of very unequal cost feed one logistic regression:

- ``word_tfidf``: word unigram TF-IDF (10k terms): cheap, and already most of the signal;
- ``char_tfidf``: character 2-6-gram TF-IDF (50k n-grams): about 25x the cost, a little
  more accuracy on the hard rows (misspellings, obfuscated slurs).

So a cascade that answers the easy tweets from the words alone pays for character
n-grams only on the rows the word model is unsure of.

The binary task (offensive or hate vs neither) is ``build``; the three-class task
(hate / offensive / neither) is ``build_multiclass`` (workload ``toxic3``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

import willump

from .datasets import load_davidson
from .workload import Workload, split, subsample

#: word vocabulary size (Willump's Toxic used 10k)
WORD_MAX_FEATURES = 10_000
#: character n-gram vocabulary size and n-gram range (Willump's Toxic: 50k, 2-6)
CHAR_MAX_FEATURES = 50_000
CHAR_NGRAMS = (2, 6)
#: inverse regularization strength of the logistic regression
LR_C = 4.0
#: iterations allowed to the solver (lbfgs converges well within this here)
LR_MAX_ITER = 1000
#: accuracy the cascade may lose against the full pipeline
MAX_LOSS = 0.005
#: class names of Davidson's ``class`` column
CLASS_NAMES = {0: "hate", 1: "offensive", 2: "neither"}


def fit_vectorizers(texts: Iterable[str]) -> tuple[TfidfVectorizer, TfidfVectorizer]:
    """Word and character TF-IDF fitted on training texts (sublinear tf, as is usual for tweets)."""
    word = TfidfVectorizer(max_features=WORD_MAX_FEATURES, sublinear_tf=True).fit(texts)
    char = TfidfVectorizer(
        analyzer="char", ngram_range=CHAR_NGRAMS, max_features=CHAR_MAX_FEATURES, sublinear_tf=True
    ).fit(texts)
    return word, char


def make_pipeline(name: str = "toxic") -> willump.Pipeline:
    """The decorated pipeline over a frame with a ``tweet`` column.

    The vocabularies are feature state: the pipeline's fit hook fits them on the rows willump
    trains on (never on the rows that certify), and the feature groups read them from there.
    """
    state: dict[str, TfidfVectorizer] = {}

    @willump.feature
    def word_tfidf(df):
        return state["word"].transform(df["tweet"])

    @willump.feature
    def char_tfidf(df):
        return state["char"].transform(df["tweet"])

    @willump.pipeline(name=name)
    def toxic(df):
        return [word_tfidf(df), char_tfidf(df)]

    @toxic.fit
    def fit_vocabularies(X, y):
        state["word"], state["char"] = fit_vectorizers(X["tweet"])

    return toxic


def model() -> LogisticRegression:
    return LogisticRegression(C=LR_C, max_iter=LR_MAX_ITER)


GROUPS = {
    "word_tfidf": f"word unigram TF-IDF, {WORD_MAX_FEATURES} terms, sublinear tf",
    "char_tfidf": f"character {CHAR_NGRAMS[0]}-{CHAR_NGRAMS[1]}-gram TF-IDF, "
    f"{CHAR_MAX_FEATURES} n-grams, sublinear tf",
}


def _build(labels: np.ndarray, texts: pd.DataFrame, name: str, description: str, data_seed: int,
           n_rows: int | None, topk_label) -> Workload:
    X, y = subsample(texts, labels, n_rows, seed=data_seed)
    X_train, y_train, X_test, y_test = split(X, y, seed=data_seed)
    return Workload(
        name=name,
        description=description,
        pipeline=make_pipeline(name=name),
        model=model(),
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        metric="accuracy",
        max_loss=MAX_LOSS,
        groups=dict(GROUPS),
        seed=data_seed,
        topk_label=topk_label,
    )


def build(data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None) -> Workload:
    """Binary toxic workload: 1 = offensive or hate, 0 = neither (Davidson's class 2).

    ``n_rows`` subsamples the data set (stratified) before the 75/25 split.
    """
    df = load_davidson(data_dir)
    y = (df["class"].to_numpy() != 2).astype(np.int64)
    return _build(y, df[["tweet"]], "toxic",
                  "Davidson tweets, offensive-or-hate vs neither; word + char TF-IDF -> logistic regression",
                  seed, n_rows, topk_label=1)


def build_multiclass(
    data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None
) -> Workload:
    """Three-class workload ``toxic3``: 'hate', 'offensive' or 'neither'; top-K asks for 'hate'."""
    df = load_davidson(data_dir)
    y = df["class"].map(CLASS_NAMES).to_numpy(dtype=object)
    return _build(y, df[["tweet"]], "toxic3",
                  "Davidson tweets, hate / offensive / neither; word + char TF-IDF -> multinomial "
                  "logistic regression", seed, n_rows, topk_label="hate")
