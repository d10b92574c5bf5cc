"""An ingress replica adopts the plan deploy refined after its in-situ probe (serving.core.plan_board):
once, only the one published for its own deploy's probe token, and it stops looking once adopted
or once its watch ran out. The key-value round trip on a real Ray is in
tests/serving/launch/test_api.py."""

from __future__ import annotations

import pytest

import serving.core.plan_board as board


@pytest.fixture
def published(monkeypatch):
    """The store, a dict; counts the reads."""
    store: dict[str, dict] = {}
    reads = []

    def read(app, probe_sha256):
        reads.append(app)
        entry = store.get(app)
        return entry["plan"] if entry and entry["probe_sha256"] == probe_sha256 and probe_sha256 else None

    monkeypatch.setattr(board, "published_plan", read)
    return store, reads


def test_a_replica_adopts_its_deploys_plan_once(published):
    store, reads = published
    adopted = []
    adoption = board.PlanAdoption("app", "h1", adopted.append)
    assert adoption.pending and not adoption.check() and adopted == []  # not published yet
    store["app"] = {"probe_sha256": "h0", "plan": {"v": 0}}  # an earlier deploy's entry
    assert not adoption.check() and adopted == []
    store["app"] = {"probe_sha256": "h1", "plan": {"v": 1}}
    assert adoption.check() and adopted == [{"v": 1}]
    reads.clear()
    assert not adoption.pending and not adoption.check() and reads == []  # never reads again


def test_no_probe_token_no_reads_and_the_watch_ends(published, monkeypatch):
    _, reads = published
    assert not board.PlanAdoption("app", None, print).pending
    clock = [100.0]
    monkeypatch.setattr(board.time, "monotonic", lambda: clock[0])
    adoption = board.PlanAdoption("app", "h1", print, watch_s=5.0)
    assert adoption.pending
    clock[0] += 6.0
    assert not adoption.pending and not adoption.check() and reads == []


def test_publishing_needs_the_token():
    with pytest.raises(ValueError, match="probe_sha256"):
        board.publish_plan("app", "", {})


def test_the_watcher_adopts_without_a_request_and_a_failed_read_is_tried_again(monkeypatch):
    """A replica nobody asks for its plan still adopts it (its watcher thread), and a read that
    fails (the GCS away for a moment) is logged and tried again, not raised."""
    import threading

    answers = iter([RuntimeError("GCS unavailable"), None, {"v": 2}])

    def read(app, probe_sha256):
        answer = next(answers, {"v": 2})
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(board, "published_plan", read)
    adopted = threading.Event()
    plans = []

    def adopt(plan):
        plans.append(plan)
        adopted.set()

    adoption = board.PlanAdoption("app", "h1", adopt, poll_s=0.01)
    adoption.start()
    try:
        assert adopted.wait(30.0), "the watcher never adopted the plan"
    finally:
        adoption.stop()
    assert plans == [{"v": 2}] and not adoption.pending


def test_one_look_at_a_time(monkeypatch):
    """A route's look while the watcher's is in flight returns at once (no second read)."""
    import threading

    release, reads = threading.Event(), []

    def read(app, probe_sha256):
        reads.append(app)
        release.wait(30.0)
        return None

    monkeypatch.setattr(board, "published_plan", read)
    adoption = board.PlanAdoption("app", "h1", print)
    looking = threading.Thread(target=adoption.check)
    looking.start()
    while not reads:
        release.wait(0.01)
    assert adoption.check() is False and len(reads) == 1
    release.set()
    looking.join(30.0)
