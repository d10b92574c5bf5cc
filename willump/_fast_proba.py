"""Class probabilities of fitted scikit-learn logistic regressions and LightGBM classifiers, bit
for bit what their ``predict_proba`` returns, without the per-call work around the model.

Why: a fitted plan calls its models on a request's rows, one to a few dozen at a time, and
around the model's own arithmetic scikit-learn re-validates the input on every call
(``check_array``, whose dataframe test through narwhals alone is about 50 us on a sparse
matrix) while LightGBM's wrapper rebuilds its predict parameters from ``get_params``. Measured
in process (2026-12-06): toxic's LogisticRegression on 32-row CSR blocks 126 -> 10 us a call
(its cascade 1.27 -> 1.10 ms a 32-row request); adult's LGBMClassifier on one row 330 -> 57 us.

Only what the model's own call would take unchanged goes this way: a model of exactly these
classes, fitted, without feature names, and a 2-D float32/float64 ndarray or CSR matrix with at
least one row and the fitted number of columns (finite, for the logistic regression, which
refuses NaN). Anything else returns None, and the caller runs the model's own ``predict_proba``,
which answers (or raises) as before. The arithmetic is the library's own: scikit-learn's
``safe_sparse_dot`` and ``expit`` in the order its ``decision_function`` and
``_predict_proba_lr`` apply them; LightGBM's public ``Booster.predict`` with the parameters its
wrapper would pass, read once per fitted booster (``set_params`` on a fitted LightGBM model
without fitting it again is not seen: a plan's models are its own, fitted once).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import expit
from sklearn import get_config
from sklearn.utils.extmath import safe_sparse_dot

#: False: every call goes through the model's own ``predict_proba`` (benchmarks.request_path
#: times both sides in one process; process-wide, unlike scikit-learn's thread-local settings)
ENABLED = True
#: LightGBM predict parameters by model: (the booster they were read for, the parameters)
_LGBM_PARAMS: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
#: the value a model is mapped to when its parameters cannot be read: its own call serves it
_UNREADABLE = object()


def fast_proba(model: Any, X: Any) -> np.ndarray | None:
    """``model.predict_proba(X)``, identical, for the models and inputs above; None otherwise."""
    if not ENABLED:
        return None
    kind = type(model).__name__
    if kind == "LogisticRegression":
        return _logistic(model, X)
    if kind == "LGBMClassifier":
        return _lightgbm(model, X)
    return None


def _plain_input(model: Any, X: Any) -> bool:
    """A 2-D float ndarray (not a subclass: scikit-learn refuses ``np.matrix`` and converts a
    masked array) or CSR matrix, rows >= 1, the fitted column count, no names to check."""
    if hasattr(model, "feature_names_in_"):
        return False
    if type(X) is np.ndarray:
        if X.ndim != 2:
            return False
    elif not (sp.issparse(X) and X.format == "csr"):
        return False
    return (X.dtype in (np.float64, np.float32) and X.shape[0] >= 1
            and X.shape[1] == getattr(model, "n_features_in_", -1))


def _logistic(model: Any, X: Any) -> np.ndarray | None:
    """What ``decision_function`` and ``_predict_proba_lr`` compute, for a binary model."""
    # exactly scikit-learn's class (a subclass may change the answer), known without importing
    # sklearn.linear_model into processes that serve no such model
    kind = type(model)
    exact = (kind.__module__, kind.__qualname__) == ("sklearn.linear_model._logistic", "LogisticRegression")
    if not exact or not hasattr(model, "coef_") or get_config().get("array_api_dispatch"):
        return None
    # binary, one-vs-rest: what predict_proba computes through _predict_proba_lr in every version
    # (a binary model fitted as multinomial in older versions takes a softmax instead)
    if len(model.classes_) > 2 or getattr(model, "multi_class", "auto") == "multinomial":
        return None
    if not _plain_input(model, X):
        return None
    values = X.data if sp.issparse(X) else X
    if not np.isfinite(values).all():
        return None  # scikit-learn names the bad value
    coef_T = model.coef_.T if model.coef_.ndim == 2 else model.coef_
    scores = safe_sparse_dot(X, coef_T, dense_output=True) + model.intercept_
    prob = scores.reshape(-1) if scores.ndim > 1 and scores.shape[1] == 1 else scores
    prob = expit(prob, out=prob)
    return np.stack([1 - prob, prob], axis=1)


def _lightgbm(model: Any, X: Any) -> np.ndarray | None:
    """What ``LGBMClassifier.predict_proba`` computes: the booster's answer, stacked into two
    columns where it is one (a binary objective)."""
    from lightgbm import LGBMClassifier

    booster = getattr(model, "_Booster", None)
    if type(model) is not LGBMClassifier or booster is None or callable(getattr(model, "_objective", None)):
        return None
    if not _plain_input(model, X):
        return None
    params = _lgbm_params(model, booster)
    if params is _UNREADABLE:
        return None
    result = booster.predict(X, raw_score=False, start_iteration=0, num_iteration=None, pred_leaf=False,
                             pred_contrib=False, validate_features=False, **params)
    if result.ndim == 2:  # a multiclass objective (on two classes too): the booster's columns
        return result
    return np.vstack((1.0 - result, result)).transpose()


def _lgbm_params(model: Any, booster: Any) -> Any:
    """The parameters LGBMModel.predict passes to ``Booster.predict`` (none of its own keyword
    arguments given), read once per fitted booster."""
    cached = _LGBM_PARAMS.get(model)
    if cached is not None and cached[0] is booster:
        return cached[1]
    try:
        from lightgbm.basic import _choose_param_value, _ConfigAliases

        if isinstance(model.random_state, (np.random.RandomState, np.random.Generator)):
            raise TypeError("a random state object is drawn from on every call")
        if set(model.get_params()) & (set(_ConfigAliases.get("objective")) - {"objective"}):
            raise TypeError("an objective alias: the model's own call warns about it on every call")
        params = model._process_params(stage="predict")
        for alias in _ConfigAliases.get_by_alias("data", "X", "raw_score", "start_iteration", "num_iteration",
                                                 "pred_leaf", "pred_contrib"):
            params.pop(alias, None)
        params = _choose_param_value("num_threads", params, model.n_jobs)
        params["num_threads"] = model._process_n_jobs(params["num_threads"])
    except (AttributeError, ImportError, TypeError):  # another LightGBM: its own call serves
        params = _UNREADABLE
    _LGBM_PARAMS[model] = (booster, params)
    return params
