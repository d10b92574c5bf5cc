"""Result objects: ranked rows plus context, as a DataFrame or as JSON-ready dicts.

Why one shape for every query (explanations, drift, change points, cascade health): serving
turns any of them into an HTTP response with `to_dict()` and notebooks read `to_frame()`.
`to_dict()` holds only plain Python values (str, int, float, bool, None, lists, dicts): floats
keep 6 significant digits (weighted counts and shares are estimates, 0.9999999999999747 is 1),
NaN becomes None; in a row, an infinite value of a numeric column (a ratio with no outliers
outside its group, its upper bound, a constant reference's effect) becomes None and its column
is named in the row's `infinite` list, so a client that expects a number in `ratio` never gets
the string "inf" (quote `ci_low`, the finite lower bound the ranking uses: "ratio >= ci_low");
elsewhere (info) an infinite value is the string "inf" (or "-inf"). So
`json.dumps(result.to_dict(), allow_nan=False)` works. `summary()` says the result in a
sentence or a few.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

#: Significant digits of floats in `to_dict()`.
SIGNIFICANT_DIGITS = 6


def jsonable(value: Any) -> Any:
    """Plain-Python, JSON-safe copy of a value (non-finite floats become None)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return None
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return float(f"{f:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (pd.Timestamp, _dt.datetime, _dt.date)):
        return value.isoformat()
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def _is_inf(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and math.isinf(float(value))


class Result:
    """Rows (dicts sharing `columns`), ranked best first, plus context in `info`."""

    kind = "result"
    #: columns whose values are numbers (NaN when missing in the DataFrame)
    numeric_columns: tuple[str, ...] = ()
    #: columns whose values are whole numbers (nullable Int64 in the DataFrame)
    integer_columns: tuple[str, ...] = ()

    def __init__(
        self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], info: Mapping[str, Any]
    ) -> None:
        self.columns = list(columns)
        self.rows = [{c: r.get(c) for c in self.columns} for r in rows]
        self.info = dict(info)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __repr__(self) -> str:
        head = f"<{type(self).__name__} {self.kind}: {len(self)} row(s)>"
        if not self.rows:
            return head
        return head + "\n" + self.to_frame().head(20).to_string()

    def to_frame(self) -> pd.DataFrame:
        """A pandas DataFrame: one row per result row, in rank order."""
        data = {}
        for c in self.columns:
            values = [r[c] for r in self.rows]
            if c in self.integer_columns:
                data[c] = pd.Series(values, dtype="Int64")
            elif c in self.numeric_columns:
                data[c] = pd.Series(
                    [np.nan if v is None else v for v in values], dtype="float64"
                )
            elif values and all(isinstance(v, (bool, np.bool_)) for v in values):
                data[c] = pd.Series(values, dtype=bool)
            else:
                data[c] = pd.Series(values, dtype=object)
        return pd.DataFrame(data, columns=self.columns)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: {'kind', 'summary', 'columns', 'rows': [...], plus context keys}."""
        out = {"kind": self.kind, "summary": self.summary(), "columns": list(self.columns)}
        out["rows"] = [self._json_row(r) for r in self.rows]
        out.update({k: jsonable(v) for k, v in self.info.items()})
        return out

    def _json_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """A row for JSON: numeric columns stay numbers or None; the infinite ones are named in
        `infinite` (always present, usually empty), so a client can say "ratio >= ci_low"."""
        infinite = [c for c in self.numeric_columns if _is_inf(row.get(c))]
        out = jsonable({c: (None if c in infinite else v) for c, v in row.items()})
        out["infinite"] = infinite
        return out

    def summary(self) -> str:
        """The result in plain language (a sentence per reported row, at most a few)."""
        from drift._text import summarize

        return summarize(self)


class Explanation(Result):
    """Attribute combinations (None = any value) ranked by the lower bound of their ratio."""

    numeric_columns = (
        "support", "ratio", "risk_ratio", "global_ratio", "ci_low", "ci_high",
        "outlier_count", "total_count", "reference_count", "current_share", "reference_share",
        "mean_in", "mean_out",
    )
    integer_columns = ("order",)

    def __init__(self, kind: str, rows, columns, info) -> None:
        self.kind = kind
        super().__init__(rows, columns, info)

    @property
    def attributes(self) -> list[str]:
        return list(self.info.get("attributes", []))


class DriftReport(Result):
    """Per-column (or per-segment, per-column) drift tests."""

    numeric_columns = (
        "statistic", "statistic_upper", "p_value", "p_adjusted", "effect", "effect_error",
        "effect_outside", "psi", "n_current", "n_reference", "new_category_share",
        "mean_current", "mean_reference",
    )
    integer_columns = ("new_categories", "windows_drifted")

    def __init__(self, kind: str, rows, columns, info) -> None:
        self.kind = kind
        super().__init__(rows, columns, info)

    @property
    def drifted_columns(self) -> list[str]:
        return list(dict.fromkeys(r["column"] for r in self.rows if r.get("drifted")))


class SequentialDrift(DriftReport):
    """Per-column sequential (CUSUM) drift: when each column's alarm began and was raised."""

    numeric_columns = (
        "effect", "baseline", "scale", "statistic", "threshold", "n_current",
    )
    integer_columns = ("start_pane", "detected_pane", "delay_panes", "alarms",
                       "panes_monitored")

    def __init__(self, rows, columns, info) -> None:
        super().__init__("sequential_drift", rows, columns, info)


class ChangePoints(Result):
    """Detected changes in per-pane scalar series (when a change began, when it was seen)."""

    kind = "change_points"
    numeric_columns = ("magnitude", "before", "after")
    integer_columns = ("start_pane", "detected_pane")


class CascadeHealth(Result):
    """Cheap-level answer fraction and small-model confidence per segment vs the reference."""

    kind = "cascade_health"
    numeric_columns = (
        "n_current", "n_reference", "cheap_fraction", "reference_cheap_fraction",
        "cheap_fraction_change", "p_value", "p_adjusted", "confidence_median",
        "reference_confidence_median", "confidence_effect", "confidence_p_value",
    )

    @property
    def healthy(self) -> bool:
        return bool(self.info.get("healthy", True))

    @property
    def message(self) -> str | None:
        return self.info.get("message")
