"""Page-Hinkley change detection on per-pane scalar series, saying when a change began.

Why Page-Hinkley on a standardized series: the series (p99 latency per pane, error rate,
fraction reaching the expensive level) have arbitrary units, so each is scaled by a robust
baseline (median and MAD of its first `burn_in` points) and the test's slack and threshold are
in robust standard deviations. Values are clipped so one wild pane cannot trigger alone. The
start of a change is the last point where the cumulative sum was at its extreme (the classic
CUSUM estimate); after a detection the detector re-learns its baseline from the points after the
estimated start, so a lasting shift is reported once.

Autocorrelated series: per-pane series are rarely independent (load, queues, AR-like noise). A
cumulative sum of AR(1) noise with coefficient phi has (1 + phi) / (1 - phi) times the variance
of independent noise (9x at phi = 0.8), which made the detector fire several times a day on no
change. The series is therefore standardized by its long-run scale, sigma_e / (1 - phi): phi is
the lag-1 autocorrelation of the burn-in with Kendall's small-sample bias correction
(phi + (1 + 3 phi) / n; clipped to [0, `MAX_PHI`]) and sigma_e the robust scale of the AR(1)
residuals, which 30 autocorrelated points estimate far better than the marginal spread. The
price is physical: a level shift of k marginal sds moves the pre-whitened series by only
k sqrt((1 - phi) / (1 + phi)) long-run sds per pane, so such shifts take longer to detect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Slack per point, in robust standard deviations (changes smaller than this are ignored).
DEFAULT_DELTA = 1.0
#: Alarm when the cumulative deviation exceeds this many robust standard deviations.
DEFAULT_THRESHOLD = 10.0
#: Points used to learn the baseline (and re-learn it after a change).
DEFAULT_BURN_IN = 30
#: Standardized values are clipped to +-clip before accumulating.
DEFAULT_CLIP = 4.0
#: Largest lag-1 autocorrelation used for the long-run variance factor.
MAX_PHI = 0.9
#: Relative floor on the baseline scale, so a constant series still has a usable scale.
SCALE_FLOOR = 1e-3


@dataclass(frozen=True)
class Change:
    """A detected change: indices into the series (start = first changed point)."""

    start: int
    detected: int
    direction: str  # "up" or "down"
    before: float
    after: float


class PageHinkley:
    """Two-sided Page-Hinkley test on a robustly standardized series."""

    def __init__(
        self,
        delta: float = DEFAULT_DELTA,
        threshold: float = DEFAULT_THRESHOLD,
        burn_in: int = DEFAULT_BURN_IN,
        clip: float = DEFAULT_CLIP,
        long_run: bool = True,
    ) -> None:
        if not delta >= 0:
            raise ValueError(f"delta must be >= 0, got {delta!r}")
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        if int(burn_in) < 3:
            raise ValueError(f"burn_in must be >= 3, got {burn_in!r}")
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip!r}")
        self.delta = float(delta)
        self.threshold = float(threshold)
        self.burn_in = int(burn_in)
        self.clip = float(clip)
        self.long_run = bool(long_run)

    def run(self, series: np.ndarray) -> list[Change]:
        """All changes in `series` (NaN points are skipped)."""
        x = np.asarray(series, dtype=np.float64)
        idx = np.flatnonzero(np.isfinite(x))
        vals = x[idx]
        changes: list[Change] = []
        pos = 0
        while pos + self.burn_in < vals.size:
            base = vals[pos : pos + self.burn_in]
            center = float(np.median(base))
            scale = 1.4826 * float(np.median(np.abs(base - center)))
            if scale == 0.0:
                scale = float(np.std(base))
            scale = max(scale, SCALE_FLOOR * max(abs(center), 1e-12))
            if self.long_run:
                scale = long_run_scale(base, center, scale)
            found = self._scan(vals, pos + self.burn_in, center, scale)
            if found is None:
                break
            start, detected, direction = found
            after_vals = vals[start : detected + 1]
            changes.append(
                Change(
                    start=int(idx[start]),
                    detected=int(idx[detected]),
                    direction=direction,
                    before=center,
                    after=float(np.median(after_vals)) if after_vals.size else math.nan,
                )
            )
            pos = start
        return changes

    def _scan(
        self, vals: np.ndarray, begin: int, center: float, scale: float
    ) -> tuple[int, int, str] | None:
        z = np.clip((vals[begin:] - center) / scale, -self.clip, self.clip)
        up = np.cumsum(z - self.delta)
        down = np.cumsum(-z - self.delta)
        up0 = np.concatenate(([0.0], up))
        down0 = np.concatenate(([0.0], down))
        up_gap = up0[1:] - np.minimum.accumulate(up0)[:-1]
        down_gap = down0[1:] - np.minimum.accumulate(down0)[:-1]
        hits_up = np.flatnonzero(up_gap > self.threshold)
        hits_down = np.flatnonzero(down_gap > self.threshold)
        first_up = int(hits_up[0]) if hits_up.size else None
        first_down = int(hits_down[0]) if hits_down.size else None
        if first_up is None and first_down is None:
            return None
        if first_down is None or (first_up is not None and first_up <= first_down):
            det, cum, direction = first_up, up0, "up"
        else:
            det, cum, direction = first_down, down0, "down"
        assert det is not None
        # start: one after the last minimum of the cumulative sum before detection
        start = int(np.flatnonzero(cum[: det + 1] == cum[: det + 1].min())[-1])
        return begin + start, begin + det, direction


def long_run_scale(base: np.ndarray, center: float, scale: float) -> float:
    """sigma_e / (1 - phi) of the burn-in (never below the marginal `scale`): the scale at
    which a cumulative sum of the standardized series grows like one of independent noise."""
    x = np.asarray(base, dtype=np.float64) - center
    n = x.size
    xm = x - x.mean()
    den = float(np.dot(xm, xm))
    if n < 3 or den <= 0:
        return scale
    phi = float(np.dot(xm[1:], xm[:-1])) / den
    phi = min(max(phi + (1.0 + 3.0 * phi) / n, 0.0), MAX_PHI)
    resid = x[1:] - phi * x[:-1]
    sigma_e = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    if sigma_e == 0.0:
        sigma_e = float(np.std(resid))
    return max(sigma_e / (1.0 - phi), scale)
