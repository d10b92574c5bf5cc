"""Classifiers: which rows are outliers of a metric.

Why separate objects: the statistic (MAD, percentile), its threshold and the data it is fitted on
are independent choices (as in NannyML / Alibi Detect). Thresholds that need data are fitted on
the reference baseline, never on the window being judged, so an incident cannot raise its own
threshold. Every classifier maps a dict of metric arrays to a boolean mask; NaN is never an
outlier.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from drift._errors import SchemaError

#: Default per-tail percentiles: 0.5% each side, 1% in all (MacroBase's percentile classifier).
DEFAULT_LOWER_PERCENTILE = 0.005
DEFAULT_UPPER_PERCENTILE = 0.995
#: One-tailed default for metrics where only large values are bad (latency, errors, sizes):
#: MacroBase's one-sided 99th percentile cutoff (the same 1% of rows as the two tails).
DEFAULT_HIGH_PERCENTILE = 0.99
#: Metric names that get the one-tailed (high) default classifier unless configured otherwise.
HIGH_TAIL_NAMES = re.compile(
    r"(latency|duration|elapsed|time|wait|queue|delay|lag|_ms$|_us$|_ns$|_s$|seconds|error|"
    r"errors|fail|loss|retr(y|ies)|bytes|size)", re.IGNORECASE)
#: Default MAD cutoff, in robust standard deviations (MAD * 1.4826).
DEFAULT_MAD_THRESHOLD = 3.0
#: Scale making the MAD a consistent estimator of a normal standard deviation.
MAD_TO_SIGMA = 1.4826


def weighted_quantile(values: np.ndarray, q: float, weights: np.ndarray | None = None) -> float:
    """Inverted-CDF quantile (equals numpy's method='inverted_cdf' for unit weights)."""
    ok = ~np.isnan(values)
    x = values[ok]
    if x.size == 0:
        return math.nan
    if weights is None:
        return float(np.quantile(x, q, method="inverted_cdf"))
    w = weights[ok]
    order = np.argsort(x, kind="stable")
    x, cw = x[order], np.cumsum(w[order])
    target = q * cw[-1]
    idx = int(np.searchsorted(cw, target - 1e-9 * cw[-1], side="left"))
    return float(x[min(idx, x.size - 1)])


class Classifier:
    """Base: `fit` on reference values if needed, then `flags(values)` -> boolean mask."""

    kind = "classifier"
    needs_fit = False

    @property
    def columns(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def fitted(self) -> bool:
        return True

    def fit(
        self, values: Mapping[str, np.ndarray], weights: np.ndarray | None = None
    ) -> Classifier:
        return self

    def flags(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-ready description including fitted thresholds."""
        return self.to_config()

    def clone(self) -> Classifier:
        return classifier_from_config(self.to_config())


class Percentile(Classifier):
    """Outlier when below the reference's `lower` quantile or above its `upper` quantile.

    Either tail may be None (one-sided). Thresholds are inverted-CDF quantiles of the reference.
    """

    kind = "percentile"
    needs_fit = True

    def __init__(
        self,
        metric: str,
        lower: float | None = DEFAULT_LOWER_PERCENTILE,
        upper: float | None = DEFAULT_UPPER_PERCENTILE,
    ) -> None:
        if lower is None and upper is None:
            raise ValueError("Percentile needs at least one of lower, upper")
        for name, v in (("lower", lower), ("upper", upper)):
            if v is not None and not 0.0 < v < 1.0:
                raise ValueError(f"Percentile {name} must be in (0, 1), got {v!r}")
        if lower is not None and upper is not None and lower >= upper:
            raise ValueError(f"Percentile lower ({lower}) must be below upper ({upper})")
        self.metric = metric
        self.lower = lower
        self.upper = upper
        self.lower_threshold_: float | None = None
        self.upper_threshold_: float | None = None
        self._fitted = False

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.metric,)

    @property
    def fitted(self) -> bool:
        return self._fitted

    def fit(
        self, values: Mapping[str, np.ndarray], weights: np.ndarray | None = None
    ) -> Percentile:
        x = np.asarray(values[self.metric], dtype=np.float64)
        if not np.isfinite(x).any():
            raise ValueError(f"cannot fit Percentile on {self.metric!r}: no finite values")
        fin = np.isfinite(x)
        x, w = x[fin], (None if weights is None else weights[fin])
        self.lower_threshold_ = None if self.lower is None else weighted_quantile(x, self.lower, w)
        self.upper_threshold_ = None if self.upper is None else weighted_quantile(x, self.upper, w)
        self._fitted = True
        return self

    def set_thresholds(self, lower: float | None, upper: float | None) -> Percentile:
        self.lower_threshold_, self.upper_threshold_ = lower, upper
        self._fitted = True
        return self

    def flags(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        if not self._fitted:
            raise RuntimeError(f"Percentile({self.metric!r}) is not fitted; set a reference")
        x = values[self.metric]
        out = np.zeros(x.shape, dtype=bool)
        if self.lower_threshold_ is not None:
            out |= x < self.lower_threshold_
        if self.upper_threshold_ is not None:
            out |= x > self.upper_threshold_
        return out

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "lower": self.lower, "upper": self.upper}

    @property
    def tail(self) -> str:
        """'high', 'low' or 'both': which values count as outliers."""
        if self.lower is None:
            return "high"
        return "low" if self.upper is None else "both"

    def describe(self) -> dict[str, Any]:
        return {
            **self.to_config(),
            "tail": self.tail,
            "lower_threshold": self.lower_threshold_,
            "upper_threshold": self.upper_threshold_,
        }


def default_classifier(metric: str, high_tail: bool | None = None) -> Percentile:
    """The classifier a metric gets by default: one-tailed high for latency/error-like names
    (`HIGH_TAIL_NAMES`, or `high_tail=True`), two-tailed 0.5% / 99.5% otherwise."""
    if high_tail is None:
        high_tail = bool(HIGH_TAIL_NAMES.search(metric))
    if high_tail:
        return Percentile(metric, lower=None, upper=DEFAULT_HIGH_PERCENTILE)
    return Percentile(metric)


class MAD(Classifier):
    """Outlier when |x - median| > threshold * 1.4826 * MAD, median and MAD from the reference.

    When the reference MAD is 0 (over half the values equal), the mean absolute deviation
    times 1.2533 stands in; if that is 0 too, any value different from the median is an outlier.
    """

    kind = "mad"
    needs_fit = True

    def __init__(self, metric: str, threshold: float = DEFAULT_MAD_THRESHOLD) -> None:
        if not threshold > 0:
            raise ValueError(f"MAD threshold must be > 0, got {threshold!r}")
        self.metric = metric
        self.threshold = float(threshold)
        self.median_: float | None = None
        self.scale_: float | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.metric,)

    @property
    def fitted(self) -> bool:
        return self.median_ is not None

    def fit(self, values: Mapping[str, np.ndarray], weights: np.ndarray | None = None) -> MAD:
        x = np.asarray(values[self.metric], dtype=np.float64)
        fin = np.isfinite(x)
        if not fin.any():
            raise ValueError(f"cannot fit MAD on {self.metric!r}: no finite values")
        x, w = x[fin], (None if weights is None else weights[fin])
        med = weighted_quantile(x, 0.5, w)
        dev = np.abs(x - med)
        mad = weighted_quantile(dev, 0.5, w) * MAD_TO_SIGMA
        if mad == 0.0:
            mean_dev = float(np.average(dev, weights=w))
            mad = mean_dev * math.sqrt(math.pi / 2.0)
        self.median_, self.scale_ = med, mad
        return self

    def flags(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.median_ is None or self.scale_ is None:
            raise RuntimeError(f"MAD({self.metric!r}) is not fitted; set a reference")
        dev = np.abs(values[self.metric] - self.median_)
        if self.scale_ == 0.0:
            return dev > 0
        return dev > self.threshold * self.scale_

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "threshold": self.threshold}

    def describe(self) -> dict[str, Any]:
        return {**self.to_config(), "median": self.median_, "scale": self.scale_}


class ErrorFlag(Classifier):
    """Outlier when the metric is non-zero (an error flag or error count)."""

    kind = "error"

    def __init__(self, metric: str) -> None:
        self.metric = metric

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.metric,)

    def flags(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        x = values[self.metric]
        return (x != 0) & ~np.isnan(x)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric}


_COMPARE = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


class Predicate(Classifier):
    """Outlier when a boolean expression over metrics holds, e.g. ``"latency_ms > 50"``.

    Grammar: comparisons (> >= < <= == !=, chains like ``10 < x <= 50``) between metric names and
    numbers, combined with ``and``, ``or``, ``not`` and parentheses. Nothing else is evaluated.
    """

    kind = "predicate"

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"Predicate expression must be a non-empty string, got {expression!r}")
        self.expression = expression.strip()
        try:
            tree = ast.parse(self.expression, mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"cannot parse predicate {expression!r}: {exc.msg}") from exc
        names: list[str] = []
        self._check(tree.body, names)
        self._tree = tree.body
        self._columns = tuple(dict.fromkeys(names))

    def _check(self, node: ast.AST, names: list[str]) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v, names)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand, names)
        elif isinstance(node, ast.Compare):
            if not all(type(op) in _COMPARE for op in node.ops):
                raise ValueError(f"predicate {self.expression!r}: only > >= < <= == != allowed")
            for operand in (node.left, *node.comparators):
                self._check_operand(operand, names)
        else:
            raise ValueError(
                f"predicate {self.expression!r}: expected comparisons joined by and/or/not, "
                f"found {type(node).__name__}"
            )

    def _check_operand(self, node: ast.AST, names: list[str]) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not (
            isinstance(node.value, bool)
        ):
            return
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            self._check_operand(node.operand, names)
            if isinstance(node.operand, ast.Name):
                return
        else:
            raise ValueError(
                f"predicate {self.expression!r}: operands must be metric names or numbers"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        return self._columns

    def _eval(self, node: ast.AST, values: Mapping[str, np.ndarray]) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = [self._eval(v, values) for v in node.values]
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(node.op, ast.And) else (out | p)
            return out
        if isinstance(node, ast.UnaryOp):
            inner = self._eval(node.operand, values)
            if isinstance(node.op, ast.Not):
                return ~inner
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, values)
            out = None
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comp, values)
                part = _COMPARE[type(op)](left, right)
                out = part if out is None else (out & part)
                left = right
            return out
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.Constant):
            return float(node.value)
        raise AssertionError("unreachable: checked at construction")

    def flags(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        out = self._eval(self._tree, values)
        shape = next(iter(values[c] for c in self._columns)).shape if self._columns else ()
        out = np.broadcast_to(np.asarray(out, dtype=bool), shape).copy()
        # NaN in any referenced metric never makes an outlier (not (x > 1) must not flag NaN)
        for c in self._columns:
            out &= ~np.isnan(values[c])
        return out

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "expression": self.expression}


_KINDS: dict[str, type[Classifier]] = {
    "percentile": Percentile,
    "mad": MAD,
    "error": ErrorFlag,
    "predicate": Predicate,
}


def classifier_from_config(config: Mapping[str, Any]) -> Classifier:
    """Rebuild a built-in classifier from `to_config()` output."""
    params = dict(config)
    kind = params.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown classifier kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**params)


def as_classifier(spec: Classifier | str, argument: str) -> Classifier:
    """A Classifier from an object or a predicate string; TypeError naming `argument`."""
    if isinstance(spec, Classifier):
        return spec
    if isinstance(spec, str):
        return Predicate(spec)
    raise TypeError(
        f"{argument} must be a Classifier or a predicate string such as 'latency_ms > 50', "
        f"not {type(spec).__name__}"
    )


def check_columns(classifier: Classifier, metrics: tuple[str, ...], argument: str) -> None:
    unknown = [c for c in classifier.columns if c not in metrics]
    if unknown:
        raise SchemaError(
            f"{argument} refers to {unknown}, which are not numeric columns of the monitor "
            f"(numeric columns: {list(metrics)})"
        )
