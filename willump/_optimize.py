"""willump.optimize: profile a pipeline, build cascades and a top-K filter, certify them."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split
from tqdm.auto import tqdm

from ._blocks import hstack
from ._capture import BODY, Pipeline
from ._cascade import BaselinePipeline, Level, OptimizedPipeline, TopKFilter
from ._metrics import N_BOOTSTRAP, N_BOOTSTRAP_SELECT, Metric, bootstrap_weights, resolve_metric
from ._models import check_model, new_model, predict_proba, time_predict
from ._planner import (
    Evaluator,
    Sweep,
    candidate_subsets,
    certify,
    chain_cost,
    chains_from,
    describe,
    full_cost,
    select_plan,
    subset_cost,
    sweep_cost,
    threshold_grid,
    topk_cost,
    topk_ratio,
)
from ._profile import (
    IMPORTANCE_REPEATS,
    PROFILE_BATCH_ROWS,
    PROFILE_REPEATS,
    PROFILE_SINGLE_ROWS,
    Costs,
    measure_node_costs,
    permutation_importance,
)
from ._report import CandidateRow, GroupRow, LevelRow, Report, TopKRow
from ._rows import n_rows, take

#: smallest number of rows allowed in each of the selection and certification splits
MIN_SPLIT_ROWS = 30
#: held-out input rows kept with the optimized pipeline (and its artifact) so that serving can
#: derive the request schema and profile stages on the serving machine
SAMPLE_ROWS = 256

REFIT_STATEMENT = (
    "not refitted: the small and full models that serve are exactly the ones the bound was "
    "certified on (refitting on all rows would change the models after certification and void "
    "the held-out guarantee)"
)


def optimize(
    pipeline: Pipeline,
    model: Any = None,
    X: Any = None,
    y: Any = None,
    *,
    metric: Any = "accuracy",
    max_loss: float = 0.005,
    confidence: float = 0.95,
    bound: str = "bootstrap",
    cost_mode: str = "batch",
    min_speedup: float = 1.0,
    verify_speedup: bool = True,
    small_model: Any = None,
    top_k: int | None = 100,
    topk_precision: float = 0.95,
    topk_quantile: float = 0.99,
    holdout: float = 0.4,
    certify_share: float = 0.6,
    max_candidates: int = 6,
    max_levels: int = 3,
    n_bootstrap: int = N_BOOTSTRAP,
    profile_batch_rows: int = PROFILE_BATCH_ROWS,
    profile_repeats: int = PROFILE_REPEATS,
    profile_single_rows: int = PROFILE_SINGLE_ROWS,
    importance_repeats: int = IMPORTANCE_REPEATS,
    seed: int = 0,
    keep_sample: bool = True,
    verbose: bool = True,
) -> OptimizedPipeline:
    """Optimize a decorated (or ``from_sklearn``) pipeline with a certified loss bound.

    The rows are split (stratified, seeded) into *train* (fits the full model and
    the small models), *selection* (profiling, importance, choosing the plan) and
    *certification* (only the final bound; ``holdout`` is the share of rows held
    out, ``certify_share`` the part of it used for certification).

    **The guarantee.** The loss is ``metric(full) - metric(optimized)`` against
    the true labels. With ``bound="bootstrap"`` (default, any metric) the bound is
    the ``confidence`` quantile of a paired percentile bootstrap (``n_bootstrap``
    resamples, both pipelines scored on the same resamples). With ``bound="exact"``
    (accuracy only) it is an exact, conservative Clopper-Pearson paired bound.
    Thresholds are tested on the certification split in a fixed order from the
    most conservative down, stopping at the first one whose bound exceeds
    ``max_loss`` (fixed-sequence testing), so the chance that the returned plan's
    true loss exceeds ``max_loss`` is at most ``1 - confidence`` (up to the
    bootstrap's approximation) with no penalty for the number of thresholds
    tried. When no plan passes, the optimized pipeline is the full pipeline and
    the report says why. Models are not refitted after certification.

    Top-K: a filter (cheap groups + small model) keeps the ceil(r*k) best rows,
    the full model ranks them; r is calibrated on held-out scores so that
    precision@k >= ``topk_precision`` in ``topk_quantile`` of bootstrap resamples
    (``top_k`` is the k used to choose the filter; any k works at query time).

    ``cost_mode`` chooses which measured cost the plan minimizes: per row at batch
    size ("batch", throughput serving, default) or per one-row call ("row", latency
    serving, where fixed per-call costs such as remote lookups dominate). Candidate
    group subsets are chosen under the same cost.

    **Never slower.** A cascade is a plan only if its expected cost is below the full
    pipeline's divided by ``min_speedup``; with ``verify_speedup`` the certified
    cascade is then timed side by side with the full pipeline on held-out rows and
    dropped (the full pipeline serves, and the report says why) unless it measures at
    least ``min_speedup``.

    ``small_model`` is the model of the cheap levels: None (the user's model class and
    settings), an estimator (cloned per level), or a callable ``groups -> estimator``;
    a smaller model (fewer trees, say) is what makes a cascade pay when the model,
    not the features, dominates the cost.

    ``keep_sample`` keeps up to SAMPLE_ROWS held-out input rows with the result (and
    its artifact) for serving's request schema and stage profiling; pass False when
    the artifact must not carry any input data.
    """
    started = time.perf_counter()
    if model is None:
        model = getattr(pipeline, "model", None)
        if model is None:
            raise TypeError("model is required (the pipeline does not carry one)")
    _validate(pipeline, model, X, y, max_loss, confidence, bound, metric, holdout, certify_share,
              top_k, topk_precision, topk_quantile, max_levels, n_bootstrap)
    if cost_mode not in ("batch", "row"):
        raise ValueError(f"cost_mode must be 'batch' or 'row', got {cost_mode!r}")
    if not min_speedup > 0:
        raise ValueError(f"min_speedup must be positive, got {min_speedup}")
    metric_obj = resolve_metric(metric)
    if bound == "exact" and metric_obj.name != "accuracy":
        raise ValueError("bound='exact' is available for metric='accuracy' only; use 'bootstrap'")
    rng = np.random.default_rng(seed)
    labels = np.asarray(y)
    timings: dict[str, float] = {}
    notes: list[str] = []

    with _step(timings, "split+capture", verbose):
        train, select, cert = _split(len(labels), labels, holdout, certify_share, seed)
        pipeline.fit_features(take(X, train), labels[train])
        graph = pipeline.capture(take(X, train))
        notes.extend(graph.notes)
        groups = list(graph.groups)
        rows = {name: take(X, idx) for name, idx in (("train", train), ("select", select), ("cert", cert))}

    with _step(timings, "features", verbose):
        blocks = {}
        for name in tqdm(rows, desc="willump: features", disable=not verbose, leave=False):
            blocks[name], _ = pipeline.compute(rows[name], groups)

    with _step(timings, "full model", verbose):
        full_model = new_model(model, seed).fit(hstack([blocks["train"][g] for g in groups]), labels[train])
        classes = np.asarray(full_model.classes_)
        y_idx = {name: _class_index(labels[idx], classes) for name, idx in
                 (("train", train), ("select", select), ("cert", cert))}
        full_proba = {s: predict_proba(full_model, hstack([blocks[s][g] for g in groups]))
                      for s in ("select", "cert")}

    with _step(timings, "profile", verbose):
        bar = tqdm(total=profile_repeats + 1, desc="willump: profile", disable=not verbose, leave=False)
        costs = measure_node_costs(
            pipeline, rows["select"], batch_rows=profile_batch_rows, repeats=profile_repeats,
            single_rows=profile_single_rows, rng=rng, progress=bar,
        )
        bar.close()
        _time_model(costs, tuple(groups), full_model, blocks["select"], profile_repeats, profile_single_rows)
        importance = permutation_importance(
            full_model, blocks["select"], groups, y_idx["select"], repeats=importance_repeats, rng=rng
        )

    with _step(timings, "small models", verbose):
        candidates = candidate_subsets(graph, costs.per_row(cost_mode), importance.mean,
                                       max_candidates=max_candidates)
        small: dict[tuple[str, ...], Any] = {}
        probas: dict[str, dict[tuple[str, ...], np.ndarray]] = {"select": {}, "cert": {}}
        for subset in tqdm(candidates, desc="willump: small models", disable=not verbose, leave=False):
            template = small_model(subset) if callable(small_model) and not hasattr(small_model, "fit") \
                else (small_model if small_model is not None else model)
            check_model(template, "small_model")
            fitted = new_model(template, seed).fit(hstack([blocks["train"][g] for g in subset]), labels[train])
            if not np.array_equal(np.asarray(fitted.classes_), classes):
                notes.append(f"small model on {list(subset)} saw other classes; candidate dropped")
                continue
            small[subset] = fitted
            _time_model(costs, subset, fitted, blocks["select"], profile_repeats, profile_single_rows)
            for s in ("select", "cert"):
                probas[s][subset] = predict_proba(fitted, hstack([blocks[s][g] for g in subset]))

    with _step(timings, "plan", verbose):
        chains = chains_from(list(small), groups, max_levels)
        grids = {subset: threshold_grid(probas["select"][subset].max(axis=1)) for subset in small}
        selector = _evaluator(metric_obj, y_idx["select"], classes, full_proba["select"],
                              N_BOOTSTRAP_SELECT, confidence, bound, graph, costs, seed)
        full_cost_mode = full_cost(graph, costs, cost_mode)
        max_cost = full_cost_mode / min_speedup
        chosen, table = select_plan(selector, chains, probas["select"], grids, max_loss, cost_mode,
                                    max_cost)
        accepted, tested = None, []
        if chosen is not None:
            certifier = _evaluator(metric_obj, y_idx["cert"], classes, full_proba["cert"],
                                   n_bootstrap, confidence, bound, graph, costs, seed + 1)
            accepted, tested = certify(certifier, chosen.chain, probas["cert"], grids[chosen.chain[0]], max_loss)
        slow_reason = None
        if accepted is not None and sweep_cost(accepted, cost_mode) >= max_cost:
            slow_reason = (
                f"full pipeline: the certified cascade {describe(accepted.chain)} (threshold "
                f"{accepted.threshold:.4f}) is expected at {full_cost_mode / sweep_cost(accepted, cost_mode):.2f}x "
                f"({cost_mode} cost), below min_speedup {min_speedup:g}"
            )
            accepted = None

    with _step(timings, "top-k", verbose):
        topk_filter, topk_row = _plan_topk(
            top_k, small, probas, full_proba, graph, costs, topk_precision, topk_quantile, seed, notes
        )

    baseline = BaselinePipeline(pipeline, full_model, classes)
    levels = _levels(accepted, small, full_model, groups)
    reason = slow_reason or _reason(chosen, accepted, tested, candidates, small, max_loss, table,
                                    cost_mode, full_cost_mode, min_speedup)
    measured = None
    if accepted is not None and verify_speedup:
        with _step(timings, "verify", verbose):
            trial = OptimizedPipeline(pipeline, levels, classes, baseline, None, None, seed)
            measured = measure_speedup(trial, rows["select"], cost_mode, rng)
        if measured < min_speedup:
            reason = (
                f"full pipeline: the certified cascade {describe(accepted.chain)} (threshold "
                f"{accepted.threshold:.4f}, loss bound {accepted.bound.upper:.4f}) measured "
                f"{measured:.2f}x against the full pipeline on held-out rows ({cost_mode} mode), "
                f"below min_speedup {min_speedup:g}"
            )
            notes.append(reason)
            accepted = None
            levels = _levels(None, small, full_model, groups)
    report = _report(
        pipeline, graph, groups, costs, importance, levels, accepted, reason, metric_obj, max_loss,
        confidence, bound, table, tested, topk_row, full_proba, probas, y_idx, classes, small,
        {"train": len(train), "selection": len(select), "certification": len(cert)}, timings, notes,
        full_model, cost_mode,
    )
    report.measured_speedup = measured
    timings["total"] = time.perf_counter() - started
    opt = OptimizedPipeline(pipeline, levels, classes, baseline, topk_filter, report, seed)
    opt.sample_rows_ = take(X, select[:SAMPLE_ROWS]) if keep_sample else None
    if verbose:
        print(report)
    return opt


#: held-out rows the certified cascade is timed on (batch mode), against the full pipeline
VERIFY_ROWS = 2048
#: single rows timed in row mode
VERIFY_SINGLE_ROWS = 100
#: interleaved timing rounds (medians)
VERIFY_REPEATS = 3


def measure_speedup(opt: OptimizedPipeline, rows: Any, cost_mode: str, rng: np.random.Generator,
                    repeats: int = VERIFY_REPEATS) -> float:
    """Full pipeline time over cascade time on held-out rows, timed side by side
    (interleaved rounds, medians): whole batches in batch mode, one row per call in row mode."""
    n = n_rows(rows)
    if cost_mode == "batch":
        pick = np.sort(rng.choice(n, min(VERIFY_ROWS, n), replace=False))
        calls = [take(rows, pick)]
    else:
        pick = rng.choice(n, min(VERIFY_SINGLE_ROWS, n), replace=False)
        calls = [take(rows, np.array([i])) for i in pick]
    opt.baseline.predict_proba(calls[0])  # warm both paths
    opt.predict_proba(calls[0])
    full_times, cascade_times = [], []
    for _ in range(repeats):
        for fn, out in ((opt.baseline.predict_proba, full_times), (opt.predict_proba, cascade_times)):
            start = time.perf_counter()
            for call in calls:
                fn(call)
            out.append(time.perf_counter() - start)
    return float(np.median(full_times) / np.median(cascade_times))


# --- helpers ---------------------------------------------------------------------------
@contextmanager
def _step(timings: dict[str, float], name: str, verbose: bool):
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
    if verbose:
        tqdm.write(f"willump: {name} done in {timings[name]:.1f}s")


def _validate(pipeline, model, X, y, max_loss, confidence, bound, metric, holdout, certify_share,
              top_k, topk_precision, topk_quantile, max_levels, n_bootstrap) -> None:
    if not isinstance(pipeline, Pipeline):
        raise TypeError(
            "pipeline must be a @willump.pipeline function or willump.from_sklearn(...), got "
            f"{type(pipeline).__name__}"
        )
    check_model(model)
    if X is None or y is None:
        raise TypeError("X and y are required")
    n = n_rows(X, "X")
    if len(np.asarray(y)) != n:
        raise ValueError(f"X has {n} rows but y has {len(np.asarray(y))}")
    if len(np.unique(np.asarray(y))) < 2:
        raise ValueError("y must contain at least two classes")
    if not 0 <= max_loss < 1:
        raise ValueError(f"max_loss must be in [0, 1), got {max_loss}")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if bound not in ("bootstrap", "exact"):
        raise ValueError(f"bound must be 'bootstrap' or 'exact', got {bound!r}")
    resolve_metric(metric)
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    if not 0 < certify_share < 1:
        raise ValueError(f"certify_share must be in (0, 1), got {certify_share}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if not 0 < topk_precision <= 1:
        raise ValueError(f"topk_precision must be in (0, 1], got {topk_precision}")
    if not 0 < topk_quantile < 1:
        raise ValueError(f"topk_quantile must be in (0, 1), got {topk_quantile}")
    if max_levels < 2:
        raise ValueError(f"max_levels must be at least 2, got {max_levels}")
    if n_bootstrap < 100:
        raise ValueError(f"n_bootstrap must be at least 100, got {n_bootstrap}")
    smallest = min(n * holdout * certify_share, n * holdout * (1 - certify_share))
    if smallest < MIN_SPLIT_ROWS:
        raise ValueError(
            f"X has too few rows ({n}) to hold out {MIN_SPLIT_ROWS}+ rows for both selection and "
            "certification; pass more rows or a larger holdout"
        )


def _split(n: int, labels: np.ndarray, holdout: float, certify_share: float, seed: int):
    positions = np.arange(n)
    stratify = labels if np.unique(labels, return_counts=True)[1].min() >= 4 else None
    train, rest = train_test_split(positions, test_size=holdout, random_state=seed, stratify=stratify)
    rest_strat = labels[rest] if stratify is not None else None
    try:
        select, cert = train_test_split(rest, test_size=certify_share, random_state=seed + 1,
                                        stratify=rest_strat)
    except ValueError:
        select, cert = train_test_split(rest, test_size=certify_share, random_state=seed + 1)
    return np.sort(train), np.sort(select), np.sort(cert)


def _class_index(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Class index of each label; -1 for a label the model never saw (always wrong)."""
    lookup = {c: i for i, c in enumerate(classes.tolist())}
    return np.array([lookup.get(v, -1) for v in values.tolist()], dtype=np.int64)


def _time_model(costs: Costs, groups, model, blocks, repeats: int, single_rows: int) -> None:
    X = hstack([blocks[g] for g in groups])
    batch, row = time_predict(model, X, repeats, single_rows)
    costs.model_batch[tuple(groups)] = batch
    costs.model_row[tuple(groups)] = row


def _evaluator(metric: Metric, y, classes, full_proba, resamples, confidence, bound, graph, costs, seed):
    weights = bootstrap_weights(len(y), resamples, np.random.default_rng(seed))
    return Evaluator(metric, y, classes, full_proba, weights, confidence, bound, graph, costs)


def _levels(accepted: Sweep | None, small, full_model, groups) -> list[Level]:
    levels = []
    if accepted is not None:
        for subset in accepted.chain[:-1]:
            levels.append(Level(tuple(subset), small[tuple(subset)], accepted.threshold))
    levels.append(Level(tuple(groups), full_model, None))
    return levels


def _reason(chosen, accepted, tested, candidates, small, max_loss, table, cost_mode, full, min_speedup) -> str:
    if accepted is not None:
        return (
            f"cascade {describe(accepted.chain)} at threshold {accepted.threshold:.4f}: loss bound "
            f"{accepted.bound.upper:.4f} <= max_loss {max_loss} on the certification split"
        )
    if not candidates:
        return "full pipeline: no proper subset of feature groups carries signal (or only one group)"
    if not small:
        return "full pipeline: no small model could be trained on the candidate subsets"
    if chosen is None and table:
        fastest = min(table, key=lambda s: sweep_cost(s, cost_mode))
        return (
            f"full pipeline: cascades within max_loss {max_loss} exist (fastest: {describe(fastest.chain)} "
            f"at threshold {fastest.threshold:.4f}) but none is expected faster than the full pipeline by "
            f"min_speedup {min_speedup:g} ({cost_mode} cost; best {full / sweep_cost(fastest, cost_mode):.2f}x): "
            "the cheap levels cost about as much as the full pipeline (a smaller small_model may help)"
        )
    if chosen is None:
        return (
            f"full pipeline: on the selection split no candidate plan kept the loss bound within "
            f"max_loss {max_loss} at any threshold (the cheap groups carry too little signal)"
        )
    first = tested[0]
    return (
        f"full pipeline: the selected plan {describe(chosen.chain)} failed certification; its most "
        f"conservative threshold {first.threshold:.4f} had loss bound {first.bound.upper:.4f} > "
        f"max_loss {max_loss}"
    )


def _plan_topk(top_k, small, probas, full_proba, graph, costs, precision, quantile, seed, notes):
    if top_k is None:
        return None, None
    pool_sel = len(full_proba["select"])
    pool_cert = len(full_proba["cert"])
    k_sel = min(top_k, max(1, pool_sel // 10))
    if k_sel < top_k:
        notes.append(f"top-K planned at k={k_sel} (the selection split has {pool_sel} rows)")
    c = full_proba["select"].shape[1] - 1
    best = None
    exact = topk_cost([], None, k_sel, pool_sel, graph, costs)
    for subset in small:
        rng = np.random.default_rng([seed, 7, len(subset)])
        ratio = topk_ratio(probas["select"][subset][:, c], full_proba["select"][:, c], k_sel, pool_sel,
                           precision=precision, quantile=quantile, rng=rng)
        if ratio is None:
            continue
        cost = topk_cost(subset, ratio, k_sel, pool_sel, graph, costs)
        if cost < exact and (best is None or cost < best[1]):
            best = (subset, cost)
    if best is None:
        notes.append("top-K: no cheap filter reached the precision target; top_k scores exactly")
        return None, TopKRow(k_sel, pool_sel, [], None, precision, quantile, 1.0)
    subset = best[0]
    filt = TopKFilter(subset, small[subset], probas["cert"][subset], full_proba["cert"], precision,
                      quantile, seed)
    k_cert = min(top_k, max(1, pool_cert // 10))
    ratio = filt.ratio_for(k_cert, pool_cert, c)
    speedup = topk_cost([], None, k_cert, pool_cert, graph, costs) / topk_cost(
        subset, ratio, k_cert, pool_cert, graph, costs)
    return filt, TopKRow(k_cert, pool_cert, list(subset), ratio, precision, quantile, speedup)


def _report(pipeline, graph, groups, costs, importance, levels, accepted, reason, metric, max_loss,
            confidence, bound, table, tested, topk_row, full_proba, probas, y_idx, classes, small,
            splits, timings, notes, full_model, cost_mode) -> Report:
    base_batch = full_cost(graph, costs, "batch")
    base_row = full_cost(graph, costs, "row")
    first_level = {}
    for i, lv in enumerate(levels):
        for g in lv.groups:
            first_level.setdefault(g, i)
    group_rows = [
        GroupRow(
            name=g,
            columns=list(graph.columns.get(g, [])),
            upstream=sorted(graph.closure([g]) - {g}),
            width=graph.widths[g],
            sparse=graph.sparse[g],
            cost_batch_us=1e6 * subset_cost(graph, costs.batch, [g]),
            cost_row_us=1e6 * subset_cost(graph, costs.row, [g]),
            importance=importance.mean[g],
            importance_std=importance.std[g],
            level=first_level[g],
        )
        for g in groups
    ]
    y_cert = y_idx["cert"]
    base_score = metric.score(y_cert, full_proba["cert"], classes)
    if accepted is not None:
        level_probas = [probas["cert"][s] for s in accepted.chain[:-1]] + [full_proba["cert"]]
        from ._planner import answer_levels, combine

        conf = np.stack([p.max(axis=1) for p in level_probas[:-1]])
        opt_score = metric.score(y_cert, combine(level_probas, answer_levels(conf, accepted.threshold)), classes)
        fractions = accepted.fractions
        speed_batch = base_batch / accepted.cost_batch
        speed_row = base_row / accepted.cost_row
        first_cost = chain_cost([accepted.chain[0]], [1.0], graph, costs, "batch")
    else:
        opt_score, fractions, speed_batch, speed_row = base_score, [1.0], 1.0, 1.0
        cheapest = min(small, key=lambda s: subset_cost(graph, costs.batch, s), default=None)
        first_cost = chain_cost([cheapest], [1.0], graph, costs, "batch") if cheapest else base_batch
    level_rows = [
        LevelRow(i, list(lv.groups), type(lv.model).__name__, lv.threshold, float(fractions[i]))
        for i, lv in enumerate(levels)
    ]
    models = {"full": f"{type(full_model).__name__} on all {len(groups)} groups, {splits['train']} training rows"}
    for i, lv in enumerate(levels[:-1]):
        models[f"level {i}"] = f"{type(lv.model).__name__} on {list(lv.groups)}, {splits['train']} training rows"
    return Report(
        pipeline=pipeline.name,
        plan="cascade" if accepted is not None else "full",
        reason=reason,
        metric=metric.name,
        max_loss=max_loss,
        confidence=confidence,
        bound_method="exact paired (Clopper-Pearson)" if bound == "exact" else "paired bootstrap",
        loss=None if accepted is None else accepted.bound.point,
        loss_bound=None if accepted is None else accepted.bound.upper,
        baseline_score=base_score,
        optimized_score=opt_score,
        expected_speedup=speed_batch,
        expected_speedup_row=speed_row,
        limit_speedup=base_batch / first_cost if first_cost > 0 else 1.0,
        groups=group_rows,
        levels=level_rows,
        candidates=[_candidate_row(s, base_batch, base_row) for s in table],
        certification=[_candidate_row(s, base_batch, base_row) for s in tested],
        topk=topk_row,
        splits=splits,
        models=models,
        refit=REFIT_STATEMENT,
        shared_nodes=graph.shared_nodes(),
        node_costs_us={k: 1e6 * v for k, v in sorted(costs.batch.items()) if k != BODY}
        | {"<body>": 1e6 * costs.batch.get(BODY, 0.0)},
        timings_s=timings,
        notes=notes,
        cost_mode=cost_mode,
    )


def _candidate_row(sweep: Sweep, base_batch: float, base_row: float) -> CandidateRow:
    return CandidateRow(describe(sweep.chain), sweep.threshold, sweep.bound.point, sweep.bound.upper,
                        base_batch / sweep.cost_batch, base_row / sweep.cost_row)
