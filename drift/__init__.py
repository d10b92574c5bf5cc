"""drift: MacroBase-style anomaly explanation and drift monitoring for served ML pipelines.

A plain library (numpy, scipy, pandas, sqlite3; never Ray or willump). Serving feeds records to
a `Monitor` and asks it why outliers happen (`explain`), which segments grew (`mix_shift`),
where inputs changed inside segments (`conditional_shift`), which columns drifted (`drift`),
when series changed (`change_points`) and whether the cascade's cheap level is still answering
inside its validated data (`cascade_health`). `explain` also works on any table, raw or
pre-aggregated. See drift/README.md.
"""

from drift._changepoint import PageHinkley
from drift._classify import MAD, Classifier, ErrorFlag, Percentile, Predicate
from drift._errors import DataWarning, NoReferenceError, SchemaError, StateError
from drift._explain import explain
from drift._monitor import IngestReceipt, Monitor
from drift._results import CascadeHealth, ChangePoints, DriftReport, Explanation, Result
from drift._sketch import QuantileSketch

__all__ = [
    "MAD",
    "CascadeHealth",
    "ChangePoints",
    "Classifier",
    "DataWarning",
    "DriftReport",
    "ErrorFlag",
    "Explanation",
    "IngestReceipt",
    "Monitor",
    "NoReferenceError",
    "PageHinkley",
    "Percentile",
    "Predicate",
    "QuantileSketch",
    "Result",
    "SchemaError",
    "StateError",
    "explain",
]
