"""willump.optimize: profile a pipeline, build cascades and a top-K filter, certify them."""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from ._bounds import BOUNDS, MIN_DISAGREEMENTS, N_BOOTSTRAP, has_exact_bound
from ._capture import Pipeline
from ._cascade import OptimizedPipeline
from ._metrics import Metric, resolve_metric
from ._models import check_model
from ._optimize_phases import (
    _assemble,
    _attach_gears,
    _features,
    _find_blocker,
    _fit_full_model,
    _fit_small_models,
    _plan,
    _plan_topk,
    _profile,
    _report,
    _Run,
    _split_and_capture,
    _verify,
)
from ._planner import bound_method
from ._profile import IMPORTANCE_REPEATS, PROFILE_BATCH_ROWS, PROFILE_REPEATS, PROFILE_SINGLE_ROWS
from ._rows import n_rows, take
from ._split import SPLITS, auto_shares

#: held-out input rows kept with the optimized pipeline (and its artifact) so that serving can
#: derive the request schema and profile stages on the serving machine
SAMPLE_ROWS = 256


def optimize(
    pipeline: Pipeline,
    model: Any = None,
    X: Any = None,
    y: Any = None,
    *,
    metric: Any = "accuracy",
    max_loss: float = 0.005,
    confidence: float = 0.95,
    bound: str = "auto",
    cert: tuple[Any, Any] | None = None,
    split: str = "random",
    order_by: Any = None,
    groups: Any = None,
    refit: bool = True,
    cost_mode: str = "batch",
    min_speedup: float = 1.0,
    verify_speedup: bool | None = None,
    fixed_costs: Mapping[str, float] | None = None,
    small_model: Any = None,
    top_k: int | None = 100,
    topk_precision: float = 0.95,
    topk_confidence: float | None = None,
    holdout: float | str = "auto",
    certify_share: float | str = "auto",
    max_candidates: int = 6,
    max_levels: int = 3,
    n_bootstrap: int = N_BOOTSTRAP,
    min_disagreements: int = MIN_DISAGREEMENTS,
    routing_tolerance: float = 0.0,
    gears: tuple[float, ...] = (),
    segments: Any = None,
    segment_max_loss: float | None = None,
    workers: int | str = "auto",
    profile_batch_rows: int = PROFILE_BATCH_ROWS,
    profile_repeats: int = PROFILE_REPEATS,
    profile_single_rows: int = PROFILE_SINGLE_ROWS,
    importance_repeats: int = IMPORTANCE_REPEATS,
    seed: int = 0,
    keep_sample: bool = True,
    verbose: bool = True,
) -> OptimizedPipeline:
    """Optimize a decorated (or ``from_sklearn``) pipeline with a certified loss bound.

    **Rows.** ``X, y`` are divided (``split``, see ``willump._split``) into *train* (fits the
    feature state through the pipeline's fit hook, the full model and the small models),
    *selection* (profiling, importance, choosing the plan) and *certification* (only the
    final bound). ``holdout`` is the share held out of training, ``certify_share`` the part
    of it that certifies; "auto" (default) gives certification more rows at a few thousand
    labelled rows, where its floor decides (``willump._split.auto_shares``: 35% certify at 2,000
    rows or fewer, 24% at 20,000 or more). ``cert=(X_cert, y_cert)`` supplies the certification
    rows instead. The caller's pipeline object is not changed: optimize fits and captures a copy.
    Certification rows must be rows that nothing fitted has seen: feature state fitted
    outside willump on all rows (a vocabulary, a table of label statistics) voids the bound;
    fit it in the pipeline's fit hook (``@my_pipeline.fit``) so willump fits it on train rows.

    **The guarantee.** ``loss = metric(full) - metric(optimized)`` on the true labels (in the
    metric's favourable direction). With probability at least ``confidence`` over the
    certification rows, the certified plan's loss on the distribution they come from is at
    most ``max_loss``. The bound (``bound="auto"``) is exact, valid at any n, for row-wise
    metrics (accuracy, error rate: an exact unconditional test on worse and better rows), ROC
    AUC (a betting bound on pair losses) and F1 (an exact flip-rate bound); other metrics get a
    guarded paired bootstrap (asymptotic; refused when fewer than ``min_disagreements`` rows
    differ). ``bound="product"`` is the earlier rowwise rule, for comparison. Thresholds are
    tested in a fixed order from the most conservative down, stopping at the first failure
    (fixed-sequence testing: no penalty for the number tried). With n certification rows no
    bound certifies less than its floor (about ``log(1 / (1 - confidence)) / n``; for ROC AUC n
    counts the minority class): a ``max_loss`` below it warns and serves the full pipeline, for
    every metric. The plan is chosen on the selection rows by the bound they predict for the
    certification rows. The report says which bound certified the plan and why.

    **Models.** With ``refit=True`` (default) willump fits its own copy of ``model`` (and of a
    ``from_sklearn`` pipeline's feature steps) on the train rows, even when they are already
    fitted. ``refit=False`` serves ``model`` and the feature state exactly as given; it then
    needs ``cert=`` rows they never saw (``X, y`` only train the small models and select).

    **Metric.** A built-in name ('accuracy', 'error_rate', 'f1', 'roc_auc', 'log_loss'), a
    scikit-learn scorer (name or ``make_scorer`` object), a ``willump.Metric`` with an
    explicit kind and direction, or a plain callable ``fn(y_true, y_pred_labels)`` (higher
    is better). A callable is never replaced by a built-in, whatever its name.

    **Top-K.** A filter (cheap groups + small model) keeps the ceil(r*k) best rows and the
    full model ranks them; each answer is certified (precision@k >= ``topk_precision`` with
    probability >= ``topk_confidence``, default ``confidence``) by an exact test on the
    certification rows, or scored exactly when it is not (see ``willump._topk``). The ratio r
    is planned per query on the selection rows.

    **Cost.** ``cost_mode`` chooses which measured cost the plan minimizes: per row at batch
    size ("batch", throughput serving) or per one-row call ("row", latency serving). A cascade
    is a plan only if its expected cost is below the full pipeline's divided by
    ``min_speedup``; with ``verify_speedup`` (default: on unless ``fixed_costs`` is given) it
    is then timed side by side with the full pipeline on held-out rows and dropped unless it
    measures at least ``min_speedup``. ``fixed_costs`` (seconds per row per feature node,
    ``"<model>"`` for every model) replaces profiling, so the plan does not depend on how
    fast the machine is.

    ``routing_tolerance``: how far a served runtime's probabilities may differ from the
    certified ones (ONNX, a GPU). For rowwise metrics the bound then covers every routing and
    label the runtime could give within it (each affected row counted at its worst); for other
    metrics it covers the two extreme routings (every row within the tolerance of the
    threshold answered early, or none of them), not every mixture.

    **Gears.** ``gears=(0.01, 0.02)`` also certifies cheaper plans at those looser losses, for
    serving to switch to under load (``opt.gear(i)``). All gears are tested in one fixed
    sequence, so their certificates hold jointly at ``confidence`` (see ``willump._gears``).

    **Segments.** ``segments=`` (a column name of ``X``, or one key per row of ``X`` when no
    ``cert=`` rows are given) certifies several risks at once (Learn-then-Test): the overall loss
    within ``max_loss`` *and* each segment's loss within ``segment_max_loss`` (default
    ``max_loss``), each on that segment's own certification rows. A threshold passes only when
    every bound does (an intersection-union test: no correction for the number of segments), so
    every segment needs enough certification rows for its own floor; one that has too few makes
    the plan the full pipeline, named in the warning.

    **Independent groups and lookups.** ``workers`` threads run the body's top-level feature
    calls at once (groups waiting on a remote lookup overlap), and groups declared
    ``@willump.feature(cache=N)`` keep their last N rows when the optimized pipeline serves
    (never while profiling, and never in ``opt.baseline``). With ``workers="auto"`` one thread
    and one per group, each with and without the caches, are timed on held-out rows and the
    fastest is kept only if it measures faster (one thread with caches when ``fixed_costs``).
    ``small_model`` is the model of the cheap levels: None (the user's model class and
    settings), an estimator (cloned per level), or a callable ``groups -> estimator``.
    ``keep_sample`` keeps up to SAMPLE_ROWS held-out input rows with the result (and its
    artifact) for serving's request schema and stage profiling.
    """
    started = time.perf_counter()
    if model is None:
        model = getattr(pipeline, "model", None)
        if model is None:
            raise TypeError("model is required (the pipeline does not carry one)")
    _validate(pipeline, model, X, y, cert, refit, max_loss, confidence, bound, metric, holdout,
              certify_share, top_k, topk_precision, topk_confidence, max_levels, n_bootstrap,
              split, cost_mode, min_speedup, min_disagreements, routing_tolerance, workers, gears)
    segment_keys = _segment_keys(X, cert, segments, segment_max_loss)
    metric_obj = resolve_metric(metric)
    method = _checked_bound_method(metric_obj, bound)
    detached = pipeline.detached()  # fitted and captured here: the caller's object stays as it was
    auto_holdout, auto_certify = auto_shares(n_rows(X, "X"), cert is not None)
    run = _Run(
        pipeline=detached, model=model, X=X, labels=np.asarray(y), cert=cert, metric=metric_obj,
        method=method, bound=bound, max_loss=max_loss, confidence=confidence, split=split,
        order_by=order_by, groups=groups, refit=refit,
        holdout=auto_holdout if holdout == "auto" else holdout,
        certify_share=auto_certify if certify_share == "auto" else certify_share,
        cost_mode=cost_mode, min_speedup=min_speedup,
        verify_speedup=fixed_costs is None if verify_speedup is None else verify_speedup,
        fixed_costs=fixed_costs, small_model=small_model, top_k=top_k, topk_precision=topk_precision,
        topk_confidence=confidence if topk_confidence is None else topk_confidence,
        max_candidates=max_candidates, max_levels=max_levels, n_bootstrap=n_bootstrap,
        min_disagreements=min_disagreements, routing_tolerance=routing_tolerance, gears=gears,
        segment_keys=segment_keys, segments_by=segments if isinstance(segments, str) else None,
        segment_max_loss=max_loss if segments is not None and segment_max_loss is None else segment_max_loss,
        workers=workers, profile_batch_rows=profile_batch_rows, profile_repeats=profile_repeats,
        profile_single_rows=profile_single_rows, importance_repeats=importance_repeats, seed=seed,
        verbose=verbose, rng=np.random.default_rng(seed),
    )
    _split_and_capture(run)
    _features(run)
    _fit_full_model(run)
    _profile(run)
    _find_blocker(run)
    _fit_small_models(run)
    _plan(run)
    _plan_topk(run)
    _assemble(run)
    _verify(run)
    _attach_gears(run)
    _report(run)
    run.timings["total"] = time.perf_counter() - started
    opt = run.opt
    opt.sample_rows_ = take(run.rows["select"], np.arange(min(SAMPLE_ROWS, len(run.splits.select)))) \
        if keep_sample else None
    if verbose:
        print(opt.report_)
    return opt


# --- validation ----------------------------------------------------------------------------
def _validate(pipeline, model, X, y, cert, refit, max_loss, confidence, bound, metric, holdout,
              certify_share, top_k, topk_precision, topk_confidence, max_levels, n_bootstrap, split,
              cost_mode, min_speedup, min_disagreements, routing_tolerance, workers, gears) -> None:
    if not isinstance(pipeline, Pipeline):
        raise TypeError(
            "pipeline must be a @willump.pipeline function or willump.from_sklearn(...), got "
            f"{type(pipeline).__name__}"
        )
    check_model(model)
    if X is None or y is None:
        raise TypeError("X and y are required")
    n = n_rows(X, "X")
    labels = _labels_1d(y, "y")
    if len(labels) != n:
        raise ValueError(f"X has {n} rows but y has {len(labels)}")
    if len(np.unique(labels)) < 2:
        raise ValueError("y must contain at least two classes")
    if cert is not None:
        if not isinstance(cert, (tuple, list)) or len(cert) != 2:
            raise TypeError("cert must be a pair (X_cert, y_cert)")
        n_cert = n_rows(cert[0], "cert[0]")
        cert_labels = _labels_1d(cert[1], "cert[1]")
        if len(cert_labels) != n_cert:
            raise ValueError(f"cert[0] has {n_cert} rows but cert[1] has {len(cert_labels)}")
        if _label_kind(cert_labels) != _label_kind(labels):
            raise ValueError(
                f"cert[1] holds {_label_kind(cert_labels)} labels but y holds {_label_kind(labels)} labels: "
                "every certification label would count as one the model never saw (read both the "
                "same way)")
        missing = sorted(set(map(str, getattr(X, "columns", []))) - set(map(str, getattr(cert[0], "columns", []))))
        if hasattr(X, "columns") and missing:
            raise ValueError(f"cert[0] lacks column(s) {missing[:10]} that X has")
    if not refit and cert is None:
        raise ValueError(
            "refit=False serves the model and feature state as given, so willump cannot know which "
            "rows they were fitted on: pass cert=(X_cert, y_cert) with rows they never saw")
    _number(max_loss, "max_loss", 0, 1, low_open=True, high_open=True)
    _number(confidence, "confidence", 0.5, 1, high_open=True)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if cost_mode not in ("batch", "row"):
        raise ValueError(f"cost_mode must be 'batch' or 'row', got {cost_mode!r}")
    if not min_speedup > 0:
        raise ValueError(f"min_speedup must be positive, got {min_speedup}")
    resolve_metric(metric)
    if holdout != "auto":
        _number(holdout, "holdout", 0, 1, low_open=True, high_open=True)
    if certify_share != "auto":
        _number(certify_share, "certify_share", 0, 1, low_open=True, high_open=True)
    if top_k is not None:
        _integer(top_k, "top_k", 1)
    _number(topk_precision, "topk_precision", 0, 1, low_open=True)
    if topk_confidence is not None:
        _number(topk_confidence, "topk_confidence", 0.5, 1, high_open=True)
    _integer(max_levels, "max_levels", 2)
    _integer(n_bootstrap, "n_bootstrap", 100)
    _integer(min_disagreements, "min_disagreements", 1)
    _number(routing_tolerance, "routing_tolerance", 0, 0.5, high_open=True)
    ladder = [max_loss, *gears] if isinstance(gears, (tuple, list)) else None
    if ladder is None or not all(isinstance(m, (int, float)) and 0 < m < 1 for m in gears) \
            or any(b <= a for a, b in pairwise(ladder)):
        raise ValueError(f"gears must be looser max_loss values in increasing order, each above max_loss "
                         f"{max_loss}; got {gears!r}")
    if workers != "auto":
        _integer(workers, "workers", 1, extra="'auto' or ")


def _number(value: Any, name: str, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False) -> None:
    """A real number in the interval, or a ValueError naming the argument."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


def _integer(value: Any, name: str, low: int, extra: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be {extra}an integer >= {low}, got {value!r}")


def _labels_1d(values: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except Exception as exc:
        raise ValueError(f"{name} must be a 1-D sequence of labels") from exc
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of labels, got shape {array.shape}")
    return array


def _label_kind(labels: np.ndarray) -> str:
    """'numeric', 'text' or 'other': labels of different kinds never compare equal."""
    kind = labels.dtype.kind
    if kind in "biuf":
        return "numeric"
    if kind in "US":
        return "text"
    sample = [v for v in labels[:100].tolist() if v is not None]
    if sample and all(isinstance(v, numbers.Number) for v in sample):
        return "numeric"
    if sample and all(isinstance(v, str) for v in sample):
        return "text"
    return "other"


def _checked_bound_method(metric: Metric, bound: str) -> str:
    """The bound the metric gets; a ValueError when the one asked for cannot serve it."""
    method = bound_method(metric, bound)
    if method == "exact" and not has_exact_bound(metric):
        raise ValueError(f"bound='exact' needs a rowwise metric, 'roc_auc' or 'f1'; {metric.name!r} "
                         "has no exact bound (use bound='auto' or 'bootstrap')")
    if method == "product" and metric.kind != "rowwise":
        raise ValueError(f"bound='product' is the earlier rule for rowwise metrics; {metric.name!r} is "
                         f"a {metric.kind} metric")
    return method


def _segment_keys(X, cert, segments, segment_max_loss) -> dict[str, np.ndarray] | None:
    """The segment key of every row of X (and of the cert= rows), validated."""
    if segments is None:
        if segment_max_loss is not None:
            raise ValueError("segment_max_loss needs segments= (a column name of X or one key per row)")
        return None
    if segment_max_loss is not None:
        _number(segment_max_loss, "segment_max_loss", 0, 1, low_open=True, high_open=True)
    n = n_rows(X, "X")
    if isinstance(segments, str):
        columns = getattr(X, "columns", None)
        if columns is None or segments not in columns:
            raise ValueError(f"segments={segments!r} names no column of X")
        keys = {"X": _present(np.asarray(X[segments]))}
        if cert is not None:
            if segments not in getattr(cert[0], "columns", []):
                raise ValueError(f"segments={segments!r} names no column of cert[0]")
            keys["cert"] = _present(np.asarray(cert[0][segments]))
        return keys
    if cert is not None:
        raise ValueError("with cert= rows, segments= must be a column name (present in X and cert[0])")
    array = np.asarray(segments)
    if array.shape != (n,):
        raise ValueError(f"segments must be a column name of X or hold one key per row of X ({n}); got shape "
                         f"{array.shape}")
    return {"X": _present(array)}


#: the segment of rows whose key is missing (NaN, None: never equal to itself, so its rows
#: would make a segment of none)
MISSING_SEGMENT = "<none>"


def _present(keys: np.ndarray) -> np.ndarray:
    """Segment keys with the missing ones named :data:`MISSING_SEGMENT`."""
    missing = pd.isna(keys)
    if not missing.any():
        return keys
    out = keys.astype(object)
    out[missing] = MISSING_SEGMENT
    return out
