"""Weighted metrics equal scikit-learn on resampled rows; the bounds behave at the edges."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

from willump._metrics import (
    bootstrap_loss_bound,
    bootstrap_weights,
    exact_accuracy_loss_bound,
    resolve_metric,
)


def _task(n_classes: int, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    logits = rng.normal(size=(n, n_classes)) + np.eye(n_classes)[y] * 1.5
    logits = np.round(logits, 1)  # ties, to exercise half-counting
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return y, proba


@pytest.mark.parametrize("n_classes", [2, 3])
def test_weighted_metrics_equal_sklearn_on_resamples(n_classes):
    y, proba = _task(n_classes)
    classes = np.arange(n_classes)
    weights = bootstrap_weights(len(y), 5, np.random.default_rng(1))
    for name in ("accuracy", "f1", "roc_auc"):
        metric = resolve_metric(name)
        fast = metric.weighted(y, proba, weights, classes)
        for b, row in enumerate(weights):
            idx = np.repeat(np.arange(len(y)), row.astype(int))
            yb, pb = y[idx], proba[idx]
            if name == "accuracy":
                expected = accuracy_score(yb, pb.argmax(axis=1))
            elif name == "f1":
                average = "binary" if n_classes == 2 else "macro"
                expected = f1_score(yb, pb.argmax(axis=1), average=average)
            elif n_classes == 2:
                expected = roc_auc_score(yb, pb[:, 1])
            else:
                expected = np.mean([roc_auc_score(yb == c, pb[:, c]) for c in range(n_classes)])
            assert fast[b] == pytest.approx(expected, abs=1e-12), (name, b)


def test_callable_metric_matches_its_function():
    y, proba = _task(2)
    metric = resolve_metric(lambda t, p: float(np.mean(t == p)))
    weights = bootstrap_weights(len(y), 3, np.random.default_rng(2))
    np.testing.assert_allclose(metric.weighted(y, proba, weights, np.array([0, 1])),
                               resolve_metric("accuracy").weighted(y, proba, weights, np.array([0, 1])))


def test_identical_pipelines_have_zero_loss():
    y, proba = _task(2)
    weights = bootstrap_weights(len(y), 200, np.random.default_rng(0))
    bound = bootstrap_loss_bound(resolve_metric("accuracy"), y, proba, proba, weights, 0.95, np.arange(2))
    assert bound.point == 0 and bound.upper == 0
    exact = exact_accuracy_loss_bound(y, proba, proba, 0.95)
    assert exact.point == 0 and 0 < exact.upper < 0.01  # no disagreement seen in 400 rows


def test_exact_bound_covers_a_known_loss():
    rng = np.random.default_rng(3)
    y = np.zeros(2000, dtype=int)
    full = np.tile([0.9, 0.1], (2000, 1))
    approx = full.copy()
    wrong = rng.random(2000) < 0.02  # the approximation errs on 2% of rows
    approx[wrong] = [0.1, 0.9]
    exact = exact_accuracy_loss_bound(y, full, approx, 0.95)
    assert exact.point == pytest.approx(wrong.mean())
    assert exact.upper > exact.point
    boot = bootstrap_loss_bound(resolve_metric("accuracy"), y, full, approx,
                                bootstrap_weights(2000, 1000, rng), 0.95, np.arange(2))
    assert exact.point < boot.upper <= exact.upper


def test_unknown_metric_is_named():
    with pytest.raises(ValueError, match="metric must be one of"):
        resolve_metric("precision@k")
    with pytest.raises(TypeError, match="metric must be"):
        resolve_metric(3)
