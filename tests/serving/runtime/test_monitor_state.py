"""The served monitor's default state directory (serving.runtime.monitor_state), without Ray:
a replica that replaces another (a hand-over, a restart) recovers the window, the reference and
the served rows awaiting labels; it waits for the directory its predecessor still holds; stale
directories of the app go, a held one stays; shutdown removes it."""

from __future__ import annotations

import asyncio
import threading
import time

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
    closer = threading.Timer(0.6, old.__del__)  # the old replica finishes stopping a moment later
    closer.start()
    t = time.monotonic()
    new = stage()
    assert time.monotonic() - t >= 0.5
    assert label(new, "req-before")["accepted"] == 1
    new.__del__()


def test_waiting_for_a_held_directory_ends():
    from drift import StateError

    old = stage()
    with pytest.raises(StateError, match="in use"):
        monitor_state.open_when_free(lambda: stage(), wait_s=0.3, poll_s=0.05)
    old.__del__()


def test_stale_directories_of_the_app_go_and_held_ones_stay():
    held = stage(token="aaaaaaaa")  # another replica of the app still holds its directory
    stale = monitor_state.default_directory("toxic", "bbbbbbbb")
    stale.mkdir(parents=True)
    (stale / "monitor.db").write_text("old")
    other_app = monitor_state.default_directory("spam", "cccccccc")
    other_app.mkdir(parents=True)
    new = stage(token="dddddddd")
    assert not stale.exists() and held.default_state.exists() and other_app.exists()
    assert asyncio.run(new.discard_state()) == {"discarded": True} and not new.default_state.exists()
    held.__del__()


def test_a_token_names_a_folder_and_nothing_else():
    for bad in ("../../etc", "ABCDEF12", "short", ""):
        with pytest.raises(ValueError, match="token"):
            monitor_state.default_directory("toxic", bad)
    assert monitor_state.default_directory("a/b c", "0123abcd").parent.name == "a_b_c"
    outside = monitor_state.root().parent / "elsewhere"
    outside.mkdir()
    monitor_state.discard(outside)  # never a directory outside the root
    assert outside.exists()
