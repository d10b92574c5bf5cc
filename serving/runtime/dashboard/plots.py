"""The dashboard's plots: matplotlib figures drawn server-side as inline SVG.

Why SVG from the server: the page must work with no internet access and no JavaScript
library, and be archivable as one file (the same approach as ``willump``'s HTML report).
Text stays text in the SVG (``svg.fonttype: none``): smaller pages, searchable labels.

Every function takes plain data and returns one ``<figure>`` (or "" when there is nothing
to draw); ``data-plot`` names it and ``data-points`` counts the finite values drawn, so a
browser test can tell a drawn plot from an empty frame.
"""

from __future__ import annotations

import html
import io
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: figure size of the time-series plots, inches (width, height)
SERIES_SIZE = (6.2, 2.6)
#: figure size of the small multiples (distributions), inches
SMALL_SIZE = (3.6, 2.3)
PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]
REFERENCE = "#9aa5b1"
ALERT = "#c44e52"
GOOD = "#55a868"
#: narrowest time axis drawn (seconds): a plot whose values sit at one time is centred in it
MIN_TIME_SPAN_S = 60.0
#: tick spacings of a time axis (seconds); wider spans tick on whole hours, at most about 8 ticks
TIME_STEPS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200)


def _finite(values: Any) -> int:
    arr = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    return int(np.isfinite(arr).sum())


def _arr(values: Sequence[Any]) -> np.ndarray:
    return np.asarray([np.nan if v is None or isinstance(v, str) else v for v in values], dtype=float)


def figure(name: str, caption: str, draw: Callable[[Any], int], size: tuple[float, float] = SERIES_SIZE) -> str:
    """One plot as ``<figure>``: ``draw(fig)`` draws and returns how many values it drew."""
    import matplotlib
    from matplotlib.figure import Figure

    # text.parse_math off: labels carry attribute values clients chose, and "$\\foo$" would be
    # parsed as mathtext (and raise) instead of drawn as the characters it is
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 8, "axes.titlesize": 9,
                                "axes.spines.top": False, "axes.spines.right": False,
                                "text.parse_math": False, "text.usetex": False}):
        fig = Figure(figsize=size)
        points = int(draw(fig))
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    svg = text[text.index("<svg"):]
    return (f'<figure data-plot="{html.escape(name)}" data-points="{points}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _x(times: Sequence[float]) -> np.ndarray:
    return np.asarray(times, dtype=float)


def _time_axis(ax: Any, times: Any, start: float | None = None) -> None:
    """Clock time (UTC) on the x axis over the plot's own time span (``start`` or the first time, to
    the last), at least :data:`MIN_TIME_SPAN_S` wide, with at most about 8 ticks on whole minutes or
    hours: figures drawn from the same data look the same whenever they are drawn, so the page can
    reuse them.

    Why the limits are set here: left to matplotlib, a plot whose values sit at one time (one pane
    with rows, a ring of two snapshots: one rate) gets a degenerate range that it widens by 5% of
    the value, i.e. by years of epoch seconds; ticks every few minutes over that span were ~27,000
    labels, a minute or more of drawing per plot and a 20 MB page."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    t = np.asarray(times, dtype=float)
    t = t[np.isfinite(t)]
    if t.size:
        lo = float(t.min()) if start is None else min(float(start), float(t.min()))
        hi = float(t.max())
        if hi - lo < MIN_TIME_SPAN_S:
            lo -= 0.5 * (MIN_TIME_SPAN_S - (hi - lo))
            hi = lo + MIN_TIME_SPAN_S
        ax.set_xlim(lo, hi)
    lo, hi = ax.get_xlim()
    span = max(hi - lo, 1.0)
    step = next((s for s in TIME_STEPS_S if span / s <= 7), 3600.0 * math.ceil(span / 7 / 3600.0))
    ax.xaxis.set_major_locator(MultipleLocator(step))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _: time.strftime("%H:%M:%S" if step < 60 else "%H:%M", time.gmtime(v))))
    ax.set_xlabel("time (UTC)")
    ax.grid(alpha=0.25)


def _log_y(ax: Any) -> None:
    """Log scale without minor tick labels (they cost most of a log plot's drawing time)."""
    from matplotlib.ticker import NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())


def _mark_changes(ax: Any, changes: Sequence[dict[str, Any]], label: bool = True) -> int:
    """Vertical lines where changes began, shaded until they were detected."""
    drawn = 0
    for ch in changes:
        start, detected = ch.get("start_t"), ch.get("detected_t")
        if start is None:
            continue
        x0 = float(start)
        ax.axvline(x0, color=ALERT, lw=1.2, ls="--")
        if detected is not None:
            ax.axvspan(x0, float(detected), color=ALERT, alpha=0.08)
        if label:
            ax.annotate(f"change: {ch.get('series', '')} {ch.get('direction', '')}", (x0, 1.0),
                        xycoords=("data", "axes fraction"), fontsize=7, color=ALERT, rotation=90,
                        va="top", ha="right")
        drawn += 1
    return drawn


def traffic_plot(times: Sequence[float], per_level: dict[str, Sequence[float]],
                 requests: Sequence[float] | None = None) -> str:
    if not len(times) or not per_level:
        return ""

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        x = _x(times)
        levels = sorted(per_level, key=lambda s: (len(s), s))
        ys = [np.nan_to_num(_arr(per_level[lv])) for lv in levels]
        ax.stackplot(x, *ys, labels=[f"level {lv}" for lv in levels], colors=PALETTE[: len(ys)], alpha=0.85)
        n = sum(_finite(per_level[lv]) for lv in levels)
        if requests is not None and len(requests):
            ax.plot(x, _arr(requests), color="#222", lw=1, ls=":", label="requests/s")
        ax.set_ylabel("rows/s")
        ax.set_title("rows answered per second, by cascade level")
        ax.legend(fontsize=7, loc="upper left")
        _time_axis(ax, x)
        return n

    return figure("traffic", "Rows answered per second by the cascade level that answered them (stacked), "
                             "from the app's counters summed over every ingress replica.", draw)


def latency_plot(times: Sequence[float], quantiles: dict[str, Sequence[float]],
                 slo_ms: float | None, predicted_ms: dict[str, float] | None) -> str:
    if not len(times) or not quantiles:
        return ""

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        x = _x(times)
        n = 0
        for i, (name, values) in enumerate(quantiles.items()):
            ax.plot(x, 1e3 * _arr(values), color=PALETTE[i], lw=1.5, label=f"{name} measured")
            n += _finite(values)
        for i, (name, value) in enumerate((predicted_ms or {}).items()):
            if value is not None and math.isfinite(value):
                ax.axhline(value, color=PALETTE[i], lw=1, ls="--", label=f"{name} predicted by the plan")
        if slo_ms:
            ax.axhline(slo_ms, color=ALERT, lw=1.2, label=f"SLO p99 {slo_ms:g} ms")
        ax.set_ylabel("ms")
        _log_y(ax)
        ax.set_title("request latency (POST /predict)")
        ax.legend(fontsize=7, loc="upper left")
        _time_axis(ax, x)
        return n

    return figure("latency", "Request latency quantiles over the preceding 30 s at each point (histogram "
                             "estimates, so within a bucket's width), against the SLO and the plan's "
                             "simulated figures.", draw)


def stage_plot(times: Sequence[float], per_stage: dict[str, dict[str, Sequence[float]]]) -> str:
    if not len(times) or not per_stage:
        return ""

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        x = _x(times)
        n = 0
        for i, (stage, qs) in enumerate(per_stage.items()):
            for name, values in qs.items():
                ax.plot(x, 1e3 * _arr(values), color=PALETTE[i % len(PALETTE)], lw=1.4 if name == "p99" else 1,
                        ls="-" if name == "p99" else ":", label=f"{stage} {name}")
                n += _finite(values)
        ax.set_ylabel("ms per call")
        _log_y(ax)
        ax.set_title("stage call latency")
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        _time_axis(ax, x)
        return n

    return figure("stages", "Per-stage call latency (a call carries many requests' rows): the in-process "
                            "stage as the ingress times it, remote stages as they report their compute.", draw)


def level_latency_plot(data: dict[str, Any], changes: Sequence[dict[str, Any]],
                       slo_ms: float | None) -> str:
    levels = (data or {}).get("levels") or {}
    if not data or not data.get("t") or not levels:
        return ""

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        x = _x(data["t"])
        n = 0
        for i, (level, series) in enumerate(levels.items()):
            ax.plot(x, _arr(series["p99"]), color=PALETTE[i], lw=1.5, marker=".", label=f"level {level} p99")
            ax.plot(x, _arr(series["p50"]), color=PALETTE[i], lw=1, ls=":", label=f"level {level} p50")
            n += _finite(series["p99"]) + _finite(series["p50"])
        if slo_ms:
            ax.axhline(slo_ms, color=ALERT, lw=1.2, label=f"SLO {slo_ms:g} ms")
        _mark_changes(ax, [c for c in changes if str(c.get("series", "")).startswith("latency")], label=False)
        ax.set_ylabel("ms")
        _log_y(ax)
        ax.set_title("request latency by the cascade level that answered, per pane")
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        _time_axis(ax, x, start=x[0] - float(data.get("bin_seconds") or 0.0) if x.size else None)
        return n

    return figure("level-latency", "Latency of the requests each cascade level answered, per monitor pane "
                                   "(weighted quantiles of the pane's row sample); dashed red lines: "
                                   "latency change points.", draw)


def shares_plot(levels: Sequence[str], live: Sequence[float], history: Sequence[float],
                certified: Sequence[float | None]) -> str:
    if not levels:
        return ""

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        x = np.arange(len(levels))
        w = 0.27
        ax.bar(x - w, _arr(certified), w, color=REFERENCE, label="certified (optimizer)")
        ax.bar(x, _arr(history), w, color=PALETTE[0], alpha=0.6, label="served, whole history")
        ax.bar(x + w, _arr(live), w, color=PALETTE[0], label="served, last minute")
        ax.set_xticks(x, [f"level {lv}" for lv in levels])
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of rows answered")
        ax.set_title("where rows are answered, against the certification")
        ax.legend(fontsize=7)
        return _finite(live) + _finite(history)

    return figure("shares", "Share of rows each cascade level answers: certified on the optimizer's held-out "
                            "rows, and as served. A cheap level answering less than certified costs speed; "
                            "the guarantee holds only on data like the certification rows.", draw)


def segments_plot(rows: Sequence[dict[str, Any]], attributes: Sequence[str], certified: float | None) -> str:
    rows = [r for r in rows if r.get("cheap_fraction") is not None]
    if not rows:
        return ""

    def label(r: dict[str, Any]) -> str:
        parts = [f"{a}={r[a]}" for a in attributes if r.get(a) is not None]
        return " & ".join(parts) or "all rows"

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        names = [label(r) for r in rows]
        y = np.arange(len(rows))
        cur = _arr([r.get("cheap_fraction") for r in rows])
        ref = _arr([r.get("reference_cheap_fraction") for r in rows])
        colors = [ALERT if r.get("degraded") else PALETTE[0] for r in rows]
        ax.barh(y, cur, color=colors, label="cheap share now")
        ax.scatter(ref, y, color="#222", marker="|", s=200, zorder=3, label="reference")
        if certified is not None:
            ax.axvline(certified, color=GOOD, lw=1.2, ls="--", label=f"certified {certified:.0%}")
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share answered by the cheap level")
        ax.set_title("cheap level's share, per segment")
        ax.legend(fontsize=7, loc="lower right")
        return _finite(cur)

    return figure("segments", "The cheap level's answer share in each segment of the window, against the "
                              "monitor's reference (black tick) and the optimizer's certification; red: "
                              "the monitor says the cascade degraded there.", draw,
                  size=(SERIES_SIZE[0], max(1.8, 0.32 * len(rows) + 1.0)))


def series_plot(data: dict[str, Any], changes: Sequence[dict[str, Any]]) -> str:
    series = (data or {}).get("series") or {}
    wanted = [s for s in ("rows", "latency_ms.p99", "expensive_fraction") if s in series]
    if not data or not data.get("t") or not wanted:
        return ""

    def draw(fig: Any) -> int:
        axes = fig.subplots(len(wanted), 1, sharex=True)
        axes = np.atleast_1d(axes)
        x = _x(data["t"])
        n = 0
        for ax, name, color in zip(axes, wanted, PALETTE, strict=False):
            ax.plot(x, _arr(series[name]), color=color, lw=1.3, drawstyle="steps-post")
            ax.set_ylabel(name.replace("latency_ms.", "latency ms ").replace("_", " "), fontsize=7)
            ax.grid(alpha=0.25)
            n += _finite(series[name])
            _mark_changes(ax, [c for c in changes if c.get("series") == name])
        axes[0].set_title("monitor series per pane, with the change points it detected")
        _time_axis(axes[-1], x)
        return n

    return figure("series", "Per-pane series the monitor keeps (rows, p99 latency, share answered by the "
                            "expensive level); a dashed red line marks where a detected change began, the "
                            "shading lasts until it was detected (Page-Hinkley).", draw,
                  size=(SERIES_SIZE[0], 1.3 * len(wanted) + 0.8))


def _distribution(ax: Any, column: str, dist: dict[str, Any]) -> int:
    ref, cur = _arr(dist["reference"]), _arr(dist["current"])
    color = ALERT if dist.get("drifted") else PALETTE[0]
    if dist.get("kind") == "numeric":
        edges = _arr(dist["edges"])
        ax.stairs(ref, edges, fill=True, color=REFERENCE, alpha=0.7, label="reference")
        ax.stairs(cur, edges, color=color, lw=1.6, label="current window")
    else:
        x = np.arange(len(dist["values"]))
        ax.bar(x - 0.2, ref, 0.4, color=REFERENCE, label="reference")
        ax.bar(x + 0.2, cur, 0.4, color=color, label="current window")
        ax.set_xticks(x, [str(v)[:12] for v in dist["values"]], rotation=30, ha="right")
    effect = dist.get("effect")
    verdict = "DRIFTED" if dist.get("drifted") else "not drifted"
    ax.set_title(f"{column}: {verdict}" + (f", effect {effect:.3g}" if isinstance(effect, (int, float)) else ""),
                 color=ALERT if dist.get("drifted") else "#222")
    ax.tick_params(labelsize=7)
    return _finite(ref) + _finite(cur)


def distributions_plot(dists: dict[str, dict[str, Any]], columns: int = 3) -> str:
    """Reference vs current distribution of each column, as small multiples in one figure."""
    shown = {c: d for c, d in dists.items()
             if (d.get("kind") == "numeric" and d.get("edges")) or (d.get("kind") == "categorical" and d.get("values"))}
    if not shown:
        return ""
    rows = -(-len(shown) // columns)

    def draw(fig: Any) -> int:
        axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
        n = 0
        for ax, (column, dist) in zip(axes, shown.items(), strict=False):
            n += _distribution(ax, column, dist)
        for ax in axes[len(shown):]:
            ax.set_visible(False)
        axes[0].legend(fontsize=6)
        axes[0].set_ylabel("share of rows")
        fig.subplots_adjust(hspace=0.75, wspace=0.3)
        return n

    return figure("distributions", "Reference (grey) against the current window, drawn from the monitor's "
                                   "sketches (numeric: share of rows per bin) and value counts (categorical); "
                                   "red: the column drifted.", draw,
                  size=(SMALL_SIZE[0] * columns, SMALL_SIZE[1] * rows))


def explanations_plot(rows: Sequence[dict[str, Any]], attributes: Sequence[str], title: str) -> str:
    rows = [r for r in rows if r.get("ratio") is not None or "ratio" in (r.get("infinite") or ())]
    if not rows:
        return ""

    def value(v: Any, infinite: bool = False) -> float:  # "inf": older monitors' rows
        return math.inf if v == "inf" or infinite else float(v) if v is not None else math.nan

    def draw(fig: Any) -> int:
        ax = fig.subplots()
        names = [" & ".join(f"{a}={r[a]}" for a in attributes if r.get(a) is not None) or "all rows" for r in rows]
        inf = [set(r.get("infinite") or ()) for r in rows]
        ratios = np.array([value(r.get("ratio"), "ratio" in i) for r, i in zip(rows, inf, strict=True)])
        lows = np.array([value(r.get("ci_low")) for r in rows])
        highs = np.array([value(r.get("ci_high"), "ci_high" in i) for r, i in zip(rows, inf, strict=True)])
        finite = np.concatenate([v[np.isfinite(v)] for v in (ratios, lows, highs)])
        cap = 2.0 * float(finite.max()) if finite.size else 10.0  # where an infinite ratio is drawn
        shown = np.where(np.isfinite(ratios), ratios, cap)
        y = np.arange(len(rows))
        ax.barh(y, shown, color=PALETTE[1], alpha=0.8)
        hi = np.where(np.isfinite(highs), highs, cap)
        ax.hlines(y, np.where(np.isfinite(lows), lows, shown), hi, color="#222", lw=1.5)
        ax.set_xscale("log")
        ax.axvline(1.0, color="#222", lw=0.8)
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_xlabel("risk ratio (line: 99% simultaneous interval)")
        ax.set_title(title)
        return int(np.isfinite(shown).sum())

    return figure("explanations", "How many times more likely rows with these attribute values are to be "
                                  "outliers than the rest; the line is the interval the ranking used.", draw,
                  size=(SERIES_SIZE[0], max(1.6, 0.35 * len(rows) + 0.9)))
