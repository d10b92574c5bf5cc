"""Feature stores: lookups in order, NaN for unknown keys, a Redis store equal to the in-process one."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pandas as pd
import pytest

from pipelines.redis_server import local_redis, redis_unavailable_reason
from pipelines.stores import FeatureStore, InMemoryStore, RedisStore, SlowSegment

TABLE = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [10, 20, 30]}, index=["x", "y", "z"])


def test_in_memory_lookup_keeps_order_and_marks_unknown_keys():
    store = InMemoryStore()
    store.put_table("t", TABLE)
    assert isinstance(store, FeatureStore)
    assert store.columns("t") == ["a", "b"]
    out = store.lookup("t", pd.Series(["z", "nope", "x", "x"]))
    np.testing.assert_array_equal(out[[0, 2, 3]], [[3, 30], [1, 10], [1, 10]])
    assert np.isnan(out[1]).all()
    assert store.lookup("t", []).shape == (0, 2)


def test_bad_tables_and_unknown_tables_are_refused():
    store = InMemoryStore()
    with pytest.raises(ValueError, match="duplicate keys"):
        store.put_table("t", pd.DataFrame({"a": [1, 2]}, index=["k", "k"]))
    with pytest.raises(ValueError, match="non-numeric"):
        store.put_table("t", pd.DataFrame({"a": ["s"]}, index=["k"]))
    with pytest.raises(KeyError, match="not in the store"):
        store.lookup("missing", ["k"])


def test_slow_segment_delays_only_lookups_that_touch_it():
    store = SlowSegment(InMemoryStore(), table="t", keys=["z"], delay_s=0.05)
    store.put_table("t", TABLE)
    fast = store.lookup("t", ["x", "y"])
    assert store.slow_calls == 0  # the delay is counted where it is slept: an outcome, not a duration
    start = time.perf_counter()
    slow = store.lookup("t", ["x", "z"])
    assert time.perf_counter() - start >= 0.05  # a sleep never ends early
    assert store.slow_calls == 1
    np.testing.assert_array_equal(fast[0], slow[0])
    prefix = SlowSegment(InMemoryStore(), table="t", keys=["SF"], match="prefix")
    assert prefix.slow_mask(["SFO|1", "LAX|2"]).tolist() == [True, False]
    copy = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(copy.lookup("t", ["y"]), store.lookup("t", ["y"]))
    with pytest.raises(ValueError, match="match"):
        SlowSegment(InMemoryStore(), "t", ["x"], match="regex")


@pytest.fixture(scope="module")
def redis_url():
    reason = redis_unavailable_reason()
    if reason is not None:
        pytest.skip(f"Redis store not testable here: {reason}")
    with local_redis() as url:
        yield url


def test_redis_store_matches_the_in_memory_store(redis_url):
    memory, remote = InMemoryStore(), RedisStore(redis_url, prefix="willump:test")
    rng = np.random.default_rng(0)
    table = pd.DataFrame(rng.normal(size=(12_000, 4)), index=[f"k{i}" for i in range(12_000)])
    table.iloc[3, 2] = np.nan
    for store in (memory, remote):
        store.put_table("big", table)
    keys = [f"k{i}" for i in rng.integers(0, 13_000, 11_000)]  # some unknown, > one HMGET chunk
    np.testing.assert_array_equal(remote.lookup("big", keys), memory.lookup("big", keys))
    assert remote.columns("big") == memory.columns("big")
    again = pickle.loads(pickle.dumps(remote))  # reconnects on first use
    np.testing.assert_array_equal(again.lookup("big", keys[:10]), memory.lookup("big", keys[:10]))
    remote.drop(["big"])
    with pytest.raises(KeyError, match="not in the Redis store"):
        RedisStore(redis_url, prefix="willump:test").lookup("big", ["k1"])
