"""The monitor's verdicts as Prometheus metrics, so people alert with the tools they run.

Why a collector: Prometheus scrapes `/metrics` every few seconds, while a verdict (drift of
every column, the top explanation per metric, cascade health per segment) costs a query.
`MonitorCollector` answers each scrape from verdicts at most `max_age_s` old, computed on the
monitor's snapshots (never holding the ingest lock for long), and exports counters (rows
ingested, late, quarantined, clock skew) fresh every time. Label sets are bounded: columns, metrics, at most
`max_segments` cascade segments and one top explanation per metric.

Usage::

    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor))
    body = generate_latest(registry)          # or: body = prometheus_text(monitor)

Example alert rules: deploy/prometheus/drift-alerts.yml (health) and drift-verdict-alerts.yml.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from drift._errors import DriftError

if TYPE_CHECKING:
    from drift._monitor import Monitor

#: Verdicts are recomputed at most this often (seconds); counters are always fresh.
DEFAULT_MAX_AGE_S = 15.0
#: Most cascade segments exported.
DEFAULT_MAX_SEGMENTS = 20


def _finite(x: Any) -> float:
    """A gauge value: NaN stays NaN (Prometheus accepts it), None becomes NaN."""
    if x is None:
        return math.nan
    return float(x)


#: longest attribute value a label shows; a longer one keeps its head and a digest of the whole
LABEL_VALUE_CHARS = 48


def _label_value(value: Any) -> str:
    """An attribute value as label text: printable characters only (a client's value can carry
    newlines or control characters into alert text), at most :data:`LABEL_VALUE_CHARS` plus a
    digest of the whole, so distinct long values never share a series."""
    text = str(value)
    clean = "".join(c if c.isprintable() else "?" for c in text)
    if len(clean) <= LABEL_VALUE_CHARS and clean == text:
        return clean
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{clean[:LABEL_VALUE_CHARS]}~{digest}"


def _combo_label(row: dict[str, Any], attributes: Sequence[str]) -> str:
    return ",".join(f"{a}={_label_value(row[a])}" for a in attributes if row.get(a) is not None) or "all"


class MonitorCollector:
    """A prometheus_client collector of one Monitor's state and verdicts.

    Exported (prefix `drift_` by default; see docs in drift/README.md):
    rows_ingested_total, rows_late_dropped_total, rows_quarantined_total,
    rows_quarantine_released_total, rows_quarantine_dropped_total, skewed_batches_total,
    duplicate_batches_total (counters); rows_retained, rows_quarantine_held, clock_max_lead_seconds, window_rows, reference_ready{reference}, verdict_age_seconds,
    column_effect{column,kind}, column_effect_error{column}, column_p_adjusted{column},
    column_drifted{column}, column_undetectable{column}, columns_drifted,
    columns_undetectable, explanations{metric}, explanation_top_ratio{metric,explanation},
    explanation_top_ratio_lower{metric,explanation}, cascade_healthy,
    cascade_cheap_share{segment}, cascade_reference_cheap_share{segment},
    cascade_degraded{segment}, query_errors{query} (1 when the last evaluation failed).
    """

    def __init__(self, monitor: Monitor, *, prefix: str = "drift",
                 max_age_s: float = DEFAULT_MAX_AGE_S,
                 metrics: Sequence[str] | None = None,
                 max_segments: int = DEFAULT_MAX_SEGMENTS) -> None:
        if not isinstance(prefix, str) or not prefix.replace("_", "").isalnum():
            raise ValueError(f"prefix must be a metric-name prefix such as 'drift', got {prefix!r}")
        if not max_age_s >= 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s!r}")
        self.monitor = monitor
        self.prefix = prefix
        self.max_age_s = float(max_age_s)
        self.metrics = None if metrics is None else list(metrics)
        self.max_segments = int(max_segments)
        self._lock = threading.Lock()
        self._verdicts: list[Metric] = []
        self._at = -math.inf

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the monitor's columns

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        stats = self.monitor.stats()
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        for family, name, key, text in (
            (counter, "rows_ingested", "rows_ingested", "rows accepted by the monitor"),
            (counter, "rows_late_dropped", "late_dropped",
             "rows too late to merge into their pane"),
            (counter, "rows_quarantined", "quarantined", "rows dated too far in the future"),
            (counter, "rows_quarantine_released", "quarantine_released",
             "quarantined rows released into their panes once time reached them"),
            (counter, "rows_quarantine_dropped", "quarantine_dropped",
             "quarantined rows dropped because too many panes were held"),
            (counter, "skewed_batches", "skewed_batches",
             "batches dated ahead of the time frontier that could not move it"),
            (counter, "duplicate_batches", "duplicate_batches",
             "batches sent again under an id already ingested (skipped)"),
            (gauge, "rows_retained", "rows_retained", "rows summarized in the monitor's state"),
            (gauge, "rows_quarantine_held", "quarantine_held",
             "quarantined rows held until the time frontier reaches them"),
            (gauge, "clock_max_lead_seconds", "max_lead_seconds",
             "largest lead of a skewed batch over the time frontier"),
        ):
            metric = family(f"{p}_{name}", text)
            metric.add_metric([], float(stats[key]))
            yield metric
        with self._lock:
            now = time.monotonic()
            if now - self._at > self.max_age_s:
                self._verdicts = list(self._evaluate())
                self._at = now
            age = GaugeMetricFamily(f"{p}_verdict_age_seconds",
                                    "seconds since the verdicts below were computed")
            age.add_metric([], now - self._at)
            yield age
            yield from self._verdicts

    # ------------------------------------------------------------------ verdicts
    def _evaluate(self) -> Iterator[Metric]:
        p, mon = self.prefix, self.monitor
        errors = GaugeMetricFamily(f"{p}_query_errors",
                                   "1 when the last evaluation of a verdict failed",
                                   labels=["query"])
        ready = GaugeMetricFamily(f"{p}_reference_ready", "1 when the reference is usable",
                                  labels=["reference"])
        names = mon.references
        for name in sorted(set(names) | {"default"}):
            ready.add_metric([name], 1.0 if name in names else 0.0)
        yield ready
        try:
            info = mon.window_info()
        except DriftError:
            info = {"rows": 0}
        w = GaugeMetricFamily(f"{p}_window_rows", "rows in the monitor's current window")
        w.add_metric([], float(info.get("rows", 0)))
        yield w
        yield from self._drift(errors)
        yield from self._explanations(errors)
        yield from self._cascade(errors)
        yield errors

    def _drift(self, errors: GaugeMetricFamily) -> Iterator[Metric]:
        p = self.prefix
        try:
            report = self.monitor.drift()
            errors.add_metric(["drift"], 0.0)
        except DriftError:
            errors.add_metric(["drift"], 1.0)
            return
        fams = {
            "effect": GaugeMetricFamily(f"{p}_column_effect", "drift effect size per column "
                                        "(Wasserstein / reference std, or Jensen-Shannon)",
                                        labels=["column", "kind"]),
            "effect_error": GaugeMetricFamily(f"{p}_column_effect_error",
                                              "sketch error bound of the effect",
                                              labels=["column"]),
            "p_adjusted": GaugeMetricFamily(f"{p}_column_p_adjusted",
                                            "BH-adjusted p-value per column", labels=["column"]),
            "drifted": GaugeMetricFamily(f"{p}_column_drifted", "1 when the column drifted "
                                         "(gates and persistence held)", labels=["column"]),
            "undetectable": GaugeMetricFamily(f"{p}_column_undetectable",
                                              "1 when sketch error alone reaches the gate",
                                              labels=["column"]),
        }
        for r in report.rows:
            col = str(r["column"])
            fams["effect"].add_metric([col, str(r.get("kind"))], _finite(r.get("effect")))
            fams["effect_error"].add_metric([col], _finite(r.get("effect_error")))
            fams["p_adjusted"].add_metric([col], _finite(r.get("p_adjusted")))
            fams["drifted"].add_metric([col], 1.0 if r.get("drifted") else 0.0)
            fams["undetectable"].add_metric([col], 1.0 if r.get("undetectable") else 0.0)
        yield from fams.values()
        for name, key in (("columns_drifted", "drifted"), ("columns_undetectable",
                                                            "undetectable")):
            g = GaugeMetricFamily(f"{p}_{name}", f"columns {key}")
            g.add_metric([], float(sum(1 for r in report.rows if r.get(key))))
            yield g

    def _explanations(self, errors: GaugeMetricFamily) -> Iterator[Metric]:
        p, mon = self.prefix, self.monitor
        count = GaugeMetricFamily(f"{p}_explanations", "reported explanations per metric",
                                  labels=["metric"])
        top = GaugeMetricFamily(f"{p}_explanation_top_ratio",
                                "risk ratio of the top explanation", labels=["metric",
                                                                             "explanation"])
        low = GaugeMetricFamily(f"{p}_explanation_top_ratio_lower",
                                "lower confidence bound of the top explanation's risk ratio",
                                labels=["metric", "explanation"])
        for metric in (self.metrics if self.metrics is not None else mon.metrics):
            try:
                exp = mon.explain(metric=metric)
                errors.add_metric([f"explain:{metric}"], 0.0)
            except (DriftError, ValueError, RuntimeError):
                errors.add_metric([f"explain:{metric}"], 1.0)
                continue
            count.add_metric([metric], float(len(exp)))
            if exp.rows:
                label = _combo_label(exp.rows[0], exp.attributes)
                top.add_metric([metric, label], _finite(exp.rows[0].get("ratio")))
                low.add_metric([metric, label], _finite(exp.rows[0].get("ci_low")))
        yield count
        yield top
        yield low

    def _cascade(self, errors: GaugeMetricFamily) -> Iterator[Metric]:
        p, mon = self.prefix, self.monitor
        cfg = mon.config
        if cfg.level_column is None and cfg.confidence_column is None:
            return
        try:
            health = mon.cascade_health(max_segments=self.max_segments)
            errors.add_metric(["cascade_health"], 0.0)
        except DriftError:
            errors.add_metric(["cascade_health"], 1.0)
            return
        ok = GaugeMetricFamily(f"{p}_cascade_healthy", "1 while no segment is degraded")
        ok.add_metric([], 1.0 if health.healthy else 0.0)
        yield ok
        attrs = [a for a in mon.attributes if a != cfg.level_column]
        share = GaugeMetricFamily(f"{p}_cascade_cheap_share", "share of rows the cheap level "
                                  "answered, per segment", labels=["segment"])
        ref = GaugeMetricFamily(f"{p}_cascade_reference_cheap_share", "the same share on the "
                                "reference", labels=["segment"])
        bad = GaugeMetricFamily(f"{p}_cascade_degraded", "1 when the segment is degraded",
                                labels=["segment"])
        for r in health.rows[: self.max_segments + 1]:
            seg = _combo_label(r, attrs)
            share.add_metric([seg], _finite(r.get("cheap_fraction")))
            ref.add_metric([seg], _finite(r.get("reference_cheap_fraction")))
            bad.add_metric([seg], 1.0 if r.get("degraded") else 0.0)
        yield share
        yield ref
        yield bad


def prometheus_text(monitor: Monitor, **options: Any) -> bytes:
    """The monitor's metrics in Prometheus text exposition format (one-off, no caching
    between calls; keep a `MonitorCollector` registered for scrapes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor, **{"max_age_s": 0.0, **options}))
    return generate_latest(registry)
