"""Classifiers: thresholds from the reference, both tails, predicates, NaN never flagged."""

from __future__ import annotations

import numpy as np
import pytest

from drift import MAD, ErrorFlag, Percentile, Predicate


def test_percentile_both_tails_from_reference() -> None:
    ref = {"x": np.arange(1.0, 1001.0)}
    clf = Percentile("x", lower=0.01, upper=0.99).fit(ref)
    assert clf.lower_threshold_ == np.quantile(ref["x"], 0.01, method="inverted_cdf")
    assert clf.upper_threshold_ == np.quantile(ref["x"], 0.99, method="inverted_cdf")
    flags = clf.flags({"x": np.array([0.5, 10.0, 500.0, 995.0, np.nan])})
    assert flags.tolist() == [True, False, False, True, False]
    one_sided = Percentile("x", lower=None, upper=0.5).fit(ref)
    assert one_sided.flags({"x": np.array([1.0, 900.0])}).tolist() == [False, True]


def test_weighted_fit_equals_repeated_values() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.array([1.0, 3.0, 1.0, 5.0])
    a = Percentile("x", lower=0.2, upper=0.8).fit({"x": x}, w)
    b = Percentile("x", lower=0.2, upper=0.8).fit({"x": np.repeat(x, w.astype(int))})
    assert (a.lower_threshold_, a.upper_threshold_) == (b.lower_threshold_, b.upper_threshold_)


def test_unfitted_percentile_refuses() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        Percentile("x").flags({"x": np.ones(3)})


def test_mad() -> None:
    rng = np.random.default_rng(0)
    clf = MAD("x", threshold=3.0).fit({"x": rng.normal(10, 2, 10_000)})
    assert clf.median_ == pytest.approx(10, abs=0.1)
    assert clf.scale_ == pytest.approx(2, rel=0.05)
    assert clf.flags({"x": np.array([10.0, 17.0, 3.0, np.nan])}).tolist() == [
        False, True, True, False]
    constant = MAD("x").fit({"x": np.array([5.0] * 10 + [6.0])})
    assert constant.flags({"x": np.array([5.0, 9.0])}).tolist() == [False, True]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("latency_ms > 50", [False, False, True, False]),
        ("latency_ms >= 50 and error == 1", [False, True, False, False]),
        ("10 < latency_ms <= 60 or not error == 0", [False, True, False, False]),
        ("-latency_ms < -55", [False, False, True, False]),
    ],
)
def test_predicate(expression: str, expected: list[bool]) -> None:
    values = {"latency_ms": np.array([5.0, 50.0, 70.0, np.nan]),
              "error": np.array([0.0, 1.0, 0.0, 1.0])}
    assert Predicate(expression).flags(values).tolist() == expected


@pytest.mark.parametrize("bad", ["", "latency_ms", "__import__('os')", "latency_ms + 1 > 2",
                                 "latency_ms > 'a'", "x >"])
def test_predicate_rejects_anything_else(bad: str) -> None:
    with pytest.raises(ValueError):
        Predicate(bad)


def test_error_flag() -> None:
    assert ErrorFlag("e").flags({"e": np.array([0.0, 1.0, 2.0, np.nan])}).tolist() == [
        False, True, True, False]
