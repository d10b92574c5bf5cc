"""The fast class probabilities equal the models' own, bit for bit, and every input the fast path
does not take goes through the model's own call (its answers and its errors as before)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from lightgbm import LGBMClassifier
from sklearn.linear_model import LogisticRegression

from willump._fast_proba import fast_proba
from willump._models import predict_proba


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 12))
    X[rng.random(X.shape) < 0.7] = 0.0  # sparse enough for the CSR cases to mean something
    binary = (X[:, 0] + 0.5 * X[:, 1] + rng.normal(scale=0.5, size=400) > 0).astype(int)
    three = np.digitize(X[:, 0] - X[:, 2], [-0.3, 0.3])
    return X, binary, three


def _inputs(X):
    rows = X[:37]
    return {"dense64": rows, "dense32": rows.astype(np.float32), "fortran": np.asfortranarray(rows),
            "one row": rows[:1], "csr64": sp.csr_matrix(rows), "csr32": sp.csr_matrix(rows.astype(np.float32)),
            "csr array": sp.csr_array(rows)}


def _models(data):
    X, binary, three = data
    return {
        "logistic": LogisticRegression(max_iter=500).fit(X, binary),
        "logistic sparse-fitted": LogisticRegression(max_iter=500).fit(sp.csr_matrix(X), binary),
        "lightgbm binary": LGBMClassifier(n_estimators=20, num_leaves=7, verbose=-1, n_jobs=1,
                                          random_state=0).fit(X, binary),
        "lightgbm three classes": LGBMClassifier(n_estimators=20, num_leaves=7, verbose=-1, n_jobs=1,
                                                 random_state=0).fit(X, three),
    }


def test_equal_to_the_models_own_bit_for_bit(data):
    taken = 0
    for name, model in _models(data).items():
        for kind, X in _inputs(data[0]).items():
            fast = fast_proba(model, X)
            own = model.predict_proba(X)
            if fast is None:
                continue
            taken += 1
            assert fast.dtype == own.dtype and fast.shape == own.shape, (name, kind)
            assert np.array_equal(fast, own), (name, kind)
            assert np.array_equal(predict_proba(model, X), own), (name, kind)
    assert taken == 4 * 7  # every model on every plain input took the fast path


def test_what_the_fast_path_leaves_to_the_model(data):
    X, binary, three = data
    logistic = LogisticRegression(max_iter=500).fit(X, binary)
    lgbm = LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1).fit(X, binary)
    import pandas as pd

    class Mine(LogisticRegression):
        def predict_proba(self, X):
            return super().predict_proba(X)

    assert fast_proba(LogisticRegression(max_iter=500).fit(X, three), X[:3]) is None  # multiclass: softmax
    assert fast_proba(Mine(max_iter=500).fit(X, binary), X[:3]) is None  # a subclass may change the answer
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(X.shape[1])])
    named = LogisticRegression(max_iter=500).fit(frame, binary)
    assert fast_proba(named, X[:3]) is None and fast_proba(named, frame.iloc[:3]) is None  # names are checked
    for model in (logistic, lgbm):
        assert fast_proba(model, X[:3].astype(int)) is None
        assert fast_proba(model, X[:3].tolist()) is None
        assert fast_proba(model, sp.csc_matrix(X[:3])) is None
        assert fast_proba(model, X[:0]) is None
        assert fast_proba(model, X[0]) is None
        assert fast_proba(model, X[:3, :5]) is None
    for model in (logistic, lgbm):  # ndarray subclasses: scikit-learn refuses or converts them
        assert fast_proba(model, np.asmatrix(X[:3])) is None
        assert fast_proba(model, np.ma.masked_array(X[:3])) is None
        assert np.array_equal(predict_proba(model, np.ma.masked_array(X[:3])),
                              model.predict_proba(np.ma.masked_array(X[:3])))
    with pytest.raises(TypeError, match="matrix"):
        predict_proba(lgbm, np.asmatrix(X[:3]))
    aliased = LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1, application="binary").fit(X, binary)
    assert fast_proba(aliased, X[:3]) is None  # its own call warns about the alias every time
    with_nan = X[:3].copy()
    with_nan[1, 2] = np.nan
    assert fast_proba(logistic, with_nan) is None
    assert np.array_equal(fast_proba(lgbm, with_nan), lgbm.predict_proba(with_nan))  # LightGBM takes NaN


def test_errors_are_the_models_own(data):
    X, binary, _ = data
    logistic = LogisticRegression(max_iter=500).fit(X, binary)
    with_nan = X[:3].copy()
    with_nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        predict_proba(logistic, with_nan)
    with pytest.raises(ValueError, match="features"):
        predict_proba(logistic, X[:3, :5])
    with pytest.raises(ValueError):
        predict_proba(LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1).fit(X, binary), X[:3, :5])


def test_a_lightgbm_model_fitted_again_answers_with_its_new_booster(data):
    """Fitted again on three classes (a new booster, new predict parameters), the answer is the
    new model's own, three columns."""
    X, binary, three = data
    model = LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1, random_state=0).fit(X, binary)
    first = fast_proba(model, X[:10])
    assert first.shape == (10, 2)
    model.fit(X, three)
    again = fast_proba(model, X[:10])
    assert again.shape == (10, 3) and np.array_equal(again, model.predict_proba(X[:10]))


def test_a_multiclass_objective_on_two_classes_keeps_the_booster_s_columns(data):
    X, binary, _ = data
    for objective in ("multiclass", "multiclassova"):
        model = LGBMClassifier(objective=objective, num_class=2, n_estimators=5, verbose=-1, n_jobs=1).fit(X, binary)
        own = model.predict_proba(X[:4])
        assert own.shape == (4, 2)
        assert np.array_equal(fast_proba(model, X[:4]), own) and np.array_equal(predict_proba(model, X[:4]), own)
