"""Relative-error quantile sketch (DDSketch-style) with exact moments.

Why this sketch: its bucket boundaries depend only on the accuracy parameter, so sketches built
in different panes (or processes) merge by adding counts, deterministically. The empirical CDF is
exact at every bucket edge, which makes KS and Wasserstein distances between two sketches
computable together with explicit error bounds (see `ks_bounds` and `wasserstein`).

Centring: values are bucketed by their distance to a fixed `offset` (the column's centre, set
once per monitor from the first data), so the relative error applies to x - offset. Without it a
column whose mean is large next to its spread (N(1000, 5)) falls into two or three 1% buckets and
no shift of a few sigmas can be resolved.

Error bound (stated): for any q, `quantile(q)` is within `relative_accuracy * |x - offset|` of
the exact inverted-CDF quantile x of the data, for |x - offset| above `min_value` (absolute
error <= min_value below it) and up to `max_magnitude`.

Overflow rule: the key range is bounded. Each sign holds `max_bins` buckets, magnitudes from
`min_value` to `max_magnitude = min_value * gamma ** max_bins` (about 3.7e26 at the defaults);
a value farther from the centre (1e300, +-inf) is counted in one `overflow` (above) or
`underflow` (below) bucket. Those buckets keep counts (ranks, the CDF and KS stay exact at
their edges) but not positions: a quantile falling in one reads as the exact max (min). So one
extreme value never collapses the other buckets (before, one 1e300 folded about half of them
and p99 read 2.7e264), memory stays bounded, and merging adds the overflow counts. Infinite
values are accepted into these buckets (NaN is rejected); the moments (mean, variance,
mean_abs) are those of the finite values, min and max those of all values. `collapsed` stays
for states written before the bounded range (it counts values an old sketch folded).
"""

from __future__ import annotations

import math

import numpy as np

_FLOAT_MAX = float(np.finfo(np.float64).max)

#: Default relative accuracy of quantile values (1%).
DEFAULT_RELATIVE_ACCURACY = 0.01
#: Magnitudes at or below this go to the zero bucket.
DEFAULT_MIN_VALUE = 1e-9
#: Buckets per sign; 4096 buckets at 1% span about 35 orders of magnitude (min_value 1e-9 to
#: max_magnitude 3.7e26); farther values go to the overflow / underflow bucket.
DEFAULT_MAX_BINS = 4096


class _Store:
    """Dense counts over a contiguous range of integer bucket keys."""

    __slots__ = ("counts", "offset")

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.offset = 0

    def copy(self) -> _Store:
        out = _Store()
        out.counts = self.counts.copy()
        out.offset = self.offset
        return out

    @property
    def empty(self) -> bool:
        return self.counts.size == 0

    def add(self, offset: int, counts: np.ndarray) -> None:
        """Add `counts` whose first element is bucket key `offset`."""
        if counts.size == 0:
            return
        if self.counts.size == 0:
            self.counts = counts.astype(np.int64, copy=True)
            self.offset = int(offset)
            return
        lo = min(self.offset, offset)
        hi = max(self.offset + self.counts.size, offset + counts.size)
        if lo != self.offset or hi != self.offset + self.counts.size:
            grown = np.zeros(hi - lo, dtype=np.int64)
            grown[self.offset - lo : self.offset - lo + self.counts.size] = self.counts
            self.counts = grown
            self.offset = lo
        self.counts[offset - lo : offset - lo + counts.size] += counts

    def trim(self) -> None:
        """Drop leading and trailing empty buckets."""
        nz = np.flatnonzero(self.counts)
        if nz.size == 0:
            self.counts = np.zeros(0, dtype=np.int64)
            self.offset = 0
            return
        first, last = int(nz[0]), int(nz[-1])
        if first or last != self.counts.size - 1:
            self.counts = self.counts[first : last + 1].copy()
            self.offset += first

    def collapse_lowest(self, max_bins: int) -> int:
        """Fold the lowest buckets into one so at most `max_bins` remain; returns values moved."""
        self.trim()
        excess = self.counts.size - max_bins
        if excess <= 0:
            return 0
        moved = int(self.counts[:excess].sum())
        self.counts[excess] += moved
        self.counts = self.counts[excess:].copy()
        self.offset += excess
        return moved


class QuantileSketch:
    """Mergeable relative-error quantile sketch of one numeric column, plus exact moments.

    Exact: count, mean, variance (Chan et al. merge), min, max, mean absolute value.
    Approximate: quantiles (relative error `relative_accuracy`), CDF (exact at bucket edges).
    """

    __slots__ = (
        "_floor",
        "_gamma",
        "_inv_log_gamma",
        "_kmax",
        "_log_gamma",
        "_neg",
        "_pos",
        "collapsed",
        "count",
        "infinite",
        "m2",
        "max",
        "max_bins",
        "max_magnitude",
        "mean",
        "min",
        "min_value",
        "offset",
        "overflow",
        "relative_accuracy",
        "sum_abs",
        "underflow",
        "zero_count",
    )

    def __init__(
        self,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        min_value: float = DEFAULT_MIN_VALUE,
        max_bins: int = DEFAULT_MAX_BINS,
        offset: float = 0.0,
    ) -> None:
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
        if not min_value > 0.0:
            raise ValueError(f"min_value must be > 0, got {min_value!r}")
        if int(max_bins) < 16:
            raise ValueError(f"max_bins must be >= 16, got {max_bins!r}")
        self.relative_accuracy = float(relative_accuracy)
        self.min_value = float(min_value)
        self.max_bins = int(max_bins)
        if not math.isfinite(offset):
            raise ValueError(f"offset must be finite, got {offset!r}")
        self.offset = float(offset)
        self._gamma = (1.0 + self.relative_accuracy) / (1.0 - self.relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self._inv_log_gamma = 1.0 / self._log_gamma
        self._floor = math.floor(math.log(self.min_value) * self._inv_log_gamma)
        # bounded key range: magnitude keys _floor + 1 .. _kmax (max_bins keys per sign)
        self._kmax = self._floor + self.max_bins
        top = self._kmax * self._log_gamma
        self.max_magnitude = math.exp(top) if top < 709.0 else _FLOAT_MAX
        self._pos = _Store()
        self._neg = _Store()
        self.zero_count = 0
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.sum_abs = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.collapsed = 0
        self.overflow = 0
        self.underflow = 0
        self.infinite = 0

    # ------------------------------------------------------------------ building
    def compatible(self, other: QuantileSketch) -> bool:
        return (
            self.relative_accuracy == other.relative_accuracy
            and self.min_value == other.min_value
            and self.offset == other.offset
        )

    def copy(self) -> QuantileSketch:
        out = QuantileSketch.__new__(QuantileSketch)
        for name in QuantileSketch.__slots__:
            setattr(out, name, getattr(self, name))
        out._pos = self._pos.copy()
        out._neg = self._neg.copy()
        return out

    def _keys(self, magnitudes: np.ndarray) -> np.ndarray:
        return np.ceil(np.log(magnitudes) * self._inv_log_gamma).astype(np.int64)

    def _add_to(self, store: _Store, magnitudes: np.ndarray, top: float) -> None:
        """Bucket magnitudes in (min_value, max_magnitude]; `top` is the largest of them."""
        keys = self._keys(magnitudes)
        lo = int(keys.min())
        floor = self._key_floor() + 1
        if lo < floor:  # float rounding just above min_value; keep out of the zero bucket
            np.maximum(keys, floor, out=keys)
            lo = floor
        if math.ceil(math.log(top) * self._inv_log_gamma) > self._kmax:
            np.minimum(keys, self._kmax, out=keys)  # float rounding at max_magnitude
        store.add(lo, np.bincount(keys - lo))
        if store.counts.size > self.max_bins:  # cannot happen within the bounded range
            self.collapsed += store.collapse_lowest(self.max_bins)

    def update(self, values: np.ndarray) -> None:
        """Add float values; values farther than `max_magnitude` from the centre (1e300, +-inf)
        are counted in the overflow / underflow bucket. NaN is rejected (callers count missing
        values; see `drift._ingest`)."""
        x = np.asarray(values, dtype=np.float64)
        n = x.size
        if n == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError("QuantileSketch.update got NaN (only finite values or +-inf)")
        lim = self.max_magnitude
        if lo - self.offset < -lim or hi - self.offset > lim:
            c = x - self.offset
            over = c > lim
            under = c < -lim
            self.overflow += int(np.count_nonzero(over))
            self.underflow += int(np.count_nonzero(under))
            inner = x[~(over | under)]
            if inner.size:
                self._bucket(inner, float(inner.min()), float(inner.max()))
            finite = np.isfinite(x)
            n_inf = int(n - np.count_nonzero(finite))
            xf = x if n_inf == 0 else x[finite]
            with np.errstate(over="ignore", invalid="ignore"):
                abs_sum = float(np.abs(xf - self.offset).sum()) if xf.size else 0.0
        else:
            abs_sum = self._bucket(x, lo, hi)
            n_inf, xf = 0, x
        # moments of the finite values (min and max of all values)
        if xf.size:
            with np.errstate(over="ignore", invalid="ignore"):
                batch_mean = float(xf.mean())
                d = xf - batch_mean
                batch_m2 = float(np.dot(d, d))
        else:
            batch_mean = batch_m2 = 0.0
        self._merge_moments(n, n_inf, batch_mean, batch_m2, abs_sum, lo, hi)

    def _bucket(self, x: np.ndarray, lo: float, hi: float) -> float:
        """Bucket values whose distance to the centre is at most max_magnitude; returns the
        sum of those distances."""
        c = x - self.offset if self.offset else x
        if lo - self.offset > self.min_value:  # fast path: all above the centre
            self._add_to(self._pos, c, hi - self.offset)
            return float(c.sum())
        # one log over |x - centre| and one bincount over signed buckets:
        # [zero | positive keys lo..hi | negative keys lo..hi]
        a = np.abs(c)
        abs_sum = float(a.sum())
        floor = self._key_floor() + 1
        zeros = float(a.min()) <= self.min_value
        logs = np.log(np.maximum(a, self.min_value) if zeros else a)
        logs *= self._inv_log_gamma
        np.ceil(logs, out=logs)
        idx = logs.astype(np.int64)
        k_lo = int(idx.min())
        if k_lo < floor:
            np.maximum(idx, floor, out=idx)
            k_lo = floor
        k_hi = int(idx.max())
        if k_hi > self._kmax:  # float rounding at max_magnitude
            np.minimum(idx, self._kmax, out=idx)
            k_hi = self._kmax
        width = k_hi - k_lo + 1
        idx -= k_lo - 1
        idx += width * (c < 0)
        if zeros:
            idx[a <= self.min_value] = 0
        counts = np.bincount(idx, minlength=2 * width + 1)
        self.zero_count += int(counts[0])
        for store, part in ((self._pos, counts[1:width + 1]),
                            (self._neg, counts[width + 1:])):
            nz = np.flatnonzero(part)
            if nz.size:
                store.add(k_lo + int(nz[0]), part[nz[0]:nz[-1] + 1])
                if store.counts.size > self.max_bins:  # cannot happen within the range
                    self.collapsed += store.collapse_lowest(self.max_bins)
        return abs_sum

    def _merge_moments(
        self, n: int, n_inf: int, mean: float, m2: float, abs_sum: float, lo: float, hi: float
    ) -> None:
        """Add n values (n_inf of them infinite; mean, m2 and abs_sum of the finite ones)."""
        have = self.count - self.infinite
        add = n - n_inf
        total = have + add
        if add:
            with np.errstate(over="ignore", invalid="ignore"):
                delta = mean - self.mean
                self.mean += delta * add / total
                self.m2 += m2 + delta * delta * have * add / total if have else m2
        self.count += n
        self.infinite += n_inf
        self.sum_abs += abs_sum
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)

    def _fold(self) -> None:
        """Move bucket keys above the bounded range (states from older sketches, or merged
        from a sketch with more bins) into the overflow / underflow counts."""
        for store, sign in ((self._pos, 1), (self._neg, -1)):
            if store.empty:
                continue
            top = store.offset + store.counts.size - 1
            if top <= self._kmax:
                continue
            keep = max(self._kmax - store.offset + 1, 0)
            moved = int(store.counts[keep:].sum())
            store.counts = store.counts[:keep].copy()
            store.trim()
            if sign > 0:
                self.overflow += moved
            else:
                self.underflow += moved

    def merge(self, other: QuantileSketch) -> None:
        """Add another sketch's contents (same accuracy parameters)."""
        if not self.compatible(other):
            raise ValueError("cannot merge sketches with different accuracy parameters")
        if other.count == 0:
            return
        self._pos.add(other._pos.offset, other._pos.counts)
        self._neg.add(other._neg.offset, other._neg.counts)
        self.overflow += other.overflow
        self.underflow += other.underflow
        if other.max_bins > self.max_bins:
            self._fold()
        for store in (self._pos, self._neg):
            if store.counts.size > self.max_bins:
                self.collapsed += store.collapse_lowest(self.max_bins)
        self.zero_count += other.zero_count
        self.collapsed += other.collapsed
        self._merge_moments(
            other.count, other.infinite, other.mean, other.m2, other.sum_abs, other.min,
            other.max,
        )

    # ------------------------------------------------------------------ exact moments
    @property
    def finite_count(self) -> int:
        """Values the moments describe (all but +-inf)."""
        return self.count - self.infinite

    @property
    def variance(self) -> float:
        """Sample variance (ddof=1) of the finite values; NaN below two of them."""
        n = self.finite_count
        return self.m2 / (n - 1) if n > 1 else math.nan

    @property
    def std(self) -> float:
        return math.sqrt(self.variance) if self.finite_count > 1 else math.nan

    @property
    def mean_abs(self) -> float:
        """Mean of |x - offset| over the finite values."""
        n = self.finite_count
        return self.sum_abs / n if n else math.nan

    # ------------------------------------------------------------------ grid views
    def _key_floor(self) -> int:
        """Largest key no magnitude above min_value can have."""
        return self._floor

    def grid(self) -> tuple[int, np.ndarray]:
        """Counts on a signed, value-ordered bucket line: (first index, counts).

        Index 0 is the zero bucket; index i > 0 is positive key `i + key_floor`; index -i is the
        negative bucket of magnitude key `i + key_floor`; `max_bins + 1` is the overflow bucket
        and `-(max_bins + 1)` the underflow bucket.
        """
        base = self._key_floor()
        parts: list[tuple[int, np.ndarray]] = []
        edge = self.max_bins + 1
        if self.underflow:
            parts.append((-edge, np.array([self.underflow], dtype=np.int64)))
        if self.overflow:
            parts.append((edge, np.array([self.overflow], dtype=np.int64)))
        if not self._neg.empty:
            # magnitude keys k..k+m-1 map to signed indices -(k-base) .. -(k+m-1-base), reversed
            k = self._neg.offset
            m = self._neg.counts.size
            parts.append((-(k + m - 1 - base), self._neg.counts[::-1]))
        if self.zero_count:
            parts.append((0, np.array([self.zero_count], dtype=np.int64)))
        if not self._pos.empty:
            parts.append((self._pos.offset - base, self._pos.counts))
        if not parts:
            return 0, np.zeros(0, dtype=np.int64)
        lo = min(p[0] for p in parts)
        hi = max(p[0] + p[1].size for p in parts)
        out = np.zeros(hi - lo, dtype=np.int64)
        for start, counts in parts:
            out[start - lo : start - lo + counts.size] += counts
        return lo, out

    def _edges(self, indices: np.ndarray) -> np.ndarray:
        """Upper edge (largest value) of each signed bucket index (+inf for the overflow
        bucket; -inf below the underflow bucket)."""
        base = self._key_floor()
        edge = self.max_bins + 1
        out = np.empty(indices.size, dtype=np.float64)
        pos = (indices > 0) & (indices < edge)
        neg = (indices < 0) & (indices > -edge)
        out[pos] = np.exp((indices[pos] + base) * self._log_gamma)
        out[neg] = -np.exp((-indices[neg] + base - 1) * self._log_gamma)
        out[indices == -edge] = -self.max_magnitude
        out[indices >= edge] = math.inf
        out[indices < -edge] = -math.inf
        out[indices == 0] = self.min_value
        return out + self.offset

    def _representatives(self, indices: np.ndarray) -> np.ndarray:
        """Value reported for each signed bucket index (within relative_accuracy of members;
        the exact max for the overflow bucket, the exact min for the underflow bucket)."""
        base = self._key_floor()
        edge = self.max_bins + 1
        out = np.zeros(indices.size, dtype=np.float64)
        scale = 2.0 / (self._gamma + 1.0)
        pos = (indices > 0) & (indices < edge)
        neg = (indices < 0) & (indices > -edge)
        out[pos] = scale * np.exp((indices[pos] + base) * self._log_gamma)
        out[neg] = -scale * np.exp((-indices[neg] + base) * self._log_gamma)
        out += self.offset
        if self.count:
            out[indices >= edge] = self.max
            out[indices <= -edge] = self.min
            np.clip(out, self.min, self.max, out=out)
        return out

    # ------------------------------------------------------------------ queries
    def quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """Inverted-CDF quantile(s): the value of the ceil(q*n)-th smallest element, approx."""
        qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
        if np.any((qs < 0) | (qs > 1)) or np.any(np.isnan(qs)):
            raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
        if self.count == 0:
            out = np.full(qs.shape, np.nan)
        else:
            lo, counts = self.grid()
            cum = np.cumsum(counts)
            ranks = np.maximum(np.ceil(qs * self.count), 1)
            pos = np.searchsorted(cum, ranks, side="left")
            out = self._representatives(pos + lo)
            out[qs == 0] = self.min
            out[qs == 1] = self.max
        return float(out[0]) if np.ndim(q) == 0 else out

    def cdf(self, x: float | np.ndarray) -> float | np.ndarray:
        """Fraction of values <= x, evaluated at the upper edge of x's bucket (approx)."""
        xs = np.atleast_1d(np.asarray(x, dtype=np.float64))
        if self.count == 0:
            out = np.full(xs.shape, np.nan)
        else:
            lo, counts = self.grid()
            cum = np.cumsum(counts) / self.count
            edges = self._edges(np.arange(lo, lo + counts.size))
            pos = np.searchsorted(edges, xs, side="left")
            out = np.where(pos >= counts.size, 1.0, cum[np.minimum(pos, counts.size - 1)])
            out = np.where(xs < self.min, 0.0, out)
            out = np.where(xs >= self.max, 1.0, out)
        return float(out[0]) if np.ndim(x) == 0 else out

    def mad(self) -> float:
        """Median absolute deviation from the median (each value at its bucket's
        representative, so within about relative_accuracy of the exact MAD's terms)."""
        if self.count == 0:
            return math.nan
        lo, counts = self.grid()
        nz = np.flatnonzero(counts)
        reps = self._representatives(nz + lo)
        med = float(self.quantile(0.5))
        with np.errstate(invalid="ignore"):
            dev = np.abs(reps - med)
        order = np.argsort(dev, kind="stable")
        cum = np.cumsum(counts[nz][order])
        rank = max(math.ceil(0.5 * self.count), 1)
        return float(dev[order][int(np.searchsorted(cum, rank, side="left"))])

    def in_range(self, value: float) -> bool:
        """Whether `value` lies inside the bounded key range (not in overflow / underflow)."""
        return abs(value - self.offset) <= self.max_magnitude

    def quantile_error(self, value: float) -> float:
        """Stated absolute error bound of a quantile estimate near `value` (inf beyond the
        bounded range: an overflow quantile reads as the max)."""
        dist = abs(value - self.offset)
        if dist > self.max_magnitude:
            return math.inf
        return max(dist * self.relative_accuracy, self.min_value)

    def nbytes(self) -> int:
        return int(self._pos.counts.nbytes + self._neg.counts.nbytes) + 160

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict:
        """Plain arrays and scalars; `from_state` rebuilds the identical sketch."""
        self._pos.trim()
        self._neg.trim()
        return {
            "params": np.array(
                [self.relative_accuracy, self.min_value, self.max_bins, self.offset],
                dtype=np.float64,
            ),
            "moments": np.array(
                [self.count, self.mean, self.m2, self.sum_abs, self.min, self.max,
                 self.zero_count, self.collapsed, self._pos.offset, self._neg.offset,
                 self.overflow, self.underflow, self.infinite],
                dtype=np.float64,
            ),
            "pos": self._pos.counts,
            "neg": self._neg.counts,
        }

    @classmethod
    def from_state(cls, state: dict) -> QuantileSketch:
        params = state["params"].tolist()
        acc, min_value, max_bins = params[:3]
        out = cls(acc, min_value, int(max_bins), params[3] if len(params) > 3 else 0.0)
        moments = state["moments"].tolist()
        (count, mean, m2, sum_abs, lo, hi, zero, collapsed, pos_off, neg_off) = moments[:10]
        # states written before the bounded range carry no overflow counts
        over, under, infinite = moments[10:13] if len(moments) >= 13 else (0, 0, 0)
        out.count = int(count)
        out.mean, out.m2, out.sum_abs, out.min, out.max = mean, m2, sum_abs, lo, hi
        out.zero_count, out.collapsed = int(zero), int(collapsed)
        out._pos.counts = np.asarray(state["pos"], dtype=np.int64).copy()
        out._pos.offset = int(pos_off)
        out._neg.counts = np.asarray(state["neg"], dtype=np.int64).copy()
        out._neg.offset = int(neg_off)
        out.overflow, out.underflow, out.infinite = int(over), int(under), int(infinite)
        out._fold()
        return out


def _aligned(a: QuantileSketch, b: QuantileSketch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both sketches' counts on one signed bucket grid, with the grid's indices."""
    if not a.compatible(b):
        raise ValueError("sketches have different accuracy parameters")
    lo_a, ca = a.grid()
    lo_b, cb = b.grid()
    lo = min(lo_a, lo_b)
    hi = max(lo_a + ca.size, lo_b + cb.size)
    fa = np.zeros(hi - lo, dtype=np.float64)
    fb = np.zeros(hi - lo, dtype=np.float64)
    fa[lo_a - lo : lo_a - lo + ca.size] = ca
    fb[lo_b - lo : lo_b - lo + cb.size] = cb
    return np.arange(lo, hi), fa, fb


def ks_bounds(a: QuantileSketch, b: QuantileSketch) -> tuple[float, float]:
    """Bounds (low, high) on the two-sample KS statistic of the raw data behind two sketches.

    Both CDFs are exact at bucket edges, so the largest gap there is a lower bound; inside a
    bucket each CDF moves by at most that bucket's mass, which gives the upper bound.
    """
    if a.count == 0 or b.count == 0:
        return math.nan, math.nan
    _, fa, fb = _aligned(a, b)
    ca = np.cumsum(fa) / a.count
    cb = np.cumsum(fb) / b.count
    low = float(np.max(np.abs(ca - cb)))
    prev_a = np.concatenate(([0.0], ca[:-1]))
    prev_b = np.concatenate(([0.0], cb[:-1]))
    high = float(max(np.max(np.abs(ca - prev_b)), np.max(np.abs(prev_a - cb)), low))
    return low, high


def wasserstein(
    a: QuantileSketch, b: QuantileSketch, lo: float | None = None, hi: float | None = None
) -> tuple[float, float]:
    """(W1 estimate, error bound) between the raw data behind two sketches.

    W1 is the integral of |F_a - F_b|. Both CDFs are exact at bucket edges; inside a bucket
    each moves by at most its bucket's mass, so |F_a - F_b| there lies between
    max(0, A_prev - B, B_prev - A) and max(|A - B_prev|, |A_prev - B|) (A, B: the CDFs at the
    bucket's upper edge, *_prev at its lower edge). Integrating both over the bucket widths
    (clipped to the data's range) brackets the exact W1; the error bound is the distance from
    the estimate to the farther end of that bracket. Unlike a bound proportional to E|x|, it
    does not grow with the column's mean (with centred sketches it shrinks with the spread).

    With `lo` / `hi`, the integral runs over [lo, hi] only: the W1 of both samples winsorised
    (clipped) to [lo, hi], which one extreme value moves by at most (hi - lo) / n. The overflow
    and underflow buckets then need no positions (their values clip to the limits); without
    limits, a value at +-inf makes W1 infinite.
    """
    if a.count == 0 or b.count == 0:
        return math.nan, math.nan
    idx, fa, fb = _aligned(a, b)
    ca = np.cumsum(fa) / a.count
    cb = np.cumsum(fb) / b.count
    upper = a._edges(idx)
    lower = a._edges(idx - 1)
    lower[idx == 0] = a.offset - a.min_value
    lo_x, hi_x = min(a.min, b.min), max(a.max, b.max)
    if lo is not None:
        lo_x = max(lo_x, float(lo))
    if hi is not None:
        hi_x = min(hi_x, float(hi))
    if not lo_x < hi_x:
        return 0.0, 0.0
    upper = np.clip(upper, lo_x, hi_x)
    lower = np.clip(lower, lo_x, hi_x)
    with np.errstate(invalid="ignore", over="ignore"):
        width = np.where(upper > lower, upper - lower, 0.0)
        pa = np.concatenate(([0.0], ca[:-1]))
        pb = np.concatenate(([0.0], cb[:-1]))
        gap_hi = np.maximum(np.abs(ca - pb), np.abs(pa - cb))
        gap_lo = np.maximum(0.0, np.maximum(pa - cb, pb - ca))
        w_low = float(np.sum(np.where(gap_lo > 0, gap_lo * width, 0.0)))
        w_high = float(np.sum(np.where(gap_hi > 0, gap_hi * width, 0.0)))
        # estimate: each value at its bucket's representative (within the bracket by
        # construction); the overflow (underflow) bucket's values at the larger max (min)
        keep = (fa > 0) | (fb > 0)
        kept = idx[keep]
        values = a._representatives(kept)
        edge = a.max_bins + 1
        values[kept >= edge] = max(a.max, b.max)
        values[kept <= -edge] = min(a.min, b.min)
        values = np.clip(values, lo_x, hi_x)
        gap = np.abs(ca[keep] - cb[keep])[:-1]
        steps = np.diff(values)
        estimate = float(np.sum(np.where(gap > 0, gap * steps, 0.0))) if values.size > 1 else 0.0
    estimate = min(max(estimate, w_low), w_high)
    return estimate, float(max(estimate - w_low, w_high - estimate))
