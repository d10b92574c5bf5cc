"""The planner, the cost model and the simulation, on synthetic and PipeDream profiles (no torch run)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import serving.partition as sp
from tests.conftest import datasets_dir

PROFILES = datasets_dir() / "pipedream_profiles"


def make_profile(compute, cuts, params, work=None, transport=(1.0, 1e6), batch_sizes=(8,)) -> sp.Profile:
    n = len(compute)
    work = work if work is not None else [0.0] * n
    return sp.Profile(
        name="synthetic", device="gpu", batch_sizes=list(batch_sizes), block_names=[f"b{i}" for i in range(n)],
        compute_ms=[[float(c)] * len(batch_sizes) for c in compute],
        cut_bytes=[[float(c)] * len(batch_sizes) for c in cuts], param_bytes=[float(p) for p in params],
        workspace_bytes=[[float(w)] * len(batch_sizes) for w in work],
        transport=sp.Transport(transport[0], transport[1], "test"),
    )


@st.composite
def instances(draw, max_blocks=5):
    n = draw(st.integers(1, max_blocks))
    compute = draw(st.lists(st.floats(0.1, 50.0), min_size=n, max_size=n))
    cuts = draw(st.lists(st.floats(0.0, 5e6), min_size=n + 1, max_size=n + 1))
    params = draw(st.lists(st.floats(1.0, 100.0), min_size=n, max_size=n))
    work = draw(st.lists(st.floats(0.0, 20.0), min_size=n, max_size=n))
    fixed = draw(st.floats(0.0, 10.0))
    bw = draw(st.sampled_from([1e5, 1e6, 1e8]))
    return make_profile(compute, cuts, params, work, (fixed, bw))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=instances(), devices=st.integers(1, 4), cap_share=st.one_of(st.none(), st.floats(0.2, 1.2)),
       overlap=st.booleans())
def test_dp_equals_brute_force(prof, devices, cap_share, overlap):
    cap = None if cap_share is None else cap_share * (prof.model_bytes + max(w[0] for w in prof.workspace_bytes))
    got = sp.plan(prof, devices, cap, overlap=overlap)
    want = sp.brute_force(prof, devices, cap, overlap=overlap)
    assert got.feasible == want.feasible
    if want.feasible:
        assert got.throughput == pytest.approx(want.throughput, rel=1e-9)
        assert got.latency_ms == pytest.approx(want.latency_ms, rel=1e-9)
        again = sp.evaluate(prof, got.stages, devices=devices, memory_per_device=cap, overlap=overlap)
        assert again.throughput == pytest.approx(got.throughput) and again.feasible


@settings(max_examples=80, deadline=None)
@given(prof=instances(max_blocks=7), devices=st.integers(1, 8))
def test_without_memory_limit_the_whole_model_is_replicated(prof, devices):
    got = sp.plan(prof, devices, None)
    assert [(s.start, s.end, s.replicas) for s in got.stages] == [(0, len(prof), devices)]


@settings(max_examples=60, deadline=None)
@given(prof=instances(max_blocks=6), devices=st.integers(1, 6), cap_share=st.one_of(st.none(), st.floats(0.3, 1.0)))
def test_more_devices_never_predict_less_throughput(prof, devices, cap_share):
    cap = None if cap_share is None else cap_share * (prof.model_bytes + max(w[0] for w in prof.workspace_bytes))
    a = sp.plan(prof, devices, cap)
    b = sp.plan(prof, devices + 1, cap)
    assert b.throughput >= a.throughput * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(prof=instances(max_blocks=7), devices=st.integers(2, 6), share=st.floats(0.3, 0.95))
def test_memory_cap_below_model_forces_a_split_that_fits(prof, devices, share):
    whole = prof.model_bytes + max(w[0] for w in prof.workspace_bytes)
    cap = share * whole
    got = sp.plan(prof, devices, cap)
    if not got.feasible:  # then nothing fits: brute force agrees
        assert not sp.brute_force(prof, devices, cap).feasible
        return
    assert len(got.stages) >= 2
    assert all(s.memory_bytes <= cap for s in got.stages)
    assert sum(s.replicas for s in got.stages) <= devices


def test_evaluate_marks_a_stage_over_memory_infeasible():
    prof = make_profile([1, 1, 1], [0, 10, 10, 0], [10, 10, 10])
    p = sp.evaluate(prof, [(0, 3, 1)], devices=2, memory_per_device=25)
    assert not p.feasible and p.throughput == 0.0 and math.isinf(p.latency_ms)
    assert "memory_per_device" in p.notes[0]
    too_many = sp.evaluate(prof, [(0, 1, 2), (1, 3, 1)], devices=2)
    assert not too_many.feasible and "devices" in too_many.notes[0]
    with pytest.raises(ValueError, match="contiguous"):
        sp.evaluate(prof, [(0, 1, 1), (2, 3, 1)])


def test_evaluate_matches_the_formula():
    # two stages, hop 1 ms + bytes / 1e6 B/s; each side pays half of each hop
    prof = make_profile([4, 6], [1000, 2000, 1000], [1, 1], transport=(1.0, 1e6))
    p = sp.evaluate(prof, [(0, 1, 1), (1, 2, 2)], devices=3)
    hop = [1 + 1000 / 1e6 * 1000, 1 + 2000 / 1e6 * 1000, 1 + 1000 / 1e6 * 1000]  # ms
    busy0 = 4 + (hop[0] + hop[1]) / 2
    busy1 = 6 + (hop[1] + hop[2]) / 2
    assert p.stages[0].busy_ms == pytest.approx(busy0)
    assert p.throughput == pytest.approx(8 * 1000 / max(busy0, busy1 / 2))
    assert p.latency_ms == pytest.approx(4 + 6 + sum(hop))


def test_latency_objective_meets_the_rate_with_least_latency():
    prof = make_profile([10, 10, 10, 10], [0, 1e3, 1e3, 1e3, 0], [1, 1, 1, 1], transport=(2.0, 1e9))
    fast = sp.plan(prof, 4, None, objective="latency", rate=8 * 1000 / 40 * 0.9)
    assert fast.feasible and len(fast.stages) == 1 and fast.throughput >= 8 * 1000 / 40 * 0.9
    need = sp.plan(prof, 4, None, objective="latency", rate=8 * 1000 / 40 * 3.5)
    assert need.feasible and need.throughput >= 8 * 1000 / 40 * 3.5 and need.stages[0].replicas == 4
    assert not sp.plan(prof, 4, None, objective="latency", rate=1e6).feasible
    with pytest.raises(ValueError, match="rate"):
        sp.plan(prof, 4, None, objective="latency")


def test_slo_picks_a_plan_within_it():
    prof = make_profile([10, 10], [0, 1e3, 0], [5, 5], transport=(5.0, 1e9))
    loose = sp.plan(prof, 2, 6.0)  # must split: one block per stage
    assert len(loose.stages) == 2
    assert not sp.plan(prof, 2, 6.0, slo_ms=loose.latency_ms - 1).feasible
    assert sp.plan(prof, 2, 6.0, slo_ms=loose.latency_ms + 1).feasible


def test_batch_sweep_prefers_the_batch_with_more_rows_per_second():
    prof = sp.Profile("b", "cpu", [1, 8], ["a", "b"], [[1.0, 2.0], [1.0, 2.0]], [[4, 32], [4, 32], [4, 32]],
                      [1, 1], [[0, 0], [0, 0]], sp.Transport(0.5, 1e9))
    assert sp.plan(prof, 2).batch_size == 8
    assert sp.plan(prof, 2, batch_sizes=[1]).batch_size == 1
    with pytest.raises(ValueError, match="not profiled"):
        sp.plan(prof, 2, batch_sizes=[4])


def test_bad_arguments_are_named():
    prof = make_profile([1], [0, 0], [1])
    with pytest.raises(ValueError, match="devices"):
        sp.plan(prof, 0)
    with pytest.raises(ValueError, match="memory_per_device"):
        sp.plan(prof, 1, -5)
    with pytest.raises(ValueError, match="objective"):
        sp.plan(prof, 1, objective="cost")


def test_baselines_cover_all_blocks():
    prof = make_profile([1] * 10, [0] * 11, [1, 1, 1, 1, 10, 1, 1, 1, 1, 1])
    for k in (1, 2, 3, 4, 10):
        for ranges in (sp.even_by_layers(10, k), sp.even_by_params(prof, k)):
            assert ranges[0][0] == 0 and ranges[-1][1] == 10 and len(ranges) == k
            assert all(a < b for a, b in ranges)
    assert sp.with_replicas([(0, 5), (5, 10)], 5) == [(0, 5, 3), (5, 10, 2)]


def test_simulation_agrees_with_the_cost_model_at_saturation():
    prof = make_profile([4, 6, 3], [1e3, 1e4, 1e4, 1e3], [1, 1, 1], transport=(1.0, 1e7))
    p = sp.evaluate(prof, [(0, 1, 1), (1, 2, 2), (2, 3, 1)], devices=4)
    sim = sp.simulate(p, prof, rate=p.throughput / 8 * 3, rows_per_request=8, requests=3000)
    assert sim.throughput == pytest.approx(p.throughput, rel=0.03)
    light = sp.simulate(p, prof, rate=p.throughput / 8 * 0.05, rows_per_request=8, requests=2000)
    assert light.p50_ms == pytest.approx(p.latency_ms, rel=0.02)  # an idle pipeline: no queueing
    assert light.p99_ms >= light.p50_ms
    assert (light.p50, light.p99) == (light.p50_ms, light.p99_ms)


def test_bursty_arrivals_have_a_longer_tail_than_poisson():
    prof = make_profile([4, 4], [1e3, 1e3, 1e3], [1, 1], transport=(0.5, 1e9), batch_sizes=(1,))
    p = sp.plan(prof, 2)
    rate = p.throughput * 0.6
    poisson = sp.simulate(p, prof, rate=rate, requests=6000, seed=1)
    bursty = sp.simulate(p, prof, rate=rate, arrivals="bursty", requests=6000, seed=1)
    assert bursty.p99_ms > 1.5 * poisson.p99_ms
    assert bursty.throughput == pytest.approx(poisson.throughput, rel=0.25)
    with pytest.raises(ValueError, match="arrivals"):
        sp.simulate(p, prof, rate=1.0, arrivals="uniform")
    with pytest.raises(ValueError, match="rate"):
        sp.simulate(p, prof, rate=0)


def test_profile_round_trips_through_json(tmp_path):
    prof = make_profile([1, 2], [3, 4, 5], [6, 7])
    sp.save_profile(prof, tmp_path / "p.json")
    again = sp.load_profile(tmp_path / "p.json")
    assert again.to_dict() == prof.to_dict()
    sp.save_profile(prof.with_transport(sp.Transport()), tmp_path / "q.json")
    assert sp.load_profile(tmp_path / "q.json").transport.bytes_per_s == math.inf
    plan = sp.plan(prof, 2)
    assert sp.Plan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()
    with pytest.raises(ValueError, match="compute_ms"):
        sp.Profile("x", "cpu", [1], ["a"], [[1.0], [2.0]], [[0], [0]], [1], [[0]])


@pytest.mark.datasets
@pytest.mark.parametrize("name", ["vgg16", "resnet50", "gnmt"])
def test_pipedream_profiles_linearize(name):
    path = PROFILES / f"{name}.txt"
    if not path.exists():
        if __import__("os").environ.get("CI") == "true":
            pytest.fail(f"{path} missing")
        pytest.skip("PipeDream profiles not available")
    prof = sp.read_pipedream(path)
    assert len(prof) > 10 and prof.batch_sizes == [64]
    raw = path.read_text()
    assert prof.model_bytes == pytest.approx(sum(
        float(line.split("parameter_size=")[1]) for line in raw.splitlines() if "parameter_size=" in line))
    assert all(c[0] >= 0 for c in prof.cut_bytes)
    # a cut inside a residual block carries the skip connection too: more than the node's own output
    if name == "resnet50":
        acts = [c[0] for c in prof.cut_bytes[1:-1]]
        assert max(acts) > 0


def test_pipedream_reader_sums_crossing_edges(tmp_path):
    text = "\n".join([
        "node1 -- Input -- forward_compute_time=9.0, backward_compute_time=0.0, activation_size=100.0, parameter_size=0.0",
        "node2 -- A -- forward_compute_time=1.0, backward_compute_time=0.0, activation_size=10.0, parameter_size=4.0",
        "node3 -- B -- forward_compute_time=2.0, backward_compute_time=0.0, activation_size=[20.0; 5.0], parameter_size=8.0",
        "node4 -- Add -- forward_compute_time=0.5, backward_compute_time=0.0, activation_size=30.0, parameter_size=0.0",
        "\tnode1 -- node2", "\tnode2 -- node3", "\tnode2 -- node4", "\tnode3 -- node4",
    ])
    path = tmp_path / "g.txt"
    path.write_text(text)
    prof = sp.read_pipedream(path)
    assert prof.block_names[0].startswith("node2") and len(prof) == 3
    assert [c[0] for c in prof.cut_bytes] == [100.0, 10.0, 10.0 + 25.0, 30.0]
    assert [c[0] for c in prof.compute_ms] == [1.0, 2.0, 0.5]
    (tmp_path / "bad.txt").write_text("garbage line\n")
    with pytest.raises(ValueError, match="not a PipeDream"):
        sp.read_pipedream(tmp_path / "bad.txt")


def test_planner_beats_even_splits_on_a_skewed_chain():
    # one heavy block: an even split by layers leaves it alone on one device; the DP
    # replicates the stage holding it
    prof = make_profile([1, 1, 1, 1, 20, 1, 1, 1], [1e3] * 9, [1] * 8, transport=(0.1, 1e9))
    cap = 5.0
    dp = sp.plan(prof, 8, cap)
    even = sp.evaluate(prof, sp.with_replicas(sp.even_by_layers(8, 8), 8), devices=8, memory_per_device=cap)
    assert dp.throughput > 2 * even.throughput
    assert np.all([s.memory_bytes <= cap for s in dp.stages])
