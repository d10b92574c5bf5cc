"""The optimization report: a structured object that prints as readable tables."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: what the bound printed beside a certified threshold is, and what it is not: the certificate is
#: max_loss, tested in a fixed sequence of thresholds; the bound at the accepted one is computed as
#: if that threshold had been chosen in advance, so after the search it is no confidence bound
#: (on 30 seeds of the toxic ladder, `python -m benchmarks.guarantee --only bounds`, fresh rows
#: read more than it for some gears, never more than max_loss)
BOUND_AT_THRESHOLD = ("what the test saw at this threshold; the guarantee is max_loss: "
                      "the search over thresholds is paid for there, not in this number")


@dataclass
class GroupRow:
    name: str
    columns: list[str]
    upstream: list[str]
    width: int
    sparse: bool
    cost_batch_us: float  # per row, the group's closure (upstream steps included)
    cost_row_us: float  # one-row call, closure included
    importance: float  # rise in held-out log loss when the group is shuffled
    importance_std: float
    level: int  # first cascade level that computes it


@dataclass
class LevelRow:
    index: int
    groups: list[str]
    model: str
    threshold: float | None
    fraction_answered: float  # on the certification split


@dataclass
class CandidateRow:
    chain: str
    threshold: float
    loss: float
    loss_bound: float
    expected_speedup: float
    expected_speedup_row: float = 1.0
    method: str = ""  # which bound produced loss_bound


@dataclass
class TopKRow:
    k: int
    pool: int
    filter_groups: list[str]
    ratio: float | None
    precision_target: float
    confidence: float
    expected_speedup: float
    #: per pool size: the ratio a query is planned at (None: scored exactly)
    reach: list[dict[str, float | None]] = field(default_factory=list)


@dataclass
class Report:
    """What the optimizer measured and decided."""

    pipeline: str
    plan: str  # "cascade" or "full"
    reason: str
    metric: str
    max_loss: float
    confidence: float
    bound_method: str
    loss: float | None
    loss_bound: float | None
    baseline_score: float
    optimized_score: float
    expected_speedup: float  # batch (throughput) cost model
    expected_speedup_row: float  # one-row (latency) cost model
    limit_speedup: float  # full cost / cheapest level's cost: no cascade beats it
    groups: list[GroupRow]
    levels: list[LevelRow]
    candidates: list[CandidateRow]
    certification: list[CandidateRow]
    topk: TopKRow | None
    splits: dict[str, int]
    models: dict[str, str]
    refit: str
    shared_nodes: list[str]
    node_costs_us: dict[str, float]
    timings_s: dict[str, float]
    notes: list[str] = field(default_factory=list)
    cost_mode: str = "batch"  # which cost chose the plan: "batch" or "row"
    measured_speedup: float | None = None  # the certified cascade timed against the full pipeline
    bound_detail: str = ""  # why that bound, and what it saw (rows worse / better / differing)
    certifiable_floor: float | None = None  # smallest loss an exact bound can certify on this split
    rows_needed: int | None = None  # certification rows an exact bound needs for max_loss at best
    split: str = ""  # how the train / selection / certification rows were chosen
    feature_state: str = ""  # who fitted the feature state, on which rows
    costs_source: str = "measured"  # "measured" or "fixed" (fixed_costs=)
    greater_is_better: bool = True  # the metric's direction (loss = full - optimized, in its favour)
    routing_tolerance: float = 0.0  # probability differences of a served runtime the bound covers
    workers: int = 1  # threads for independent groups when the optimized pipeline serves
    workers_gain: float | None = None  # measured: plain serving's time over the chosen option's
    cached_groups: list[str] = field(default_factory=list)  # groups serving from a row cache
    gears: list[dict[str, Any]] = field(default_factory=list)  # cheaper plans certified jointly
    #: segments certified with the plan (segments=): each one's loss and bound on its own rows
    segments: list[dict[str, Any]] = field(default_factory=list)
    segment_max_loss: float | None = None
    #: the column of X that segments= named (None: no segments, or one key per row given)
    segments_by: str | None = None
    #: the bound as optimize was asked for it (bound=, n_bootstrap=, min_disagreements=):
    #: re-certification bounds the plan again the same way
    bound_request: str | None = None  # None: an artifact saved before it was kept
    n_bootstrap: int | None = None
    min_disagreements: int | None = None
    #: the plan's certification rows, and those whose predicted class differs from the full
    #: pipeline's (None: the full pipeline, or a report saved before they were kept)
    cert_rows: int | None = None
    cert_disagreed: int | None = None
    #: the plan's served confidence against accuracy on those rows (willump._confidence)
    calibration: dict[str, list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _finite(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_html(self, path: Any) -> Any:
        """Write the report as a self-contained HTML page with plots (inline SVG: no network
        needed to view it); returns the path written."""
        from ._report_html import write

        return write(self, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        data = dict(data)
        data["groups"] = [GroupRow(**g) for g in data["groups"]]
        data["levels"] = [LevelRow(**lv) for lv in data["levels"]]
        known = set(cls.__dataclass_fields__)
        data = {k: v for k, v in data.items() if k in known}
        data["candidates"] = [CandidateRow(**c) for c in data["candidates"]]
        data["certification"] = [CandidateRow(**c) for c in data["certification"]]
        data["topk"] = TopKRow(**data["topk"]) if data.get("topk") else None
        return cls(**data)

    def __str__(self) -> str:
        lines = [
            f"willump report: pipeline '{self.pipeline}' -> {self.plan}",
            f"  {self.reason}",
            f"  metric {self.metric}: baseline {self.baseline_score:.4f}, optimized "
            f"{self.optimized_score:.4f} (certification split)",
        ]
        if self.loss_bound is not None:
            loss = "n/a" if self.loss is None else f"{self.loss:+.4f}"
            lines.append(
                f"  loss {loss}; certified: loss <= max_loss {self.max_loss} at {self.confidence:.0%} "
                f"({self.bound_method}: {self.bound_detail}); bound at this threshold alone "
                f"{self.loss_bound:.4f} ({BOUND_AT_THRESHOLD})"
            )
        if self.certifiable_floor is not None:
            lines.append(
                f"  certification: {self.splits.get('certification', 0)} rows ({self.split}); the "
                f"smallest loss an exact bound can certify with them is {self.certifiable_floor:.4f}"
                + ("" if self.rows_needed is None else
                   f"; max_loss {self.max_loss} needs at least {self.rows_needed} rows")
            )
        if self.feature_state:
            lines.append(f"  feature state: {self.feature_state}")
        lines.append(
            f"  expected speedup {self.expected_speedup:.2f}x batch, {self.expected_speedup_row:.2f}x "
            f"one row (limit {self.limit_speedup:.1f}x); plan chosen by {self.cost_mode} cost"
            + ("" if self.measured_speedup is None else f"; measured {self.measured_speedup:.2f}x")
        )
        if self.workers > 1 or self.cached_groups or self.workers_gain is not None:
            lines.append(
                f"  serving: {self.workers} thread(s) for independent groups"
                + ("" if self.workers_gain is None else f" (chosen option measured {self.workers_gain:.2f}x)")
                + (f"; row caches: {', '.join(self.cached_groups)}" if self.cached_groups else "")
            )
        lines.append("")
        lines.append(_table(
            ["group", "cost/row us (batch)", "cost us (1 row)", "importance", "level", "reads"],
            [
                [g.name, f"{g.cost_batch_us:.2f}", f"{g.cost_row_us:.1f}",
                 f"{g.importance:+.4f}±{g.importance_std:.4f}", str(g.level), ",".join(g.columns)]
                for g in self.groups
            ],
        ))
        if self.shared_nodes:
            lines.append(f"  shared upstream steps (costed once): {', '.join(self.shared_nodes)}")
        lines.append("")
        lines.append(_table(
            ["level", "groups", "model", "threshold", "answered"],
            [
                [str(lv.index), ", ".join(lv.groups), lv.model,
                 "-" if lv.threshold is None else f"{lv.threshold:.4f}",
                 f"{lv.fraction_answered:.1%}"]
                for lv in self.levels
            ],
        ))
        if self.candidates:
            lines.append("")
            lines.append("  candidate plans (selection split, cheapest threshold within max_loss each):")
            lines.append(_table(
                ["chain", "threshold", "loss", "bound at threshold", "speedup batch", "speedup 1 row"],
                [[c.chain, f"{c.threshold:.4f}", f"{c.loss:+.4f}", f"{c.loss_bound:.4f}",
                  f"{c.expected_speedup:.2f}x", f"{c.expected_speedup_row:.2f}x"] for c in self.candidates],
            ))
        if self.gears:
            lines.append("")
            lines.append("  gears (certified jointly with the plan, for serving under load; opt.gear(i)):")
            lines.append(_table(
                ["gear", "max_loss", "chain", "threshold", "bound at threshold", "speedup batch", "answered first"],
                [[str(i + 1), f"{g['max_loss']:g}", g["chain"], f"{g['threshold']:.4f}", f"{g['loss_bound']:.4f}",
                  f"{g['expected_speedup']:.2f}x", f"{g['answered'][0]:.1%}"] for i, g in enumerate(self.gears)],
            ))
        if self.segments:
            worst = max(self.segments, key=lambda s: s["bound"])
            lines.append("")
            lines.append(
                f"  segments: {len(self.segments)}, each certified within segment_max_loss "
                f"{self.segment_max_loss} on its own rows (worst: {worst['segment']}, bound "
                f"{worst['bound']:.4f} on {worst['rows']} rows)")
        if self.topk is not None:
            t = self.topk
            ratio = "exact" if t.ratio is None else f"r={t.ratio:g}"
            lines.append("")
            planned = [r["pool"] for r in t.reach if r["ratio"] is not None]
            lines.append(
                f"  top-K (certified per query: precision@k >= {t.precision_target} at "
                f"{t.confidence:.0%}, else exact): k={t.k} of {t.pool} rows, filter "
                f"[{', '.join(t.filter_groups)}], {ratio}, expected speedup {t.expected_speedup:.2f}x"
                + (f"; planned for pools up to {max(planned):,} rows, larger pools are scored exactly"
                   if planned else "")
            )
        lines.append("  models: " + "; ".join(f"{k}: {v}" for k, v in self.models.items()))
        lines.append(f"  refit: {self.refit}")
        lines.append(
            "  splits: " + ", ".join(f"{k} {v}" for k, v in self.splits.items())
            + " | optimizer time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings_s.items())
        )
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in rows]
    return "\n".join(out)


def _finite(value: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
