"""The dashboard page: one self-contained HTML document (inline SVG plots, inline CSS, no
script, nothing fetched from elsewhere), built from :func:`serving.runtime.dashboard.view.model`.

It refreshes itself with a meta refresh; ``?refresh=0`` turns that off (screenshots,
archiving). Every section says where its figures come from and how old they are, and says so
plainly when a part cannot be shown (no monitor, a reference still being collected).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import Any

from serving.runtime.dashboard import plots as plots
from serving.runtime.dashboard.view import RECENT_S

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.2rem auto;
       max-width: 84rem; color: #222; line-height: 1.4; padding: 0 1rem; }
h1 { font-size: 1.4rem; margin-bottom: 0.2rem; } h2 { font-size: 1.1rem; margin-top: 1.8rem;
     border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.85rem; }
td, th { border-bottom: 1px solid #e3e3e3; padding: 0.2rem 0.55rem; text-align: left; vertical-align: top; }
th { background: #f6f7f9; }
.status { color: #555; font-size: 0.85rem; }
.cards { display: flex; flex-wrap: wrap; gap: 0.6rem; margin: 0.8rem 0; }
.card { background: #f3f6fa; border-left: 4px solid #4c72b0; padding: 0.4rem 0.8rem; min-width: 9rem; }
.card b { display: block; font-size: 1.25rem; } .card span { font-size: 0.78rem; color: #555; }
.card.bad { border-left-color: #c44e52; background: #fbf0f0; } .card.ok { border-left-color: #55a868; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; } .grid figure { margin: 0; }
figcaption { font-size: 0.78rem; color: #555; max-width: 36rem; }
.notice { background: #fff7e6; border-left: 4px solid #dd8452; padding: 0.5rem 0.8rem; margin: 0.6rem 0; }
.off { background: #f0f0f0; border-left: 4px solid #8c8c8c; padding: 0.6rem 0.8rem; }
.why { font-size: 1.0rem; background: #f3f6fa; border-left: 4px solid #4c72b0; padding: 0.5rem 0.8rem; }
.bad { color: #c44e52; font-weight: 600; } .muted { color: #777; }
nav a { margin-right: 0.9rem; font-size: 0.85rem; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def num(value: Any, digits: int = 3, unit: str = "") -> str:
    if value is None or isinstance(value, str) or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None or not isinstance(value, str) else esc(value)
    v = float(value)
    text = f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"
    return text + unit


def pct(value: Any) -> str:
    return "-" if value is None or isinstance(value, str) else f"{100 * float(value):.1f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], raw: bool = False) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def ago(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "never"
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


# --- sections -------------------------------------------------------------------------------
def _cards(view: dict[str, Any]) -> str:
    k = view["kpis"]
    slo = k.get("slo_ms")
    p99 = k.get("p99_ms")
    late = slo is not None and p99 is not None and p99 > slo
    cheap, cert = k.get("cheap_share"), k.get("cheap_share_certified")
    low = cheap is not None and cert is not None and cheap < cert - 0.05
    errors = sum(v for v in (k.get("errors_per_s") or {}).values() if isinstance(v, (int, float)))
    cards = [
        ("", num(k.get("requests_per_s")), "requests/s (POST /predict)"),
        ("", num(k.get("rows_per_s")), "rows/s"),
        ("bad" if late else "ok" if p99 is not None and slo else "", num(p99, unit=" ms"),
         "p99 latency" + (f" (SLO {slo:g} ms)" if slo else " (no SLO set)")),
        ("", num(k.get("p50_ms"), unit=" ms"), "p50 latency"),
        ("bad" if low else "ok" if cheap is not None else "", pct(cheap),
         f"cheap level's share (certified {pct(cert)})"),
        ("bad" if errors > 0 else "", num(errors), "errors/s"),
        ("bad" if k.get("degraded_rows") else "", num(k.get("degraded_rows")), "degraded rows"),
        ("bad" if k.get("shed_requests") else "", num(k.get("shed_requests")), "requests shed (503)"),
    ]
    body = "".join(f'<div class="card {c}"><b>{v}</b><span>{esc(label)}</span></div>' for c, v, label in cards)
    return (f'<div class="cards" id="kpis">{body}</div><p class="status">Figures over the last '
            f"{num(k.get('seconds'), 2)} s of samples (up to {RECENT_S:.0f} s).</p>")


def _plan(view: dict[str, Any]) -> str:
    k = view["kpis"]
    rows = []
    for r in view["plan"]:
        rows.append([
            esc(r["deployment"]) + (f' <span class="muted">({esc(r["note"])})</span>' if r.get("note") else ""),
            esc(r.get("replicas", "-")), esc(r.get("device") or "-"),
            f"{num(r.get('num_cpus'))} / {num(r.get('num_gpus'))}",
            f"{num(r.get('batch_planned'))} / {num(r.get('batch_measured'))}",
            f"{num(r.get('capacity_rows_s'))} / {num(r.get('rows_s'))}",
            f"{pct(r.get('utilization_planned'))} / {pct(r.get('utilization_measured'))}",
            f"{num(r.get('call_ms_predicted'))} / {num(r.get('call_ms_measured'))}"
            + (f' <span class="muted">({esc(r["call_ms_source"])})</span>' if r.get("call_ms_source") else ""),
        ])
    header = ["deployment", "replicas", "device", "CPUs / GPUs per replica", "batch rows: planned max / measured mean",
              "rows/s: capacity / measured", "utilization: planned / measured",
              "ms per call: predicted at the measured batch / measured"]
    rate = k.get("predicted_at_rps")
    whole = ("<p>The plan's simulation"
             + (f" at {num(rate)} req/s" if rate else "")
             + f": p50 {num(k.get('predicted_p50_ms'), unit=' ms')}, p99 {num(k.get('predicted_p99_ms'), unit=' ms')}, "
             f"{num(k.get('predicted_rows_per_s'))} rows/s; measured at {num(k.get('requests_per_s'))} req/s: "
             f"p50 {num(k.get('p50_ms'), unit=' ms')}, p99 {num(k.get('p99_ms'), unit=' ms')}, "
             f"{num(k.get('rows_per_s'))} rows/s.</p>")
    notes = "".join(f"<li>{esc(n)}</li>" for n in view.get("plan_notes") or [])
    return (f'<h2 id="plan">The plan, predicted against measured</h2>{table(header, rows, raw=True)}{whole}'
            + (f'<ul class="status">{notes}</ul>' if notes else ""))


def _memo(view: dict[str, Any], name: str, draw: Any) -> str:
    """``draw()``, reused while the monitor's snapshot is the same (its plots do not move
    with the clock): re-rendering the page then only redraws the metric-ring plots."""
    cache = view.get("_cache")
    monitor = view.get("monitor") or {}
    key = (monitor.get("taken_at"), view["monitor_deployed"])
    if cache is None or key[0] is None:
        return draw()
    hit = cache.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    text = draw()
    cache[name] = (key, text)
    return text


def _live(view: dict[str, Any]) -> str:
    s, k = view["series"], view["kpis"]
    figs = [
        plots.traffic_plot(s["t"], s["rows_per_level"], s["requests"]),
        plots.latency_plot(s["latency_t"], s["latency"], k.get("slo_ms"),
                           {"p50": k.get("predicted_p50_ms"), "p99": k.get("predicted_p99_ms")}),
        plots.stage_plot(s["t"], s["stages"]),
    ]
    monitor = view.get("monitor") or {}
    figs.append(_memo(view, "level-latency", lambda: plots.level_latency_plot(
        monitor.get("levels") or {}, view["changes"], k.get("slo_ms"))))
    figs = [f for f in figs if f]
    sampler = view["sampler"]
    if not figs:
        return ('<h2 id="live">Traffic and latency</h2><p class="notice">No samples yet: the first ones '
                f"arrive {sampler['every_s']:g} s after the app's first request.</p>")
    return f'<h2 id="live">Traffic and latency, last minutes</h2><div class="grid">{"".join(figs)}</div>'


def _segment(row: dict[str, Any], attributes: Sequence[str]) -> str:
    parts = [f"{a}={row[a]}" for a in attributes if row.get(a) is not None]
    return " & ".join(parts) or "all rows"


def _attributes(result: dict[str, Any], first_figure: str) -> list[str]:
    if result.get("attributes"):
        return list(result["attributes"])
    columns = result.get("columns") or []
    return columns[: columns.index(first_figure)] if first_figure in columns else []


def _times(v: Any, infinite: bool = False) -> str:
    if v == "inf" or infinite:  # "inf": older monitors; now None with the column in `infinite`
        return "∞"
    return num(v, 3) + "x"


def explanation_sentences(result: dict[str, Any], what: str) -> list[str]:
    """One plain sentence per reported combination."""
    attributes = _attributes(result, "support")
    # support counts rows; with request ids the intervals count requests (rows of a request
    # share its latency and client, so they are not independent evidence)
    by_requests = result.get("unit") == "requests"
    unit = "; the interval counts requests, not rows" if by_requests else ""
    out = []
    for r in result.get("rows", []):
        inf = set(r.get("infinite") or ())
        ratio = (f"at least {_times(r.get('ci_low'))} (no outlier outside them)" if "ratio" in inf
                 else _times(r.get("ratio")))
        out.append(
            f"Rows with {_segment(r, attributes)} are {ratio} as likely as the rest to be "
            f"{what} (99% simultaneous interval {_times(r.get('ci_low'))} to "
            f"{_times(r.get('ci_high'), 'ci_high' in inf)}{unit}); "
            f"they hold {pct(r.get('support'))} of the outliers ({num(r.get('outlier_count'))} outlier rows "
            f"of {num(r.get('total_count'))} with these values).")
    return out


def _part_error(monitor: dict[str, Any], name: str) -> str:
    err = (monitor.get("errors") or {}).get(name)
    if not err:
        return ""
    retry = err.get("retry_after_s")
    extra = f" (ready in about {retry:.0f} s)" if isinstance(retry, (int, float)) else ""
    return f'<p class="notice">{esc(err.get("error"))}{esc(extra)}</p>'


def _explanations(view: dict[str, Any]) -> str:
    monitor = view["monitor"]
    out = ['<h2 id="why">Why: what the outliers share</h2>']
    slo = view["kpis"].get("slo_ms")
    parts = [("explain_slo", f"requests slower than the {slo:g} ms SLO" if slo else "", "above the SLO"),
             ("explain_latency", "latency outliers (above the reference's percentile)", "latency outliers")]
    for name, title, what in parts:
        if not title:
            continue
        result = monitor.get(name)
        out.append(f"<h3>{esc(title)}</h3>")
        if result is None:
            out.append(_part_error(monitor, name) or '<p class="muted">not computed</p>')
            continue
        out.append(f'<p class="why" data-part="{name}">{esc(result.get("summary"))}</p>')
        sentences = explanation_sentences(result, what)
        if sentences:
            out.append("<ol>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ol>")
            out.append(plots.explanations_plot(result["rows"], _attributes(result, "support"),
                                               f"what {what} share"))
    mix = monitor.get("mix")
    if mix is not None:
        out.append(f"<h3>segments whose share of traffic grew</h3><p>{esc(mix.get('summary'))}</p>")
    else:
        out.append(_part_error(monitor, "mix"))
    return "".join(out)


def _cascade(view: dict[str, Any]) -> str:
    sh = view["shares"]
    figs = [plots.shares_plot(sh["levels"], sh["live"], sh["history"], sh["certified"])]
    text = ""
    monitor = view.get("monitor")
    if monitor is not None:
        cascade = monitor.get("cascade")
        if cascade is not None:
            attrs = _attributes(cascade, "n_current")
            certified = sh["certified"][0] if sh["certified"] else None
            figs.append(_memo(view, "segments", lambda: plots.segments_plot(cascade.get("rows", []), attrs, certified)))
            healthy = cascade.get("healthy", True)
            text = (f'<p class="{"why" if healthy else "notice"}">{esc(cascade.get("summary"))}'
                    + ("" if healthy else f' <span class="bad">{esc(cascade.get("message") or "")}</span>') + "</p>")
        else:
            text = _part_error(monitor, "cascade")
    figs = [f for f in figs if f]
    guarantee = _guarantee((monitor or {}).get("guarantee"))
    return f'<h2 id="cascade">The cascade</h2>{text}{guarantee}<div class="grid">{"".join(figs)}</div>'


def _guarantee(report: dict[str, Any] | None) -> str:
    """The live audit's verdict per gear (serving.runtime.audit; drift.GuaranteeLedger)."""
    if not report:
        return ""
    rows = [[g["gear"], pct(g["max_loss"]), f'{g["audited_rows"]:,}', f'{g["shed_audits"]:,}',
             f'{pct(g["disagreement_rate"])} (at least {pct(g["disagreement_lower"])})',
             pct(g["alarm_reference"]), pct(g["loss_upper"]),
             "-" if g["supported"] is None else ("yes" if g["supported"] else "not yet"),
             ('<span class="bad">ALARM</span>' if g["alarm"] else "ok")
             + (' <span class="bad">HELD</span>' if g.get("held") else "")] for g in report["gears"]]
    lead = ("served answers differ from the full pipeline's more often than on the certification rows"
            if report["alarm"] else "the live audit finds served answers in line with certification")
    held = report.get("held")
    if held:
        lead += ("; the full pipeline answers every row until the rows audited since show gear 0 is back"
                 if 0 in held else f"; gear(s) {', '.join(map(str, held))} held: a more conservative gear serves")
    return (f'<h3>the live guarantee</h3><p class="{"notice" if report["alarm"] else "why"}">{esc(lead)} '
            f'(anytime-valid, {pct(report["confidence"])} confidence)</p>'
            + table(["gear", "max_loss", "audited", "shed", "disagreement", "certified rate", "loss upper bound",
                     "supports max_loss", "verdict"],
                    [[esc(c) if i < 8 else c for i, c in enumerate(r)] for r in rows], raw=True))


def _drift(view: dict[str, Any]) -> str:
    monitor = view["monitor"]
    drift = monitor.get("drift")
    out = ['<h2 id="drift">Column drift</h2>']
    if drift is None:
        return out[0] + _part_error(monitor, "drift")
    out.append(f'<p class="why">{esc(drift.get("summary"))}</p>')
    rows = [[r["column"], r.get("kind"), f"{num(r.get('effect'))} ± {num(r.get('effect_error'))}",
             esc(r.get("effect_name") or ""), num(r.get("p_adjusted")), num(r.get("windows_drifted")),
             '<span class="bad">drifted</span>' if r.get("drifted") else
             ('<span class="muted">undetectable at the gate</span>' if r.get("undetectable") else "no")]
            for r in drift.get("rows", [])]
    out.append(table(["column", "kind", "effect ± sketch error", "effect", "p (BH-adjusted)",
                      "windows drifted", "verdict"], [[esc(c) for c in r[:-1]] + [r[-1]] for r in rows], raw=True))
    dists = monitor.get("distributions") or {}
    fig = plots.distributions_plot(dists)
    if fig:
        out.append(f'<div class="grid">{fig}</div>')
    elif "distributions" in (monitor.get("errors") or {}):
        out.append(_part_error(monitor, "distributions"))
    cond = monitor.get("conditional")
    if cond is not None and cond.get("rows"):
        out.append(f"<h3>inside segments</h3><p>{esc(cond.get('summary'))}</p>")
    return "".join(out)


def _changes(view: dict[str, Any]) -> str:
    monitor = view["monitor"]
    out = ['<h2 id="changes">Change points</h2>']
    fig = plots.series_plot(monitor.get("series") or {}, view["changes"])
    changes = monitor.get("changes")
    if changes is None:
        out.append(_part_error(monitor, "changes"))
    else:
        out.append(f"<p>{esc(changes.get('summary'))}</p>")
    if fig:
        out.append(f'<div class="grid">{fig}</div>')
    return "".join(out)


def _health(view: dict[str, Any]) -> str:
    monitor = view["monitor"]
    stats = monitor.get("stats") or {}
    k = view["kpis"]
    drift = monitor.get("drift") or {}
    undetectable = drift.get("undetectable_columns") or [r["column"] for r in drift.get("rows", [])
                                                         if r.get("undetectable")]
    refs = stats.get("references") or {}
    default = refs.get("default") or {}
    if not refs:
        ref_text = "none yet (explanations judge the window by itself; drift needs one)"
    elif default.get("pending"):
        ref_text = "being collected"
    else:
        ref_text = f"{num(default.get('rows'))} rows, {esc(default.get('start'))} to {esc(default.get('end'))}"
    dropped = sum(v for v in (k.get("records_dropped") or {}).values() if isinstance(v, (int, float)))
    rows = [
        ["rows ingested", num(stats.get("rows_ingested"))],
        ["late rows dropped", f'<span class="{"bad" if stats.get("late_dropped") else ""}">'
                              f"{num(stats.get('late_dropped'))}</span>"],
        ["quarantined (future-dated) rows", f'<span class="{"bad" if stats.get("quarantined") else ""}">'
                                            f"{num(stats.get('quarantined'))}</span>"],
        ["columns whose drift cannot be detected at the gate", esc(", ".join(undetectable) or "none")],
        ["records sent / dropped by the ingress (last minute)",
         f"{num(k.get('records_sent'))} / " + (f'<span class="bad">{num(dropped)}</span>' if dropped else "0")],
        ["reference", ref_text],
        ["window", esc(_window_text(monitor.get("window") or {}))],
        ["panes", f"{num(stats.get('pane_seconds'))} s each, window of {num(stats.get('window_panes'))}"],
        ["clock", esc(stats.get("clock", "-"))],
        ["memory", num((stats.get("memory_bytes") or 0) / 2**20, unit=" MiB")],
        ["query time (last snapshot)", f"{num(monitor.get('elapsed_ms'))} ms"],
    ]
    errors = {k2: v for k2, v in (monitor.get("errors") or {}).items()}
    if errors:
        rows.append(["parts not answered", esc("; ".join(f"{k2}: {v.get('error')}" for k2, v in errors.items()))])
    return f'<h2 id="health">Monitor health</h2>{table(["", ""], rows, raw=True)}'


def _window_text(window: dict[str, Any]) -> str:
    if not window:
        return "-"
    return f"{window.get('rows', '-')} rows in {window.get('panes', '-')} panes, {window.get('start')} to {window.get('end')}"


def _monitor_sections(view: dict[str, Any]) -> str:
    if not view["monitor_deployed"]:
        return ('<h2 id="why">Explanations, drift and change points</h2><div class="off" id="monitor-off">'
                "<b>The monitor is off for this app.</b> There are no explanations of outliers, no column drift, "
                "no change points and no per-segment cascade health. Deploy with "
                "<code>monitor=dict(attributes=[...])</code> (or <code>willump serve --monitor-attributes ...</code>) "
                "to see them here.</div>")
    if view.get("monitor") is None:
        reason = view.get("monitor_error") or "the first answer is still being computed"
        return ('<h2 id="why">Explanations, drift and change points</h2><div class="notice" id="monitor-pending">'
                f"The monitor's answers are not available yet: {esc(reason)}. This page refreshes by itself.</div>")
    return (_memo(view, "explanations", lambda: _explanations(view)) + _memo(view, "drift", lambda: _drift(view))
            + _memo(view, "changes", lambda: _changes(view)) + _health(view))


def render(view: dict[str, Any], *, refresh: bool = True, root: str = "",
           cache: dict[str, Any] | None = None) -> str:
    """The page as an HTML document; ``cache`` (a dict kept between calls) reuses the parts
    drawn from an unchanged monitor snapshot."""
    started = time.perf_counter()
    view = {**view, "_cache": cache}
    sampler = view["sampler"]
    age = view.get("monitor_age_s")
    monitor_text = ("monitor off" if not view["monitor_deployed"] else
                    f"monitor answers computed {ago(age)}" if view.get("monitor") is not None else
                    "monitor answers pending")
    status = (f"Updated {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(view['now']))} UTC"
              + (f" · refreshes every {view['refresh_s']:g} s" if refresh else " · not refreshing")
              + f" · metrics sampled every {sampler['every_s']:g} s (last {ago(sampler.get('age_s'))}; "
              f"{num(sampler.get('cpu_ms'))} ms CPU per sample, off the request path)"
              + f" · {monitor_text}")
    body = (_cards(view) + _plan(view) + _live(view) + _cascade(view) + _monitor_sections(view))
    links = "".join(f'<a href="{root}/{p}">{p}</a>' for p in ("plan", "report", "metrics", "docs", "healthz"))
    links += f'<a href="{root}/ui?format=json">ui?format=json</a>'
    render_ms = 1e3 * (time.perf_counter() - started)
    meta = f'<meta http-equiv="refresh" content="{view["refresh_s"]:g}">' if refresh else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">{meta}
<title>{esc(view['app'])} - willump dashboard</title><style>{STYLE}</style></head><body>
<h1>{esc(view['app'])} <span class="muted">model {esc(view['model_version'])} · {esc(view.get('layout'))} layout ·
stages {esc(', '.join(view.get('stages') or []))}</span></h1>
<p class="status" id="status">{esc(status)}</p>
<nav><a href="#plan">plan</a><a href="#live">traffic</a><a href="#cascade">cascade</a><a href="#why">why</a>
<a href="#drift">drift</a><a href="#changes">changes</a><a href="#health">health</a> | {links}</nav>
{body}
<p class="status" id="render">Page drawn in {render_ms:.0f} ms on the server{_where(view)} (plots are inline SVG;
nothing is fetched from elsewhere).</p>
</body></html>
"""


def _where(view: dict[str, Any]) -> str:
    info = view.get("render") or {}
    if not info.get("where"):
        return ""
    last = info.get("cpu_ms")
    return f", in a {esc(info['where'])}" + (f"; the previous drawing took {last:.0f} ms CPU" if last else "")


#: page parts drawn from unchanged monitor snapshots, per app, in the process that draws
_SHARED_CACHES: dict[str, dict[str, Any]] = {}


def render_shared(view: dict[str, Any], refresh: bool, root: str, key: str) -> tuple[str, float]:
    """:func:`render` with a cache kept in this process (the dashboard's drawing process):
    (page, CPU seconds spent)."""
    cpu0 = time.process_time()
    text = render(view, refresh=refresh, root=root, cache=_SHARED_CACHES.setdefault(key, {}))
    return text, time.process_time() - cpu0


def drawing_page(app: str, root: str, retry_s: float, waited_s: float) -> str:
    """What a page request answers while the page is still being drawn (the first drawing in a
    fresh process loads the plotting library; a loaded machine makes it slow): a small page that
    says so and loads again, never an error."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{retry_s:g}">
<title>{esc(app)} - willump dashboard</title><style>{STYLE}</style></head><body>
<h1>{esc(app)}</h1>
<p class="notice" id="drawing">The dashboard is being drawn on the server (waited {waited_s:.0f} s so far);
this page loads again in {retry_s:g} s. Its data as JSON: <a href="{root}/ui?format=json">{root}/ui?format=json</a>.</p>
</body></html>
"""


def warm() -> float:
    """Load matplotlib and its font cache in the drawing process, drawing one tiny figure, so
    that the first page drawn there costs a drawing, not a start-up (on a loaded machine the
    start-up alone outlasted RENDER_WAIT_S). Returns the CPU seconds it took."""
    cpu0 = time.process_time()
    plots.figure("warm-up", "", lambda fig: len(fig.subplots().plot([0.0, 1.0], [0.0, 1.0])))
    return time.process_time() - cpu0
