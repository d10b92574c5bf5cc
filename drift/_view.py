"""A read-only snapshot of a monitor's state, over a time range, that queries run on.

Why: queries used to hold the ingest lock for their whole run (0.7 s for a 1M-row window) and
reached into the monitor's private state. A View is taken under the lock in microseconds
(shallow copies of the pane dictionaries; open panes, the only ones ingest mutates in place, are
copied; closed panes are replaced, never mutated) and the query then runs without the lock.
It also answers time-range queries: `window=` / `as_of=` select panes from the full, detail and
rollup tiers (a rollup covers `rollup_panes` panes, so an old range is answered at that
granularity, with the rows each tier keeps; `window_info` says what was covered).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from drift._classify import Classifier
from drift._errors import NoReferenceError, SchemaError
from drift._references import Reference, iso
from drift._sample import Sample
from drift._summary import Summary

if TYPE_CHECKING:
    from drift._config import Config
    from drift._encode import Encoder
    from drift._ingest import Schema

__all__ = ["Labels", "Reference", "View", "iso", "to_epoch", "to_seconds"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hour|d|day)s?\s*$", re.I)
_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400,
         "day": 86400}


def to_epoch(value: Any, argument: str) -> float:
    """Epoch seconds of a datetime, pandas Timestamp, ISO text or number."""
    if isinstance(value, bool):
        raise TypeError(f"{argument} must be a time (datetime, ISO text or epoch seconds)")
    if isinstance(value, (int, float, np.integer, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"{argument} must be finite, got {value!r}")
        return f
    if isinstance(value, str):
        text = value.strip()
        try:
            return to_epoch(float(text), argument)
        except ValueError:
            pass
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{argument}: cannot read {value!r} as a time (ISO 8601 such as "
                         f"2024-05-01T14:00:00Z, or epoch seconds)") from exc
    if ts is pd.NaT:
        raise ValueError(f"{argument} is not a time: {value!r}")
    if ts.tzinfo is None:
        ts = ts.tz_localize("UTC")
    return float(ts.timestamp())


def to_seconds(value: Any, argument: str) -> float:
    """A duration: seconds, a timedelta, or text such as '10m', '2h', '90s'."""
    if isinstance(value, (_dt.timedelta, pd.Timedelta)):
        secs = float(value.total_seconds())
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        secs = float(value)
    elif isinstance(value, str) and _DURATION.match(value):
        m = _DURATION.match(value)
        assert m is not None
        secs = float(m.group(1)) * _UNIT[m.group(2).lower()]
    else:
        raise ValueError(f"{argument} must be a duration such as 600, '10m' or '2h', or a "
                         f"(start, end) pair of times; got {value!r}")
    if not (math.isfinite(secs) and secs > 0):
        raise ValueError(f"{argument} must be a positive duration, got {value!r}")
    return secs


def _pair(value: Any) -> tuple[Any, Any] | None:
    """(start, end) from a 2-sequence or 'start/end' text; None otherwise."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, str) and "/" in value:
        start, _, end = value.partition("/")
        return start.strip(), end.strip()
    return None


@dataclass
class Labels:
    """Code -> value of every categorical column, frozen at the snapshot's code counts."""

    encoders: list[Encoder]
    sizes: list[int]

    def label(self, column: int, code: int) -> Any:
        return self.encoders[column].label(code)

    def code_of(self, column: int, value: Any) -> int | None:
        code = self.encoders[column].code_of(value)
        if code is None:  # "0" configured, 0 sent (or the reverse): match by text
            text = str(value)
            enc = self.encoders[column]
            code = next((c for c in range(self.sizes[column]) if str(enc.label(c)) == text), None)
        return code if code is not None and code < self.sizes[column] else None

    def card(self, column: int) -> int:
        return max(self.sizes[column], 1)


class View:
    """What a query sees: config, schema, classifiers, labels, panes of a time range, refs."""

    def __init__(
        self,
        config: Config,
        schema: Schema,
        classifiers: Mapping[str, Classifier],
        labels: Labels,
        full: Mapping[int, Summary],
        detail: Mapping[int, Summary],
        rollups: Mapping[int, Summary],
        series: Mapping[int, Mapping[str, float]],
        closed_upto: int | None,
        newest: int | None,
        refs: Mapping[str, Reference],
        reference_pending: Mapping[str, Any] | None = None,
        counters: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.schema = schema
        self.classifiers = {n: copy.deepcopy(c) for n, c in classifiers.items()}
        self.labels = labels
        self.full = dict(full)
        self.detail = dict(detail)
        self.rollups = dict(rollups)
        self.series = dict(series)
        self.closed_upto = closed_upto
        self.newest = newest
        self.refs = dict(refs)
        self.reference_pending = dict(reference_pending or {})
        self.counters = dict(counters or {})
        w = config.window_panes
        self.range: tuple[int, int] | None = (
            None if newest is None else (newest - w + 1, newest))

    # ------------------------------------------------------------------ time ranges
    def pane_of(self, t: float) -> int:
        return math.floor(t / self.config.pane_seconds)

    def select(self, window: Any = None, as_of: Any = None) -> View:
        """This view restricted to a query range (returns self for the default window).

        window: None (the last `window_panes` panes), a duration ('10m', 600) ending at
        `as_of` (default: the newest pane), or a (start, end) pair / 'start/end' text of times.
        as_of: a time; the window's last pane is the one ending at or after it.
        """
        if window is None and as_of is None:
            return self
        ps = self.config.pane_seconds
        out = copy.copy(self)
        pair = _pair(window)
        if pair is not None:
            if as_of is not None:
                raise ValueError("pass either window=(start, end) or as_of=, not both")
            start, end = to_epoch(pair[0], "window start"), to_epoch(pair[1], "window end")
            if not end > start:
                raise ValueError(f"window ends ({iso(end)}) before it starts ({iso(start)})")
            out.range = (math.floor(start / ps), math.ceil(end / ps) - 1)
            return out
        if as_of is not None:
            last = math.ceil(to_epoch(as_of, "as_of") / ps) - 1
        elif self.newest is not None:
            last = self.newest
        else:
            out.range = None
            return out
        panes = (self.config.window_panes if window is None
                 else max(1, math.ceil(to_seconds(window, "window") / ps - 1e-9)))
        out.range = (last - panes + 1, last)
        return out

    @property
    def length(self) -> int:
        return 0 if self.range is None else self.range[1] - self.range[0] + 1

    def shifted(self, back: int) -> tuple[int, int] | None:
        """The range `back` whole lengths earlier (disjoint from this one)."""
        if self.range is None:
            return None
        step = back * self.length
        return self.range[0] - step, self.range[1] - step

    # ------------------------------------------------------------------ panes
    def sources(self, rng: tuple[int, int] | None = None) -> list[tuple[str, int, Summary]]:
        """(tier, id, summary) covering the range: full or detail panes, else rollups."""
        rng = self.range if rng is None else rng
        if rng is None:
            return []
        out: list[tuple[str, int, Summary]] = []
        buckets: set[int] = set()
        r = self.config.rollup_panes
        lo, hi = rng
        # iterate over what exists, not over the range (a range may span months)
        for p in sorted(k for k in self.full if lo <= k <= hi):
            out.append(("pane", p, self.full[p]))
        have = {p for _, p, _ in out}
        for p in sorted(k for k in self.detail if lo <= k <= hi and k not in have):
            out.append(("detail", p, self.detail[p]))
        for b in sorted(self.rollups):
            if (b + 1) * r - 1 >= lo and b * r <= hi and b not in buckets:
                buckets.add(b)
                out.append(("rollup", b, self.rollups[b]))
        return out

    def window_summary(self, rng: tuple[int, int] | None = None) -> Summary | None:
        """Counts and sketches of a range (default: the view's window), no rows."""
        src = self.sources(rng)
        if not src:
            return None
        out = src[0][2].copy(with_reservoir=False)
        for _, _, s in src[1:]:
            out.merge(s)  # `out` has no reservoir, so rows are not merged
        return out

    def window_sample(self, rng: tuple[int, int] | None = None) -> Sample:
        src = self.sources(rng)
        return Sample.from_reservoirs([s.reservoir for _, _, s in src],
                                      len(self.schema.cat_columns), len(self.schema.num_columns),
                                      self.clustered)

    def window_info(self, rng: tuple[int, int] | None = None) -> dict[str, Any]:
        rng = self.range if rng is None else rng
        src = self.sources(rng)
        ps = self.config.pane_seconds
        if rng is None:
            return {"panes": 0, "rows": 0, "start": None, "end": None}
        info: dict[str, Any] = {"panes": 0, "rows": 0, "start": iso(rng[0] * ps),
                                "end": iso((rng[1] + 1) * ps)}
        if not src:
            return info
        r = self.config.rollup_panes
        first = min(i * r if t == "rollup" else i for t, i, _ in src)
        last = max((i + 1) * r - 1 if t == "rollup" else i for t, i, _ in src)
        info.update(panes=sum(r if t == "rollup" else 1 for t, _, _ in src),
                    rows=int(sum(s.n for _, _, s in src)))
        if first < rng[0] or last > rng[1]:
            info.update(covered_start=iso(first * ps), covered_end=iso((last + 1) * ps))
        tiers = sorted({t for t, _, _ in src})
        if tiers != ["pane"]:
            info["tiers"] = tiers
        return info

    # ------------------------------------------------------------------ references
    def reference(self, spec: Any = "default") -> Reference:
        """A named reference, a (start, end) range of history, or '-1d' (this window shifted
        back by a duration)."""
        if spec is None:
            spec = "default"
        if isinstance(spec, str) and spec in self.refs and not self.refs[spec].pending:
            return self.refs[spec]
        if isinstance(spec, str) and spec.strip().startswith("-"):
            back = to_seconds(spec.strip()[1:], "reference")
            if self.range is None:
                raise no_data()
            k = max(1, round(back / self.config.pane_seconds))
            rng = (self.range[0] - k, self.range[1] - k)
            return self.range_reference(rng, f"window shifted back {spec.strip()[1:]}")
        pair = _pair(spec)
        if pair is not None:
            ps = self.config.pane_seconds
            start, end = to_epoch(pair[0], "reference start"), to_epoch(pair[1], "reference end")
            if not end > start:
                raise ValueError("reference range ends before it starts")
            rng = (math.floor(start / ps), math.ceil(end / ps) - 1)
            return self.range_reference(rng, f"{iso(start)}/{iso(end)}")
        if not isinstance(spec, str):
            raise TypeError("reference must be a reference name, a (start, end) pair of times, "
                            f"or a shift such as '-1d'; got {type(spec).__name__}")
        have = sorted(n for n, r in self.refs.items() if not r.pending)
        raise no_reference(spec, have, self.reference_pending if spec == "default" else {})

    def reference_sample(self, ref: Reference) -> Sample:
        res = ref.summary.reservoir
        return Sample.from_reservoirs([] if res is None else [res], len(self.schema.cat_columns),
                                      len(self.schema.num_columns), self.clustered)

    @property
    def clustered(self) -> bool:
        """Rows came in requests (a request column is configured): samples carry request keys
        and every interval counts requests (drift._clusters)."""
        return self.schema.request is not None

    def range_reference(self, rng: tuple[int, int], label: str) -> Reference:
        """A reference made of a time range of this monitor's own history."""
        src = self.sources(rng)
        if not src:
            raise NoReferenceError(
                f"no retained data in the reference range {label}", reason="empty_range",
                http_message=f"the monitor holds no data for the reference range {label}; "
                             "pick a range inside its retention")
        k = self.config.reference_reservoir_size
        summary = Summary(src[0][2].layout, (k, k))
        for _, _, s in src:
            summary.merge(s)
        info = {"name": label, "source": "time range", **self.window_info(rng)}
        return Reference(label, summary, info)

    # ------------------------------------------------------------------ labels
    def label(self, column: int, code: int) -> Any:
        return self.labels.label(column, code)

    def cheap_code(self) -> int | None:
        """Code of the cheap cascade level (see `cheap_code`)."""
        return cheap_code(self.config, self.schema, self.labels, self.refs.get("default"))


def cheap_code(config: Config, schema: Schema, labels: Labels, default: Reference | None
               ) -> int | None:
    """Code of the cheap cascade level: configured, else the lowest level in the reference."""
    if config.level_column is None:
        return None
    i = list(schema.cat_columns).index(config.level_column)
    if config.cheap_level is not None:
        return labels.code_of(i, config.cheap_level)
    if default is not None and not default.pending:
        codes = default.summary.cats[i].items()[0].tolist()
    else:
        codes = list(range(labels.sizes[i]))
    if not codes:
        return None
    pairs = [(labels.label(i, c), c) for c in codes]
    try:
        return min(pairs, key=lambda lc: float(lc[0]))[1]
    except (TypeError, ValueError):
        return min(pairs, key=lambda lc: str(lc[0]))[1]


def no_data() -> NoReferenceError:
    return NoReferenceError("the monitor has no data yet", reason="no_data",
                            http_message="the monitor has received no records yet")


def no_reference(name: str, have: Sequence[str], pending: Mapping[str, Any]
                 ) -> NoReferenceError:
    """The error for a missing reference: what to do with query parameters (HTTP and Python
    alike), and in `hint` what a Python caller can do besides."""
    hint = (f"set_reference(batch, name={name!r}), or construct the Monitor with "
            "auto_reference_panes=N")
    if pending:
        wait = pending.get("retry_after_s")
        text = (f"the reference {name!r} is still being collected from the first "
                f"{pending.get('panes_needed')} panes of traffic "
                f"({pending.get('panes_done')} closed so far)")
        return NoReferenceError(
            text, reason="reference_pending", retry_after_s=wait, hint=hint,
            http_message=(f"{text}; retry in about {wait:.0f} s, or compare against a time "
                          "range now with reference=-1h or reference=<start>/<end>")
            if wait is not None else f"{text}; retry once traffic has flowed",
        )
    return NoReferenceError(
        f"no reference named {name!r} (have {list(have)})", reason="no_reference", hint=hint,
        http_message=f"no reference named {name!r} (have {list(have)}): compare against a "
                     "time range instead, e.g. reference=-1h (the same window an hour earlier) "
                     "or reference=<start>/<end> in ISO 8601",
    )


def check_range(view: View) -> None:
    if view.range is not None and view.range[1] < view.range[0]:
        raise SchemaError("window ends before it starts")
