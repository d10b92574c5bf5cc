"""The app's metrics over the last minutes: a bounded ring of snapshots of its totals.

Why snapshots of totals: the ingress records counters into Ray's metrics, its histograms as
counters too (:mod:`serving.runtime.metrics`), summed across replicas and nodes by ``GET
/metrics``. Rates and latency quantiles over time are differences between two snapshots of those totals, the way
Prometheus computes ``rate()`` and ``histogram_quantile()``; the dashboard needs no store of its
own, and the request path records nothing more than it already does.

A snapshot is taken off the request path (:class:`serving.runtime.dashboard.live.Dashboard`'s sampler, in a
worker thread); this module is plain Python on parsed text, tested without Ray.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

#: seconds between snapshots of the app's totals
SAMPLE_S = 5.0
#: seconds of history kept (the ring holds HISTORY_S / SAMPLE_S snapshots)
HISTORY_S = 900.0
#: seconds of history a latency quantile point is computed over (several snapshots, so that a
#: p99 rests on more than one interval's requests)
QUANTILE_SPAN_S = 30.0

Labels = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    """Cumulative bucket counts of one labelled histogram (upper bounds ascending, +inf last)."""

    bounds: np.ndarray
    counts: np.ndarray
    total: float
    count: float


@dataclass
class Snapshot:
    """The app's totals at time ``t`` (epoch seconds): counters and histograms by family and
    labels (the ``app`` label dropped: one app per ring)."""

    t: float
    counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    histograms: dict[tuple[str, Labels], Histogram] = field(default_factory=dict)
    #: seconds the snapshot took to read and parse (wall, and CPU of the thread doing it)
    cost_s: float = 0.0
    cpu_s: float = 0.0

    @classmethod
    def parse(cls, text: str, t: float | None = None) -> Snapshot:
        """A snapshot from Prometheus text (the app's ``GET /metrics`` form)."""
        snap = cls(time.time() if t is None else t)
        buckets: dict[tuple[str, Labels], dict[float, float]] = {}
        sums: dict[tuple[str, Labels], float] = {}
        counts: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("app", "le")))
                key = (family.name, labels)
                if family.type == "histogram":
                    if sample.name.endswith("_bucket"):
                        buckets.setdefault(key, {})[float(sample.labels["le"])] = sample.value
                    elif sample.name.endswith("_sum"):
                        sums[key] = sample.value
                    elif sample.name.endswith("_count"):
                        counts[key] = sample.value
                elif sample.name.endswith("_total") and family.type in ("counter", "unknown", "untyped"):
                    # "# TYPE x counter" then "x_total ..." parses as an untyped family named
                    # x_total in some prometheus-client versions: key counters by the base name
                    base = (sample.name[: -len("_total")], labels)
                    snap.counters[base] = snap.counters.get(base, 0.0) + sample.value
                elif family.type in ("gauge", "untyped", "unknown"):
                    snap.counters[key] = sample.value
        for key, per_bound in buckets.items():
            bounds = np.array(sorted(per_bound))
            cum = np.maximum.accumulate(np.array([per_bound[b] for b in bounds]))
            snap.histograms[key] = Histogram(bounds, cum, sums.get(key, 0.0), counts.get(key, float(cum[-1])))
        return snap


def _match(labels: Labels, where: dict[str, str] | None) -> bool:
    if not where:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in where.items())


def _group(labels: Labels, by: str | None) -> str:
    return "all" if by is None else dict(labels).get(by, "")


def histogram_quantile(q: float, bounds: np.ndarray, counts: np.ndarray) -> float:
    """Prometheus's estimate: linear within the bucket holding rank q (cumulative counts);
    NaN without observations; the largest finite bound when the rank is in the +inf bucket."""
    if counts.size == 0 or counts[-1] <= 0:
        return math.nan
    rank = q * counts[-1]
    i = int(np.searchsorted(counts, rank, side="left"))
    i = min(i, counts.size - 1)
    if math.isinf(bounds[i]):
        finite = bounds[np.isfinite(bounds)]
        return float(finite[-1]) if finite.size else math.nan
    lo = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0.0 if i == 0 else float(counts[i - 1])
    inside = float(counts[i]) - below
    if inside <= 0:
        return float(bounds[i])
    return lo + (float(bounds[i]) - lo) * (rank - below) / inside


class MetricRing:
    """The last ``history_s`` seconds of snapshots, oldest first; series derived on demand."""

    def __init__(self, history_s: float = HISTORY_S, sample_s: float = SAMPLE_S):
        if sample_s <= 0 or history_s < sample_s:
            raise ValueError(f"need 0 < sample_s <= history_s, got {sample_s} and {history_s}")
        self.sample_s = float(sample_s)
        self.history_s = float(history_s)
        self.snapshots: deque[Snapshot] = deque(maxlen=math.ceil(history_s / sample_s) + 1)

    def __len__(self) -> int:
        return len(self.snapshots)

    def add(self, snap: Snapshot) -> None:
        if self.snapshots and snap.t <= self.snapshots[-1].t:
            return  # a clock step back, or the same shared read again: keep the series monotone
        self.snapshots.append(snap)

    @property
    def latest(self) -> Snapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    def cost(self) -> dict[str, float]:
        """Mean wall and CPU seconds a snapshot took, over the ring."""
        snaps = list(self.snapshots)
        if not snaps:
            return {"snapshots": 0, "wall_ms": math.nan, "cpu_ms": math.nan, "every_s": self.sample_s}
        return {"snapshots": len(snaps), "wall_ms": 1e3 * float(np.mean([s.cost_s for s in snaps])),
                "cpu_ms": 1e3 * float(np.mean([s.cpu_s for s in snaps])), "every_s": self.sample_s}

    # --- counters ------------------------------------------------------------------------
    def _counter_totals(self, snap: Snapshot, family: str, by: str | None,
                        where: dict[str, str] | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for (name, labels), value in snap.counters.items():
            if name == family and _match(labels, where):
                g = _group(labels, by)
                out[g] = out.get(g, 0.0) + value
        return out

    def rates(self, family: str, by: str | None = None,
              where: dict[str, str] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Per-second rate of a counter between consecutive snapshots, per value of label
        ``by``: (interval end times, {group: rates}). A total that fell (a replica died and took
        its counts with it) gives NaN for that interval, not a negative or inflated rate."""
        snaps = list(self.snapshots)
        totals = [self._counter_totals(s, family, by, where) for s in snaps]
        groups = sorted({g for t in totals for g in t})
        times = np.array([s.t for s in snaps[1:]])
        out: dict[str, np.ndarray] = {}
        for g in groups:
            values = np.array([t.get(g, 0.0) for t in totals])
            dt = np.diff([s.t for s in snaps])
            step = np.diff(values)
            rate = np.where(step >= 0, step / np.maximum(dt, 1e-9), np.nan)
            out[g] = rate
        return times, out

    def increase(self, family: str, seconds: float | None = None, by: str | None = None,
                 where: dict[str, str] | None = None) -> dict[str, float]:
        """How much a counter grew over the last ``seconds`` (all history when None), summing
        only the intervals where it did not fall."""
        times, rates = self.rates(family, by, where)
        if times.size == 0:
            return {}
        snaps = list(self.snapshots)
        dt = np.diff([s.t for s in snaps])
        # intervals that lie inside the last ``seconds`` (the span :meth:`span_seconds` reports)
        keep = np.ones(times.size, dtype=bool) if seconds is None else times - dt >= times[-1] - seconds - 1e-9
        return {g: float(np.nansum(r[keep] * dt[keep])) for g, r in rates.items()}

    def span_seconds(self, seconds: float | None = None) -> float:
        """Seconds the last ``seconds`` of history actually cover (what ``increase`` summed)."""
        if len(self.snapshots) < 2:
            return 0.0
        end = self.snapshots[-1].t
        start = self.snapshots[0].t if seconds is None else max(self.snapshots[0].t, end - seconds)
        first = next(s.t for s in self.snapshots if s.t >= start)
        return end - first

    # --- histograms ----------------------------------------------------------------------
    def _hist(self, snap: Snapshot, family: str, by: str | None,
              where: dict[str, str] | None) -> dict[str, Histogram]:
        out: dict[str, Histogram] = {}
        for (name, labels), h in snap.histograms.items():
            if name != family or not _match(labels, where):
                continue
            g = _group(labels, by)
            if g in out and np.array_equal(out[g].bounds, h.bounds):
                prev = out[g]
                out[g] = Histogram(h.bounds, prev.counts + h.counts, prev.total + h.total, prev.count + h.count)
            else:
                out[g] = Histogram(h.bounds, h.counts.copy(), h.total, h.count)
        return out

    def _window_hist(self, newer: Histogram, older: Histogram | None) -> Histogram | None:
        if older is None:
            return newer
        if not np.array_equal(newer.bounds, older.bounds):
            return None
        counts = newer.counts - older.counts
        if np.any(counts < 0):  # a replica's counts left the totals: no estimate this time
            return None
        return Histogram(newer.bounds, counts, newer.total - older.total, newer.count - older.count)

    def quantiles(self, family: str, q: float, by: str | None = None, where: dict[str, str] | None = None,
                  span_s: float = QUANTILE_SPAN_S) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Quantile ``q`` (seconds) of a latency histogram at each snapshot, over the
        observations of the preceding ``span_s`` seconds: (times, {group: values}); NaN where
        the span holds no observation."""
        snaps = list(self.snapshots)
        per = [self._hist(s, family, by, where) for s in snaps]
        groups = sorted({g for h in per for g in h})
        times = np.array([s.t for s in snaps[1:]])
        out = {g: np.full(times.size, math.nan) for g in groups}
        j = 0
        for i in range(1, len(snaps)):
            while snaps[j].t < snaps[i].t - span_s - 1e-9 and j < i - 1:
                j += 1
            for g in groups:
                newer, older = per[i].get(g), per[j].get(g)
                if newer is None:
                    continue
                window = self._window_hist(newer, older)
                if window is not None:
                    out[g][i - 1] = histogram_quantile(q, window.bounds, window.counts)
        return times, out

    def _windows_over(self, family: str, seconds: float | None, by: str | None,
                      where: dict[str, str] | None) -> dict[str, Histogram]:
        """Per group, the histogram of the observations of the last ``seconds`` (all history
        when None); empty with fewer than two snapshots or a span holding only the newest."""
        snaps = list(self.snapshots)
        if len(snaps) < 2:
            return {}
        end = snaps[-1]
        start = snaps[0] if seconds is None else next(s for s in snaps if s.t >= end.t - seconds - 1e-9)
        if start is end:
            return {}
        newer, older = self._hist(end, family, by, where), self._hist(start, family, by, where)
        windows = {g: self._window_hist(h, older.get(g)) for g, h in newer.items()}
        return {g: w for g, w in windows.items() if w is not None}

    def quantile_over(self, family: str, q: float, seconds: float | None = None, by: str | None = None,
                      where: dict[str, str] | None = None) -> dict[str, float]:
        """Quantile ``q`` of the observations of the last ``seconds`` (all history when None)."""
        return {g: histogram_quantile(q, w.bounds, w.counts)
                for g, w in self._windows_over(family, seconds, by, where).items()}

    def mean_over(self, family: str, seconds: float | None = None, by: str | None = None,
                  where: dict[str, str] | None = None) -> dict[str, tuple[float, float]]:
        """(mean of the observations, their count) over the last ``seconds``, per group."""
        return {g: (w.total / w.count, w.count)
                for g, w in self._windows_over(family, seconds, by, where).items() if w.count > 0}


def families_of(snapshots: Iterable[Snapshot]) -> set[str]:
    """Family names present in any of the snapshots."""
    names: set[str] = set()
    for s in snapshots:
        names.update(n for n, _ in s.counters)
        names.update(n for n, _ in s.histograms)
    return names
