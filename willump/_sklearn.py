"""willump.from_sklearn: a scikit-learn Pipeline as a willump pipeline.

``Pipeline([... preprocessing ..., (features: FeatureUnion | ColumnTransformer), (model)])``
becomes a pipeline whose groups are the union's branches (the ColumnTransformer's
remainder is a group too), whose shared upstream step is the preprocessing, and
whose default model is the last step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import FeatureUnion
from sklearn.pipeline import Pipeline as SkPipeline
from sklearn.utils import _safe_indexing
from sklearn.utils.validation import check_is_fitted

from ._capture import FeatureGroup, Pipeline
from .errors import PipelineError


class _Preprocess:
    """The steps before the feature union, applied once and shared by all groups."""

    def __init__(self, owner: SklearnPipeline):
        self.owner = owner

    def __call__(self, rows: Any) -> Any:
        out = rows
        for _, step in self.owner.pre_steps:
            out = step.transform(out)
        return out


class _Branch:
    """One branch of the union: select its columns (ColumnTransformer) and transform."""

    def __init__(self, owner: SklearnPipeline, name: str):
        self.owner = owner
        self.name = name

    def __call__(self, x: Any) -> Any:
        transformer, columns, weight = self.owner.branch(self.name)
        if columns is not None:
            x = _safe_indexing(x, columns(x) if callable(columns) else columns, axis=1)
        out = x if transformer == "passthrough" else transformer.transform(x)
        if weight is not None:
            out = out * weight
        return out


class SklearnPipeline(Pipeline):
    """A willump pipeline backed by a scikit-learn Pipeline (see :func:`from_sklearn`)."""

    def __init__(self, sk_pipeline: SkPipeline, name: str | None = None):
        if not isinstance(sk_pipeline, SkPipeline):
            raise TypeError(
                f"from_sklearn expects a sklearn.pipeline.Pipeline, got {type(sk_pipeline).__name__}"
            )
        steps = list(sk_pipeline.steps)
        if len(steps) < 2:
            raise PipelineError("the scikit-learn Pipeline needs a feature step and a final estimator")
        union_at = [i for i, (_, s) in enumerate(steps) if isinstance(s, (FeatureUnion, ColumnTransformer))]
        if not union_at:
            raise PipelineError(
                "the scikit-learn Pipeline has no FeatureUnion or ColumnTransformer step; its "
                "branches are the feature groups willump optimizes"
            )
        at = union_at[-1]
        if at != len(steps) - 2:
            between = [n for n, _ in steps[at + 1 : -1]]
            raise PipelineError(
                f"steps {between} sit between the feature union and the estimator; move them inside "
                "the union's branches so each group stays separable"
            )
        estimator = steps[-1][1]
        if not callable(getattr(estimator, "predict_proba", None)):
            raise PipelineError(
                f"the final step {steps[-1][0]!r} ({type(estimator).__name__}) has no predict_proba"
            )
        self.sk_pipeline = sk_pipeline
        self.pre_steps = steps[:at]
        self.union = steps[at][1]
        self.model = estimator
        self._fitted = _is_fitted(self.union) and all(_is_fitted(s) for _, s in self.pre_steps)
        self._preprocess = FeatureGroup(_Preprocess(self), name="preprocess") if self.pre_steps else None
        self._features = [FeatureGroup(_Branch(self, n), name=n) for n in self._branch_names()]
        if not self._features:
            raise PipelineError("the feature union has no active branches")
        super().__init__(self._body, name=name or f"sklearn:{steps[at][0]}")

    def _body(self, rows: Any) -> list[Any]:
        x = self._preprocess(rows) if self._preprocess is not None else rows
        return [f(x) for f in self._features]

    def _branch_names(self) -> list[str]:
        if isinstance(self.union, FeatureUnion):
            return [n for n, t in self.union.transformer_list if t != "drop" and t is not None]
        names = [n for n, t, cols in self.union.transformers if t != "drop" and not _empty(cols)]
        if self.union.remainder != "drop":
            names.append("remainder")
        return names

    def branch(self, name: str) -> tuple[Any, Any, float | None]:
        """(fitted transformer or 'passthrough', columns or None, weight or None)."""
        if isinstance(self.union, FeatureUnion):
            weights = self.union.transformer_weights or {}
            transformer = dict(self.union.transformer_list)[name]
            return transformer, None, weights.get(name)
        for n, transformer, columns in self.union.transformers_:
            if n == name:
                return transformer, columns, (self.union.transformer_weights or {}).get(name)
        raise PipelineError(f"the ColumnTransformer has no fitted branch {name!r} (empty columns?)")

    @property
    def has_feature_state(self) -> bool:
        return True

    def detached(self) -> SklearnPipeline:
        """A new wrapper of the same scikit-learn Pipeline holding this one's fitted steps: its
        own refit (``fit_features`` fits clones) never reaches this wrapper's or the user's
        objects, and its state version is its own."""
        other = SklearnPipeline(self.sk_pipeline, name=self.name)
        other.pre_steps, other.union, other.model, other._fitted = (
            list(self.pre_steps), self.union, self.model, self._fitted)
        return other  # not captured: its groups are its own (optimize captures it)

    @property
    def is_fitted(self) -> bool:
        return self._fitted

    def fit_features(self, X: Any, y: Any) -> None:
        """Fit fresh copies of the preprocessing and the union on the training rows.

        Already-fitted transformers are refitted too: they may have seen the rows willump
        certifies on. ``optimize(refit=False, cert=...)`` keeps them as they are."""
        x = X
        fitted_pre = []
        for n, step in self.pre_steps:
            step = clone(step)
            x = step.fit_transform(x, y)
            fitted_pre.append((n, step))
        self.pre_steps = fitted_pre
        self.union = clone(self.union).fit(x, y)
        self._fitted = True
        self._fit_state.version += 1


def _is_fitted(step: Any) -> bool:
    if step == "passthrough" or step is None:
        return True
    try:
        check_is_fitted(step)
        return True
    except NotFittedError:
        return False
    except TypeError:
        return True  # not an estimator: nothing to fit


def _empty(columns: Any) -> bool:
    if callable(columns):
        return False
    if isinstance(columns, (list, tuple, np.ndarray)):
        return len(columns) == 0
    return False


def from_sklearn(sk_pipeline: SkPipeline, name: str | None = None) -> SklearnPipeline:
    """Wrap ``Pipeline([..., FeatureUnion|ColumnTransformer, estimator])`` for willump.

    Each branch becomes a feature group; steps before the union become a shared
    upstream step; ``willump.optimize`` takes the last step as the model when
    ``model`` is not given. By default optimize refits copies of the feature steps and the
    model on its own training split (fitted ones too: they may have seen the rows it
    certifies on); ``optimize(refit=False, cert=(X_cert, y_cert))`` serves them as fitted.
    """
    return SklearnPipeline(sk_pipeline, name=name)
