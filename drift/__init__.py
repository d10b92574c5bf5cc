"""drift: MacroBase-style anomaly explanation and drift monitoring for served ML pipelines.

A plain library (numpy, scipy, pandas, sqlite3, prometheus-client; never Ray or willump).
Serving feeds records to a `Monitor` and asks it why outliers happen (`explain`), which segments
grew (`mix_shift`), what distinguishes two time ranges (`diff`), where inputs changed inside
segments (`conditional_shift`), which columns drifted (`drift`, or
sooner with a CUSUM: `sequential_drift`), when series changed
(`change_points`) and whether the cascade's cheap level is still answering inside its
validated data (`cascade_health`). A served cascade's live audit is judged by a `GuaranteeLedger` (an anytime-valid bound on
how often served answers differ from the full pipeline's), and labels fed back by a `LabelJoin`.
`explain` and `diff` also work on any tables, raw or
pre-aggregated. Verdicts export to Prometheus with `MonitorCollector`. See drift/README.md.
"""

from drift._changepoint import PageHinkley
from drift._classify import MAD, Classifier, ErrorFlag, Percentile, Predicate
from drift._errors import DataWarning, DriftError, NoReferenceError, SchemaError, StateError
from drift._explain import diff, explain
from drift._guarantee import GearTerms, GuaranteeLedger
from drift._guarantee_metrics import GuaranteeCollector
from drift._labels import LabelError, LabelJoin
from drift._monitor import IngestReceipt, Monitor
from drift._prometheus import MonitorCollector, prometheus_text
from drift._results import (
    CascadeHealth,
    ChangePoints,
    DriftReport,
    Explanation,
    Result,
    SequentialDrift,
)
from drift._rules import EffectGate, Persistence
from drift._sketch import QuantileSketch

__all__ = [
    "MAD",
    "CascadeHealth",
    "ChangePoints",
    "Classifier",
    "DataWarning",
    "DriftError",
    "DriftReport",
    "EffectGate",
    "ErrorFlag",
    "Explanation",
    "GearTerms",
    "GuaranteeCollector",
    "GuaranteeLedger",
    "IngestReceipt",
    "LabelError",
    "LabelJoin",
    "Monitor",
    "MonitorCollector",
    "NoReferenceError",
    "PageHinkley",
    "Percentile",
    "Persistence",
    "Predicate",
    "QuantileSketch",
    "Result",
    "SchemaError",
    "SequentialDrift",
    "StateError",
    "diff",
    "explain",
    "prometheus_text",
]
