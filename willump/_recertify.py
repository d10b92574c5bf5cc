"""Re-certification: the certified plan, as it stands, bounded again on fresh labelled rows.

A certificate speaks of the rows it was computed on. When the traffic moves (the live audit's
alarm, a drift verdict, labels fed back showing served accuracy under the certified floor), the
question is whether the plan still holds on rows like today's. Nothing is refitted or searched
again: every certified gear keeps its levels and threshold, and its loss against the full
pipeline is bounded on the new rows with the certificate's own metric and bound (the ``bound=``,
``n_bootstrap=`` and ``min_disagreements=`` optimize was given), and per segment where the plan
was certified per segment. Gears are judged together at the certificate's confidence (Bonferroni
over the gears: each at ``1 - (1 - confidence) / gears``), since a plan is re-certified only as
a whole. A new certificate replaces every figure of the old one (bounds, per-segment bounds, the
scores on the certification rows the label join's floor is read from, the confidence).

The result carries, per gear, the new bound, whether it is within the gear's ``max_loss``, and
what a live audit compares with afterwards (the rows and their class disagreements, the
confidence-to-accuracy map); :meth:`Recertification.pipeline` is the plan with the new
certificate, to save and serve, when every gear held.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._blocks import hstack
from ._bounds import MIN_DISAGREEMENTS, N_BOOTSTRAP
from ._confidence import calibration_map
from ._metrics import Labels, resolve_metric
from ._models import predict_proba
from ._routing import route
from ._rows import n_rows


@dataclass
class GearRecertification:
    """One gear on the new rows: its loss point and bound, whether it held, and what a live
    audit reads afterwards."""

    gear: int
    max_loss: float
    loss: float
    loss_bound: float
    method: str
    certified: bool
    rows: int
    disagreed: int
    calibration: dict[str, list[float]] | None = None
    #: what the bound saw, and the scores on the new rows (full pipeline, this gear)
    detail: str = ""
    baseline_score: float | None = None
    score: float | None = None
    #: per segment (a plan certified per segment): its rows, loss and bound on the new rows
    segments: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Recertification:
    """The plan's certificate recomputed on fresh rows (module docstring)."""

    opt: Any
    confidence: float
    metric: str
    gears: list[GearRecertification] = field(default_factory=list)

    @property
    def certified(self) -> bool:
        """Whether every gear's bound is within its max_loss on the new rows."""
        return all(g.certified for g in self.gears)

    def pipeline(self) -> Any:
        """The plan with the new certificate (bounds, certification counts, calibration maps),
        ready to save and serve; ValueError when a gear did not hold (serve the full pipeline or
        re-optimize instead)."""
        if not self.certified:
            failed = [g.gear for g in self.gears if not g.certified]
            raise ValueError(f"gear(s) {failed} exceed their max_loss on the new rows: the plan is not re-certified")
        new = copy.copy(self.opt)
        new.gears_ = [dataclasses.replace(gear, loss_bound=r.loss_bound, method=r.method, cert_rows=r.rows,
                                          cert_disagreed=r.disagreed, calibration=r.calibration)
                      for gear, r in zip(self.opt.gears_, self.gears, strict=True)]
        report = copy.deepcopy(self.opt.report_)
        first = self.gears[0]
        report.loss, report.loss_bound, report.bound_method = first.loss, first.loss_bound, first.method
        report.bound_detail, report.confidence = first.detail, self.confidence
        report.baseline_score, report.optimized_score = first.baseline_score, first.score
        report.cert_rows, report.cert_disagreed, report.calibration = first.rows, first.disagreed, first.calibration
        report.segments = list(first.segments)
        for row, r in zip(report.gears, self.gears[1:], strict=False):
            row.update({"loss_bound": r.loss_bound, "method": r.method, "cert_rows": r.rows,
                        "cert_disagreed": r.disagreed})
        report.notes = [*report.notes, f"re-certified on {first.rows} fresh rows at confidence {self.confidence} "
                                       f"(every gear jointly): bound {first.loss_bound:.4f} <= {first.max_loss}"]
        new.report_ = report
        return new

    def to_dict(self) -> dict[str, Any]:
        return {"certified": self.certified, "confidence": self.confidence, "metric": self.metric,
                "gears": [dataclasses.asdict(g) for g in self.gears]}


def recertify(opt: Any, X: Any, y: Any, *, metric: Any = None, confidence: float | None = None,
              segments: Any = None, seed: int = 0) -> Recertification:
    """Bound every certified gear of ``opt`` again on the labelled rows ``X``, ``y`` (rows the
    plan never saw). ``metric`` defaults to the certificate's (a callable metric must be given
    again: only its name was kept; another metric is refused); ``confidence`` to the
    certificate's; ``segments`` (a plan certified per segment only) to the column optimize's
    ``segments=`` named."""
    from ._optimize_phases import _evaluator

    report = opt.report()
    if report.plan != "cascade" or not opt.is_cascade:
        raise ValueError("the plan serves the full pipeline: there is no approximation to re-certify")
    n = n_rows(X, "X")
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must hold one label per row (1-D), got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"y must have one label per row of X: {len(y)} labels for {n} rows")
    if n < 2:
        raise ValueError(f"X must hold at least 2 rows, got {n}")
    opt._check_rows(X)
    confidence = float(report.confidence if confidence is None else confidence)
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
    try:
        resolved = resolve_metric(report.metric if metric is None else metric)
    except ValueError as exc:
        raise ValueError(f"metric: the certificate's metric {report.metric!r} cannot be rebuilt from its name; "
                         f"pass metric= (the same one optimize was given)") from exc
    if resolved.name != report.metric:
        raise ValueError(f"metric: the plan was certified on {report.metric!r} (its max_loss is in that metric's "
                         f"units); {resolved.name!r} would bound another loss")
    keys = _recertified_segments(report, X, segments)
    labels = Labels.of(y, np.asarray(opt.classes_))
    if np.any(labels.index < 0):
        unseen = sorted({str(v) for v in labels.values[labels.index < 0]})[:5]
        raise ValueError(f"y holds labels that are not classes of the plan: {unseen}")
    groups = sorted({g for gear in opt.gears_ for level in gear.levels for g in level.groups})
    blocks, _ = opt.pipeline.compute(X, groups, workers=getattr(opt, "workers", 1))
    full_proba = opt.baseline.predict_proba(X)
    joint = 1.0 - (1.0 - confidence) / len(opt.gears_)
    # the bound optimize was asked for; an artifact from before it was kept: the method it used
    requested = report.bound_request or (
        report.bound_method if report.bound_method in ("exact", "product", "bootstrap") else "auto")
    evaluator = _evaluator(resolved, labels, full_proba, report.n_bootstrap or N_BOOTSTRAP, joint, requested,
                           None, None, seed, float(getattr(report, "routing_tolerance", 0.0) or 0.0),
                           MIN_DISAGREEMENTS if report.min_disagreements is None else report.min_disagreements,
                           segments=keys, segment_max_loss=None if keys is None else report.segment_max_loss)
    baseline_score = float(resolved.utility(labels, full_proba))
    out = Recertification(opt, confidence, resolved.name)
    for index, gear in enumerate(opt.gears_):
        levels = gear.levels
        threshold = float(levels[0].threshold)
        level_probas = [predict_proba(lv.model, hstack([blocks[g] for g in lv.groups])) for lv in levels[:-1]]
        level_probas.append(full_proba)
        answered, approx = route(level_probas, threshold)
        bound = evaluator.loss_bound(level_probas, answered, approx, threshold)
        served = approx.argmax(axis=1)
        parts = getattr(bound, "segments", None) or {}
        out.gears.append(GearRecertification(
            gear=index, max_loss=float(gear.max_loss), loss=float(bound.point), loss_bound=float(bound.upper),
            method=bound.method, certified=bool(bound.within(float(gear.max_loss))), rows=n,
            disagreed=int(np.count_nonzero(served != full_proba.argmax(axis=1))),
            calibration=calibration_map(approx.max(axis=1), served == labels.index),
            detail=bound.detail, baseline_score=baseline_score, score=float(resolved.utility(labels, approx)),
            segments=[{"segment": str(key), "rows": bound.sizes[key], "loss": b.point, "bound": b.upper}
                      for key, b in parts.items()]))
    return out


def _recertified_segments(report: Any, X: Any, segments: Any) -> np.ndarray | None:
    """The segment key of every row of ``X`` where the plan was certified per segment (each
    segment is bounded again on its own rows: the old per-segment bounds speak of the old rows),
    else None; ``segments`` defaults to the column optimize named."""
    if not report.segments:
        if segments is not None:
            raise ValueError("segments: the plan was not certified per segment (optimize had no segments=); "
                             "there is no per-segment certificate to renew")
        return None
    segments = report.segments_by if segments is None else segments
    if segments is None:
        raise ValueError(f"segments: the plan was certified per segment ({len(report.segments)} segments, each "
                         f"within {report.segment_max_loss}); pass segments= (one key per row of X, or the column "
                         "holding them; `willump recertify --segments COLUMN`) so each is bounded again on its "
                         "own rows")
    from ._optimize import _segment_keys

    return _segment_keys(X, None, segments, report.segment_max_loss)["X"]
