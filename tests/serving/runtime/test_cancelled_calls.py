"""A stage call the ingress cancels (its copy answered, its deadline passed) is no answer from its
replica: the capacity router books its end as withdrawn, so a frozen replica stays silent and its
bound does not stretch. Serve's private names the notes read are checked against Serve here."""

from __future__ import annotations

import asyncio
import collections
import types

import pytest

from serving.runtime import cancelled_calls
from serving.runtime.routing import CapacityPolicy, CapacityRouter, ReplicaView


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def _no_notes(monkeypatch):
    monkeypatch.setattr(cancelled_calls, "_notes", {})


def _response(request_id: str, actor: str | None = None):
    """Looks like Serve's DeploymentResponse: its metadata, its replica's result once sent."""
    result = None if actor is None else types.SimpleNamespace(_actor_id=types.SimpleNamespace(hex=lambda: actor))
    return types.SimpleNamespace(_request_metadata=types.SimpleNamespace(internal_request_id=request_id),
                                 _replica_result=result)


def test_serves_response_holds_the_names_the_notes_read():
    """The request id and the replica's actor as Serve's own classes keep them (private names:
    this fails when a Ray upgrade renames them)."""
    import ray
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.replica_result import gRPCReplicaResult
    from ray.serve.handle import DeploymentResponse

    class _Call:  # a gRPC call: only what the result's constructor touches
        def add_done_callback(self, callback):
            pass

    loop = asyncio.new_event_loop()
    try:
        meta = RequestMetadata(request_id="http-1", internal_request_id="internal-1")
        response = DeploymentResponse(loop.create_future(), meta, _is_router_running_in_separate_loop=False)
        assert (cancelled_calls.request_id(response), cancelled_calls.actor(response)) == ("internal-1", None)
        actor_id = ray.ActorID.from_random()
        response._replica_result = gRPCReplicaResult(_Call(), meta, actor_id, loop=loop)
        assert cancelled_calls.actor(response) == actor_id.hex()
    finally:
        loop.close()
    from ray.serve._private.request_router.replica_wrapper import RunningReplica

    assert isinstance(getattr(RunningReplica, "actor_id", None), property), "the router maps replicas to actors"


def test_a_sent_call_is_known_by_its_replica_and_an_unsent_one_by_the_copy_that_answered():
    cancelled_calls.note(_response("r1", "frozen"))
    assert not cancelled_calls.take("r1", "live"), "another replica's end of the same request is an answer"
    assert cancelled_calls.take("r1", "frozen") and not cancelled_calls.take("r1", "frozen"), "used once"
    # not accepted yet by its replica (a frozen one never does): any end but the copy's
    cancelled_calls.note(_response("r2"), answered_by=_response("r2", "copy"))
    assert not cancelled_calls.take("r2", "copy")
    assert cancelled_calls.take("r2", "frozen")
    cancelled_calls.note(_response("r3"))  # no copy (a deadline): the request's next end
    assert cancelled_calls.take("r3", "any")
    assert not cancelled_calls.take("unknown", "frozen")
    pooled = types.SimpleNamespace(response=_response("r4", "a"), pool="spot")  # a node pool's wrapper
    cancelled_calls.note(pooled)
    assert cancelled_calls.take("r4", "a")
    cancelled_calls.note(object())  # not Serve's: nothing noted
    assert cancelled_calls._notes == {}


def test_notes_are_bounded(monkeypatch):
    monkeypatch.setattr(cancelled_calls, "MAX_NOTES", 3)
    monkeypatch.setattr(cancelled_calls, "MAX_PER_REQUEST", 2)
    for i in range(5):
        cancelled_calls.note(_response(f"r{i}", "a"))
    assert list(cancelled_calls._notes) == ["r2", "r3", "r4"]
    for actor in ("a", "b", "c"):
        cancelled_calls.note(_response("r4", actor))
    assert [n.actor for n in cancelled_calls._notes["r4"]] == ["b", "c"]


def test_the_router_books_a_cancelled_calls_end_as_no_answer():
    """A replica frozen with a call: the ingress copies it past the bound and cancels it when the
    copy answers. Over gRPC the cancel ends the call at the router at once; booked as an answer it
    made the replica look alive and stretched its bound (the flaky silent-replica test)."""
    clock = _Clock()
    router = CapacityRouter.__new__(CapacityRouter)  # Serve's adapter without Serve's state
    router.policy = CapacityPolicy(lost_after_s=2.0, lost_over_service=5.0, clock=clock)
    replica_id = collections.namedtuple("ReplicaID", "unique_id")  # Serve's ReplicaID, as the router reads it
    frozen, live = replica_id("f"), replica_id("l")
    router.actors = {frozen: "actor-f", live: "actor-l"}
    policy = router.policy
    for _ in range(10):  # both answer every 0.05 s
        for r in ("f", "l"):
            policy.routed(r)
        clock.t += 0.05
        for replica in (frozen, live):
            router.on_request_completed(replica, "earlier")
    bound = policy.bound_s("f")
    policy.routed("f")  # the call that never comes back
    clock.t += 2.1
    assert policy.silent("f")
    policy.routed("l")  # its copy answers, then the first is cancelled
    first, copy = _response("req", None), _response("req", "actor-l")
    from serving.runtime.calls import _cancel

    pending = asyncio.new_event_loop()
    try:
        task = pending.create_future()
        first.cancel = lambda: None
        _cancel(first, task, answered_by=copy)
    finally:
        pending.close()
    router.on_request_completed(live, "req")  # the copy's answer: an answer
    router.on_request_completed(frozen, "req")  # the cancelled call's end: no answer
    assert policy.outstanding == {"f": 0, "l": 0}
    assert policy.bound_s("f") == pytest.approx(bound), "the frozen replica's bound did not stretch"
    # holding no call now, it stays suspect until it answers: new calls go elsewhere
    assert policy.suspect("f") and "f" not in policy.rank([ReplicaView("f", 0, 500.0), ReplicaView("l", 1, 100.0)])[0]
    policy.routed("f")  # the next call sent there is silent after one bound, not after the freeze
    clock.t += 2.1
    assert policy.silent("f") and policy.any_silent()
    policy.completed("f")  # it woke and answered
    assert not policy.suspect("f") and not policy.muted
    # what a cancelled call's end did when booked as an answer
    before = CapacityPolicy(lost_after_s=2.0, lost_over_service=5.0, clock=clock)
    before.answered_at["f"], before.gap["f"] = clock.t, 0.05
    before.routed("f")
    clock.t += 2.1  # held past the bound, then cancelled
    before.completed("f")
    before.routed("f")
    clock.t += 2.1
    assert before.bound_s("f") > 2.0 and not before.silent("f")


def test_a_finished_call_leaves_no_note():
    from serving.runtime.calls import _cancel

    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        done.set_result(1)
        response = _response("r", "a")
        response.cancel = lambda: None
        _cancel(response, done)
    finally:
        loop.close()
    assert cancelled_calls._notes == {}
