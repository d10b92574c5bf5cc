"""Independent groups run at once, and lookup-style groups serve from a bounded row cache.
Nothing here times anything: concurrency is shown with a barrier that only concurrent calls
pass, caching by counting the rows a group computes."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from willump._capture import clear_row_caches
from willump._rowcache import RowCache

from .synth import make_rows


def _barrier_pipeline():
    """Two groups that wait for each other at a barrier while ``gate["on"]``: only calls
    running at the same time pass it."""
    gate = {"on": False, "barrier": threading.Barrier(2, timeout=10)}
    threads: dict[str, str] = {}

    def meet(name):
        threads[name] = threading.current_thread().name
        if gate["on"]:
            gate["barrier"].wait()

    @willump.feature
    def left(df):
        meet("left")
        return df[["a"]].to_numpy()

    @willump.feature
    def right(df):
        meet("right")
        return df[["b", "c"]].to_numpy()

    @willump.pipeline
    def both(df):
        return [left(df), right(df)]

    return both, gate, threads


def test_independent_groups_run_at_the_same_time():
    rows = make_rows(200, seed=1)[0]
    both, gate, threads = _barrier_pipeline()
    assert both.capture(rows).concurrent
    gate["on"] = True
    blocks, _ = both.compute(rows, ["left", "right"], workers=2)  # would deadlock one at a time
    assert threads["left"] != threads["right"] and threads["left"].startswith("willump-")
    np.testing.assert_array_equal(blocks["right"], rows[["b", "c"]].to_numpy())
    gate["barrier"] = threading.Barrier(2, timeout=0.5)
    with pytest.raises(willump.FeatureError, match="BrokenBarrierError") as raised:
        both.compute(rows, ["left", "right"])  # workers=1: sequential, the barrier breaks
    assert isinstance(raised.value.__cause__, threading.BrokenBarrierError)


def test_capture_finds_whether_the_body_allows_concurrency():
    rows = make_rows(100, seed=2)[0]

    @willump.feature
    def base(df):
        return df[["a"]].to_numpy()

    @willump.feature
    def scaled(x):
        return x * 2

    @willump.feature
    def other(df):
        return df[["b"]].to_numpy()

    @willump.pipeline
    def passes_outputs(df):  # outputs only returned or passed to features: concurrent
        a = base(df)
        return [scaled(a), other(df)]

    @willump.pipeline
    def uses_outputs(df):  # arithmetic on an output in the body: sequential
        a = base(df)
        return [scaled(a + 1), other(df)]

    assert passes_outputs.capture(rows).concurrent
    blocks, _ = passes_outputs.compute(rows, ["scaled", "other"], workers=4)
    np.testing.assert_array_equal(blocks["scaled"], rows[["a"]].to_numpy() * 2)
    graph = uses_outputs.capture(rows)
    assert not graph.concurrent and any("one after another" in n for n in graph.notes)
    blocks, _ = uses_outputs.compute(rows, ["scaled"], workers=4)  # still right, sequentially
    np.testing.assert_array_equal(blocks["scaled"], (rows[["a"]].to_numpy() + 1) * 2)


def _counting_pipeline(cache: int = 1000, ttl: float | None = None):
    seen = {"rows": 0, "calls": 0}

    @willump.feature(cache=cache, cache_ttl=ttl, cache_key=["key"])
    def lookup(df):
        seen["rows"] += len(df)
        seen["calls"] += 1
        return np.column_stack([df["key"].to_numpy() * 10.0, df["key"].to_numpy() + 0.5])

    @willump.feature
    def local(df):
        return df[["x"]].to_numpy()

    @willump.pipeline
    def keyed(df):
        return [local(df), lookup(df)]

    return keyed, seen


def _keyed_rows(keys, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"key": np.asarray(keys), "x": rng.normal(size=len(keys))})


def test_row_cache_computes_only_rows_it_has_not_seen():
    keyed, seen = _counting_pipeline()
    graph = keyed.capture(_keyed_rows(np.arange(40)))
    assert graph.cacheable == ["lookup"] and graph.columns["lookup"] == ["key"]
    rows = _keyed_rows([1, 2, 3, 2, 1])
    seen.update(rows=0, calls=0)
    first, _ = keyed.compute(rows, ["lookup"], cache=True)
    assert seen["rows"] == 3 and seen["calls"] == 1  # cold: each distinct key once, one call
    second, _ = keyed.compute(_keyed_rows([3, 1, 7]), ["lookup"], cache=True)
    assert seen["rows"] == 4 and seen["calls"] == 2  # only key 7 was new
    np.testing.assert_array_equal(second[:, 0] if isinstance(second, np.ndarray) else second["lookup"][:, 0],
                                  [30.0, 10.0, 70.0])
    keyed.compute(_keyed_rows([7, 3]), ["lookup"], cache=True)
    assert seen["calls"] == 2  # all hits: the lookup is not called at all
    keyed.compute(_keyed_rows([7, 3]), ["lookup"])  # without cache=True: always computed
    assert seen["calls"] == 3
    np.testing.assert_array_equal(first["lookup"], np.column_stack([rows.key * 10.0, rows.key + 0.5]))


def test_row_cache_is_bounded_expires_and_clears_on_refit():
    cache = RowCache(2)
    cache.store([(1,), (2,)], np.eye(2))
    assert cache.lookup([(1,)])[0].all()  # (1,) used: (2,) is now the least recent
    cache.store([(3,)], np.ones((1, 2)))
    hit, rows = cache.lookup([(1,), (2,), (3,)])
    assert len(cache) == 2 and hit.tolist() == [True, False, True]
    np.testing.assert_array_equal(rows, [[1, 0], [1, 1]])
    before = cache.generation
    cache.clear()  # a refit while a row was being computed from the old state
    cache.store([(9,)], np.ones((1, 2)), generation=before)
    assert len(cache) == 0  # the stale row is not kept
    keyed, seen = _counting_pipeline(ttl=1e-9)  # every row expires at once
    keyed.capture(_keyed_rows(np.arange(40)))
    keyed.compute(_keyed_rows([1, 2]), ["lookup"], cache=True)
    seen.update(rows=0)
    keyed.compute(_keyed_rows([1, 2]), ["lookup"], cache=True)
    assert seen["rows"] == 2
    keyed, seen = _counting_pipeline()
    keyed.capture(_keyed_rows(np.arange(40)))
    keyed.compute(_keyed_rows([1, 2]), ["lookup"], cache=True)
    keyed.fit_features(None, None)  # refitting feature state empties every row cache
    seen.update(rows=0)
    keyed.compute(_keyed_rows([1, 2]), ["lookup"], cache=True)
    assert seen["rows"] == 2
    with pytest.raises(ValueError, match="cache must be a positive"):
        willump.feature(cache=0)(lambda df: df)
    with pytest.raises(ValueError, match="cache_ttl and cache_key need cache="):
        willump.feature(cache_ttl=5.0)(lambda df: df)


def test_optimized_pipeline_serves_from_the_cache_and_the_baseline_never_does():
    keyed, seen = _counting_pipeline(cache=10_000)
    rng = np.random.default_rng(3)
    X = _keyed_rows(rng.integers(0, 50, 4000), seed=4)
    y = (X["x"] + 0.1 * X["key"] + rng.normal(0, 0.3, len(X)) > 2.5).astype(int).to_numpy()
    opt = willump.optimize(keyed, LogisticRegression(), X, y, max_loss=0.05, verbose=False,
                           fixed_costs={"local": 1e-6, "lookup": 1e-3}, top_k=None)
    assert opt.report().cached_groups == ["lookup"]
    batch = _keyed_rows(rng.integers(0, 50, 300), seed=5)
    seen.update(rows=0)
    opt.baseline.predict_proba(batch)
    assert seen["rows"] == 300  # the baseline computes every row, always
    graph = opt.pipeline.graph
    cacheable, graph.cacheable = graph.cacheable, []
    want = opt.predict_proba(batch)  # the cascade without its cache
    graph.cacheable = cacheable
    clear_row_caches()
    seen.update(rows=0)
    cold = opt.predict_proba(batch)
    assert 0 < seen["rows"] <= 50  # each distinct key computed once
    seen.update(rows=0)
    warm = opt.predict_proba(batch)
    assert seen["rows"] == 0  # every key of this batch is cached now
    np.testing.assert_array_equal(cold, want)
    np.testing.assert_array_equal(warm, want)


@pytest.mark.parametrize(("seconds", "chosen"), [
    ({(1, False): 10.0, (1, True): 2.0, (4, False): 5.0, (4, True): 1.0}, (4, True)),
    ({(1, False): 10.0, (1, True): 2.0, (4, False): 11.0, (4, True): 3.0}, (1, True)),
    ({(1, False): 10.0, (1, True): 9.8, (4, False): 10.2, (4, True): 9.9}, (1, False)),  # < 5% better
])
def test_serving_options_are_chosen_by_what_they_measure(seconds, chosen):
    """The decision rule of optimize's serving-option timing, on a clock the test controls
    (no test may depend on how fast the machine is)."""
    from willump._speed import choose_serving

    keyed, _ = _counting_pipeline()
    rows = _keyed_rows(np.arange(40))
    keyed.capture(rows)
    keyed.graph.concurrent = True
    keyed.graph.depth0 = {"local", "lookup", "a", "b"}  # four top-level calls: four threads
    clock = {"now": 0.0}

    class Timed:
        workers, use_cache = 1, False
        pipeline = keyed

        def predict_proba(self, call):
            clock["now"] += seconds[(self.workers, self.use_cache)]

    opt = Timed()
    workers, cache, gain = choose_serving(opt, rows, "batch", np.random.default_rng(0),
                                          timer=lambda: clock["now"])
    assert (workers, cache) == chosen == (opt.workers, opt.use_cache)
    assert gain == pytest.approx(seconds[(1, False)] / min(seconds.values()))


def test_a_helper_shared_by_the_body_and_a_group_is_safe_with_threads():
    """The body calls clean(df) and so does a group, in another thread: the group must get the
    value (waiting for it), never the stand-in; 30 runs, each would fail on the old race."""
    import time

    @willump.feature
    def clean(df):
        time.sleep(0.002)
        return df[["a"]].to_numpy() * 2

    @willump.feature
    def uses_clean(df):
        return clean(df) + 1

    @willump.feature
    def scaled(c):
        return c * 3

    @willump.pipeline
    def shared_helper(df):
        c = clean(df)
        return [uses_clean(df), scaled(c)]

    rows = make_rows(60, seed=9)[0]
    assert shared_helper.capture(rows).concurrent
    for _ in range(30):
        out = shared_helper.execute(rows, workers=4).outputs
        np.testing.assert_array_equal(out[0], rows[["a"]].to_numpy() * 2 + 1)
        np.testing.assert_array_equal(out[1], rows[["a"]].to_numpy() * 6)


def test_cache_keys_hold_every_column_the_output_may_depend_on():
    """Found by review: a column read only for values absent from capture's sample (a route
    to HNL) was left out of the key, and JFK->HNL was served JFK->BOS's cached value."""
    @willump.feature(cache=100)
    def route(df):
        base = df["origin"].map({"JFK": 1.0, "LGA": 2.0}).to_numpy()
        return (base + 10.0 * (df["dest"] == "HNL").to_numpy())[:, None]

    @willump.feature(cache=100, cache_key=["origin"])  # a key the group outgrows: refused
    def route_narrow(df):
        return (df["origin"].map({"JFK": 1.0, "LGA": 2.0}).to_numpy() + (df["dest"] == "ORD").to_numpy())[:, None]

    @willump.feature
    def other(df):
        return df[["x"]].to_numpy()

    @willump.pipeline
    def routes(df):
        return [route(df), route_narrow(df), other(df)]

    rng = np.random.default_rng(0)
    sample = pd.DataFrame({"origin": rng.choice(["JFK", "LGA"], 200), "dest": rng.choice(["BOS", "ORD"], 200),
                           "x": rng.normal(size=200)})
    graph = routes.capture(sample)
    assert graph.cacheable == ["route"]
    assert any("not in its cache_key" in note for note in graph.notes)
    routes.compute(pd.DataFrame({"origin": ["JFK"], "dest": ["BOS"], "x": [0.0]}), ["route"], cache=True)
    hnl, _ = routes.compute(pd.DataFrame({"origin": ["JFK"], "dest": ["HNL"], "x": [0.0]}), ["route"], cache=True)
    assert hnl["route"].ravel().tolist() == [11.0]


def test_cache_keys_with_missing_values_and_integer_column_labels():
    calls = {"rows": 0}

    @willump.feature(cache=100)
    def doubled(df):
        calls["rows"] += len(df)
        return df[[0]].fillna(-1).to_numpy() * 2

    @willump.feature
    def plain(df):
        return df[[1]].to_numpy()

    @willump.pipeline
    def numbered(df):
        return [doubled(df), plain(df)]

    frame = pd.DataFrame({0: [1.0, np.nan, 3.0, np.nan], 1: [0.0, 1.0, 2.0, 3.0]})
    assert numbered.capture(frame).cacheable == ["doubled"]
    calls["rows"] = 0
    blocks, _ = numbered.compute(frame, ["doubled"], cache=True)
    assert calls["rows"] == 4  # keys are whole rows here: (NaN, 1.0) and (NaN, 3.0) differ
    numbered.compute(frame, ["doubled"], cache=True)
    assert calls["rows"] == 4  # NaN keys hit like any other value
    np.testing.assert_array_equal(blocks["doubled"].ravel(), [2.0, -2.0, 6.0, -2.0])


def test_what_serves_with_threads_and_caches_is_what_was_certified():
    from willump._routing import route

    from .synth import default_splits

    keyed, _ = _counting_pipeline(cache=10_000)
    rng = np.random.default_rng(3)
    X = _keyed_rows(rng.integers(0, 50, 4000), seed=4)
    y = (X["x"] + 0.1 * X["key"] + rng.normal(0, 0.3, len(X)) > 2.5).astype(int).to_numpy()
    opt = willump.optimize(keyed, LogisticRegression(), X, y, max_loss=0.05, verbose=False,
                           fixed_costs={"local": 1e-6, "lookup": 1e-3}, top_k=None)
    keyed = opt.pipeline  # the copy optimize captured
    assert opt.is_cascade and keyed.graph.concurrent and opt.use_cache
    opt.workers = 4
    cert = X.iloc[default_splits(X, y).cert]
    blocks, _ = keyed.compute(cert, keyed.graph.groups)  # one thread, no cache: as certified
    probas = [lv.model.predict_proba(np.hstack([blocks[g] for g in lv.groups])) for lv in opt.levels]
    levels, certified = route(probas, opt.levels[0].threshold)
    clear_row_caches()
    for _ in range(2):  # cold cache, then warm
        served, served_levels = opt.predict_with_levels(cert)
        np.testing.assert_array_equal(served_levels, levels)
        np.testing.assert_allclose(served, certified, rtol=0, atol=1e-12)
