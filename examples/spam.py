"""SMS spam: cheap message statistics and keywords answer most messages; char n-grams the rest.

    .venv/bin/python examples/spam.py                  (needs ../shared/datasets)
"""

from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.linear_model import LogisticRegression

import willump
from pipelines.compare import compare
from pipelines.datasets import load_sms_spam
from pipelines.spam import message_statistics, select_keywords
from pipelines.workload import split

# 1. load: labels 'ham' / 'spam'; 25% held out for the comparison
sms = load_sms_spam()
X_train, y_train, X_test, y_test = split(sms[["text"]], sms["label"].to_numpy(dtype=object), seed=0)
state = {}  # keywords (chosen with the labels!) and vocabularies: fitted by the fit hook below


# 2. decorate: three groups of very different cost
@willump.feature
def message_stats(df):
    return message_statistics(df["text"])  # length, digits, digit runs, URLs, capitals, ...


@willump.feature
def keyword_tfidf(df):
    return state["keywords"].transform(df["text"])


@willump.feature
def char_ngrams(df):
    return state["chars"].transform(df["text"])


@willump.pipeline
def spam(df):
    return [message_stats(df), keyword_tfidf(df), char_ngrams(df)]


@spam.fit  # willump calls it with its training rows: certification labels never pick keywords
def fit_vocabularies(X, y):
    keywords = TfidfVectorizer(vocabulary=select_keywords(X["text"], y), sublinear_tf=True)
    state["keywords"] = keywords.fit(X["text"])
    state["chars"] = CountVectorizer(analyzer="char", ngram_range=(2, 5), max_features=30_000).fit(X["text"])


# 3. optimize for F1 of 'spam', losing at most 0.01
opt = willump.optimize(spam, LogisticRegression(max_iter=2000), X_train, y_train,
                       metric="f1", max_loss=0.01, seed=0, verbose=False)

# 4. report, 5. compare
print(opt.report())
print(compare(opt, X_test, y_test, "f1", k=100, label="spam"))
