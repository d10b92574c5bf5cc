"""The guarantee benchmark's parts run and report what they claim (the figures themselves come
from ``python -m benchmarks.guarantee``, not from tests)."""

from __future__ import annotations

import numpy as np

from benchmarks import guarantee as bench_guarantee
from benchmarks._guarantee_tasks import fresh_loss, task
from benchmarks._guarantee_topk import topk_section


def test_a_cell_reports_certified_runs_and_their_fresh_loss():
    cell = {"section": "validity", "task": "logistic", "metric": "accuracy", "rows": 1200, "max_loss": 0.02,
            "rule": "default", "seeds": 2}
    out = bench_guarantee.run_cell(cell)
    assert out["certified"] == sum(r["certified"] for r in out["runs"]) and out["cert_rows"] == 420
    assert out["exceeded"] == sum(r["exceeded"] for r in out["runs"])
    for run in out["runs"]:
        if run["certified"]:
            assert run["bound"] <= 0.02 and run["exceeded"] == (run["fresh_loss"] > 0.02)
            # each gear's fresh loss against the bound it reports, one per certified gear, counted
            assert len(run["bounds"]) == len(run["fresh_losses"]) == run["gears"] + 1
            assert all(b <= 0.02 for b in run["bounds"]) and 0 <= run["gears_over_bound"] <= len(run["bounds"])
            assert run["gears_over_bound"] == sum(loss > b for loss, b in zip(run["fresh_losses"], run["bounds"],
                                                                             strict=True))
    assert out["gears_certified"] == sum(len(r["bounds"]) for r in out["runs"])
    assert out["gears_over_bound"] == sum(r["gears_over_bound"] for r in out["runs"])


def test_rules_differ_only_in_what_they_say():
    old = bench_guarantee.run_cell({"section": "power", "task": "logistic", "metric": "accuracy", "rows": 800,
                                    "max_loss": 0.02, "rule": "product", "seeds": 1})
    assert old["cert_rows"] == round(800 * 0.4 * 0.6)  # the earlier split


def test_rows_for_half_the_seeds_and_the_power_ratio():
    cells = [{"section": "power", "rule": rule, "max_loss": 0.01, "rows": rows, "certified": c, "seeds": 4}
             for rule, rows, c in (("default", 400, 1), ("default", 800, 2), ("product", 800, 1),
                                   ("product", 1200, 3))]
    assert bench_guarantee._rows_for_half(cells, "default", 0.01) == 800
    assert bench_guarantee._rows_for_half(cells, "product", 0.01) == 1200


def test_fresh_loss_is_measured_in_every_metric():
    t = task("rare")
    opt = t.optimize(3000, 0, metric="accuracy", max_loss=0.02)
    X, y = t.fresh(0)
    for metric in ("accuracy", "roc_auc", "f1"):
        assert np.isfinite(fresh_loss(opt, metric, X.iloc[:5000], y[:5000]))


def test_topk_section_certifies_where_calibration_rows_speak_and_never_wrongly_often():
    rows = topk_section(seed=1)
    for r in rows:
        assert r["certified_below_target"] <= max(1, 0.1 * r["queries"])
        if r["pool"] > 10 * r["calibration"]:
            assert r["certified"] == 0 or r["k"] >= 1000
