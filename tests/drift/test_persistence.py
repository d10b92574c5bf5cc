"""State survives a killed process: nothing acknowledged is lost, queries answer the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from drift import Monitor, StateError

from ._helpers import MONITOR_ARGS, T0, records
from ._persist_child import ROWS, batch, make

REPO = Path(__file__).resolve().parents[2]


def _run_and_kill(directory: Path, durability: str, kill_after: int) -> list[str]:
    """Start the child, SIGKILL it right after it acknowledged batch `kill_after`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.drift._persist_child", str(directory), durability],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith(f"ACK {kill_after} "):
            proc.send_signal(signal.SIGKILL)  # mid-stream: the child is already ingesting more
            break
    proc.wait(timeout=60)
    lines += [ln.strip() for ln in proc.stdout.read().splitlines()]
    assert proc.returncode == -signal.SIGKILL
    return lines


def _answers(mon: Monitor) -> list:
    return [
        mon.explain(metric="latency_ms").to_dict(),
        mon.explain(classifier="latency_ms > 40").to_dict(),
        mon.mix_shift().to_dict(),
        mon.drift().to_dict(),
        mon.change_points().to_dict(),
        mon.series().to_json(date_format="iso"),
    ]


def test_batch_durability_survives_kill(tmp_path: Path) -> None:
    lines = _run_and_kill(tmp_path, "batch", kill_after=37)
    acked = [int(ln.split()[1]) for ln in lines if ln.startswith("ACK")]
    last = max(acked)
    assert last >= 37
    restored = make(str(tmp_path), "batch")
    rows = restored.stats()["rows_retained"] + restored.stats()["late_dropped"]
    # every acknowledged batch is there; the batch in flight at the kill may be too
    assert rows in (ROWS * (last + 1), ROWS * (last + 2))
    durable = rows // ROWS
    # a monitor that ingested exactly the durable batches, uninterrupted, answers the same
    with Monitor(**{**MONITOR_ARGS}, window_panes=4, detail_panes=3, rollup_panes=2,
                 retention_panes=30, reservoir_size=300, flagged_reservoir_size=200,
                 directory=tmp_path / "fresh", durability="batch") as fresh:
        fresh.set_reference(records(2000, 7, t0=T0 - 3600))
        for i in range(durable):
            fresh.ingest(batch(i))
        assert _answers(restored) == _answers(fresh)
    # the restored monitor keeps going
    restored.ingest(batch(durable))
    assert restored.stats()["rows_retained"] == ROWS * (durable + 1)
    restored.close()


def test_pane_durability_keeps_closed_panes(tmp_path: Path) -> None:
    lines = _run_and_kill(tmp_path, "pane", kill_after=40)
    acks = [ln.split() for ln in lines if ln.startswith("ACK")]
    through = float(acks[-1][3])  # durable_through of the last acknowledged batch
    restored = make(str(tmp_path), "pane")
    stats = restored.stats()
    # the last commit may come from a batch after the last ACK read (the child kept going)
    durable = float(pd.Timestamp(stats["durable_through"]).timestamp())
    assert durable >= through
    # exactly the rows before durable_through (batches are in time order, so later batches
    # hold none): none lost, none counted twice
    expected = sum(int((batch(i).timestamp < durable).sum()) for i in range(len(acks) + 1))
    assert stats["rows_retained"] == expected
    promised = sum(int((batch(i).timestamp < through).sum()) for i in range(len(acks)))
    assert stats["rows_retained"] >= promised
    assert restored.explain(metric="latency_ms").rows  # the planted cause is in closed panes
    restored.close()


def test_flush_and_reopen_with_stored_config(tmp_path: Path) -> None:
    mon = make(str(tmp_path), "pane")
    mon.set_reference(records(1000, 7, t0=T0 - 3600))
    for i in range(4):
        mon.ingest(batch(i))
    mon.flush()
    before = _answers(mon)
    mon.close()
    with pytest.raises(StateError, match="closed"):
        mon.ingest(batch(5))
    again = Monitor.open(tmp_path)
    assert _answers(again) == before
    assert again.stats()["rows_retained"] == 4 * ROWS
    again.close()


def test_directory_is_locked_and_config_checked(tmp_path: Path) -> None:
    first = make(str(tmp_path), "pane")
    with pytest.raises(StateError, match="in use"):
        make(str(tmp_path), "pane")
    first.ingest(batch(0))
    first.close()
    with pytest.raises(StateError, match="window_panes"):
        Monitor(**MONITOR_ARGS, window_panes=9, directory=tmp_path)
    with pytest.raises(StateError, match="no monitor state"):
        Monitor.open(tmp_path / "empty")


def test_reopen_adopts_retention_but_refuses_a_different_meaning(tmp_path: Path) -> None:
    first = make(str(tmp_path), "pane")
    first.ingest(batch(0))
    first.close()
    args = dict(MONITOR_ARGS, window_panes=4, detail_panes=3, rollup_panes=2,
                reservoir_size=300, flagged_reservoir_size=200, directory=tmp_path)
    with Monitor(**args, retention_panes=90) as longer:  # how long to keep: adopted
        assert longer.stats()["rows_retained"] == ROWS
    with Monitor.open(tmp_path) as again:
        assert again.config.retention_panes == 90
    with pytest.raises(StateError, match="reservoir_size"):
        Monitor(**{**args, "reservoir_size": 301}, retention_panes=90)


def test_the_state_is_readable_by_its_owner_only(tmp_path):
    """The monitor's state holds attribute values (possibly personal data): the directory is
    created 0700 and the database files 0600, whatever the process's umask."""
    import stat

    old = os.umask(0o022)
    try:
        with Monitor(**MONITOR_ARGS, directory=tmp_path / "state", durability="batch") as monitor:
            monitor.ingest(records(200, 1))
            files = [p for p in (tmp_path / "state").iterdir() if p.is_file()]
            assert files
            assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
            assert all(mode & 0o077 == 0 for mode in modes.values()), modes
    finally:
        os.umask(old)


def test_a_batch_sent_again_under_its_id_is_ingested_once_across_a_restart(tmp_path: Path) -> None:
    """A sender that never heard back sends the batch again: the monitor skips an id it has,
    in memory and after a reopen (the ids ride with the saved state), and answers exactly as a
    monitor that got each batch once."""
    once = make(None, "pane")
    once.set_reference(records(1000, 7, t0=T0 - 3600))
    for i in range(3):
        once.ingest(batch(i))
    mon = make(str(tmp_path), "pane")
    mon.set_reference(records(1000, 7, t0=T0 - 3600))
    first = mon.ingest(batch(0), batch_id="ingress-a:0")
    assert first.rows == ROWS and not first.duplicate
    again = mon.ingest(batch(0), batch_id="ingress-a:0")
    # under durability='pane' the first copy's rows may still be in an open pane: not said durable
    assert again.duplicate and again.rows == 0 and not again.durable
    mon.ingest(batch(1), batch_id="ingress-a:1")
    mon.close()
    mon = Monitor.open(tmp_path)
    assert mon.ingest(batch(1), batch_id="ingress-a:1").duplicate  # the retry after a restart
    assert not mon.ingest(batch(2), batch_id="ingress-b:0").duplicate  # another sender's id
    assert mon.stats()["duplicate_batches"] == 2  # counted across the restart
    assert mon.stats()["rows_ingested"] == once.stats()["rows_ingested"] == 3 * ROWS
    mon.flush()
    once.flush()
    assert _answers(mon) == _answers(once)
    for bad, error in ((7, TypeError), ("", ValueError), ("x" * 201, ValueError), ("\ud800", ValueError)):
        with pytest.raises(error, match="batch_id"):
            mon.ingest(batch(3), batch_id=bad)
    mon.close()


def test_a_copy_is_durable_where_its_first_copy_was_committed(tmp_path: Path) -> None:
    mon = make(str(tmp_path), "batch")
    mon.set_reference(records(1000, 7, t0=T0 - 3600))
    assert mon.ingest(batch(0), batch_id="ingress-a:0").durable
    assert mon.ingest(batch(0), batch_id="ingress-a:0").durable  # committed with the first copy
    mon.close()
    memory = make(None, "batch")
    memory.set_reference(records(1000, 7, t0=T0 - 3600))
    memory.ingest(batch(0), batch_id="ingress-a:0")
    assert not memory.ingest(batch(0), batch_id="ingress-a:0").durable  # nothing is on disk


def test_only_the_latest_batch_ids_are_remembered() -> None:
    from drift._batch_ids import RecentBatchIds

    ids = RecentBatchIds(3, ["a", "b"])
    ids.add("c")
    ids.add("a")  # seen again: now the newest
    ids.add("d")
    assert ids.to_json() == ["c", "a", "d"] and "b" not in ids
    with pytest.raises(ValueError, match="capacity"):
        RecentBatchIds(0)
