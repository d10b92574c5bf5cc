"""Routing in deploy's own apps on two raylets of this machine, the worker an emulated device
three times slower (the node label ``willump.io/emulated-slowdown``): the capacity router
(serving.runtime.routing) gives the slower replica fewer rows, and a preemption notice
(Ray's DrainNode with a deadline) moves every replica off the worker with no request lost.

Outcomes, not rates: shares of rows and counts of failures, whatever the machine's speed.
"""

from __future__ import annotations

import os
import time

import pytest
import requests

from serving import deploy
from serving.launch.config import plan_offline
from serving.runtime.emulated_node import MS_PER_ROW_LABEL, SLOWDOWN_LABEL
from tests.serving.conftest import (
    free_port,
    replica_nodes,
    request_batches,
    two_raylets,
    under_load,
    wait_for,
)

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

CLIENTS = 4
ROWS_PER_REQUEST = 16
SLOWDOWN = 3


#: the node label that names each raylet's pool (deploy(pools=...))
POOL_LABEL = "willump.io/pool"


@pytest.fixture(scope="module")
def cluster():
    # the pools test's expensive stage on the worker: also a device of a fixed 1 ms a row (its rate measured
    # there does not move with this machine's load, against the head's compute alone)
    yield from two_raylets({SLOWDOWN_LABEL: str(SLOWDOWN), POOL_LABEL: "worker", f"{MS_PER_ROW_LABEL}-expensive": "1"},
                           head_labels={POOL_LABEL: "head"})


@pytest.fixture(scope="module")
def app(cluster, synth_opt):
    c, _ = cluster
    plan = plan_offline(synth_opt, cpus=4, rows_per_request=32, rps=None, p99_ms=None, layout="staged",
                        monitor=None)
    plan.ingress_replicas, plan.ingress_cpus = 1, 0.3
    plan.stage("cheap").replicas, plan.stage("cheap").num_cpus = 2, 0.3  # Serve spreads them over both nodes
    plan.stage("expensive").replicas, plan.stage("expensive").num_cpus = 1, 0.3
    served = deploy(synth_opt, name="pools", port=free_port(), address=c.address, plan=plan,
                    artifact_share="object_store", ship_code="always", insitu="never")
    yield served
    served.shutdown(stop_ray=False)


def _replica_infos(deployment: str, want: set[str] | None = None, calls: int = 20,
                   rounds: int = 40) -> dict[str, dict]:
    """Every replica's info, or those in ``want``: rounds of concurrent calls, until each has
    answered one. The capacity router sends a call where it expects the shortest wait, so once
    the replicas report unequal capacity, a round reaches the slower one only while the faster
    holds enough of the round's calls (after the load, ten rounds of 16 calls once reached only
    the faster replica). ``calls`` stays under the stage's queue bound (24: Serve refuses more)."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, "pools")
    out: dict[str, dict] = {}
    for _ in range(rounds):
        for info in [r.result() for r in [handle.info.remote() for _ in range(calls)]]:
            out[info["replica"]] = info
        if (want is None and len(out) >= 2) or (want is not None and want <= set(out)):
            break
        time.sleep(0.25)
    if want is not None:
        assert want <= set(out), f"replicas {sorted(want - set(out))} answered none of {rounds} rounds of {calls} calls"
    return out


def _under_load(app, synth_opt, request_rows, until, timeout: float, message: str) -> list:
    batches, expected = request_batches(synth_opt, request_rows, ROWS_PER_REQUEST)
    with under_load(app.url + "/predict", batches, expected, CLIENTS) as results:
        until(results, timeout, message)
    return results


def test_the_slower_replica_gets_fewer_rows(cluster, app, synth_opt, request_rows):
    """The capacity router gives the replica on the slower node fewer rows. Its rows are read
    from the replica when it answers a round of info calls; once the router has learnt its
    capacity it may answer none (twice in loaded suite runs, 40 rounds of 20 calls all went to
    the faster one), and then they are the load's rows less the faster replica's: every
    answered request sent ROWS_PER_REQUEST rows through the cheap stage, none failed."""
    worker = cluster[1]
    infos = _replica_infos("pools-cheap")
    assert {i["node_id"] for i in infos.values()} == {worker.node_id, cluster[0].head_node.node_id}, infos
    before = {k: v["rows"] for k, v in infos.items()}
    role = {k: ("slow" if v["node_id"] == worker.node_id else "fast") for k, v in infos.items()}
    slowdown = {role[k]: v["emulated"]["slowdown"] for k, v in infos.items()}
    assert slowdown == {"slow": SLOWDOWN, "fast": 1.0}
    fast = next(k for k, r in role.items() if r == "fast")

    def answered(results, timeout, message):
        wait_for(lambda: sum(r[1] == 200 for r in results) >= 120, timeout=timeout, message=message)

    results = _under_load(app, synth_opt, request_rows, answered, 180, "120 answers")
    assert all(r[2] for r in results if r[1] == 200) and all(r[1] == 200 for r in results), \
        sorted({r[1] for r in results})
    after = _replica_infos("pools-cheap", want={fast})
    rows = {role[k]: v["rows"] - before[k] for k, v in after.items()}
    if "slow" not in rows:
        rows["slow"] = ROWS_PER_REQUEST * len(results) - rows["fast"]
    print(f"rows per replica {rows}; reported rows/s {[v['rows_per_s'] for v in after.values()]}")
    # Serve's default router gives replicas with short queues about equal shares; by capacity
    # the replica three times as fast takes most of them
    assert rows["fast"] > 1.5 * rows["slow"], rows


def test_a_stage_on_two_node_pools(cluster, synth_opt, request_rows):
    """deploy(pools=...): the expensive stage's replica is timed on each pool (the worker's is an
    emulated device of 1 ms a row), the LP's replicas are one deployment per pool pinned to
    its node, and the ingress sends most of the stage's rows to the faster pool; every answer
    equals the pipeline's in process."""
    c, worker = cluster
    head = c.head_node.node_id
    plan = plan_offline(synth_opt, cpus=4, rows_per_request=32, rps=None, p99_ms=None, layout="fused", monitor=None)
    plan.ingress_replicas, plan.ingress_cpus = 1, 0.3
    plan.stage("expensive").num_cpus = 0.3
    # the worker's pool preemptible: a tier plan, whose head replica must hold the rate alone
    pools = {"head": {"labels": {POOL_LABEL: "head"}, "max_replicas": 1},
             "worker": {"labels": {POOL_LABEL: "worker"}, "max_replicas": 1, "preemptible": True}}
    from serving.launch.deploy import _serve_running

    serve_was_running = _serve_running()
    served = deploy(synth_opt, name="pooled", port=free_port(), address=c.address, plan=plan, pools=pools,
                    artifact_share="object_store", ship_code="always", insitu="never")
    try:
        entry = served.plan.pools
        rates = entry["rates"]["expensive"]
        print(f"rows/s of one expensive replica measured per pool: {rates}; replicas {entry['replicas']}")
        assert entry["replicas"] == {"expensive": {"head": 1, "worker": 1}}
        # what the plan holds with the worker's pool lost: the head's replica alone
        assert 0 < entry["after_loss_rows_s"]["worker"] < entry["predicted_rows_s"]
        assert entry["specs"]["worker"]["preemptible"] and any("a tier plan" in n for n in served.plan.notes)
        # the HTTP fronts stay off the preemptible pool: Serve started here runs them on the head
        # only; one already running (this module's first app started it) is named in a note
        from ray import serve

        if serve_was_running:
            assert any("proxy_location='HeadOnly'" in n for n in served.notes), served.notes
        else:
            assert set(serve.status().proxies) == {head}, serve.status().proxies
        assert rates["head"] > rates["worker"], rates  # the worker's device: at most 1,000 rows/s
        # and so does the ingress: its replicas run off the preemptible pool (a label selector)
        assert entry["request_path"] == {"label_selector": {POOL_LABEL: "!worker"}, "off_pools": ["worker"]}
        assert replica_nodes("pooled") == {"pooled-ingress": {head},
                                           "pooled-expensive-head": {head},
                                           "pooled-expensive-worker": {worker.node_id}}

        def answered(results, timeout, message):
            wait_for(lambda: sum(r[1] == 200 for r in results) >= 60, timeout=timeout, message=message)

        results = _under_load(served, synth_opt, request_rows, answered, 180, "60 answers")
        assert all(r[1] == 200 and r[2] for r in results), sorted({r[1] for r in results})
        from ray import serve

        rows = {pool: serve.get_deployment_handle(f"pooled-expensive-{pool}", "pooled").info.remote().result()["rows"]
                for pool in ("head", "worker")}
        print(f"rows answered by each pool's replica under load: {rows}")
        assert rows["head"] > rows["worker"], rows
        wait_for(lambda: any(line.startswith("willump_stage_pool_calls") and 'pool="head"' in line
                             for line in requests.get(served.url + "/metrics", timeout=30).text.splitlines()),
                 timeout=60, interval=1.0, message="the calls per pool in /metrics")
        health = requests.get(served.url + "/readyz", timeout=30).json()
        assert health["status"] == "ready" and set(health["stages"]["expensive"]["pools"]) == {"head", "worker"}, health
    finally:
        served.shutdown(stop_ray=False)


def test_bad_pools_are_refused_by_name(synth_opt):
    with pytest.raises(ValueError, match="drop min_replicas"):
        deploy(synth_opt, name="refused", pools={"a": {"labels": {"p": "a"}}, "b": {"labels": {"p": "b"}}},
               min_replicas=1)
    with pytest.raises(ValueError, match=r"pools\['b'\] names no labels and no resources"):
        deploy(synth_opt, name="refused", pools={"a": {"labels": {"p": "a"}}, "b": {}})
    with pytest.raises(ValueError, match="layout='whole' runs every level in the ingress"):
        deploy(synth_opt, name="refused", pools={"a": {"labels": {"p": "a"}}, "b": {"labels": {"p": "b"}}},
               layout="whole")


#: seconds the silent replica stays frozen: longer than a request may take while it is (below),
#: so a call left on it, without the bound, would fail the test
FREEZE_S = 12.0
#: the longest a request may take while a replica is frozen: the bound (2 s) and the copy's own
#: time, with room for a loaded machine; well under FREEZE_S
FROZEN_SLOWEST_S = 9.0


def test_a_silent_replica_costs_one_bound(cluster, app, synth_opt, request_rows):
    """A replica frozen for FREEZE_S without anyone saying so (SIGSTOP: alive to Ray, answering
    nothing): calls it holds are copied to the other replica after the bound
    (serving.runtime.hedge.LOST_AFTER_S) and the router ranks it last, so every request is
    answered, none waits for the replica to wake, and the copies are counted in /metrics.
    Deployed with lost_after_s=None the same test fails (no copy is ever counted)."""
    import signal

    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    alive = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000, detail=True)
    actors = [a for a in alive if a.class_name == "ServeReplica:pools:pools-cheap"]
    assert len(actors) == 2, actors
    head = cluster[0].head_node.node_id
    frozen = next(a for a in actors if a.node_id == head)  # the faster one: it holds most calls
    # the processes that must go on answering while it is frozen: their CPU over the freeze tells a
    # machine too loaded to run them (other suite workers) from calls left waiting on the frozen one
    others = {f"{a.class_name.rsplit(':', 1)[1]}{'' if a.node_id == head else '@worker'} {a.pid}": a.pid
              for a in alive if a.class_name.startswith("ServeReplica:pools:") and a.pid != frozen.pid}
    state: dict = {}

    def rescued() -> float:
        text = requests.get(app.url + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("willump_stage_rescues") and 'stage="cheap"' in line)

    before = rescued()  # the counter is the module's app's: copies from earlier tests count there too

    def freeze(results, timeout, message):
        wait_for(lambda: sum(r[1] == 200 for r in results) >= 10, timeout=timeout, message="answers before")
        os.kill(frozen.pid, signal.SIGSTOP)
        state["t"] = time.perf_counter()
        cpu_before = {name: _cpu_s(pid) for name, pid in others.items()}
        try:
            time.sleep(FREEZE_S)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            state["end"] = time.perf_counter()
            state["cpu"] = {name: round(_cpu_s(pid) - cpu_before[name], 2) for name, pid in others.items()}

    results = _under_load(app, synth_opt, request_rows, freeze, 180, "")
    failed = [r for r in results if r[1] != 200 or not r[2]]
    assert not failed, sorted({r[1] for r in failed})
    # requests started while the replica was frozen (answered at t, after `seconds`)
    frozen_for = [r for r in results if state["t"] <= r[0] - r[3] < state["end"]]
    load = f"CPU s the app's other replicas got meanwhile {state['cpu']}, load average {os.getloadavg()[0]:.1f}"
    assert frozen_for, (f"no request started in the {FREEZE_S:g} s the replica was frozen: every client waited "
                        f"throughout (no call was copied at the bound); {load}")
    slowest = max(r[3] for r in frozen_for)
    answered = sum(1 for r in results if state["t"] <= r[0] < state["end"])

    wait_for(lambda: rescued() > before, timeout=60, interval=1.0, message="the copies at the bound in /metrics")
    print(f"frozen replica {FREEZE_S:g} s: {len(results)} requests, 0 failed, {answered} answered while frozen, "
          f"slowest started then {slowest:.2f} s, {rescued() - before:g} calls copied at the bound; {load}")
    # a call left on the frozen replica would wait until it woke (FREEZE_S) or for the request's
    # deadline; copied at the bound (2 s), it is answered within a few seconds
    assert answered >= 20, (answered, load)
    assert slowest < FROZEN_SLOWEST_S, (slowest, load)


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (Linux /proc; 0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def test_a_preemption_notice_loses_no_request(cluster, app, synth_opt, request_rows):
    import ray

    from serving.runtime.routing import draining_nodes

    c, worker = cluster
    head = c.head_node.node_id
    state: dict = {}

    def drained(results, timeout, message):
        from ray.core.generated import autoscaler_pb2

        wait_for(lambda: sum(r[1] == 200 for r in results) >= 20, timeout=timeout, message="answers before")
        client = ray._private.worker.global_worker.gcs_client
        accepted, why = client.drain_node(worker.node_id, autoscaler_pb2.DrainNodeReason.Value(
            "DRAIN_NODE_REASON_PREEMPTION"), "a test's preemption notice", int(time.time() * 1000) + 120_000)
        assert accepted, why
        state["t"] = time.perf_counter()
        assert worker.node_id in draining_nodes()
        wait_for(lambda: all(nodes == {head} for nodes in replica_nodes("pools").values()),
                 timeout=timeout, message="every replica moved to the head")
        wait_for(lambda: sum(r[0] > time.perf_counter() - 1 and r[1] == 200 for r in results) >= 1 and
                 sum(r[0] > state["t"] and r[1] == 200 for r in results) >= 40, timeout=timeout,
                 message="answers after the move")

    results = _under_load(app, synth_opt, request_rows, drained, 180, "")
    failed = [r for r in results if r[1] != 200 or not r[2]]
    print(f"drain on notice: {len(results)} requests, {len(failed)} failed or wrong")
    assert not failed, sorted({r[1] for r in failed})

