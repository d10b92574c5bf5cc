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
    assert len(bp.profile_names(str(shared_datasets))) == 14  # the default: every profile
    out = bp.part_plan(str(shared_datasets), sp.Transport(5.0, 1e9, "test"), requests=300,
                       models=("vgg16", "gnmt"), simulated=("vgg16",))
    rows = out["rows"]
    assert len(rows) == 2 * 2 * 2  # transports x models x device counts
    for r in rows:
        plans = r["plans"]
        assert r["memory_per_device"] < r["footprint"]
        assert not plans["whole-model replicas"]["feasible"]  # the cap is below the model
        dp = plans["dp+replication"]
        assert dp["feasible"] and all(
            dp["throughput"] >= p["throughput"] * (1 - 1e-9) for p in plans.values() if p["feasible"])
        if r["model"] == "vgg16":
            assert dp["p99_ms_poisson"] > 0 and dp["p99_ms_bursty"] > 0
        else:  # planned, not simulated
            assert "p99_ms_poisson" not in dp
        assert r["dp_over_best_even_any_k"] <= r["dp_over_best_even"] + 1e-9
    verdict = out["versus_even"]
    assert verdict["dp_at_least_every_even_split"] and not verdict["short"]
    assert set(verdict["gain_per_profile"]["assumed-gpu"]) == {"vgg16", "gnmt"}
    assert all(v["min"] >= 1 - 1e-9 for v in verdict["gain_per_profile"]["serve-measured"].values())
    table = plan_table({"plan": out}, "assumed-gpu")
    assert table.count("\n") == 1 + 2 * 2 and "does not fit" in table


def test_memory_cap_lies_between_the_largest_block_and_the_model():
    prof = sp.Profile("m", "gpu", [4], ["a", "b", "c"], [[1.0]] * 3, [[0.0]] * 4, [10.0, 50.0, 20.0],
                      [[5.0], [0.0], [1.0]])
    cap, whole = bp.memory_cap(prof)
    assert whole == 85.0 and cap == pytest.approx(50.0 + 0.5 * 35.0)


def test_a_dp_short_of_an_even_split_is_reported():
    rows = [{"transport": "t", "model": "m", "devices": d, "dp_over_best_even_any_k": g}
            for d, g in ((2, 1.2), (4, 0.9), (8, None))]
    verdict = bp.versus_even(rows)
    assert not verdict["dp_at_least_every_even_split"]
    assert verdict["no_even_split_fits"] == [{"transport": "t", "model": "m", "devices": 8}]
    assert verdict["short"] == [{"transport": "t", "model": "m", "devices": 4, "dp_over_best_even_any_k": 0.9}]
    assert verdict["gain_per_profile"] == {"t": {"m": {"min": 0.9, "max": 1.2}}}
