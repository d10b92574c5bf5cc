"""The flights workload: runs from the PyPI package alone, lookups without leakage, a usable
optimized pipeline (the demo's), stores chosen by argument."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import willump
from pipelines import flights
from pipelines.redis_server import local_redis, redis_unavailable_reason
from pipelines.stores import InMemoryStore, RedisStore, SlowSegment

FAST = dict(verbose=False, profile_repeats=1, profile_single_rows=3, importance_repeats=1)
ROWS = 6_000


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("WILLUMP_DATASETS", str(tmp_path_factory.mktemp("no-shared")))  # not needed
    try:
        yield flights.build(n_rows=ROWS, seed=1)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def optimized(workload):
    return workload.optimize(**FAST)


def test_builds_without_shared_data_and_splits_held_out(workload):
    assert len(workload.X_train) + len(workload.X_test) == ROWS
    assert list(workload.X_test.columns) == list(flights.REQUEST_COLUMNS)
    assert not {"arr_delay", "dep_delay", "air_time"} & set(workload.X_test.columns)
    assert set(workload.groups) == {"schedule", "plane", "weather", "dest_airport",
                                    "carrier_history", "route_stats"}
    assert 0.15 < workload.y_train.mean() < 0.3
    assert isinstance(workload.store, InMemoryStore)


def test_lookups_find_their_rows(workload):
    workload.pipeline.fit_features(workload.X_train, workload.y_train)  # what optimize's hook does
    store, X = workload.store, workload.X_test
    weather = store.lookup("weather", X["origin"] + "|" + X["time_hour"])
    assert np.isfinite(weather[:, 0]).mean() > 0.95
    planes = store.lookup("plane", X["tailnum"])
    assert 0.7 < np.isfinite(planes[:, 1]).mean() < 1.0  # some tail numbers are not in planes
    history = store.lookup("carrier_history", X["carrier"] + "|" + flights.date_keys(X))
    assert np.isfinite(history[:, 0]).mean() > 0.95


def test_flight_dates_weekday_and_invalid_dates():
    df = pd.DataFrame({"year": [2013, 2013, 2013], "month": [1, 4, 13], "day": [1, 31, 1]})
    dates = flights.flight_dates(df)
    assert str(dates[0]) == "2013-01-01"
    assert np.isnat(dates[1]) and np.isnat(dates[2])  # 31 April, month 13
    assert flights.date_keys(df)[0] == "2013-01-01"


def test_carrier_history_uses_only_earlier_days():
    train = pd.DataFrame({"carrier": ["AA"] * 4, "year": 2013, "month": 1, "day": [1, 1, 2, 9]})
    late = np.array([1, 0, 1, 1])
    table = flights.carrier_history_table(train, late, np.array([30.0, 0.0, 60.0, 90.0]))
    assert np.isnan(table.loc["AA|2013-01-01", "hist_late_share"])  # nothing before day 1
    assert table.loc["AA|2013-01-02", "hist_flights"] == 2
    assert table.loc["AA|2013-01-02", "hist_late_share"] == 0.5
    assert table.loc["AA|2013-01-03", "hist_flights"] == 3  # day 3 sees days 1 and 2
    assert table.loc["AA|2013-01-09", "hist_flights"] == 1  # 7-day window: day 2 only
    assert table.loc["AA|2013-01-09", "hist_mean_delay"] == 60.0
    assert table.loc["AA|2013-01-10", "prev_day_late_share"] == 1.0


def test_tables_built_from_labels_see_willump_train_rows_only(optimized, workload):
    """The route and carrier tables hold outcomes of the rows willump trains on, never of the
    rows that select or certify the plan (the fit hook is called with the train split)."""
    report = optimized.report()
    train = report.splits["train"]
    assert train < len(workload.X_train)
    routes = workload.store.lookup("route_stats", pd.Series(sorted({
        f"{o}|{d}" for o, d in zip(workload.X_train["origin"], workload.X_train["dest"], strict=True)})))
    assert np.nansum(routes[:, 0]) == train  # route_flights sums to the train rows
    assert "fitted by willump on its" in report.feature_state


def test_optimized_pipeline_is_consistent_and_saves(optimized, workload, tmp_path):
    X = workload.X_test.iloc[:500]
    proba, level = optimized.predict_with_levels(X)
    assert np.allclose(proba.sum(axis=1), 1.0)
    full_rows = level == len(optimized.levels) - 1
    np.testing.assert_allclose(proba[full_rows], optimized.baseline.predict_proba(X)[full_rows])
    report = optimized.report()
    assert report.plan in ("cascade", "full")
    if report.plan == "cascade":
        assert report.loss_bound <= workload.max_loss and report.expected_speedup > 1.0
    optimized.save(tmp_path / "flights.willump")
    loaded = willump.load(tmp_path / "flights.willump")
    np.testing.assert_allclose(loaded.predict_proba(X), optimized.predict_proba(X))
    single = optimized.predict_proba(X.iloc[[0]])
    np.testing.assert_allclose(single, proba[:1])


def test_store_is_chosen_by_argument_and_a_slow_segment_can_be_planted():
    slow = SlowSegment(InMemoryStore(), table="dest_airport", keys=["SFO"], delay_s=0.02)
    w = flights.build(n_rows=3_000, seed=2, store=slow)
    assert w.store is slow
    X = w.X_test
    to_sfo = X[X["dest"] == "SFO"].iloc[:1]
    elsewhere = X[X["dest"] != "SFO"].iloc[:1]
    w.pipeline.fit_features(w.X_train, w.y_train)
    w.pipeline.capture(w.X_train.iloc[:64])
    before = slow.slow_calls
    w.pipeline.compute(elsewhere, w.pipeline.graph.groups)
    assert slow.slow_calls == before
    w.pipeline.compute(to_sfo, w.pipeline.graph.groups)
    assert slow.slow_calls == before + 1
    with pytest.raises(TypeError, match="feature store"):
        flights.build(n_rows=3_000, store=object())


@pytest.mark.skipif(redis_unavailable_reason() is not None,
                    reason=f"Redis store not testable here: {redis_unavailable_reason()}")
def test_redis_backed_flights_equal_in_memory_flights(workload):
    with local_redis() as url:
        remote = flights.build(n_rows=ROWS, seed=1, store=RedisStore(url, prefix="willump:test-fl"),
                               name="flights_redis")
        X = remote.X_test.iloc[:300]
        for w in (remote, workload):
            w.pipeline.fit_features(w.X_train, w.y_train)
            w.pipeline.capture(w.X_train.iloc[:64])
        got, _ = remote.pipeline.compute(X, remote.pipeline.graph.groups)
        want, _ = workload.pipeline.compute(X, workload.pipeline.graph.groups)
        for group, block in want.items():
            np.testing.assert_array_equal(got[group], block)
