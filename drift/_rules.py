"""Decision rules: turn statistics (p-values, effects with error bounds) into verdicts.

Why separate objects (the NannyML / Alibi Detect split): the statistic, the rule that judges it
and the windows it is judged on are independent choices. A detector is a statistic + these
rules + a window; each rule here is a small object a caller can swap
(``Monitor.drift(rules=...)``) and test alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

#: Benjamini-Hochberg false discovery rate across the columns of one window.
DEFAULT_ALPHA = 0.05
#: Robust Wasserstein effect (W1 of both samples winsorised to the reference's far-out fences,
#: over its IQR / 1.349; see drift._column_tests) at or above which a numeric column drifted.
DEFAULT_NUMERIC_EFFECT = 0.1
#: Jensen-Shannon distance (base 2, bias-corrected) at or above which a categorical column
#: drifted.
DEFAULT_CATEGORICAL_EFFECT = 0.1
#: Fewest rows on each side before a column may be flagged.
DEFAULT_MIN_SAMPLES = 200
#: A column drifts when the gates hold in 2 of the last 3 disjoint windows.
DEFAULT_PERSISTENCE = (2, 3)


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """BH-adjusted p-values; None (and NaN) stay None."""
    idx = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(p_values)
    if idx:
        adj = stats.false_discovery_control(np.array([p_values[i] for i in idx]), method="bh")
        for i, a in zip(idx, adj, strict=True):
            out[i] = float(a)
    return out


def bonferroni_level(confidence: float, tests: float, simultaneous: bool = True) -> float:
    """Per-test miscoverage giving simultaneous `confidence` over `tests` intervals."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return (1.0 - confidence) / max(float(tests), 1.0) if simultaneous else 1.0 - confidence


@dataclass(frozen=True)
class EffectGate:
    """Significant (adjusted p < alpha), large (effect minus its error >= threshold) and backed
    by enough rows on both sides. A column whose error bound alone reaches the threshold can
    never pass: it is reported `undetectable` instead of silently never firing."""

    alpha: float = DEFAULT_ALPHA
    numeric_effect: float = DEFAULT_NUMERIC_EFFECT
    categorical_effect: float = DEFAULT_CATEGORICAL_EFFECT
    min_samples: int = DEFAULT_MIN_SAMPLES

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        for name in ("numeric_effect", "categorical_effect"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"{name} must be > 0, got {v!r}")
        m = self.min_samples
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"min_samples must be a positive integer, got {m!r}")

    def threshold(self, kind: str) -> float:
        return self.numeric_effect if kind == "numeric" else self.categorical_effect

    def undetectable(self, row: dict[str, Any], kind: str) -> bool:
        err = row.get("effect_error")
        return err is not None and math.isfinite(err) and err >= self.threshold(kind)

    def passes(self, row: dict[str, Any], kind: str) -> bool:
        p, effect = row.get("p_adjusted"), row.get("effect")
        if p is None or effect is None:
            return False
        lower = effect - (row.get("effect_error") or 0.0)
        enough = (row.get("n_current") or 0) >= self.min_samples and (
            row.get("n_reference") or 0) >= self.min_samples
        return bool(p < self.alpha and lower >= self.threshold(kind) and enough)


@dataclass(frozen=True)
class Persistence:
    """k of the last n windows, the windows DISJOINT (ending at the newest pane, one window
    earlier, two windows earlier). Overlapping windows (sharing 9 of 10 panes) are not n
    looks at the data but about one, so "2 of 3" on them filtered nothing."""

    k: int = DEFAULT_PERSISTENCE[0]
    n: int = DEFAULT_PERSISTENCE[1]

    def __post_init__(self) -> None:
        if not (isinstance(self.k, int) and isinstance(self.n, int) and 1 <= self.k <= self.n):
            raise ValueError(f"persistence must be (k, n) with 1 <= k <= n, got "
                             f"({self.k!r}, {self.n!r})")

    @classmethod
    def of(cls, value: Persistence | Sequence[int]) -> Persistence:
        if isinstance(value, Persistence):
            return value
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"persistence must be (k, n) with 1 <= k <= n, got {value!r}")
        try:
            return cls(int(value[0]), int(value[1]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"persistence must be (k, n) with 1 <= k <= n, got {value!r}") \
                from exc

    def window_ends(self, newest: int, window_panes: int) -> list[int]:
        """End panes of the windows judged, newest first."""
        return [newest - i * window_panes for i in range(self.n)]

    def decide(self, hits: Sequence[bool]) -> bool:
        return sum(bool(h) for h in hits) >= self.k
