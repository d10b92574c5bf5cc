"""The phases of ``willump.optimize``, in the order it runs them, over one shared ``_Run``.

``optimize`` validates its arguments and builds the run; each phase then reads what the phases
before it left on the run and fills in its own part. The timed phases run inside ``_step``
under the names the report's timings show."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ._artifact import unpicklable_groups
from ._blocks import hstack
from ._bounds import N_BOOTSTRAP_SELECT, Resamples, certifiable_floor, rows_needed
from ._capture import Pipeline
from ._cascade import BaselinePipeline, Gear, Level, OptimizedPipeline
from ._confidence import calibration_map
from ._gears import certify_ladder
from ._metrics import Labels, Metric
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
    MODEL_COST_KEY,
    Costs,
    fixed_node_costs,
    measure_node_costs,
    permutation_importance,
)
from ._routing import route
from ._rows import n_rows, take
from ._speed import choose_serving, measure_speedup
from ._split import make_splits
from ._summarize import Decision, build_report, plan_reason
from ._topk import plan_topk
from .errors import WillumpWarning

if TYPE_CHECKING:
    from ._gears import GearResult
    from ._graph import Graph
    from ._profile import Importance
    from ._report import TopKRow
    from ._split import Splits
    from ._topk import TopKFilter

#: smallest number of rows allowed in each of the selection and certification splits
MIN_SPLIT_ROWS = 30


@dataclass(repr=False)
class _Run:
    """One optimize call: the options as validated and resolved by ``optimize`` (the "auto"
    shares, the metric object, every default filled in), then what each phase leaves for the
    next. A phase's fields are unset until it has run, so reading one early fails loudly."""

    pipeline: Pipeline  # optimize's detached copy: fitted and captured here, never the caller's
    model: Any
    X: Any
    labels: np.ndarray  # y as an array
    cert: tuple[Any, Any] | None
    metric: Metric
    method: str  # the bound the metric gets ("exact", "bootstrap", "product")
    bound: str  # the bound asked for
    max_loss: float
    confidence: float
    split: str
    order_by: Any
    groups: Any
    refit: bool
    holdout: float
    certify_share: float
    cost_mode: str
    min_speedup: float
    verify_speedup: bool
    fixed_costs: Mapping[str, float] | None
    small_model: Any
    top_k: int | None
    topk_precision: float
    topk_confidence: float
    max_candidates: int
    max_levels: int
    n_bootstrap: int
    min_disagreements: int
    routing_tolerance: float
    gears: tuple[float, ...]
    segment_keys: dict[str, np.ndarray] | None
    segment_max_loss: float | None
    segments_by: str | None  # the column segments= named (None: none, or one key per row)
    workers: int | str
    profile_batch_rows: int
    profile_repeats: int
    profile_single_rows: int
    importance_repeats: int
    seed: int
    verbose: bool
    rng: np.random.Generator
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # _split_and_capture
    splits: Splits = field(init=False)
    rows: dict[str, Any] = field(init=False)  # "train", "select", "cert" -> input rows
    y_split: dict[str, np.ndarray] = field(init=False)
    split_segments: dict[str, np.ndarray] | None = field(init=False)
    feature_state: str = field(init=False)
    graph: Graph = field(init=False)
    group_names: list[str] = field(init=False)
    # _features
    blocks: dict[str, dict[str, Any]] = field(init=False)  # split -> group -> block
    # _fit_full_model
    full_model: Any = field(init=False)
    full_model_note: str = field(init=False)
    classes: np.ndarray = field(init=False)
    split_labels: dict[str, Labels] = field(init=False)
    full_proba: dict[str, np.ndarray] = field(init=False)  # "select", "cert"
    # _profile
    costs: Costs = field(init=False)
    importance: Importance = field(init=False)
    # _find_blocker
    floor: float = field(init=False)
    needed: float = field(init=False)
    blocker: str | None = field(init=False)
    # _fit_small_models
    candidates: list[tuple[str, ...]] = field(init=False)
    small: dict[tuple[str, ...], Any] = field(init=False)
    probas: dict[str, dict[tuple[str, ...], np.ndarray]] = field(init=False)
    # _plan
    decision: Decision = field(init=False)
    gear_results: list[GearResult] = field(init=False)
    full_cost: float = field(init=False)  # the full pipeline's cost in cost_mode
    slow_reason: str | None = field(init=False)
    # _plan_topk
    topk_filter: TopKFilter | None = field(init=False)
    topk_row: TopKRow = field(init=False)
    # _assemble, _verify
    baseline: BaselinePipeline = field(init=False)
    levels: list[Level] = field(init=False)
    reason: str = field(init=False)
    opt: OptimizedPipeline = field(init=False)
    workers_gain: float | None = field(init=False)
    measured: float | None = field(init=False)


# --- the phases, in order ------------------------------------------------------------------
def _split_and_capture(run: _Run) -> None:
    """Divide the rows before anything is fitted, so the certification rows stay unseen by the
    feature state and by every model; then fit the feature state on the train rows only and
    capture the graph (groups, nodes, determinism, caches) from them."""
    with _step(run.timings, "split+capture", run.verbose):
        X, cert, labels = run.X, run.cert, run.labels
        splits = run.splits = make_splits(
            X, labels, split=run.split, holdout=run.holdout, certify_share=run.certify_share,
            seed=run.seed, order_by=run.order_by, groups=run.groups,
            external_cert_rows=None if cert is None else n_rows(cert[0], "cert[0]"))
        run.rows = {"train": take(X, splits.train), "select": take(X, splits.select),
                    "cert": cert[0] if cert is not None else take(X, splits.cert)}
        run.y_split = {"train": labels[splits.train], "select": labels[splits.select],
                       "cert": np.asarray(cert[1]) if cert is not None else labels[splits.cert]}
        _check_split_sizes(splits.sizes())
        keys = run.segment_keys
        run.split_segments = None if keys is None else {
            "select": keys["X"][splits.select],
            "cert": keys["cert"] if "cert" in keys else keys["X"][splits.cert]}
        if run.refit:
            run.pipeline.fit_features(run.rows["train"], run.y_split["train"])
        run.feature_state = _feature_state(run.pipeline, run.refit, splits)
        run.graph = run.pipeline.capture(run.rows["train"])
        run.notes.extend(run.graph.notes)
        run.group_names = list(run.graph.groups)


def _features(run: _Run) -> None:
    """Compute every feature group once on every split: the models, the importance and the plan
    search all reuse these blocks instead of running the pipeline again."""
    with _step(run.timings, "features", run.verbose):
        run.blocks = {}
        for name in tqdm(run.rows, desc="willump: features", disable=not run.verbose, leave=False):
            run.blocks[name], _ = run.pipeline.compute(run.rows[name], run.group_names)


def _fit_full_model(run: _Run) -> None:
    """The full model on all groups is the reference every loss is measured against: its
    probabilities on the selection and certification rows are what a cascade must match."""
    with _step(run.timings, "full model", run.verbose):
        run.full_model, run.full_model_note = _full_model(run.model, run.refit, run.seed, run.blocks,
                                                          run.group_names, run.y_split, run.splits)
        classes = run.classes = np.asarray(run.full_model.classes_)
        if run.metric.builtin == "f1":
            run.metric.f1_targets(classes)  # a pos_label that is no class fails here, not mid-search
        run.split_labels = {name: Labels.of(run.y_split[name], classes) for name in run.rows}
        run.full_proba = {s: predict_proba(run.full_model, hstack([run.blocks[s][g] for g in run.group_names]))
                          for s in ("select", "cert")}
        unseen = int(np.sum(run.split_labels["cert"].index < 0))
        if unseen:
            run.notes.append(f"{unseen} certification rows carry a label the full model never saw "
                             "(scored as wrong for every pipeline)")


def _profile(run: _Run) -> None:
    """What each feature node and the full model cost per row (measured on the selection rows,
    or taken from fixed_costs) and how much each group matters to the full model: the plan
    search trades the one against the other."""
    with _step(run.timings, "profile", run.verbose):
        if run.fixed_costs is not None:
            run.costs = fixed_node_costs(run.graph.nodes, run.fixed_costs, run.graph.groups)
        else:
            bar = tqdm(total=run.profile_repeats + 1, desc="willump: profile", disable=not run.verbose,
                       leave=False)
            run.costs = measure_node_costs(
                run.pipeline, run.rows["select"], batch_rows=run.profile_batch_rows,
                repeats=run.profile_repeats, single_rows=run.profile_single_rows, rng=run.rng, progress=bar,
            )
            bar.close()
        _cost_model(run.costs, tuple(run.group_names), run.full_model, run.blocks["select"],
                    run.profile_repeats, run.profile_single_rows, run.fixed_costs)
        run.importance = permutation_importance(
            run.full_model, run.blocks["select"], run.group_names, run.split_labels["select"].index,
            repeats=run.importance_repeats, rng=run.rng,
        )


def _find_blocker(run: _Run) -> None:
    """A reason no cascade can be certified, found before the search so the search is skipped
    and the report says why: non-deterministic groups, a max_loss below the bound's floor with
    these certification rows, or a segment with too few rows for its own floor. Untimed."""
    labels, proba = run.split_labels["cert"], run.full_proba["cert"]
    run.floor = certifiable_floor(run.metric, run.method, labels, proba, run.confidence)
    run.needed = rows_needed(run.metric, run.method, labels, run.max_loss, run.confidence, proba)
    run.blocker = _blocker(run.graph, run.max_loss, run.floor, len(labels), run.needed, run.metric,
                           run.confidence)
    if run.blocker is None and run.split_segments is not None:
        run.blocker = _segment_blocker(run.split_segments["cert"], run.metric, run.method, labels, proba,
                                       run.confidence, run.segment_max_loss)


def _fit_small_models(run: _Run) -> None:
    """A small model on each candidate subset of cheap, informative groups (train rows only),
    priced and run on the selection and certification rows: the cascade's early levels and the
    top-K filter's models. One that did not see the full model's classes cannot stand in for
    it and is dropped."""
    with _step(run.timings, "small models", run.verbose):
        run.candidates = candidate_subsets(run.graph, run.costs.per_row(run.cost_mode), run.importance.mean,
                                           max_candidates=run.max_candidates)
        run.small = {}
        run.probas = {"select": {}, "cert": {}}
        small_model, blocks = run.small_model, run.blocks
        for subset in tqdm(run.candidates, desc="willump: small models", disable=not run.verbose, leave=False):
            template = small_model(subset) if callable(small_model) and not hasattr(small_model, "fit") \
                else (small_model if small_model is not None else run.model)
            check_model(template, "small_model")
            fitted = new_model(template, run.seed).fit(hstack([blocks["train"][g] for g in subset]),
                                                       run.y_split["train"])
            if not np.array_equal(np.asarray(fitted.classes_), run.classes):
                run.notes.append(f"small model on {list(subset)} saw other classes; candidate dropped")
                continue
            run.small[subset] = fitted
            _cost_model(run.costs, subset, fitted, blocks["select"], run.profile_repeats,
                        run.profile_single_rows, run.fixed_costs)
            for s in ("select", "cert"):
                run.probas[s][subset] = predict_proba(fitted, hstack([blocks[s][g] for g in subset]))


def _plan(run: _Run) -> None:
    """Choose the cheapest chain and threshold on the selection rows, then certify it (and the
    gears' plans) on the certification rows in one fixed sequence. A certified plan not
    expected to be min_speedup faster than the full pipeline is turned down here."""
    with _step(run.timings, "plan", run.verbose):
        decision = run.decision = Decision(None, None, [], [], run.candidates, run.small, run.blocker)
        run.gear_results = []
        run.full_cost = full_cost(run.graph, run.costs, run.cost_mode)
        max_cost = run.full_cost / run.min_speedup
        segments = run.split_segments
        if run.blocker is None and run.small:
            chains = chains_from(list(run.small), run.group_names, run.max_levels)
            evaluator = _evaluator(run.metric, run.split_labels["select"], run.full_proba["select"],
                                   N_BOOTSTRAP_SELECT, run.confidence, run.bound, run.graph, run.costs,
                                   run.seed, run.routing_tolerance, run.min_disagreements,
                                   project_to=len(run.split_labels["cert"]),
                                   segments=None if segments is None else segments["select"],
                                   segment_max_loss=run.segment_max_loss)
            select = run.probas["select"]
            grids = {c: threshold_grid(select[c[0]].max(axis=1)) for c in chains}
            decision.chosen, decision.table = select_plan(evaluator, chains, select, grids, run.max_loss,
                                                          run.cost_mode, max_cost)
            decision.refused = evaluator.refused
            if decision.chosen is not None:
                certifier = _evaluator(run.metric, run.split_labels["cert"], run.full_proba["cert"],
                                       run.n_bootstrap, run.confidence, run.bound, run.graph, run.costs,
                                       run.seed + 1, run.routing_tolerance, run.min_disagreements,
                                       segments=None if segments is None else segments["cert"],
                                       segment_max_loss=run.segment_max_loss)
                ladder = [(run.max_loss, decision.chosen)] + [
                    (m, select_plan(evaluator, chains, select, grids, m, run.cost_mode, max_cost)[0])
                    for m in run.gears]
                run.gear_results = certify_ladder(evaluator, certifier, ladder, select, run.probas["cert"],
                                                  grids)
                decision.accepted, decision.tested = run.gear_results[0].accepted, run.gear_results[0].tested
        run.slow_reason = None
        accepted = decision.accepted
        if accepted is not None and sweep_cost(accepted, run.cost_mode) >= max_cost:
            run.slow_reason = (
                f"full pipeline: the certified cascade {describe(accepted.chain)} (threshold "
                f"{accepted.threshold:.4f}) is expected at "
                f"{run.full_cost / sweep_cost(accepted, run.cost_mode):.2f}x "
                f"({run.cost_mode} cost), below min_speedup {run.min_speedup:g}"
            )
            decision.accepted = None


def _plan_topk(run: _Run) -> None:
    """The top-K filter: the cheapest small model whose shortlist the full model can rank with a
    certified precision@k (or none, said in the notes)."""
    with _step(run.timings, "top-k", run.verbose):
        run.topk_filter, run.topk_row = plan_topk(run.top_k, run.small, run.probas, run.full_proba, run.graph,
                                                  run.costs, run.topk_precision, run.topk_confidence,
                                                  run.notes)


def _assemble(run: _Run) -> None:
    """The optimized pipeline that serves the certified levels (the full model alone when no
    plan was accepted), its serving options, and the one-sentence reason for the plan."""
    run.baseline = BaselinePipeline(run.pipeline, run.full_model, run.classes)
    run.levels = _levels(run.decision.accepted, run.small, run.full_model, run.group_names)
    run.reason = run.slow_reason or plan_reason(run.decision, run.max_loss, run.cost_mode, run.full_cost,
                                                run.min_speedup)
    run.opt, run.workers_gain = _serving_pipeline(run, run.levels)


def _verify(run: _Run) -> None:
    """Time the certified cascade side by side with the full pipeline, as it will serve: the
    plan's speed-up is an estimate from the cost model, and a cascade that does not measure
    min_speedup is dropped for the full pipeline."""
    run.measured = None
    accepted = run.decision.accepted
    if accepted is None or not run.verify_speedup:
        return
    with _step(run.timings, "verify", run.verbose):
        run.measured = measure_speedup(run.opt, run.rows["select"], run.cost_mode, run.rng)  # as it will serve
    if run.measured < run.min_speedup:
        run.reason = (
            f"full pipeline: the certified cascade {describe(accepted.chain)} (threshold "
            f"{accepted.threshold:.4f}, loss bound {accepted.bound.upper:.4f}) "
            f"measured {run.measured:.2f}x against the full pipeline on held-out rows ({run.cost_mode} "
            f"mode), below min_speedup {run.min_speedup:g}"
        )
        run.notes.append(run.reason)
        run.decision.accepted = None
        run.levels = _levels(None, run.small, run.full_model, run.group_names)
        run.opt, run.workers_gain = _serving_pipeline(run, run.levels)


def _attach_gears(run: _Run) -> None:
    """The gears serving may switch to under load: the plan that serves first, then each looser
    plan the fixed sequence certified (the plan alone, unbounded, when it is the full pipeline)."""
    accepted = run.decision.accepted
    if accepted is not None:
        run.opt.gears_ = [Gear(run.max_loss, run.levels, accepted.bound.upper, accepted.bound.method,
                               accepted.rows, accepted.class_disagreed, _calibration(run, accepted))] + [
            Gear(g.max_loss, _levels(g.accepted, run.small, run.full_model, run.group_names),
                 g.accepted.bound.upper, g.accepted.bound.method, g.accepted.rows, g.accepted.class_disagreed,
                 _calibration(run, g.accepted))
            for g in run.gear_results[1:] if g.accepted is not None]
    else:
        run.opt.gears_ = [Gear(run.max_loss, run.levels, None, "")]


def _calibration(run: _Run, sweep: Any) -> dict[str, list[float]] | None:
    """The certified plan's served confidence against being right, on the certification rows
    (isotonic, clipped at the ends; :attr:`willump._cascade.Gear.calibration`)."""
    labels = run.split_labels["cert"]
    level_probas = [run.probas["cert"][s] for s in sweep.chain[:-1]] + [run.full_proba["cert"]]
    _, approx = route(level_probas, sweep.threshold)
    # a row whose class the models never saw is answered wrong: counted so (as re-certification does)
    return calibration_map(approx.max(axis=1), approx.argmax(axis=1) == labels.index)


def _report(run: _Run) -> None:
    """What was measured and decided, and why, as ``opt.report_``, with the notes serving should
    know: groups that run one after another, gears left uncertified, groups that cannot be pickled
    (those also warn, at the caller of optimize)."""
    opt, graph, notes = run.opt, run.graph, run.notes
    if opt.workers > 1 and not graph.concurrent:
        notes.append(f"workers={opt.workers} asked, but the groups run one after another (see notes above)")
    report = build_report(
        pipeline=run.pipeline, graph=graph, costs=run.costs, importance=run.importance, levels=run.levels,
        decision=run.decision, reason=run.reason, metric=run.metric, max_loss=run.max_loss,
        confidence=run.confidence, bound_request=run.bound, topk_row=run.topk_row, full_proba=run.full_proba,
        probas=run.probas, labels=run.split_labels, splits=run.splits.sizes(), timings=run.timings,
        notes=notes, full_model_note=run.full_model_note, cost_mode=run.cost_mode, floor=run.floor,
        rows_needed=run.needed, split_how=run.splits.how, feature_state=run.feature_state,
        costs_source="measured" if run.fixed_costs is None else "fixed (fixed_costs=)",
    )
    report.measured_speedup = run.measured
    report.workers = opt.workers
    report.gears = [_gear_row(g, run.gear_results, graph, run.costs) for g in opt.gears_[1:]]
    report.cert_rows, report.cert_disagreed = opt.gears_[0].cert_rows, opt.gears_[0].cert_disagreed
    report.calibration = opt.gears_[0].calibration
    if run.gears and len(opt.gears_) < len(run.gears) + 1:
        notes.append(f"gears: {len(opt.gears_) - 1} of {len(run.gears)} certified (the fixed sequence stopped, "
                     "or a gear had no plan within its max_loss)")
    report.routing_tolerance = run.routing_tolerance
    # what re-certification bounds the plan again with (willump._recertify)
    report.segments_by, report.bound_request = run.segments_by, run.bound
    report.n_bootstrap, report.min_disagreements = run.n_bootstrap, run.min_disagreements
    report.workers_gain = run.workers_gain
    report.cached_groups = list(graph.cacheable) if opt.use_cache else []
    for group, why in unpicklable_groups(run.pipeline):
        message = (f"feature group '{group}' cannot be pickled ({why}): opt.save and serving will fail; "
                   "create what it holds inside the function or in the fit hook")
        warnings.warn(message, WillumpWarning, stacklevel=3)  # 3: optimize's caller
        notes.append(message)
    opt.report_ = report


# --- helpers -------------------------------------------------------------------------------
@contextmanager
def _step(timings: dict[str, float], name: str, verbose: bool) -> Iterator[None]:
    """Time the block into ``timings[name]`` (the report shows them) and say so when verbose."""
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
    if verbose:
        tqdm.write(f"willump: {name} done in {timings[name]:.1f}s")


def _serving_pipeline(run: _Run, levels: list[Level]) -> tuple[OptimizedPipeline, float | None]:
    """The optimized pipeline for these levels, with its serving options chosen (and the gain
    the chosen options measured, when they were timed)."""
    made = OptimizedPipeline(run.pipeline, levels, run.classes, run.baseline, run.topk_filter, None, run.seed)
    if run.workers == "auto" and run.fixed_costs is None and run.verify_speedup:
        with _step(run.timings, "serving options", run.verbose):
            return made, choose_serving(made, run.rows["select"], run.cost_mode, run.rng)[2]
    made.workers = 1 if run.workers == "auto" else run.workers
    made.use_cache = bool(run.graph.cacheable)
    return made, None


def _check_split_sizes(sizes: dict[str, int]) -> None:
    small = {k: v for k, v in sizes.items() if k != "train" and v < MIN_SPLIT_ROWS}
    if small or sizes["train"] < 2:
        raise ValueError(
            f"too few rows to hold out {MIN_SPLIT_ROWS}+ rows for both selection and certification "
            f"(split sizes {sizes}); pass more rows, a larger holdout, or cert= rows"
        )


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
            "with cert=(X_cert, y_cert) rows it never saw", WillumpWarning, stacklevel=4)  # optimize's caller
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
        warnings.warn(message, WillumpWarning, stacklevel=4)  # optimize's caller
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
    warnings.warn(message, WillumpWarning, stacklevel=4)  # optimize's caller
    return "full pipeline: " + message


def _gear_row(gear: Gear, results, graph, costs) -> dict[str, Any]:
    accepted = next(r.accepted for r in results if r.max_loss == gear.max_loss)
    return {"max_loss": gear.max_loss, "chain": describe(accepted.chain), "threshold": accepted.threshold,
            "loss_bound": accepted.bound.upper, "method": accepted.bound.method,
            "answered": list(accepted.fractions),
            "cert_rows": gear.cert_rows, "cert_disagreed": gear.cert_disagreed,
            "expected_speedup": full_cost(graph, costs, "batch") / accepted.cost_batch}


def _levels(accepted, small, full_model, groups) -> list[Level]:
    levels = []
    if accepted is not None:
        for subset in accepted.chain[:-1]:
            levels.append(Level(tuple(subset), small[tuple(subset)], accepted.threshold))
    levels.append(Level(tuple(groups), full_model, None))
    return levels
