"""The served monitor's default state directory (serving.runtime.monitor_state), without Ray:
a replica that replaces another (a hand-over, a restart) recovers the window, the reference and
the served rows awaiting labels; it waits for the directory its predecessor still holds; stale
directories of the app go, a held one stays; shutdown removes it."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pandas as pd
import pytest

from serving.runtime import monitor_state
from serving.runtime.records import record_columns
from serving.runtime.replicas import MonitorStage


@pytest.fixture(autouse=True)
def private_root(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor_state, "root", lambda: tmp_path / "states")


LABELS = {"classes": ["neg", "pos"], "certified": [{"max_loss": 0.02, "baseline_score": 0.9}],
          "segments": ["client"], "metric": "accuracy", "confidence": 0.95}


def stage(token: str = "00c0ffee", app: str = "toxic"):
    return MonitorStage.func_or_class({"attributes": ["client"], "metrics": ["latency_ms"]}, None, None, LABELS,
                                      {"app": app, "token": token})


def serve_rows(monitor, rid: str) -> None:
    frame = pd.DataFrame({"x": np.arange(4.0)})
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    columns = record_columns(frame, proba, np.zeros(4, int), np.full(4, "r", dtype=object), 3.0, 1e9, "v1",
                             {"client": "a"}, {"request_attributes": ["client"]}, request_id=rid)
    asyncio.run(monitor.ingest(pd.DataFrame(columns)))


def label(monitor, rid: str) -> dict:
    return asyncio.run(monitor.labels({"labels": [{"request_id": rid, "row": 0, "label": "neg"}]}))


def test_the_replica_that_replaces_a_monitor_recovers_its_state():
    old = stage()
    serve_rows(old, "req-before")
    assert old.state_token() == "00c0ffee"
    old.__del__()  # what Serve calls as the old replica stops
    new = stage()
    assert label(new, "req-before") == {"status": 200, "accepted": 1, "unknown": 0, "duplicate": 0}
    assert new.monitor.stats()["rows_ingested"] == 4
    new.__del__()
    other = stage(token="0badcafe")  # a new app of the same name starts afresh
    assert label(other, "req-before")["unknown"] == 1
    other.__del__()


def test_a_user_directory_is_the_users(tmp_path):
    mine = tmp_path / "mine"
    kept = MonitorStage.func_or_class({"attributes": ["client"], "metrics": ["latency_ms"], "directory": str(mine)},
                                      None, None, LABELS, {"app": "toxic", "token": "00c0ffee"})
    assert kept.state_token() is None and kept.monitor.directory == str(mine)
    assert asyncio.run(kept.discard_state()) == {"discarded": False} and mine.exists()


def test_the_new_replica_waits_while_the_old_one_still_holds_the_directory():
    old = stage()
    serve_rows(old, "req-before")
    released = threading.Event()

    def stop_old() -> None:  # the old replica finishes stopping a moment later
        old.__del__()
        released.set()

    threading.Timer(0.6, stop_old).start()
    new = stage()
    assert released.is_set()  # the new replica opened the directory only once the old let go
    assert label(new, "req-before")["accepted"] == 1
    new.__del__()


def test_waiting_for_a_held_directory_ends():
    from drift import StateError

    old = stage()
    with pytest.raises(StateError, match="in use"):
        monitor_state.open_when_free(lambda: stage(), wait_s=0.3, poll_s=0.05)
    old.__del__()


def test_stale_directories_of_the_app_go_and_held_ones_stay(monkeypatch):
    import os

    held = stage(token="aaaaaaaa")  # another replica of the app still holds its directory
    stale = monitor_state.default_directory("toxic", "bbbbbbbb")
    stale.mkdir(parents=True)
    (stale / "monitor.db").write_text("old")
    recent = monitor_state.default_directory("spam", "cccccccc")  # another app's, recent: kept
    old_other = monitor_state.default_directory("flights", "dddddddd")  # another app's, untouched a week
    for folder in (recent, old_other):
        folder.mkdir(parents=True)
    week = monitor_state.STALE_AFTER_S + 60
    os.utime(old_other, (os.path.getatime(old_other) - week, os.path.getmtime(old_other) - week))
    new = stage(token="eeeeeeee")
    assert not stale.exists() and held.default_state.exists() and recent.exists() and not old_other.exists()
    assert asyncio.run(new.discard_state()) == {"discarded": True} and not new.default_state.exists()
    held.__del__()


def test_a_changed_monitor_configuration_starts_afresh_instead_of_failing():
    old = stage()
    serve_rows(old, "req-before")
    old.__del__()
    changed = MonitorStage.func_or_class({"attributes": ["client", "gear"], "metrics": ["latency_ms"]}, None, None,
                                         LABELS, {"app": "toxic", "token": "00c0ffee"})
    assert changed.default_state is not None and changed.monitor.stats()["rows_ingested"] == 0
    assert label(changed, "req-before")["unknown"] == 1
    changed.__del__()


def test_memory_when_asked_or_when_the_root_is_not_private(tmp_path, monkeypatch):
    memory = MonitorStage.func_or_class({"attributes": ["client"], "metrics": ["latency_ms"], "directory": False},
                                        None, None, LABELS, {"app": "toxic", "token": "00c0ffee"})
    assert memory.default_state is None and memory.monitor.directory is None
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setattr(monitor_state, "root", lambda: shared)
    unsafe = stage()
    assert unsafe.default_state is None and unsafe.monitor.directory is None
    readable = tmp_path / "readable"  # this user's, nobody else writes there: made private and used
    readable.mkdir()
    readable.chmod(0o755)
    monkeypatch.setattr(monitor_state, "root", lambda: readable)
    kept = stage(app="other")
    assert kept.default_state is not None and (readable.stat().st_mode & 0o777) == 0o700
    kept.__del__()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere-private", target_is_directory=True)
    (tmp_path / "elsewhere-private").mkdir(mode=0o700)
    monkeypatch.setattr(monitor_state, "root", lambda: link)
    assert stage().monitor.directory is None


def test_a_token_and_an_app_name_never_escape_the_root():
    for bad in ("../../etc", "ABCDEF12", "short", ""):
        with pytest.raises(ValueError, match="token"):
            monitor_state.default_directory("toxic", bad)
    names = {monitor_state.default_directory(app, "0123abcd").parent.name for app in (".", "..", "a/b", "a b", "a_b")}
    assert len(names) == 5 and all(len(n) == 24 and n.isalnum() for n in names)
    for app in (".", ".."):
        assert monitor_state.root() in monitor_state.default_directory(app, "0123abcd").parents
    monitor_state.private_root()
    outside = monitor_state.root().parent / "elsewhere"
    outside.mkdir()
    monitor_state.discard(outside)  # never a directory outside the root
    monitor_state.discard(monitor_state.root() / ".." / "elsewhere")
    assert outside.exists()
