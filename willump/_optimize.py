"""willump.optimize: profile a pipeline, build cascades and a top-K filter, certify them."""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ._artifact import unpicklable_groups
from ._blocks import hstack
from ._bounds import (
    BOUNDS,
    MIN_DISAGREEMENTS,
    N_BOOTSTRAP,
    N_BOOTSTRAP_SELECT,
    Resamples,
    certifiable_floor,
    has_exact_bound,
    rows_needed,
)
from ._capture import Pipeline
from ._cascade import BaselinePipeline, Gear, Level, OptimizedPipeline
from ._gears import certify_ladder
from ._metrics import Labels, Metric, resolve_metric
from ._models import check_model, new_model, predict_proba, time_predict
from ._planner import (
    Evaluator,
    bound_method,
    candidate_subsets,
    chains_from,
    describe,
    full_cost,
    select_plan,
    sweep_cost,
    threshold_grid,
)
from ._profile import (
    IMPORTANCE_REPEATS,
    MODEL_COST_KEY,
    PROFILE_BATCH_ROWS,
    PROFILE_REPEATS,
    PROFILE_SINGLE_ROWS,
    Costs,
    fixed_node_costs,
    measure_node_costs,
    permutation_importance,
)
from ._rows import n_rows, take
from ._speed import choose_serving, measure_speedup
from ._split import SPLITS, auto_shares, make_splits
from ._summarize import Decision, build_report, plan_reason
from ._topk import plan_topk
from .errors import WillumpWarning

#: smallest number of rows allowed in each of the selection and certification splits
MIN_SPLIT_ROWS = 30
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
    if segments is not None and segment_max_loss is None:
        segment_max_loss = max_loss
    metric_obj = resolve_metric(metric)
    method = bound_method(metric_obj, bound)
    if method == "exact" and not has_exact_bound(metric_obj):
        raise ValueError(f"bound='exact' needs a rowwise metric, 'roc_auc' or 'f1'; {metric_obj.name!r} "
                         "has no exact bound (use bound='auto' or 'bootstrap')")
    if method == "product" and metric_obj.kind != "rowwise":
        raise ValueError(f"bound='product' is the earlier rule for rowwise metrics; {metric_obj.name!r} is "
                         f"a {metric_obj.kind} metric")
    if verify_speedup is None:
        verify_speedup = fixed_costs is None
    pipeline = pipeline.detached()  # fitted and captured here: the caller's object stays as it was
    auto_holdout, auto_certify = auto_shares(n_rows(X, "X"), cert is not None)
    holdout = auto_holdout if holdout == "auto" else holdout
    certify_share = auto_certify if certify_share == "auto" else certify_share
    rng = np.random.default_rng(seed)
    labels = np.asarray(y)
    timings: dict[str, float] = {}
    notes: list[str] = []

    with _step(timings, "split+capture", verbose):
        splits = make_splits(X, labels, split=split, holdout=holdout, certify_share=certify_share,
                             seed=seed, order_by=order_by, groups=groups,
                             external_cert_rows=None if cert is None else n_rows(cert[0], "cert[0]"))
        rows = {"train": take(X, splits.train), "select": take(X, splits.select),
                "cert": cert[0] if cert is not None else take(X, splits.cert)}
        y_split = {"train": labels[splits.train], "select": labels[splits.select],
                   "cert": np.asarray(cert[1]) if cert is not None else labels[splits.cert]}
        _check_split_sizes(splits.sizes())
        split_segments = None if segment_keys is None else {
            "select": segment_keys["X"][splits.select],
            "cert": segment_keys["cert"] if "cert" in segment_keys else segment_keys["X"][splits.cert]}
        if refit:
            pipeline.fit_features(rows["train"], y_split["train"])
        feature_state = _feature_state(pipeline, refit, splits)
        graph = pipeline.capture(rows["train"])
        notes.extend(graph.notes)
        group_names = list(graph.groups)

    with _step(timings, "features", verbose):
        blocks = {}
        for name in tqdm(rows, desc="willump: features", disable=not verbose, leave=False):
            blocks[name], _ = pipeline.compute(rows[name], group_names)

    with _step(timings, "full model", verbose):
        full_model, full_model_note = _full_model(model, refit, seed, blocks, group_names, y_split,
                                                  splits)
        classes = np.asarray(full_model.classes_)
        if metric_obj.builtin == "f1":
            metric_obj.f1_targets(classes)  # a pos_label that is no class fails here, not mid-search
        split_labels = {name: Labels.of(y_split[name], classes) for name in rows}
        full_proba = {s: predict_proba(full_model, hstack([blocks[s][g] for g in group_names]))
                      for s in ("select", "cert")}
        unseen = int(np.sum(split_labels["cert"].index < 0))
        if unseen:
            notes.append(f"{unseen} certification rows carry a label the full model never saw "
                         "(scored as wrong for every pipeline)")

    with _step(timings, "profile", verbose):
        if fixed_costs is not None:
            costs = fixed_node_costs(graph.nodes, fixed_costs, graph.groups)
        else:
            bar = tqdm(total=profile_repeats + 1, desc="willump: profile", disable=not verbose, leave=False)
            costs = measure_node_costs(
                pipeline, rows["select"], batch_rows=profile_batch_rows, repeats=profile_repeats,
                single_rows=profile_single_rows, rng=rng, progress=bar,
            )
            bar.close()
        _cost_model(costs, tuple(group_names), full_model, blocks["select"], profile_repeats,
                    profile_single_rows, fixed_costs)
        importance = permutation_importance(
            full_model, blocks["select"], group_names, split_labels["select"].index,
            repeats=importance_repeats, rng=rng,
        )

    n_cert = len(split_labels["cert"])
    floor = certifiable_floor(metric_obj, method, split_labels["cert"], full_proba["cert"], confidence)
    needed = rows_needed(metric_obj, method, split_labels["cert"], max_loss, confidence, full_proba["cert"])
    blocker = _blocker(graph, max_loss, floor, n_cert, needed, metric_obj, confidence)
    if blocker is None and split_segments is not None:
        blocker = _segment_blocker(split_segments["cert"], metric_obj, method, split_labels["cert"],
                                   full_proba["cert"], confidence, segment_max_loss)

    with _step(timings, "small models", verbose):
        candidates = candidate_subsets(graph, costs.per_row(cost_mode), importance.mean,
                                       max_candidates=max_candidates)
        small: dict[tuple[str, ...], Any] = {}
        probas: dict[str, dict[tuple[str, ...], np.ndarray]] = {"select": {}, "cert": {}}
        for subset in tqdm(candidates, desc="willump: small models", disable=not verbose, leave=False):
            template = small_model(subset) if callable(small_model) and not hasattr(small_model, "fit") \
                else (small_model if small_model is not None else model)
            check_model(template, "small_model")
            fitted = new_model(template, seed).fit(hstack([blocks["train"][g] for g in subset]),
                                                   y_split["train"])
            if not np.array_equal(np.asarray(fitted.classes_), classes):
                notes.append(f"small model on {list(subset)} saw other classes; candidate dropped")
                continue
            small[subset] = fitted
            _cost_model(costs, subset, fitted, blocks["select"], profile_repeats, profile_single_rows,
                        fixed_costs)
            for s in ("select", "cert"):
                probas[s][subset] = predict_proba(fitted, hstack([blocks[s][g] for g in subset]))

    with _step(timings, "plan", verbose):
        decision = Decision(None, None, [], [], candidates, small, blocker)
        gear_results: list = []
        full_cost_mode = full_cost(graph, costs, cost_mode)
        max_cost = full_cost_mode / min_speedup
        if blocker is None and small:
            chains = chains_from(list(small), group_names, max_levels)
            evaluator = _evaluator(metric_obj, split_labels["select"], full_proba["select"],
                                   N_BOOTSTRAP_SELECT, confidence, bound, graph, costs, seed,
                                   routing_tolerance, min_disagreements, project_to=n_cert,
                                   segments=None if split_segments is None else split_segments["select"],
                                   segment_max_loss=segment_max_loss)
            grids = {c: threshold_grid(probas["select"][c[0]].max(axis=1)) for c in chains}
            decision.chosen, decision.table = select_plan(evaluator, chains, probas["select"], grids,
                                                          max_loss, cost_mode, max_cost)
            decision.refused = evaluator.refused
            if decision.chosen is not None:
                certifier = _evaluator(metric_obj, split_labels["cert"], full_proba["cert"], n_bootstrap,
                                       confidence, bound, graph, costs, seed + 1, routing_tolerance,
                                       min_disagreements,
                                       segments=None if split_segments is None else split_segments["cert"],
                                       segment_max_loss=segment_max_loss)
                ladder = [(max_loss, decision.chosen)] + [
                    (m, select_plan(evaluator, chains, probas["select"], grids, m, cost_mode, max_cost)[0])
                    for m in gears]
                gear_results = certify_ladder(evaluator, certifier, ladder, probas["select"], probas["cert"],
                                              grids)
                decision.accepted, decision.tested = gear_results[0].accepted, gear_results[0].tested
        slow_reason = None
        accepted = decision.accepted
        if accepted is not None and sweep_cost(accepted, cost_mode) >= max_cost:
            slow_reason = (
                f"full pipeline: the certified cascade {describe(accepted.chain)} (threshold "
                f"{accepted.threshold:.4f}) is expected at {full_cost_mode / sweep_cost(accepted, cost_mode):.2f}x "
                f"({cost_mode} cost), below min_speedup {min_speedup:g}"
            )
            decision.accepted = None

    with _step(timings, "top-k", verbose):
        topk_filter, topk_row = plan_topk(top_k, small, probas, full_proba, graph, costs, topk_precision,
                                          confidence if topk_confidence is None else topk_confidence, notes)

    baseline = BaselinePipeline(pipeline, full_model, classes)
    levels = _levels(decision.accepted, small, full_model, group_names)
    reason = slow_reason or plan_reason(decision, max_loss, cost_mode, full_cost_mode, min_speedup)
    timing = fixed_costs is None and verify_speedup

    def serving_pipeline(levels_: list[Level]) -> tuple[OptimizedPipeline, float | None]:
        """The optimized pipeline for these levels, with its serving options chosen."""
        made = OptimizedPipeline(pipeline, levels_, classes, baseline, topk_filter, None, seed)
        if workers == "auto" and timing:
            with _step(timings, "serving options", verbose):
                return made, choose_serving(made, rows["select"], cost_mode, rng)[2]
        made.workers = 1 if workers == "auto" else workers
        made.use_cache = bool(graph.cacheable)
        return made, None

    opt, gain = serving_pipeline(levels)
    measured = None
    if decision.accepted is not None and verify_speedup:
        with _step(timings, "verify", verbose):
            measured = measure_speedup(opt, rows["select"], cost_mode, rng)  # as it will serve
        if measured < min_speedup:
            reason = (
                f"full pipeline: the certified cascade {describe(decision.accepted.chain)} (threshold "
                f"{decision.accepted.threshold:.4f}, loss bound {decision.accepted.bound.upper:.4f}) "
                f"measured {measured:.2f}x against the full pipeline on held-out rows ({cost_mode} "
                f"mode), below min_speedup {min_speedup:g}"
            )
            notes.append(reason)
            decision.accepted = None
            levels = _levels(None, small, full_model, group_names)
            opt, gain = serving_pipeline(levels)
    if opt.workers > 1 and not graph.concurrent:
        notes.append(f"workers={opt.workers} asked, but the groups run one after another (see notes above)")
    if decision.accepted is not None:
        opt.gears_ = [Gear(max_loss, levels, decision.accepted.bound.upper, decision.accepted.bound.method)] + [
            Gear(g.max_loss, _levels(g.accepted, small, full_model, group_names), g.accepted.bound.upper,
                 g.accepted.bound.method)
            for g in gear_results[1:] if g.accepted is not None]
    else:
        opt.gears_ = [Gear(max_loss, levels, None, "")]
    report = build_report(
        pipeline=pipeline, graph=graph, costs=costs, importance=importance, levels=levels,
        decision=decision, reason=reason, metric=metric_obj, max_loss=max_loss,
        confidence=confidence, bound_request=bound, topk_row=topk_row, full_proba=full_proba,
        probas=probas, labels=split_labels, splits=splits.sizes(), timings=timings, notes=notes,
        full_model_note=full_model_note, cost_mode=cost_mode, floor=floor, rows_needed=needed,
        split_how=splits.how, feature_state=feature_state,
        costs_source="measured" if fixed_costs is None else "fixed (fixed_costs=)",
    )
    report.measured_speedup = measured
    report.workers = opt.workers
    report.gears = [_gear_row(g, gear_results, graph, costs) for g in opt.gears_[1:]]
    if gears and len(opt.gears_) < len(gears) + 1:
        notes.append(f"gears: {len(opt.gears_) - 1} of {len(gears)} certified (the fixed sequence stopped, "
                     "or a gear had no plan within its max_loss)")
    report.routing_tolerance = routing_tolerance
    report.workers_gain = gain
    report.cached_groups = list(graph.cacheable) if opt.use_cache else []
    for group, why in unpicklable_groups(pipeline):
        message = (f"feature group '{group}' cannot be pickled ({why}): opt.save and serving will fail; "
                   "create what it holds inside the function or in the fit hook")
        warnings.warn(message, WillumpWarning, stacklevel=2)
        notes.append(message)
    timings["total"] = time.perf_counter() - started
    opt.report_ = report
    opt.sample_rows_ = take(rows["select"], np.arange(min(SAMPLE_ROWS, len(splits.select)))) \
        if keep_sample else None
    if verbose:
        print(report)
    return opt


# --- steps ---------------------------------------------------------------------------------
@contextmanager
def _step(timings: dict[str, float], name: str, verbose: bool):
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
    if verbose:
        tqdm.write(f"willump: {name} done in {timings[name]:.1f}s")


def _feature_state(pipeline: Pipeline, refit: bool, splits) -> str:
    state = getattr(pipeline, "has_feature_state", None)
    if not refit:
        return ("as given (refit=False): fitted outside willump; the certification rows (cert=) "
                "must be rows it never saw")
    if state:
        return f"fitted by willump on its {len(splits.train)} train rows only"
    return ("no fit hook: willump cannot tell whether the feature groups hold state fitted on rows "
            "(vocabularies, label statistics); if they do, fit it in @pipeline.fit or pass cert= rows "
            "it never saw")


def _full_model(model: Any, refit: bool, seed: int, blocks, group_names, y_split, splits):
    X_train = hstack([blocks["train"][g] for g in group_names])
    if not refit:
        if not hasattr(model, "classes_"):
            raise ValueError("refit=False serves model as given, but model is not fitted "
                             "(it has no classes_)")
        return model, (f"{type(model).__name__} on all {len(group_names)} groups, as given "
                       "(refit=False): trained outside willump; certified on the cert= rows")
    if hasattr(model, "classes_"):
        warnings.warn(
            f"model is already fitted; willump fits its own copy on its {len(splits.train)} train rows "
            "(the rows it certifies on must be unseen). To serve your fitted model, pass refit=False "
            "with cert=(X_cert, y_cert) rows it never saw", WillumpWarning, stacklevel=3)
    fitted = new_model(model, seed).fit(X_train, y_split["train"])
    return fitted, (f"{type(model).__name__} on all {len(group_names)} groups, fitted by willump on "
                    f"{len(splits.train)} train rows")


def _cost_model(costs: Costs, groups, model, blocks, repeats: int, single_rows: int, fixed) -> None:
    if fixed is not None:
        costs.model_batch[tuple(groups)] = costs.model_row[tuple(groups)] = float(fixed.get(MODEL_COST_KEY, 0.0))
        return
    X = hstack([blocks[g] for g in groups])
    batch, row = time_predict(model, X, repeats, single_rows)
    costs.model_batch[tuple(groups)] = batch
    costs.model_row[tuple(groups)] = row


def _blocker(graph, max_loss, floor, n_cert, needed, metric: Metric, confidence) -> str | None:
    """A reason no cascade can be certified, known before searching: non-deterministic groups,
    or a max_loss below what the metric's bound can certify with these rows (every metric)."""
    bad = getattr(graph, "nondeterministic", [])
    if bad:
        return (f"full pipeline: feature group(s) {bad} gave different values on two runs over the same "
                "rows; the cascade would not be the pipeline that was certified, so its bound would "
                "be void")
    if max_loss < floor:
        rows = "" if not math.isfinite(needed) else (
            f"; certifying max_loss={max_loss} needs at least {needed} certification rows")
        scaled = " (ROC AUC: counted in the minority class)" if metric.builtin == "roc_auc" else ""
        message = (
            f"max_loss={max_loss} is below the smallest {metric.name} loss the bound can certify with "
            f"{n_cert} certification rows at confidence {confidence} ({floor:.4f}){scaled}{rows}"
        )
        warnings.warn(message, WillumpWarning, stacklevel=3)
        return "full pipeline: " + message
    return None


def _evaluator(metric: Metric, labels: Labels, full_proba, resamples, confidence, bound, graph,
               costs, seed, tolerance, min_disagreements, project_to: int | None = None,
               segments: np.ndarray | None = None, segment_max_loss: float | None = None) -> Evaluator:
    method = bound_method(metric, bound)
    draws = None if method != "bootstrap" else Resamples(len(labels), resamples, np.random.default_rng(seed))
    return Evaluator(metric, labels, full_proba, draws, confidence, bound, graph, costs, tolerance,
                     min_disagreements, project_to=project_to if method != "bootstrap" else None, seed=seed,
                     segments=segments, segment_max_loss=segment_max_loss)


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
        keys = {"X": np.asarray(X[segments])}
        if cert is not None:
            if segments not in getattr(cert[0], "columns", []):
                raise ValueError(f"segments={segments!r} names no column of cert[0]")
            keys["cert"] = np.asarray(cert[0][segments])
        return keys
    if cert is not None:
        raise ValueError("with cert= rows, segments= must be a column name (present in X and cert[0])")
    array = np.asarray(segments)
    if array.shape != (n,):
        raise ValueError(f"segments must be a column name of X or hold one key per row of X ({n}); got shape "
                         f"{array.shape}")
    return {"X": array}


def _segment_blocker(keys: np.ndarray, metric: Metric, method: str, labels: Labels, full_proba,
                     confidence: float, segment_max_loss: float) -> str | None:
    """Segments whose certification rows cannot certify segment_max_loss even with no disagreement."""
    short = []
    for key in pd.unique(pd.Series(keys)):
        mask = np.asarray(keys == key)
        part = Labels(labels.values[mask], labels.index[mask], labels.classes)
        floor = certifiable_floor(metric, method, part, full_proba[mask], confidence)
        if segment_max_loss < floor:
            short.append(f"{key!r} ({int(mask.sum())} rows, floor {floor:.4f})")
    if not short:
        return None
    message = (f"segment_max_loss={segment_max_loss} is below what the certification rows of segment(s) "
               f"{', '.join(short[:10])} can certify; each segment needs its own rows")
    warnings.warn(message, WillumpWarning, stacklevel=3)
    return "full pipeline: " + message


def _gear_row(gear: Gear, results, graph, costs) -> dict[str, Any]:
    accepted = next(r.accepted for r in results if r.max_loss == gear.max_loss)
    return {"max_loss": gear.max_loss, "chain": describe(accepted.chain), "threshold": accepted.threshold,
            "loss_bound": accepted.bound.upper, "method": accepted.bound.method,
            "answered": list(accepted.fractions),
            "expected_speedup": full_cost(graph, costs, "batch") / accepted.cost_batch}


def _levels(accepted, small, full_model, groups) -> list[Level]:
    levels = []
    if accepted is not None:
        for subset in accepted.chain[:-1]:
            levels.append(Level(tuple(subset), small[tuple(subset)], accepted.threshold))
    levels.append(Level(tuple(groups), full_model, None))
    return levels


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


def _check_split_sizes(sizes: dict[str, int]) -> None:
    small = {k: v for k, v in sizes.items() if k != "train" and v < MIN_SPLIT_ROWS}
    if small or sizes["train"] < 2:
        raise ValueError(
            f"too few rows to hold out {MIN_SPLIT_ROWS}+ rows for both selection and certification "
            f"(split sizes {sizes}); pass more rows, a larger holdout, or cert= rows"
        )
