"""Heavy-hitter counts keep their error bound; reservoirs are exact when small and mergeable."""

from __future__ import annotations

import numpy as np

from drift._counts import ValueCounts
from drift._reservoir import Reservoir


def test_exact_below_cap() -> None:
    c = ValueCounts(max_values=10)
    c.add_codes(np.array([0, 1, 1, 5]))
    c.add_codes(np.array([5, 5, 9]))
    codes, counts = c.items()
    assert dict(zip(codes.tolist(), counts.tolist(), strict=True)) == {0: 1, 1: 2, 5: 3, 9: 1}
    assert c.exact and c.total == 7 and c.other_mass == 0


def test_heavy_hitter_error_bound_and_merge() -> None:
    rng = np.random.default_rng(0)
    k = 20
    parts = [rng.zipf(1.3, 5000) % 2000 for _ in range(4)]
    summaries = []
    for p in parts:
        s = ValueCounts(max_values=k)
        s.add_codes(p)
        summaries.append(s)
    merged = summaries[0]
    for s in summaries[1:]:
        merged.merge(s)
    truth = np.bincount(np.concatenate(parts))
    codes, counts = merged.items()
    assert codes.size <= k
    n = sum(p.size for p in parts)
    assert merged.total == n
    assert merged.error <= n / (k + 1)
    for code, count in zip(codes, counts, strict=True):
        assert truth[code] - merged.error <= count <= truth[code]
    heavy = np.flatnonzero(truth > merged.error)
    assert set(heavy.tolist()) <= set(codes.tolist())
    restored = ValueCounts.from_state(merged.to_state())
    assert np.array_equal(restored.items()[1], counts) and restored.error == merged.error


def _offer(res: Reservoir, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, 5, (2, n)).astype(np.int32)
    num = rng.normal(size=(1, n))
    flags = (rng.random(n) < 0.1).astype(np.uint32)
    res.add(cat, num, flags, rng.random(n))
    return cat


def test_reservoir_exact_when_small() -> None:
    res = Reservoir(2, 1, (100, 100))
    _offer(res, 50, 1)
    assert res.size == 50 and np.all(res.weights() == 1.0)


def test_reservoir_merge_order_is_irrelevant_and_subgroups_are_estimated() -> None:
    """Stratum weight sums equal the population by calibration (they cannot fail); what the
    weights are for is estimating subgroups, which is checked against the truth here."""
    parts, cats = [], []
    for seed in range(5):
        r = Reservoir(2, 1, (300, 50))
        cats.append(_offer(r, 2000, seed))
        parts.append(r)
    forward, backward = Reservoir(2, 1, (300, 50)), Reservoir(2, 1, (300, 50))
    for r in parts:
        forward.merge(r.copy())
    for r in reversed(parts):
        backward.merge(r.copy())
    forward.compact()
    backward.compact()
    assert np.array_equal(forward.prio, backward.prio)
    assert np.array_equal(forward.cat, backward.cat)
    w = forward.weights()
    truth = np.concatenate(cats, axis=1)
    for value in range(5):
        est = float(w[forward.cat[0] == value].sum())
        true = int((truth[0] == value).sum())
        # 350 kept rows of 10,000: binomial sampling error about sqrt(n p q) * w ~ 200
        assert abs(est - true) < 4 * np.sqrt(350 * 0.2 * 0.8) * (10_000 / 350)
    wrong = np.ones_like(w) * w.mean()  # the old single weight per stratum is not it
    assert not np.allclose(wrong, w)
