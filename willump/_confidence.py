"""How often a served answer of a given confidence is right: the map a label-free accuracy
estimate needs (NannyML's CBPE calibrates its model's probabilities on labelled reference rows
before it trusts them; certification rows are ours).

A cascade's answers mix levels whose probabilities are calibrated differently (a cheap linear
model under-confident where the full model is not, as on the toxic workload: the raw mean
confidence read 92.2% where served accuracy was 94.8%), so the map is fit on the certified
plan's own served answers, by isotonic regression (monotone, no shape assumed), and kept as a
small table of points to interpolate between.
"""

from __future__ import annotations

import numpy as np

#: points kept of the isotonic fit (evenly spaced in confidence order beyond it)
MAX_POINTS = 200


def calibration_map(confidence: np.ndarray, correct: np.ndarray) -> dict[str, list[float]] | None:
    """``{"x": confidences, "y": accuracies, "rows": n}``, increasing in x, from served answers'
    confidences and whether each was right (``rows``: how many, the map's own sampling error
    an estimate read through it carries); None with fewer than two distinct confidences."""
    from sklearn.isotonic import IsotonicRegression

    confidence = np.asarray(confidence, dtype=float)
    correct = np.asarray(correct, dtype=float)
    if len(np.unique(confidence)) < 2:
        return None
    fit = IsotonicRegression(increasing=True, out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(confidence, correct)
    x, y = np.asarray(fit.X_thresholds_, dtype=float), np.asarray(fit.y_thresholds_, dtype=float)
    if len(x) > MAX_POINTS:
        keep = np.unique(np.linspace(0, len(x) - 1, MAX_POINTS).round().astype(int))
        x, y = x[keep], y[keep]
    return {"x": [round(float(v), 6) for v in x], "y": [round(float(v), 6) for v in y], "rows": len(correct)}
