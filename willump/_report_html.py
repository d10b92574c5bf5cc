"""The optimization report as one self-contained HTML page with plots.

Plots are drawn server-side by matplotlib as inline SVG, so the page needs no network access
(no scripts, fonts or styles fetched from elsewhere) and can be mailed or archived as is.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._report import BOUND_AT_THRESHOLD

if TYPE_CHECKING:
    from ._report import Report

#: figure size of every plot, inches (width, height)
FIGURE_SIZE = (6.4, 3.2)
BAR = "#4c72b0"
ACCENT = "#dd8452"
GOOD = "#55a868"

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: 70rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
td, th { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: left; }
.plan { font-size: 1.05rem; padding: 0.6rem 0.8rem; background: #f3f6fa; border-left: 4px solid #4c72b0; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; } .grid figure { margin: 0; }
figcaption { font-size: 0.85rem; color: #555; max-width: 38rem; }
.note { color: #555; font-size: 0.9rem; }
"""


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline in HTML


def _figure(caption: str, draw) -> str:
    from willump._extras import require

    require("matplotlib", "the report's plots")
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE)
    draw(fig)
    return f"<figure>{_svg(fig)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _groups_plot(report: Report) -> str:
    names = [g.name for g in report.groups]

    def draw(fig):
        cost, imp = fig.subplots(1, 2)
        cost.barh(names, [g.cost_batch_us for g in report.groups], color=BAR)
        cost.set_xlabel("cost per row, us (batch)")
        cost.invert_yaxis()
        imp.barh(names, [g.importance for g in report.groups], xerr=[g.importance_std for g in report.groups],
                 color=ACCENT)
        imp.set_xlabel("importance (log-loss rise when shuffled)")
        imp.invert_yaxis()
        imp.set_yticklabels([])
        fig.tight_layout()

    return _figure("Cost and importance of each feature group: a cheap, important group is what "
                   "a cascade's first level is made of.", draw)


def _bound_plot(report: Report) -> str | None:
    tested = report.certification
    if not tested:
        return None

    def draw(fig):
        ax = fig.subplots()
        xs = [c.threshold for c in tested]
        ax.plot(xs, [c.loss for c in tested], "o-", color=BAR, label="loss (certification rows)")
        uppers = [c.loss_bound if math.isfinite(c.loss_bound) else None for c in tested]
        ax.plot(xs, [u if u is not None else float("nan") for u in uppers], "s--", color=ACCENT,
                label=f"{report.confidence:.0%} upper bound")
        ax.axhline(report.max_loss, color="#c44e52", lw=1, label=f"max_loss {report.max_loss}")
        if report.plan == "cascade" and report.levels and report.levels[0].threshold is not None:
            t = report.levels[0].threshold
            ax.axvline(t, color=GOOD, lw=1.5, label=f"certified threshold {t:.3f}")
        ax.set_xlabel("confidence threshold (tested from the right, most conservative first)")
        ax.set_ylabel(f"{report.metric} loss")
        ax.invert_xaxis()
        ax.legend(fontsize=8)
        fig.tight_layout()

    return _figure("The fixed sequence of certification: each threshold's loss and upper bound; "
                   "testing stopped at the first bound above max_loss.", draw)


def _levels_plot(report: Report) -> str:
    def draw(fig):
        ax = fig.subplots()
        labels = [f"level {lv.index}\n" + ", ".join(lv.groups)[:40] for lv in report.levels]
        ax.bar(labels, [lv.fraction_answered for lv in report.levels], color=BAR)
        ax.set_ylabel("share of certification rows answered")
        ax.set_ylim(0, 1)
        fig.tight_layout()

    return _figure("Where rows are answered: the cheap level's share is what the speedup is made of.",
                   draw)


def _topk_plot(report: Report) -> str | None:
    t = report.topk
    if t is None or not t.reach:
        return None

    def draw(fig):
        ax = fig.subplots()
        pools = [r["pool"] for r in t.reach]
        ratios = [r["ratio"] if r["ratio"] is not None else float("nan") for r in t.reach]
        ax.plot(pools, ratios, "o-", color=BAR, label="planned ratio (none: scored exactly)")
        ax.axvline(t.pool, color=ACCENT, lw=1, label=f"calibration rows {t.pool:,}")
        ax.set_xscale("log")
        ax.set_xlabel(f"pool size (k={t.k})")
        ax.set_ylabel("kept rows / k")
        ax.legend(fontsize=8)
        fig.tight_layout()

    return _figure(f"Top-K, certified per query (precision@k >= {t.precision_target} at {t.confidence:.0%}, "
                   f"else exact): the ratio a query of k={t.k} is planned at, by pool size.", draw)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(report: Report) -> str:
    """The report as an HTML document (a string)."""
    plots = [p for p in (_groups_plot(report), _bound_plot(report), _levels_plot(report),
                         _topk_plot(report)) if p]
    bound = ("" if report.loss_bound is None else
             f"<p>Loss {'n/a' if report.loss is None else format(report.loss, '+.4f')}; certified: loss &le; max_loss {report.max_loss} at "
             f"{report.confidence:.0%} &mdash; {html.escape(report.bound_method)}: "
             f"{html.escape(report.bound_detail)}. Bound at this threshold alone {report.loss_bound:.4f} "
             f"({html.escape(BOUND_AT_THRESHOLD)}).</p>")
    facts = [
        ["metric", f"{report.metric}: baseline {report.baseline_score:.4f}, optimized "
                   f"{report.optimized_score:.4f} (certification rows)"],
        ["expected speedup", f"{report.expected_speedup:.2f}x batch, {report.expected_speedup_row:.2f}x one row"
                             + ("" if report.measured_speedup is None else
                                f"; measured {report.measured_speedup:.2f}x")],
        ["rows", ", ".join(f"{k} {v}" for k, v in report.splits.items()) + f" ({report.split})"],
        ["certifiable floor", "-" if report.certifiable_floor is None else
         f"{report.certifiable_floor:.4f} (max_loss {report.max_loss} needs >= {report.rows_needed} rows)"],
        ["feature state", report.feature_state],
        ["models", "; ".join(f"{k}: {v}" for k, v in report.models.items())],
        ["costs", report.costs_source],
    ]
    levels = _table(["level", "groups", "model", "threshold", "answered"],
                    [[lv.index, ", ".join(lv.groups), lv.model,
                      "-" if lv.threshold is None else f"{lv.threshold:.4f}", f"{lv.fraction_answered:.1%}"]
                     for lv in report.levels])
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>willump report: {html.escape(report.pipeline)}</title>
<style>{STYLE}</style></head><body>
<h1>willump report: pipeline '{html.escape(report.pipeline)}' &rarr; {html.escape(report.plan)}</h1>
<p class="plan">{html.escape(report.reason)}</p>
{bound}
{_table(["", ""], facts)}
<h2>Plots</h2>
<div class="grid">{"".join(plots)}</div>
<h2>Levels</h2>
{levels}
<h2>Notes</h2>
<ul class="note">{notes or "<li>none</li>"}</ul>
</body></html>
"""


def write(report: Report, path: Any) -> Path:
    """Write the HTML report to ``path`` (parents created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(report), encoding="utf-8")
    return out
