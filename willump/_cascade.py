"""The optimized pipeline at inference time: cascades and approximate top-K."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._blocks import Block, hstack, take_rows
from ._capture import Pipeline
from ._models import fitted_calls, predict_proba
from ._routing import is_confident
from ._rows import n_rows, take
from ._topk import Certificate, TopKFilter
from .errors import PipelineError


@dataclass
class Level:
    """One cascade level: the groups it reads, its model, and its exit threshold.

    The last level (the full model) has ``threshold=None`` and answers every row
    that reaches it.
    """

    groups: tuple[str, ...]
    model: Any
    threshold: float | None = None


@dataclass
class Gear:
    """A certified plan of the ladder: its levels, the max_loss it was certified for, and the
    bound (``gears[0]`` is the plan ``predict`` serves)."""

    max_loss: float
    levels: list[Level]
    loss_bound: float | None
    method: str = ""
    #: what certification saw, the baseline a live audit compares with: the certification rows,
    #: and those whose predicted class (argmax) under this plan differs from the full pipeline's.
    #: None when unknown: the full pipeline (no cascade was certified) or an older artifact.
    cert_rows: int | None = None
    cert_disagreed: int | None = None
    #: how often a served answer of this confidence was right on the certification rows: a
    #: monotone map {"x": confidences, "y": accuracies} (isotonic regression), which turns the
    #: served confidence into a label-free accuracy estimate calibrated like NannyML's CBPE
    calibration: dict[str, list[float]] | None = None


@dataclass
class StageResult:
    """Rows answered by a range of levels, and what the next level needs for the rest."""

    proba: np.ndarray  # rows x classes; NaN for rows not answered
    level: np.ndarray  # answering level per row; -1 when not answered
    unsure: np.ndarray  # positions of rows not answered
    blocks: dict[str, Block]  # blocks computed so far, restricted to the unsure rows


@dataclass
class TopKResult:
    """The k best rows for a class, best first.

    ``indices`` are positions in the input (length k). ``scores`` and
    ``approximate`` cover every input row: a row the cheap filter dropped keeps its
    cheap score and is marked approximate.
    """

    indices: np.ndarray
    scores: np.ndarray
    approximate: np.ndarray
    k: int
    label: Any
    ratio: float | None = None  # filter ratio used; None when scored exactly
    #: the filter's certificate (certified precision and what it saw); None: no filter was tried
    certificate: Certificate | None = None

    @property
    def exact(self) -> bool:
        """True when every row was scored by the full model (no filter, or its certificate failed)."""
        return not bool(self.approximate.any())

    @property
    def top_scores(self) -> np.ndarray:
        return self.scores[self.indices]

    def to_dict(self) -> dict[str, Any]:
        return {
            "indices": self.indices.tolist(),
            "scores": self.top_scores.tolist(),
            "approximate": self.approximate[self.indices].tolist(),
            "k": self.k,
            "label": _plain(self.label),
            "ratio": self.ratio,
            "rows_fully_scored": int((~self.approximate).sum()),
            "certificate": None if self.certificate is None else self.certificate.to_dict(),
        }


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _ranked(scores: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Positions sorted by descending score, ties by position (deterministic)."""
    return positions[np.lexsort((positions, -scores[positions]))]


class _Scoring:
    """Input checks and the class/label helpers shared by baseline and optimized."""

    pipeline: Pipeline
    classes_: np.ndarray

    def _check_rows(self, rows: Any) -> int:
        self._check_state()
        return self._check_columns(rows)

    def _check_state(self) -> None:
        version = getattr(self, "state_version_", None)
        if version is not None and getattr(self.pipeline, "state_version", version) != version:
            raise PipelineError(
                f"pipeline '{self.pipeline.name}' was refitted or recaptured after this optimized "
                "pipeline was built (a later willump.optimize or capture on the same pipeline object): "
                "its certificate was for the earlier feature state; save optimized pipelines before "
                "optimizing the same pipeline again, or re-run optimize"
            )

    def _check_columns(self, rows: Any) -> int:
        n = n_rows(rows)
        graph = self.pipeline.graph
        needed = sorted({c for cols in graph.columns.values() for c in cols} - {"<input>"})
        present = getattr(rows, "columns", None)
        if present is not None and needed:
            missing = [c for c in needed if c not in set(map(str, present))]
            if missing:
                raise ValueError(f"rows lack column(s) {missing} that the feature groups read")
        return n

    def _label_index(self, label: Any) -> int:
        if label is None:
            return len(self.classes_) - 1
        matches = np.flatnonzero(self.classes_ == label)
        if matches.size == 0:
            raise ValueError(f"label {label!r} is not a class of the model; classes: {list(self.classes_)}")
        return int(matches[0])

    @staticmethod
    def _check_k(k: Any, n: int) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be an integer, got {type(k).__name__}")
        if not 1 <= k <= n:
            raise ValueError(f"k must be between 1 and the number of rows ({n}), got {k}")
        return int(k)

    def predict(self, rows: Any) -> np.ndarray:
        """Predicted labels, in the input's row order."""
        return self.classes_[np.argmax(self.predict_proba(rows), axis=1)]

    def predict_proba(self, rows: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


class BaselinePipeline(_Scoring):
    """The unoptimized pipeline: every group, then the full model, for every row."""

    def __init__(self, pipeline: Pipeline, model: Any, classes: np.ndarray):
        self.pipeline = pipeline
        self.model = model
        self.classes_ = classes
        self.state_version_ = getattr(pipeline, "state_version", None)

    def features(self, rows: Any) -> Block:
        blocks, _ = self.pipeline.compute(rows, self.pipeline.graph.groups)
        return hstack([blocks[g] for g in self.pipeline.graph.groups])

    def predict_proba(self, rows: Any) -> np.ndarray:
        if self._check_rows(rows) == 0:
            return np.zeros((0, len(self.classes_)))
        with fitted_calls():
            return predict_proba(self.model, self.features(rows))

    def top_k(self, rows: Any, k: int, label: Any = None) -> TopKResult:
        """Exact top-K: every row scored by the full model."""
        n = self._check_rows(rows)
        k = self._check_k(k, n)
        c = self._label_index(label)
        scores = self.predict_proba(rows)[:, c]
        order = _ranked(scores, np.arange(n))
        return TopKResult(order[:k], scores, np.zeros(n, dtype=bool), k, self.classes_[c])


@dataclass
class TopKFilterStep:
    """What the cheap half of a top-K query hands to the full model, and what its certificate
    needs to know about the pool (the cheap cut, rows below it, rows tied at it left out)."""

    k: int
    label: Any
    ratio: float
    cheap_scores: np.ndarray  # every row
    kept: np.ndarray  # positions the full model must score
    kept_blocks: dict[str, Block]  # the filter's blocks for the kept rows
    cutoff: float = 0.0
    pool_below: int = 0
    ties: int = 0

    @property
    def check(self) -> dict[str, Any]:
        """The pool facts the certificate needs (plain values: they cross process boundaries)."""
        return {"k": self.k, "cutoff": self.cutoff, "pool_below": self.pool_below, "ties": self.ties}

    def result(self, full_scores: np.ndarray, certificate: Certificate | None = None) -> TopKResult:
        scores = self.cheap_scores.copy()
        scores[self.kept] = full_scores
        approximate = np.ones(len(scores), dtype=bool)
        approximate[self.kept] = False
        order = _ranked(scores, self.kept)
        return TopKResult(order[: self.k], scores, approximate, self.k, self.label, self.ratio, certificate)


class OptimizedPipeline(_Scoring):
    """A cascade of levels plus an optional top-K filter, with the baseline beside it.

    ``predict``/``predict_proba`` return rows in input order; rows confident at a
    cheap level never pay for the remaining groups; one-row calls exit early.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        levels: list[Level],
        classes: np.ndarray,
        baseline: BaselinePipeline,
        topk: TopKFilter | None,
        report: Any,
        seed: int = 0,
    ):
        self.pipeline = pipeline
        self.state_version_ = getattr(pipeline, "state_version", None)
        self.levels = levels
        self.classes_ = classes
        self.baseline = baseline
        self.topk_filter = topk
        self.report_ = report
        self.seed = seed
        self.sample_rows_: Any = None  # a few held-out input rows, for serving (see optimize)
        #: threads for independent feature groups, and whether declared row caches serve
        #: (optimize measures whether each pays)
        self.workers = 1
        self.use_cache = True
        #: the certified ladder (see willump._gears); gears_[0] is this plan
        self.gears_: list[Gear] = [Gear(float("nan"), levels, None)]

    # --- cascade ---------------------------------------------------------------------
    def run_levels(
        self,
        rows: Any,
        first: int = 0,
        last: int | None = None,
        blocks: dict[str, Block] | None = None,
    ) -> StageResult:
        """Run levels ``first..last`` (inclusive) on ``rows``.

        ``blocks`` are feature blocks already computed for these rows by earlier
        levels (they are reused, not recomputed). Serving runs the cheap levels in
        one stage and hands the unsure rows and their blocks to the next stage.
        """
        self._check_state()
        with fitted_calls():
            return self._run_levels(rows, first, last, blocks)

    def _run_levels(self, rows: Any, first: int, last: int | None, blocks: dict[str, Block] | None) -> StageResult:
        last = len(self.levels) - 1 if last is None else last
        n = n_rows(rows)
        proba = np.full((n, len(self.classes_)), np.nan)
        answered_by = np.full(n, -1, dtype=np.int64)
        positions = np.arange(n)
        blocks = dict(blocks or {})
        subset = rows
        for index in range(first, last + 1):
            if positions.size == 0:
                break
            level = self.levels[index]
            missing = [g for g in level.groups if g not in blocks]
            if missing:
                new, _ = self.pipeline.compute(subset, missing, workers=self.workers, cache=self.use_cache)
                blocks.update(new)
            p = predict_proba(level.model, hstack([blocks[g] for g in level.groups]))
            done = is_confident(p, level.threshold)
            proba[positions[done]] = p[done]
            answered_by[positions[done]] = index
            if done.all():
                positions = positions[:0]
                blocks = {}
                break
            if done.any():
                keep = np.flatnonzero(~done)
                positions = positions[keep]
                subset = take(subset, keep)
                blocks = {g: take_rows(b, keep) for g, b in blocks.items()}
        return StageResult(proba, answered_by, positions, blocks)

    def predict_with_levels(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities and the index of the level that answered each row."""
        n = self._check_rows(rows)
        if n == 0:
            return np.zeros((0, len(self.classes_))), np.zeros(0, dtype=np.int64)
        result = self.run_levels(rows)
        return result.proba, result.level

    def predict_proba(self, rows: Any) -> np.ndarray:
        """Class probabilities (columns in ``classes_`` order), rows in input order."""
        return self.predict_with_levels(rows)[0]

    # --- top-K -----------------------------------------------------------------------
    def top_k(self, rows: Any, k: int, label: Any = None) -> TopKResult:
        """The k rows with the highest probability of ``label`` (default: the last class,
        the positive one for binary problems), best first.

        The cheap filter keeps the ceil(r*k) best rows by its own score and the full model
        ranks them; then a certificate (see ``willump._topk``) tests, on calibration rows,
        whether the answer holds precision@k >= ``topk_precision`` at ``confidence``. A
        certified answer carries its certificate; otherwise, or where no ratio is planned (a
        pool much larger than the calibration rows), every row is scored exactly.
        """
        n = self._check_rows(rows)
        k = self._check_k(k, n)
        c = self._label_index(label)
        step = self.topk_filter_step(rows, k, c)
        if step is None:
            return self.baseline.top_k(rows, k, label=self.classes_[c])
        full = self.topk_rank_step(take(rows, step.kept), step.kept_blocks, c)
        certificate = self.topk_certify(c, step.check, full)
        if certificate.certified:
            return step.result(full, certificate)
        exact = self.baseline.top_k(rows, k, label=self.classes_[c])
        exact.certificate = certificate
        return exact

    def topk_certify(self, label_index: int, check: dict[str, Any], full_kept: np.ndarray) -> Certificate:
        """The certificate of a filtered answer (``check``: the filter step's pool facts)."""
        assert self.topk_filter is not None
        return self.topk_filter.certify(label_index, int(check["k"]), int(check["pool_below"]),
                                        int(check["ties"]), float(check["cutoff"]), full_kept)

    def topk_filter_step(self, rows: Any, k: int, label_index: int) -> TopKFilterStep | None:
        """First half of top-K: cheap scores for every row and the rows kept (None: exact)."""
        n = n_rows(rows)
        f = self.topk_filter
        ratio = None if f is None else f.ratio_for(k, n, label_index)
        if ratio is None or math.ceil(ratio * k) >= n:
            return None
        cheap_blocks, _ = self.pipeline.compute(rows, f.groups, workers=self.workers, cache=self.use_cache)
        cheap = predict_proba(f.model, hstack([cheap_blocks[g] for g in f.groups]))[:, label_index]
        m = math.ceil(ratio * k)
        kept = np.sort(_ranked(cheap, np.arange(n))[:m])
        cutoff = float(cheap[kept].min())
        below = int(np.sum(cheap < cutoff))
        blocks = {g: take_rows(b, kept) for g, b in cheap_blocks.items()}
        return TopKFilterStep(k, self.classes_[label_index], ratio, cheap, kept, blocks, cutoff, below,
                              n - m - below)

    def topk_rank_step(self, kept_rows: Any, kept_blocks: dict[str, Block], label_index: int) -> np.ndarray:
        """Second half of top-K: the full model's scores for the kept rows."""
        blocks = dict(kept_blocks)
        rest = [g for g in self.pipeline.graph.groups if g not in blocks]
        if rest:
            new, _ = self.pipeline.compute(kept_rows, rest, workers=self.workers, cache=self.use_cache)
            blocks.update(new)
        X = hstack([blocks[g] for g in self.pipeline.graph.groups])
        return predict_proba(self.baseline.model, X)[:, label_index]

    # --- gears -----------------------------------------------------------------------
    def recertify(self, X: Any, y: Any, *, metric: Any = None, confidence: float | None = None,
                  segments: Any = None, seed: int = 0) -> Any:
        """Bound every certified gear again on fresh labelled rows, plan unchanged (no refit, no
        search): a :class:`willump._recertify.Recertification`; its ``pipeline()`` is this plan with
        the new certificate when every gear held (see :mod:`willump._recertify`). A plan certified
        per segment is bounded per segment again (``segments``: the column optimize named, by
        default, or one key per row of ``X``)."""
        from ._recertify import recertify

        return recertify(self, X, y, metric=metric, confidence=confidence, segments=segments, seed=seed)

    def gear(self, index: int) -> OptimizedPipeline:
        """The pipeline serving gear ``index`` of the certified ladder (0: this plan; higher:
        cheaper plans certified at looser max_loss, for serving under load)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.gears_):
            raise ValueError(f"gear must be an integer in [0, {len(self.gears_) - 1}], got {index!r}")
        if index == 0:
            return self
        gear = self.gears_[index]
        other = OptimizedPipeline(self.pipeline, gear.levels, self.classes_, self.baseline,
                                  self.topk_filter, _gear_report(self.report_, index, gear), self.seed)
        other.workers, other.use_cache = self.workers, self.use_cache
        # its own ladder: this gear first, the looser ones after (never gear 0's certificate)
        other.sample_rows_, other.gears_ = self.sample_rows_, self.gears_[index:]
        other.gear_index_ = getattr(self, "gear_index_", 0) + index  # in the plan's ladder
        return other

    # --- results ---------------------------------------------------------------------
    def report(self) -> Any:
        """The optimization report (prints as tables; ``to_dict()`` for JSON)."""
        return self.report_

    @property
    def is_cascade(self) -> bool:
        return len(self.levels) > 1

    def save(self, path: Any, *, signing_key: str | bytes | None = None) -> None:
        """Write the artifact directory (manifest, checksums, models); see willump.load. A gear's
        view (``opt.gear(i)``, i > 0) is not an artifact: its report is the plan's, re-labelled
        only where the gear's certificate is known; save the plan and serve the gear
        (``deploy(..., gears=i)``)."""
        from ._artifact import save

        if getattr(self, "gear_index_", 0):
            raise ValueError(f"this is gear {self.gear_index_} of a certified ladder (opt.gear({self.gear_index_})), "
                             "not a plan of its own: save the optimized pipeline itself and serve the gear with "
                             f"deploy(..., gears={self.gear_index_}) (or `willump serve --gears {self.gear_index_}`)")
        save(self, path, signing_key=signing_key)

    def __repr__(self) -> str:
        shape = " -> ".join(f"{list(lv.groups)}" for lv in self.levels)
        return f"<OptimizedPipeline {self.pipeline.name}: {shape}>"


def _gear_report(report: Any, index: int, gear: Gear) -> Any:
    """The plan's report as gear ``index`` speaks for itself: its max_loss, bound and what its
    certification saw, the looser gears after it; the point loss (not kept per gear) unknown,
    and a note that the tables and scores are the plan's."""
    import copy

    out = copy.deepcopy(report)
    row = report.gears[index - 1] if len(report.gears) >= index else {}
    out.max_loss, out.loss_bound, out.loss = gear.max_loss, gear.loss_bound, None
    out.bound_method, out.bound_detail = gear.method, ""
    out.cert_rows, out.cert_disagreed, out.calibration = gear.cert_rows, gear.cert_disagreed, gear.calibration
    out.gears = list(report.gears[index:])
    out.notes = [*report.notes, f"gear {index} of the plan's certified ladder (threshold {row.get('threshold')}, "
                                f"chain {row.get('chain')}): certified at max_loss {gear.max_loss}; the tables, "
                                "scores and speedups below are the plan's (gear 0's)"]
    return out
