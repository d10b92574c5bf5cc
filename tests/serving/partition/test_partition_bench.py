"""The partition benchmark's planner part runs on PipeDream's profiles and keeps its invariants
(no Ray, no timing: simulations are seeded and the cost model is deterministic)."""

from __future__ import annotations

import pytest

import serving.partition as sp
from benchmarks import partition as bp
from benchmarks.partition_report import plan_table


@pytest.mark.datasets
def test_planner_part_on_pipedream_profiles(shared_datasets, monkeypatch):
    monkeypatch.setattr(bp, "DEVICES", (2, 4))
    monkeypatch.setattr(bp, "MODELS", ("vgg16", "gnmt"))
    out = bp.part_plan(str(shared_datasets), sp.Transport(5.0, 1e9, "test"), requests=300)
    rows = out["rows"]
    assert len(rows) == 2 * 2 * 2  # transports x models x device counts
    for r in rows:
        plans = r["plans"]
        assert r["memory_per_device"] < r["footprint"]
        assert not plans["whole-model replicas"]["feasible"]  # the cap is below the model
        dp = plans["dp+replication"]
        assert dp["feasible"] and all(
            dp["throughput"] >= p["throughput"] * (1 - 1e-9) for p in plans.values() if p["feasible"])
        assert dp["p99_ms_poisson"] > 0 and dp["p99_ms_bursty"] > 0
        assert r["dp_over_best_even_any_k"] <= r["dp_over_best_even"] + 1e-9
    table = plan_table({"plan": out}, "assumed-gpu")
    assert table.count("\n") == 1 + 2 * 2 and "does not fit" in table


def test_memory_cap_lies_between_the_largest_block_and_the_model():
    prof = sp.Profile("m", "gpu", [4], ["a", "b", "c"], [[1.0]] * 3, [[0.0]] * 4, [10.0, 50.0, 20.0],
                      [[5.0], [0.0], [1.0]])
    cap, whole = bp.memory_cap(prof)
    assert whole == 85.0 and cap == pytest.approx(50.0 + 0.5 * 35.0)
