"""Metrics: vectorized values equal scikit-learn on resamples; kind and direction are explicit;
callables are never swapped for built-ins; scorers work; unseen labels are always wrong."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    f1_score,
    log_loss,
    make_scorer,
    roc_auc_score,
)

from willump import Metric
from willump._bounds import Resamples
from willump._metrics import Labels, resolve_metric


def _task(n_classes: int, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    logits = rng.normal(size=(n, n_classes)) + np.eye(n_classes)[y] * 1.5
    logits = np.round(logits, 1)  # ties, to exercise half-counting
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return y, proba


def _resampled(y, weights_row):
    return np.repeat(np.arange(len(y)), weights_row.astype(int))


@pytest.mark.parametrize("n_classes", [2, 3])
def test_weighted_metrics_equal_sklearn_on_resamples(n_classes):
    y, proba = _task(n_classes)
    labels = Labels.of(y, np.arange(n_classes))
    draws = Resamples(len(y), 5, np.random.default_rng(1), chunk_elements=3 * len(y))  # two chunks
    weights = np.vstack(list(draws.chunks()))
    assert weights.shape == (5, len(y)) and np.all(weights.sum(axis=1) == len(y))
    for name in ("accuracy", "f1", "roc_auc", "log_loss", "error_rate", "balanced_accuracy", "neg_log_loss"):
        metric = resolve_metric(name)
        values = metric.sign * metric.utilities(labels, proba, draws.chunks())
        for b, row in enumerate(weights):
            idx = _resampled(y, row)
            yb, pb = y[idx], proba[idx]
            if name == "accuracy":
                expected = accuracy_score(yb, pb.argmax(axis=1))
            elif name == "error_rate":
                expected = 1 - accuracy_score(yb, pb.argmax(axis=1))
            elif name == "f1":
                average = "binary" if n_classes == 2 else "macro"
                expected = f1_score(yb, pb.argmax(axis=1), average=average)
            elif name == "log_loss":
                expected = log_loss(yb, pb, labels=np.arange(n_classes))
            elif name == "neg_log_loss":
                expected = -log_loss(yb, pb, labels=np.arange(n_classes))
            elif name == "balanced_accuracy":
                expected = balanced_accuracy_score(yb, pb.argmax(axis=1))
            elif n_classes == 2:
                expected = roc_auc_score(yb, pb[:, 1])
            else:
                expected = np.mean([roc_auc_score(yb == c, pb[:, c]) for c in range(n_classes)])
            assert values[b] == pytest.approx(expected, abs=1e-10), (name, b)


def test_a_callable_is_never_replaced_by_a_builtin_of_the_same_name():
    y, proba = _task(2)
    labels = Labels.of(y, np.array([0, 1]))

    def accuracy(y_true, y_pred):  # named like the built-in, computes something else
        return float(np.mean(y_pred == 1))

    metric = resolve_metric(accuracy)
    assert metric.builtin is None and metric.name == "accuracy"
    assert metric.value(labels, proba) == pytest.approx(np.mean(proba.argmax(axis=1) == 1))
    assert metric.value(labels, proba) != pytest.approx(resolve_metric("accuracy").value(labels, proba))


def test_lower_is_better_metrics_count_loss_in_their_favour():
    y, proba = _task(2)
    labels = Labels.of(y, np.array([0, 1]))
    worse = 0.5 * proba + 0.25  # less confident: higher log loss
    for metric in (resolve_metric("log_loss"),
                   Metric("cost", fn=lambda t, p: float(np.mean(t != p)), greater_is_better=False)):
        loss = metric.utility(labels, proba) - metric.utility(labels, worse if metric.name == "log_loss"
                                                              else np.fliplr(proba))
        assert loss > 0, metric.name  # the approximation is worse: a positive loss


def test_scorers_of_builtin_functions_are_vectorized_and_others_called_directly():
    assert resolve_metric(make_scorer(balanced_accuracy_score)).builtin == "balanced_accuracy"
    assert resolve_metric("neg_log_loss").builtin == "neg_log_loss"
    adjusted = resolve_metric(make_scorer(balanced_accuracy_score, adjusted=True))
    assert adjusted.builtin is None  # other arguments: scikit-learn's own function is called
    y, proba = _task(2)
    labels = Labels.of(y, np.array([0, 1]))
    assert adjusted.value(labels, proba) == pytest.approx(
        balanced_accuracy_score(y, proba.argmax(axis=1), adjusted=True))


def test_scorers_are_called_as_scikit_learn_calls_them():
    y, proba = _task(3)
    labels = Labels.of(y, np.arange(3))
    balanced = resolve_metric(make_scorer(balanced_accuracy_score))
    assert balanced.value(labels, proba) == pytest.approx(balanced_accuracy_score(y, proba.argmax(axis=1)))
    neg_log_loss = resolve_metric("neg_log_loss")  # a scorer name: greater is better, response proba
    assert neg_log_loss.value(labels, proba) == pytest.approx(-log_loss(y, proba))
    auc = resolve_metric(make_scorer(roc_auc_score, response_method="predict_proba", multi_class="ovr"))
    assert auc.value(labels, proba) == pytest.approx(roc_auc_score(y, proba, multi_class="ovr"))


def test_unseen_labels_are_always_wrong():
    classes = np.array(["a", "b"])
    labels = Labels.of(np.array(["a", "b", "zz", "zz"]), classes)
    assert labels.index.tolist() == [0, 1, -1, -1]
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.9, 0.1], [0.1, 0.9]])
    assert resolve_metric("accuracy").value(labels, proba) == pytest.approx(0.5)
    custom = resolve_metric(lambda t, p: float(np.mean(t == p)))
    assert custom.value(labels, proba) == pytest.approx(0.5)
    rowwise = Metric("hit", fn=lambda t, p: (t == p).astype(float), kind="rowwise")
    assert rowwise.row_values(labels, proba).tolist() == [1, 1, 0, 0]


def test_rowwise_metrics_must_return_zero_one_rows():
    y, proba = _task(2)
    labels = Labels.of(y, np.array([0, 1]))
    bad = Metric("bad", fn=lambda t, p: np.full(len(t), 0.5), kind="rowwise")
    with pytest.raises(ValueError, match="one 0/1 value per row"):
        bad.value(labels, proba)


def test_bad_metrics_are_named():
    with pytest.raises(ValueError, match="metric must be one of"):
        resolve_metric("precision@k")
    with pytest.raises(TypeError, match="metric must be"):
        resolve_metric(3)
    with pytest.raises(ValueError, match="kind"):
        Metric("x", fn=lambda t, p: 0.0, kind="ranking")
    with pytest.raises(TypeError, match="callable fn"):
        Metric("x")
