"""The cbpe section of ``benchmarks.guarantee_live``: the label-free accuracy estimate
``drift.LabelJoin`` reports beside the labelled accuracy of the served (cascade) answers.

``estimate_without_labels`` is CBPE's (NannyML): the mean, over served rows, of the probability
the served answer gave its class, the accuracy a calibrated model expects; its interval counts
only the sampling noise of right/wrong given those probabilities. Each workload's held-out rows
go through a real ``LabelJoin`` (in memory): ``served`` with the served class and its
probability, then ``label`` with every row's label, and ``report()`` gives both figures.

Workloads: UCI Adult, the very cascade of the shift section (``pipelines.adult``, 6,000
certification rows passed as ``cert=``, fixed costs), and the Davidson tweets (``pipelines.toxic``,
optimized with its own defaults and ``keep_slower_cascade``: about 25 s on 2 cores). Under a
planted shift a segment's share has grown to 100%: the held-out rows of that segment alone. Adult's
segments are the shift section's (attribute values; the one that disagrees most and the one that
loses most among those losing 2 x max_loss); the tweets have no attributes, so a few are read off
the text (a mention, a retweet, a link, a hashtag, an HTML-escaped emoji, the length in words)
and picked by the same rule.
"""

from __future__ import annotations

import re
import time
import warnings
from typing import Any

import numpy as np

import pipelines
import willump
from benchmarks._guarantee_live_shift import (
    MIN_SEGMENT_ROWS,
    _optimize,
    planted_segments,
    row_facts,
)
from drift import LabelJoin
from drift._labels import MAX_LABELS_PER_CALL
from pipelines.adult import CATEGORICAL_GROUPS, categories

#: target from the issue: the estimate within this many accuracy points of the labelled accuracy
TARGET_POINTS = 2.0
WORKLOADS = ("adult", "toxic")
FAST = dict(verbose=False, importance_repeats=1)


def label_join_figures(opt: Any, X: Any, y: np.ndarray) -> dict[str, Any]:
    """The served rows of ``X`` and their labels through a LabelJoin: its label-free estimate and
    labelled accuracy, with their intervals."""
    proba, level = opt.predict_with_levels(X)
    served = proba.argmax(axis=1)
    conf = proba[np.arange(len(served)), served]
    classes = [c.item() if isinstance(c, np.generic) else c for c in opt.classes_]

    def through_join(calibration: list | None) -> dict[str, Any]:
        join = LabelJoin(None, classes, clock=lambda: 0.0, calibration=calibration)
        try:
            ids = [f"r{i}" for i in range(len(served))]
            join.served(ids, [0] * len(ids), served.tolist(), None, conf.tolist())
            labels = [{"request_id": r, "row": 0, "label": v.item() if isinstance(v, np.generic) else v}
                      for r, v in zip(ids, y, strict=True)]
            for a in range(0, len(labels), MAX_LABELS_PER_CALL):
                join.label({"labels": labels[a:a + MAX_LABELS_PER_CALL]})
            return join.report()["gears"][0]
        finally:
            join.close()

    # as serving runs it: the served confidence through the certification rows' map (Gear.calibration)
    g = through_join([getattr(gear, "calibration", None) for gear in opt.gears_])
    raw = through_join(None)["estimate_without_labels"]
    estimate, accuracy, (lo, hi) = g["estimate_without_labels"], g["accuracy"], g["estimate_interval"]
    cheap = level < len(opt.levels) - 1
    full = opt.baseline.predict_proba(X)  # the full pipeline's own estimate: its calibration, not the cascade's
    return {"rows": len(served), "cheap_share": float(cheap.mean()), "estimate": estimate,
            "calibrated": bool(g["estimate_calibrated"]), "raw_estimate": raw,
            "raw_error_points": 100.0 * (raw - accuracy),
            "estimate_interval": [lo, hi], "accuracy": accuracy,
            "accuracy_interval": [g["accuracy_lower"], g["accuracy_upper"]],
            "error_points": 100.0 * (estimate - accuracy), "accuracy_in_estimate_interval": bool(lo <= accuracy <= hi),
            "within_target": bool(abs(estimate - accuracy) * 100.0 <= TARGET_POINTS),
            "full_accuracy": float(np.mean(opt.classes_[full.argmax(axis=1)] == y)),
            "full_estimate": float(full.max(axis=1).mean())}


def _text_attributes(X: Any) -> dict[str, np.ndarray]:
    text = X["tweet"].astype(str)
    words = text.str.split().str.len().to_numpy()
    flags = {"mention": r"@\w", "retweet": r"\bRT\b", "link": r"https?://", "hashtag": r"(?:^|\s)#\w",
             "emoji": r"&#\d+;"}
    out = {name: np.where(text.str.contains(rx, regex=True, flags=re.IGNORECASE if name == "link" else 0),
                          "yes", "no") for name, rx in flags.items()}
    out["words"] = np.where(words <= 8, "<=8", np.where(words <= 16, "9-16", ">16"))
    return out


def _segments(attributes: dict[str, np.ndarray], cheap: np.ndarray, disagree: np.ndarray,
              loss: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for attribute, values in attributes.items():
        for value in np.unique(values):
            m = values == value
            if m.sum() >= MIN_SEGMENT_ROWS:
                rows.append({"attribute": attribute, "value": str(value), "rows": int(m.sum()),
                             "cheap_share": float(cheap[m].mean()), "disagreement": float(disagree[m].mean()),
                             "loss": float(loss[m].mean())})
    return rows


def _workload(name: str, seed: int) -> tuple[Any, Any, dict[str, np.ndarray], float]:
    """The workload, its cascade, its segment attributes per held-out row, optimize seconds
    (Adult's cascade is the shift section's, cached when that section ran first)."""
    t = time.perf_counter()
    if name == "adult":
        w, opt, _ = _optimize(seed)
        attrs = {a: categories(w.X_test, [a])[a].astype(str).to_numpy()
                 for a in [c for cols in CATEGORICAL_GROUPS.values() for c in cols]}
        return w, opt, attrs, time.perf_counter() - t
    w = pipelines.build(name, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", willump.WillumpWarning)
        opt = w.optimize(keep_slower_cascade=True, **FAST)
    return w, opt, _text_attributes(w.X_test), time.perf_counter() - t


def cbpe_section(seed: int, workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Any]:
    out: dict[str, Any] = {"target_points": TARGET_POINTS, "workloads": []}
    for name in workloads:
        w, opt, attrs, seconds = _workload(name, seed)
        entry: dict[str, Any] = {"workload": name, "plan": repr(opt), "is_cascade": opt.is_cascade,
                                 "max_loss": w.max_loss, "optimize_seconds": seconds}
        entry["held_out"] = label_join_figures(opt, w.X_test, w.y_test)
        cheap, disagree, loss = row_facts(opt, w.X_test, w.y_test)
        table = _segments(attrs, cheap, disagree, loss)
        picks = planted_segments(table, w.max_loss)
        if not picks:  # none loses 2 x max_loss: the segment that loses most
            picks = {"loses most (none loses 2 x max_loss)": max(table, key=lambda r: r["loss"])}
        entry["shifted"] = []
        for why, pick in picks.items():
            m = attrs[pick["attribute"]] == pick["value"]
            entry["shifted"].append({"segment": f"{pick['attribute']}={pick['value']}", "why": why,
                                     "segment_row": pick, **label_join_figures(opt, w.X_test[m].reset_index(drop=True), w.y_test[m])})
        out["workloads"].append(entry)
    every = [e["held_out"] for e in out["workloads"]]
    out["held_out_within_target"] = sum(f["within_target"] for f in every)
    return out


def print_cbpe(r: dict[str, Any]) -> None:
    print(f"\n== cbpe: LabelJoin's label-free accuracy estimate (served confidence through the certification "
          "rows' calibration map, averaged) against the "
          f"labelled accuracy of the served answers (target: within {r['target_points']:g} points on held-out "
          "rows) ==\n")
    print("| workload | rows served | cheap share | estimate | its interval | labelled accuracy (interval) "
          "| error (estimate - accuracy) | accuracy in the estimate's interval | uncalibrated mean confidence: "
          "error | full pipeline: accuracy | its own estimate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for e in r["workloads"]:
        for label, f in [("held-out", e["held_out"])] + [(f"{s['segment']} at 100% ({s['why']})", s)
                                                          for s in e["shifted"]]:
            print(f"| {e['workload']}: {label} | {f['rows']:,} | {f['cheap_share']:.1%} | {f['estimate']:.2%} | "
                  f"{f['estimate_interval'][0]:.2%} - {f['estimate_interval'][1]:.2%} | {f['accuracy']:.2%} "
                  f"({f['accuracy_interval'][0]:.2%} - {f['accuracy_interval'][1]:.2%}) | "
                  f"{f['error_points']:+.2f} points | {'yes' if f['accuracy_in_estimate_interval'] else 'no'} | "
                  f"{f['raw_error_points']:+.2f} points | {f['full_accuracy']:.2%} | {f['full_estimate']:.2%} |")
    print(f"target (within {r['target_points']:g} points on held-out rows): met on "
          f"{r['held_out_within_target']} of {len(r['workloads'])} workloads ("
          + ", ".join(f"{e['workload']} {e['held_out']['error_points']:+.2f}" for e in r["workloads"])
          + "); plans: " + "; ".join(f"{e['workload']} {e['plan']} ({_built(e['optimize_seconds'])})"
                                     for e in r["workloads"]))


def _built(seconds: float) -> str:
    return "the shift section's, cached" if seconds < 1.0 else f"built and optimized in {seconds:.0f} s"
