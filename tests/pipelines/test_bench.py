"""The benchmark harness: JSON with the fields outside checks read, honest target checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import workloads as bench

REQUIRED = {"name", "rows", "baseline_rows_per_s", "optimized_rows_per_s", "speedup", "metric",
            "baseline_score", "optimized_score", "loss", "loss_bound", "max_loss", "latency_ms",
            "topk", "limit_speedup", "level_fractions"}


@pytest.fixture(scope="module")
def flights_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    code = bench.main(["--workload", "flights", "--rows", "5000", "--repeats", "1",
                       "--latency-rows", "5", "--k", "20", "--json", str(out)])
    return code, json.loads(out.read_text()), out


def test_json_has_the_fields_outside_checks_read(flights_run):
    code, doc, out = flights_run
    assert code == 0
    (result,) = doc["workloads"]
    assert REQUIRED <= set(result)
    assert set(result["latency_ms"]) >= {"baseline_p50", "baseline_p99", "optimized_p50", "optimized_p99"}
    assert set(result["topk"]) >= {"k", "speedup", "precision"}
    assert result["name"] == "flights" and result["rows"] == 1250 and result["topk"]["k"] == 20
    assert sum(result["level_fractions"]) == pytest.approx(1.0)
    assert 0 <= result["topk"]["precision"] <= 1
    assert result["speedup"] > 0 and result["limit_speedup"] > 0
    assert result["loss"] == pytest.approx(result["baseline_score"] - result["optimized_score"])
    assert isinstance(doc["loadavg_start"], float) and "loadavg_before" in result
    assert "measured_speedup" in result and result["small_model"].startswith("LGBMClassifier")
    assert out.with_suffix(".md").read_text().count("| flights |") == 1
    assert any(t["workload"] == "flights" for t in doc["targets"])


def test_workloads_that_cannot_run_are_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("WILLUMP_DATASETS", str(tmp_path / "nowhere"))
    out = tmp_path / "b.json"
    assert bench.main(["--workload", "credit", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["workloads"]
    assert "real data sets not found" in result["skipped"]
    assert str(tmp_path / "nowhere") in result["skipped"]


def _result(name, speedup, **extra):
    r = {"name": name, "speedup": speedup, "loss": 0.001, "loss_bound": 0.004, "max_loss": 0.005,
         "optimize_s": 10.0, "topk": {"k": 100, "speedup": 12.0, "precision": 0.97},
         "plan": "cascade", "reason": "cascade", "expected_speedup": 1.0,
         "level_fractions": [0.9, 0.1], "limit_speedup": 1.3,
         "cost_us_per_row": {"full_pipeline": 10.0, "full_model": 8.0, "cheapest_level": 8.5,
                             "cheapest_level_model": 7.9}}
    r.update(extra)
    return r


def test_targets_and_explanations():
    targets = bench.check_targets([_result("toxic", 7.0), _result("credit", 1.1),
                                   {"name": "adult", "skipped": "no data"}])
    by = {(t["workload"], t["target"]): t["met"] for t in targets}
    assert by[("toxic", "speedup >= 6x")] and by[("toxic", "top-K precision@100 >= 0.95")]
    assert not by[("credit", "speedup >= 2x at the guarantee")]
    assert not any(t["workload"] == "adult" for t in targets)
    assert bench.explain(_result("toxic", 7.0)) is None
    text = bench.explain(_result("credit", 1.1, expected_speedup=1.2, small_model=(
        "LGBMClassifier(n_estimators=40, n_jobs=1, num_leaves=15, random_state=0)")))
    assert "1.10x" in text and "80%" in text and "model, not the features" in text
    assert "LGBMClassifier(n_estimators=40, num_leaves=15)" in text  # the settings saying its size
    # a cheap level that is cheap enough but answers too few rows: the signal is named, with
    # the share of rows 2x would need (1 - (10/2 - 1) / (10 - 1 + 0.5) = 58%)
    text = bench.explain(_result("adult", 1.5, expected_speedup=1.6, limit_speedup=10.0,
                                 level_fractions=[0.4, 0.6],
                                 cost_us_per_row={"full_pipeline": 10.0, "full_model": 8.0,
                                                  "cheapest_level": 1.0, "cheapest_level_model": 0.5}))
    assert "answers 40.0% of test rows" in text and "about 58% of rows" in text
    assert "too little signal" in text
    text = bench.explain(_result("credit", 1.0, expected_speedup=1.0, plan="full",
                                 reason="full pipeline: measured 0.90x", level_fractions=[1.0]))
    assert "No cascade was kept (full pipeline: measured 0.90x)" in text


def test_score_matches_the_metric_definitions():
    classes = np.array(["a", "b"])
    y = np.array(["a", "b", "b", "a"])
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    assert bench.score("accuracy", y, proba, classes) == 0.5
    assert bench.score("f1", y, proba, classes) == pytest.approx(0.5)
    assert bench.score("roc_auc", y, proba, classes) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="metric"):
        bench.score("mse", y, proba, classes)
