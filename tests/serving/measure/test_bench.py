"""benchmarks.serving's accounting and comparison (pure functions; the benchmark itself is not run here)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.serving import compare, foreign_cores, predict, under_load
from serving.core.procstat import cpu_per_request, process_cpu
from tests.serving.planning.test_planner import costs, ingress, linear


def test_cpu_is_split_by_deployment_front_load_generator_and_the_rest():
    before = {1: ("ray::ServeReplica:app:app-ingress", 1.0), 2: ("ray::ServeReplica:app:app-expensive", 2.0),
              3: ("haproxy -f cfg", 0.5), os.getpid(): ("python -m benchmarks.serving", 4.0),
              5: ("ray::ServeReplica:app:app-ingress", 0.0), 7: ("raylet", 1.0), 8: ("someone else's job", 1.0),
              9: ("ray::ServeReplica:peer:PeerPipeline", 1.0), 10: ("ray::ServeReplica:app-monitor:app-monitor", 1.0)}
    after = {1: (before[1][0], 1.2), 2: (before[2][0], 2.05), 3: (before[3][0], 0.51),
             os.getpid(): (before[os.getpid()][0], 4.02), 5: (before[5][0], 0.1), 7: ("raylet", 1.03),
             8: ("someone else's job", 9.0), 6: ("started during the phase", 9.0), 9: (before[9][0], 1.01),
             10: (before[10][0], 1.02)}
    cpu = cpu_per_request(before, after, requests=100, app="app", ours={1, 2, 3, 5, 7, 9, 10})
    assert cpu["monitor"] == pytest.approx(0.2)  # the app's own monitor is the app's
    assert cpu["other apps"] == pytest.approx(0.1)  # another app's idle replica: not this app's CPU
    assert cpu["ingress"] == pytest.approx(3.0)  # two ingress processes: (0.2 + 0.1) s / 100
    assert cpu["expensive"] == pytest.approx(0.5)
    assert cpu["front"] == pytest.approx(0.1) and cpu["load generator"] == pytest.approx(0.2)
    assert cpu["other"] == pytest.approx(0.3)  # the raylet; not another user's process
    assert cpu["total"] == pytest.approx(4.4)
    assert cpu_per_request(before, after, requests=0) == {"total": 0.0}


def test_process_cpu_sees_this_process_spend_cpu():
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc on this platform")
    before = process_cpu()
    sum(i * i for i in range(2_000_000))
    after = process_cpu()
    assert after[os.getpid()][1] > before[os.getpid()][1]


def test_prediction_and_comparison_fields():
    from serving.planning.planner import Resources, plan_stages

    plan = plan_stages([linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)],
                       Resources(cpus=2), rows_per_request=32, layout="fused", ingress=ingress(), costs=costs())
    p = predict(plan, clients=16, client_ms=0.4)
    assert p["predicted_rows_per_s"] <= p["bound_rows_per_s"] * 1.05
    assert p["predicted_p99_ms"] > p["predicted_p50_ms"] > 0
    assert p["predicted_cpu_ms_per_request"]["load generator"] == pytest.approx(0.4, rel=0.05)
    phase = {**p, "measured_rows_per_s": 1.2 * p["predicted_rows_per_s"],
             "measured_p99_ms": 2.5 * p["predicted_p99_ms"]}
    c = compare(phase)
    assert c["rows_per_s_ratio"] == pytest.approx(1.2) and c["rows_per_s_within_target"]
    assert c["p99_ratio"] == pytest.approx(2.5) and not c["p99_within_target"]


def test_other_users_load_is_measured_and_slows_the_prediction():
    before = {1: ("ray::ServeReplica:app:app-ingress", 1.0), os.getpid(): ("python -m benchmarks.serving", 4.0),
              8: ("someone else's job", 1.0)}
    after = {1: (before[1][0], 3.0), os.getpid(): (before[os.getpid()][0], 5.0), 8: ("someone else's job", 9.0),
             9: ("started during the phase", 2.0)}
    assert foreign_cores(before, after, seconds=10.0, ours={1}) == pytest.approx(1.0)  # (8 + 2) s / 10 s
    assert foreign_cores(before, after, seconds=10.0, ours=None) is None

    from serving.planning.planner import Resources, plan_stages

    plan = plan_stages([linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)],
                       Resources(cpus=2), rows_per_request=32, layout="fused", ingress=ingress(), costs=costs())
    quiet = predict(plan, clients=16, client_ms=0.4)
    busy = predict(under_load(plan, 1.0), clients=16, client_ms=0.4)
    assert busy["predicted_rows_per_s"] < 0.75 * quiet["predicted_rows_per_s"]
    assert plan.costs.background_cores == costs().background_cores  # the plan itself is unchanged


def test_in_situ_factors_scale_the_groups_the_probe_measured():
    """Measured over modelled CPU per group; what the model barely charges, the total, GPU time
    and groups the probe did not see keep their modelled cost. The simulation then charges each
    group its factor: told its own figures it predicts the same, and a costlier ingress lowers
    an ingress-bound prediction."""
    from serving.measure.insitu import cpu_factors, probe_clients
    from serving.planning.planner import Resources, plan_stages
    from serving.planning.simulate import simulate

    measured = {"ingress": 6.0, "expensive": 3.0, "other": 1.2, "front": 0.3, "load generator": 0.5,
                "cheap": 0.4,
                "total": 11.0, "gone": 1.0}
    modelled = {"ingress": 4.0, "expensive": 2.0, "other": 0.3, "front": 0.15, "client": 0.25, "cheap": 0.01,
                "expensive (GPU)": 1.0}
    factors = cpu_factors(measured, modelled)
    assert factors == pytest.approx({"ingress": 1.5, "expensive": 1.5, "front": 2.0, "client": 2.0})
    assert probe_clients(16) == 4 and probe_clients(1) == 1
    with pytest.raises(ValueError, match="clients"):
        probe_clients(0)

    plan = plan_stages([linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)],
                       Resources(cpus=2), rows_per_request=32, layout="fused", ingress=ingress(), costs=costs())
    plain = simulate(plan, clients=4, n_requests=600)
    same = cpu_factors({k: v for k, v in plain.cpu_ms.items()}, plain.cpu_ms)
    assert all(v == pytest.approx(1.0) for v in same.values())
    again = simulate(plan, clients=4, n_requests=600, cpu_scale=same)
    assert again.throughput_rows_s == pytest.approx(plain.throughput_rows_s, rel=1e-6)
    heavier = simulate(plan, clients=16, n_requests=600, cpu_scale={"ingress": 2.0})
    base = simulate(plan, clients=16, n_requests=600)
    assert heavier.cpu_ms["ingress"] == pytest.approx(2.0 * base.cpu_ms["ingress"], rel=0.05)
    assert heavier.throughput_rows_s < 0.8 * base.throughput_rows_s
    with pytest.raises(ValueError, match="cpu_scale"):
        simulate(plan, clients=4, n_requests=100, cpu_scale={"ingress": 0.0})


def test_ray_processes_split_into_cores_while_serving_and_cpu_per_request():
    """Calibration phases at different rates: a fixed 0.15 cores plus 0.2 ms per request is
    recovered; rates that hardly differ count everything per request; the fixed part comes
    off the machine's cores in the bound (not off each request)."""
    from dataclasses import replace

    from serving.measure.calibrate import split_rest
    from serving.planning.planner import Resources, plan_stages

    load = [(rate, 0.15 + 0.0002 * rate) for rate in (100.0, 400.0, 1200.0, 1600.0)]
    fixed, per_request = split_rest(load)
    assert fixed == pytest.approx(0.15, abs=1e-6) and per_request == pytest.approx(0.2, abs=1e-6)
    fixed, per_request = split_rest([(1000.0, 0.35), (1050.0, 0.36)])
    assert fixed == 0.0 and per_request == pytest.approx(0.35, rel=0.02)
    assert split_rest([]) == (0.0, 0.0)

    plan = plan_stages([linear("cheap", 0.0003, 0.00003), linear("expensive", 0.001, 0.0005, scale=0.1)],
                       Resources(cpus=2), rows_per_request=32, layout="fused", ingress=ingress(), costs=costs())
    host = next(iter(plan.costs.cores))
    busy = replace(plan.costs, serving_cores={host: 0.5})
    assert busy.busy_cores(host) == pytest.approx(plan.costs.background_cores.get(host, 0.0) + 0.5)
    quiet = predict(plan, clients=16, client_ms=0.4)
    loaded = predict(replace(plan, costs=busy), clients=16, client_ms=0.4)
    assert loaded["predicted_rows_per_s"] < 0.85 * quiet["predicted_rows_per_s"]


def test_poisson_calls_start_every_arrival_below_the_horizon_once():
    import asyncio

    from serving.measure.loadgen import poisson_calls

    seen: list[tuple[int, float]] = []

    async def call(i: int, t: float) -> None:
        seen.append((i, t))

    asyncio.run(poisson_calls(2000.0, 0.05, call, seed=3))
    gaps = np.random.default_rng(3).exponential(1 / 2000.0, 1000)
    expected = np.cumsum(gaps)[np.cumsum(gaps) < 0.05]
    assert [i for i, _ in seen] == list(range(len(expected)))
    np.testing.assert_allclose([t for _, t in seen], expected)


def test_rounds_are_summarised_by_medians_and_the_overhead_leaves_out_the_client_and_other_apps():
    from benchmarks._rounds import median_phase, overhead

    phases = [{"rows_per_s": r, "requests_per_s": r / 32, "p50_ms": 10.0, "p99_ms": p99, "seconds": 10.0,
               "requests": 100, "errors": e, "error_kinds": {"HTTP 503": e} if e else {}, "round": i,
               "at": "00:00:00",
               "cpu_ms_per_request": {"ingress": ing, "other": 1.0, "load generator": 0.7, "other apps": 0.4,
                                      "total": ing + 2.1}}
              for i, (r, p99, e, ing) in enumerate([(5000, 200.0, 0, 6.0), (3000, 400.0, 2, 8.0), (4000, 300.0, 0, 7.0)])]
    phase = median_phase(phases)
    assert phase["rows_per_s"] == 4000 and phase["p99_ms"] == 300.0
    assert phase["errors"] == 2 and phase["requests"] == 300 and len(phase["rounds"]) == 3
    assert phase["error_kinds"] == {"HTTP 503": 2} and phase["rounds"][1]["error_kinds"] == {"HTTP 503": 2}
    assert phase["cpu_ms_per_request"]["ingress"] == 7.0
    cost = overhead(phase, pipeline_cpu_ms=3.0)
    assert cost["app_cpu_ms_per_request"] == pytest.approx(8.0)  # ingress 7 + Ray's processes 1
    assert cost["overhead_ms_per_request"] == pytest.approx(5.0)


def test_a_sampling_profile_is_summed_by_what_the_time_went_to():
    from benchmarks.request_profile import summarise

    raw = "\n".join([
        "Thread.run (threading.py:1);Ingress._predict (serving/runtime/ingress.py:2);run_levels (willump/_cascade.py:3) 60",
        "Thread.run (threading.py:1);Ingress._predict (serving/runtime/ingress.py:2);parse_request (serving/core/schema.py:4) 10",
        "Thread.run (threading.py:1);FastAPI.__call__ (.venv/site-packages/fastapi/applications.py:5) 20",
        "Thread.run (threading.py:1);something_else (x.py:6) 10",
    ])
    out = summarise(raw, top=3)
    assert out["samples"] == 100
    assert out["groups"]["the pipeline's own work"] == pytest.approx(0.6)
    assert out["groups"]["parse and validate the body"] == pytest.approx(0.1)
    assert out["groups"]["FastAPI"] == pytest.approx(0.2) and out["groups"]["other: something_else"] == pytest.approx(0.1)
    assert next(iter(out["functions"])).startswith("Thread.run")  # every sample is inside it


def test_the_request_path_benchmark_pairs_old_and_new_and_prints_every_step(tmp_path, capsys):
    """benchmarks.request_path on a tiny block: every step timed on both sides, the JSON written,
    bad sizes refused by name."""
    import json

    import pytest

    from benchmarks import request_path

    path = tmp_path / "out.json"
    assert request_path.main(["--rows-per-request", "4", "--block", "8", "--repeats", "1", "--n-rows", "2000",
                              "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    assert set(out["steps"]) == {"dispatch", "parse", "encode", "predict"}
    assert all(s["old_ms"] > 0 and s["new_ms"] > 0 for s in out["steps"].values())
    assert "dispatch" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        request_path.main(["--block", "0"])


def test_in_process_phases_take_their_turns_in_the_rounds_and_are_summarised_by_medians():
    from benchmarks._rounds import measure_rounds, median_local

    calls = []

    def phase(name, rate):
        def run():
            calls.append(name)
            return {"rows_per_s": rate + len(calls), "requests_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 2.0,
                    "cpu_ms_per_request": float(len(calls)), "requests": 10}
        return run

    rounds = measure_rounds({}, [], rows_each=1, clients=1, duration=0.0, max_requests=1, rounds=3, session=None,
                            local={"c": phase("c", 100.0), "c'": phase("c'", 10.0)})
    assert calls == ["c", "c'", "c'", "c", "c", "c'"]  # the order rotates every round
    summary = median_local(rounds["c"])
    assert summary["cpu_ms_per_request"] == 4.0 and summary["requests"] == 30 and len(summary["rounds"]) == 3


def test_the_rounds_collect_the_measuring_heap_before_any_cpu_reading(monkeypatch):
    """The load generator's heap is settled once for all rounds: no collection of it falls
    between a phase's two /proc readings (it would be charged to the load generator)."""
    import gc

    import benchmarks._rounds as rounds_module
    from serving.measure.loadgen import timed_on_a_settled_heap

    events = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: events.append("collect") or real_collect(*a))
    monkeypatch.setattr(rounds_module, "process_cpu", lambda: events.append("cpu") or {})
    monkeypatch.setattr(rounds_module, "cpu_per_request", lambda *a, **k: {})

    @timed_on_a_settled_heap
    async def closed_loop(url, bodies, rows_each, **kwargs):
        return {"requests": 1, "rows_per_s": 1.0, "p99_ms": 1.0, "errors": 0}

    monkeypatch.setattr(rounds_module, "closed_loop", closed_loop)
    rounds_module.measure_rounds({"a": "u", "b": "v"}, [b"{}"], rows_each=1, clients=1, duration=0.0,
                                 max_requests=1, rounds=2, session=None)
    assert events[0] == "collect" and events.count("collect") == 1 and events.count("cpu") == 8


def test_a_replicas_start_is_read_from_serves_status_by_littles_law():
    """Replicas sampled once a second: two added at t=2 that sat in STARTING for 2 s each."""
    from benchmarks._deploy_autoscale import mean_start_s

    samples = [(0.0, 1), (1.0, 1), (2.0, 3), (3.0, 3), (4.0, 3), (5.0, 2)]
    starting = [(0.0, 0), (1.0, 0), (2.0, 2), (3.0, 2), (4.0, 0), (5.0, 0)]
    assert mean_start_s(samples, starting) == 2.0
    assert mean_start_s(samples[:2], starting[:2]) is None  # none added


def test_a_preemption_phase_counts_failures_and_the_windowed_recovery():
    """benchmarks._deploy_tiers: requests around a loss at t=4 s; the windows after it whose p99
    is over the SLO (a failed request counts as far over) end 2 s after the loss."""
    import numpy as np

    from benchmarks._deploy_tiers import SLO_MS, phase_outcome

    expected = [np.array([[0.2, 0.8]])]
    ok = {"status": 200, "i": 0, "proba": np.array([[0.2, 0.8]])}
    log = [{**ok, "at": t, "ms": 20.0} for t in np.arange(0.0, 4.0, 0.1)]
    log += [{**ok, "at": 4.2, "ms": SLO_MS * 3}, {"i": 0, "at": 5.5, "error": "ClientOSError"}]
    log += [{**ok, "at": t, "ms": 25.0} for t in np.arange(6.0, 9.0, 0.1)]
    log += [{**ok, "at": 7.05, "ms": 30.0, "proba": np.array([[0.7, 0.3]])}]
    out = phase_outcome(log, 4.0, expected)
    assert out["failed"] == 1 and out["wrong"] == 1 and out["failures"] == ["ClientOSError"]
    assert out["recovery_s"] == 2.0 and out["p99_ms_before"] == 20.0
    assert phase_outcome([x for x in log if x["at"] < 4.0], 4.0, expected)["recovery_s"] == 0.0


def test_the_tail_benchmark_reads_the_ingress_gc_pauses_from_metrics_text():
    from benchmarks.single_row_tail import gc_pauses

    text = "\n".join([
        'willump_gc_pause_seconds_count{app="tail",generation="1"} 20.0',
        'willump_gc_pause_seconds_sum{app="tail",generation="1"} 0.0047',
        'willump_gc_pause_seconds_count{app="tail",generation="2"} 1.0',
        'willump_gc_pause_seconds_sum{app="tail",generation="2"} 0.0008',
        'willump_gc_pause_seconds_count{app="other",generation="2"} 9.0',
        'willump_gc_pause_seconds_bucket{app="tail",generation="2",le="0.001"} 1.0',
    ])
    assert gc_pauses(text, "tail") == {"1": {"passes": 20.0, "seconds": 0.0047}, "2": {"passes": 1.0, "seconds": 0.0008}}
    assert gc_pauses("", "tail") == {}


def test_agent_idle_refuses_bad_arguments():
    from benchmarks import agent_idle

    for bad in (["--apps", "0"], ["--ingress-replicas", "0"], ["--seconds", "0"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            agent_idle.main(bad)
