"""spam: is an SMS spam? (Willump's Product analogue: short texts, groups of unequal cost)

Three feature groups feed one logistic regression:

- ``message_stats``: hand-written statistics (length, words, digits, long digit runs such as
  phone numbers and short codes, URLs, capitals, '!' and currency signs): cheap, and
  very telling for SMS spam, which is full of numbers to call or text;
- ``keyword_tfidf``: word TF-IDF restricted to a keyword list (the words most associated
  with either class on the training split, by chi-squared);
- ``char_ngrams``: character 2-5-gram counts over the whole message: the costly group.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.feature_selection import chi2
from sklearn.linear_model import LogisticRegression

import willump

from .datasets import load_sms_spam
from .workload import Workload, split, subsample

#: size of the keyword list chosen on the training split
N_KEYWORDS = 200
#: least training messages a word must appear in to be a keyword candidate
KEYWORD_MIN_DF = 3
#: character n-gram range and vocabulary size of the costly group
CHAR_NGRAMS = (2, 5)
CHAR_MAX_FEATURES = 30_000
#: logistic regression settings
LR_C = 1.0
LR_MAX_ITER = 2000
#: F1 (of the spam class) the cascade may lose against the full pipeline
MAX_LOSS = 0.01

#: regular expressions of the message statistics
URL_PATTERN = re.compile(r"(?:https?://|www\.)\S+|\S+\.(?:com|co\.uk|net|org)\b", re.IGNORECASE)
DIGIT_RUN_PATTERN = re.compile(r"\d{5,}")  # phone numbers and short codes
CURRENCY_PATTERN = re.compile(r"[£$€]|\bp(?:ence|pm)\b|\bGBP\b")
WORD_PATTERN = re.compile(r"\S+")
DIGIT_PATTERN = re.compile(r"\d")
CAPITAL_PATTERN = re.compile(r"[A-Z]")
#: statistics per message (see message_statistics)
N_STATS = 10


def select_keywords(texts: pd.Series, labels: np.ndarray, n: int = N_KEYWORDS) -> list[str]:
    """The ``n`` words most associated with either class (chi-squared on word presence)."""
    counter = CountVectorizer(binary=True, min_df=KEYWORD_MIN_DF)
    presence = counter.fit_transform(texts)
    scores, _ = chi2(presence, labels)
    scores = np.nan_to_num(scores)
    words = counter.get_feature_names_out()
    order = np.lexsort((words, -scores))  # best first, ties by word (deterministic)
    return sorted(words[order[:n]].tolist())


def _counts(text: str) -> tuple[int, ...]:
    return (
        len(text),
        len(WORD_PATTERN.findall(text)),
        len(DIGIT_PATTERN.findall(text)),
        len(DIGIT_RUN_PATTERN.findall(text)),
        len(URL_PATTERN.findall(text)),
        len(CAPITAL_PATTERN.findall(text)),
        text.count("!"),
        len(CURRENCY_PATTERN.findall(text)),
    )


def message_statistics(text: pd.Series) -> np.ndarray:
    """Per message: log1p of length, words, digits, digit runs, URLs, capitals, '!', currency
    signs; and the shares of digits and capitals. A plain loop with compiled patterns: as fast
    as pandas' string methods in batch, and far cheaper for one message."""
    counts = np.array([_counts(t) for t in text.astype(str).tolist()], dtype=np.float64)
    counts = counts.reshape(len(text), N_STATS - 2)
    shares = counts[:, [2, 5]] / np.maximum(counts[:, 0], 1.0)[:, None]
    return np.hstack([np.log1p(counts), shares])


def make_pipeline() -> willump.Pipeline:
    """The decorated pipeline over a frame with a ``text`` column.

    The keywords are chosen with the labels, so they are feature state: the fit hook chooses
    them (and fits both vectorizers) on the rows willump trains on only.
    """
    state: dict[str, Any] = {}

    @willump.feature
    def message_stats(df):
        return message_statistics(df["text"])

    @willump.feature
    def keyword_tfidf(df):
        return state["keywords"].transform(df["text"])

    @willump.feature
    def char_ngrams(df):
        return state["chars"].transform(df["text"])

    @willump.pipeline
    def spam(df):
        return [message_stats(df), keyword_tfidf(df), char_ngrams(df)]

    @spam.fit
    def fit_vocabularies(X, y):
        keywords = TfidfVectorizer(vocabulary=select_keywords(X["text"], y), sublinear_tf=True)
        state["keywords"] = keywords.fit(X["text"])
        chars = CountVectorizer(analyzer="char", ngram_range=CHAR_NGRAMS, max_features=CHAR_MAX_FEATURES)
        state["chars"] = chars.fit(X["text"])

    return spam


def model() -> LogisticRegression:
    return LogisticRegression(C=LR_C, max_iter=LR_MAX_ITER)


GROUPS = {
    "message_stats": "10 hand-written message statistics (length, digits, digit runs, URLs, "
    "capitals, '!', currency)",
    "keyword_tfidf": f"word TF-IDF over {N_KEYWORDS} keywords chosen on the training split (chi-squared)",
    "char_ngrams": f"character {CHAR_NGRAMS[0]}-{CHAR_NGRAMS[1]}-gram counts, {CHAR_MAX_FEATURES} n-grams",
}


def build(data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None) -> Workload:
    """SMS spam workload: labels 'ham' / 'spam'; metric F1 of 'spam'; top-K asks for 'spam'."""
    df = load_sms_spam(data_dir)
    X, y = subsample(df[["text"]], df["label"].to_numpy(dtype=object), n_rows, seed=seed)
    X_train, y_train, X_test, y_test = split(X, y, seed=seed)
    return Workload(
        name="spam",
        description="SMS Spam Collection; message statistics + keyword TF-IDF + char n-gram counts "
        "-> logistic regression",
        pipeline=make_pipeline(),
        model=model(),
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        metric="f1",
        max_loss=MAX_LOSS,
        groups=dict(GROUPS),
        seed=seed,
        topk_label="spam",
    )
