"""Apache DataSketches against the monitor's own sketches, at the monitor's ingest pattern.

Why measured, not assumed: the field's well-kept library should replace hand-written code
unless ours is measurably needed. Three pairs are compared on the same inputs:

- quantiles: DataSketches KLL (k=200, its default) vs drift.QuantileSketch (centred DDSketch,
  1% relative accuracy): update cost per 10k-value batch, merge of 60 pane sketches, bytes, and
  what each can *guarantee* for the drift tests: the KS statistic's error and whether an
  effect of 0.1 std (the default gate) is resolvable on N(1000, 5), where the old uncentred
  sketch could not see 3 std.
- frequent items: DataSketches frequent_strings (per-item `update`) vs drift's ValueCounts
  (np.bincount on codes), rows per second.
- weighted sampling: DataSketches var_opt (per-item `update`) vs drift's Reservoir (vectorized
  priority sampling with inclusion thresholds), rows per second.

`python -m benchmarks.drift --sections libraries` prints them; drift/README.md records the choice.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from drift._counts import ValueCounts
from drift._reservoir import Reservoir
from drift._sketch import QuantileSketch, ks_bounds, wasserstein

BATCH = 10_000


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def quantile_sketches(repeats: int = 5) -> dict[str, Any]:
    import datasketches as ds

    rng = np.random.default_rng(0)
    batches = [rng.normal(1000.0, 5.0, BATCH) for _ in range(60)]
    shifted = [b + 0.5 for b in batches]  # +0.1 std: the default effect gate

    def ours(parts: list[np.ndarray]) -> list[QuantileSketch]:
        out = []
        for x in parts:
            s = QuantileSketch(0.01, offset=1000.0)
            s.update(x)
            out.append(s)
        return out

    def kll(parts: list[np.ndarray]) -> list[Any]:
        out = []
        for x in parts:
            s = ds.kll_doubles_sketch(200)
            s.update(x)
            out.append(s)
        return out

    t_ours = _best(lambda: ours(batches), repeats) / len(batches)
    t_kll = _best(lambda: kll(batches), repeats) / len(batches)
    a_ours, b_ours = ours(batches), ours(shifted)
    a_kll, b_kll = kll(batches), kll(shifted)

    def merge_ours(parts: list[QuantileSketch]) -> QuantileSketch:
        m = parts[0].copy()
        for s in parts[1:]:
            m.merge(s)
        return m

    def merge_kll(parts: list[Any]) -> Any:
        m = ds.kll_doubles_sketch(200)
        for s in parts:
            m.merge(s)
        return m

    m_ours = _best(lambda: merge_ours(a_ours), repeats)
    m_kll = _best(lambda: merge_kll(a_kll), repeats)
    wa, wb = merge_ours(a_ours), merge_ours(b_ours)
    ka, kb = merge_kll(a_kll), merge_kll(b_kll)
    # KS statistic: ours is bracketed exactly; KLL's CDFs are each within eps (rank error,
    # ~99% confidence) so the statistic is within 2 eps
    d_lo, d_hi = ks_bounds(wa, wb)
    eps = ds.kll_doubles_sketch.get_normalized_rank_error(200, False)
    xa, xb = np.concatenate(batches), np.concatenate(shifted)
    grid = np.quantile(np.concatenate((xa, xb)), np.linspace(0.001, 0.999, 999))
    ks_kll = float(np.max(np.abs(np.array(ka.get_cdf(grid.tolist()))[:-1]
                                 - np.array(kb.get_cdf(grid.tolist()))[:-1])))
    w_est, w_err = wasserstein(wa, wb)
    std = float(np.std(xa))
    state = wa.to_state()
    ours_bytes = int(state["pos"].nbytes + state["neg"].nbytes + 80)
    return {
        "update_ms_per_10k": {"drift": 1e3 * t_ours, "kll": 1e3 * t_kll},
        "merge_60_panes_ms": {"drift": 1e3 * m_ours, "kll": 1e3 * m_kll},
        "bytes_per_pane_sketch": {"drift": ours_bytes,
                                  "kll": len(a_kll[0].serialize())},
        "ks_shift_0_1_std": {"truth_approx": float(0.5 / 5.0 * 0.3989),
                             "drift_bracket": [d_lo, d_hi], "kll_estimate": ks_kll,
                             "kll_guaranteed_error": 2 * eps},
        "wasserstein_over_std": {"truth": 0.1, "drift_estimate": w_est / std,
                                 "drift_error_bound": w_err / std,
                                 "kll_error_bound": "none (rank error only; W1 needs value "
                                                    "error, which KLL does not bound)"},
    }


def frequent_items(repeats: int = 3) -> dict[str, Any]:
    import datasketches as ds

    rng = np.random.default_rng(1)
    codes = (rng.zipf(1.3, 50_000) % 5000).astype(np.int64)
    labels = np.array([f"client{i}" for i in range(5000)], dtype=object)[codes].tolist()

    def theirs() -> None:
        s = ds.frequent_strings_sketch(10)  # lg_max_k 10: 1024 counters, like max_values
        for v in labels:
            s.update(v)

    def ours() -> None:
        c = ValueCounts(1024)
        for i in range(0, codes.size, BATCH):
            c.add_bincount(np.bincount(codes[i:i + BATCH]))

    t_theirs = _best(theirs, repeats)
    t_ours = _best(ours, repeats)
    return {"rows_per_s": {"drift": codes.size / t_ours,
                           "frequent_strings": codes.size / t_theirs},
            "note": "datasketches' frequent items take one Python call per row; drift counts "
                    "encoded codes with one np.bincount per batch"}


def weighted_sampling(repeats: int = 3) -> dict[str, Any]:
    import datasketches as ds

    rng = np.random.default_rng(2)
    n = 50_000
    cat = rng.integers(0, 100, (8, n)).astype(np.int32)
    num = rng.normal(size=(4, n))
    flags = (rng.random(n) < 0.01).astype(np.uint32)
    prio = rng.random(n)
    def theirs() -> None:
        s = ds.var_opt_sketch(20_000)
        for i in range(0, n, BATCH):  # the monitor holds column arrays: rows must be built
            for r in np.vstack((cat[:, i:i + BATCH], num[:, i:i + BATCH])).T.tolist():
                s.update(tuple(r))

    def ours() -> None:
        res = Reservoir(8, 4, (20_000, 10_000))
        for i in range(0, n, BATCH):
            sl = slice(i, i + BATCH)
            res.add(cat[:, sl], num[:, sl], flags[sl], prio[sl])
        res.compact()

    t_theirs = _best(theirs, repeats)
    t_ours = _best(ours, repeats)
    return {"rows_per_s": {"drift": n / t_ours, "var_opt": n / t_theirs},
            "note": "var_opt takes one Python call per row (rows built as tuples from the "
                    "batch's columns, as ingest would have to); drift offers column arrays per "
                    "batch and keeps per-row inclusion thresholds"}


def libraries(quick: bool) -> dict[str, Any]:
    try:
        import datasketches  # noqa: F401
    except ImportError:
        return {"error": "datasketches is not installed (pip install 'willump-serve[bench]')"}
    repeats = 3 if quick else 5
    return {"quantiles": quantile_sketches(repeats), "frequent_items": frequent_items(),
            "sampling": weighted_sampling()}


def report_lines(res: dict[str, Any]) -> list[str]:
    if "error" in res:
        return [f"libraries: {res['error']}"]
    q = res["quantiles"]
    ks = q["ks_shift_0_1_std"]
    w = q["wasserstein_over_std"]
    lines = [
        f"quantiles, update of 10k values: drift {q['update_ms_per_10k']['drift']:.3f} ms, "
        f"KLL(200) {q['update_ms_per_10k']['kll']:.3f} ms; merge of 60 panes: drift "
        f"{q['merge_60_panes_ms']['drift']:.2f} ms, KLL {q['merge_60_panes_ms']['kll']:.2f} ms; "
        f"bytes per pane: drift {q['bytes_per_pane_sketch']['drift']:,}, KLL "
        f"{q['bytes_per_pane_sketch']['kll']:,}",
        f"  0.1-std shift of N(1000, 5) (KS ~{ks['truth_approx']:.3f}): drift brackets KS in "
        f"[{ks['drift_bracket'][0]:.4f}, {ks['drift_bracket'][1]:.4f}], W1/std "
        f"{w['drift_estimate']:.3f} +- {w['drift_error_bound']:.4f}; KLL estimates KS "
        f"{ks['kll_estimate']:.4f} with a guaranteed error of +-{ks['kll_guaranteed_error']:.4f}"
        f" and no W1 bound",
        f"frequent items: drift {res['frequent_items']['rows_per_s']['drift']:,.0f} rows/s, "
        f"datasketches frequent_strings "
        f"{res['frequent_items']['rows_per_s']['frequent_strings']:,.0f} rows/s",
        f"weighted sampling: drift Reservoir {res['sampling']['rows_per_s']['drift']:,.0f} "
        f"rows/s, datasketches var_opt {res['sampling']['rows_per_s']['var_opt']:,.0f} rows/s",
    ]
    return lines
