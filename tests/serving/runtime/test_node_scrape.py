"""serving.runtime.node_scrape: one read of a node's metrics endpoint serves every replica on
the machine that asks for a read no older than it was, per slot, in a folder only its user
can read; failed reads are not kept and nobody waits on another's read for long."""

from __future__ import annotations

import asyncio
import fcntl
import multiprocessing
import os
import stat
import tempfile
import threading
import time

import pytest

from serving.runtime import metrics, node_scrape
from serving.runtime.dashboard import live


class _Endpoint:
    """A stand-in for a node's endpoint: counts reads, answers its n-th read's lines (None: failed)."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False):
        self.reads = 0
        self.delay_s, self.fail = delay_s, fail
        self.lock = threading.Lock()

    def __call__(self, endpoint: str) -> str | None:
        with self.lock:
            self.reads += 1
            n = self.reads
        time.sleep(self.delay_s)
        return None if self.fail else f'ray_willump_requests_total{{app="a",read="{n}",at="{endpoint}"}} 1.0\n'


class _Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def folder(tmp_path):
    path = tmp_path / "share"
    path.mkdir(mode=0o700)
    return path


def _shared(folder, endpoint, clock, fresh_after, node="n1", address="h:1", slot="s"):
    return node_scrape.read_shared(node, address, fresh_after, slot=slot, folder=folder, read=endpoint, clock=clock)


def test_a_read_serves_every_caller_that_accepts_its_time(folder):
    endpoint, clock = _Endpoint(), _Clock()
    first = _shared(folder, endpoint, clock, 995.0)
    clock.t = 1004.0
    assert _shared(folder, endpoint, clock, 999.0) == first == (first[0], 1000.0)
    assert endpoint.reads == 1
    # a caller that wants a read made after it: a new one, which serves from then on
    again = _shared(folder, endpoint, clock, 1001.0)
    assert endpoint.reads == 2 and 'read="2"' in again[0] and again[1] == 1004.0
    clock.t = 1005.0
    assert _shared(folder, endpoint, clock, 1001.0) == again


def test_slots_nodes_and_endpoints_are_kept_apart(folder):
    endpoint, clock = _Endpoint(), _Clock()
    a = _shared(folder, endpoint, clock, 0.0)
    b = _shared(folder, endpoint, clock, 0.0, slot="other")  # GET /metrics' reads never move a sampler's
    c = _shared(folder, endpoint, clock, 0.0, node="n2")  # a Ray started again on the same port
    d = _shared(folder, endpoint, clock, 0.0, address="h:2")
    assert endpoint.reads == 4 and len({a[0], b[0], c[0], d[0]}) == 4


def test_a_read_from_the_future_is_read_again(folder):
    endpoint, clock = _Endpoint(), _Clock()
    _shared(folder, endpoint, clock, 0.0)
    clock.t -= 30.0  # the clock stepped back
    _shared(folder, endpoint, clock, 0.0)
    assert endpoint.reads == 2


def test_a_failed_read_answers_no_lines_and_is_not_kept(folder):
    failing, clock = _Endpoint(fail=True), _Clock()
    assert _shared(folder, failing, clock, 0.0) == ("", 1000.0)
    assert not list(folder.glob("*.txt"))
    _shared(folder, failing, clock, 0.0)
    assert failing.reads == 2  # the next caller tries the endpoint itself
    # a read kept before a failure stays (the failure did not replace it)
    working = _Endpoint()
    kept = _shared(folder, working, clock, 0.0)
    clock.t += 10
    assert _shared(folder, failing, clock, 1005.0) == ("", 1010.0)
    assert _shared(folder, working, clock, 990.0) == kept


def test_callers_at_once_wait_for_one_read(folder):
    endpoint = _Endpoint(delay_s=0.05)
    got: list[tuple[str, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            got.append(node_scrape.read_shared("n1", "h:1", 0.0, slot="s", folder=folder, read=endpoint))
        except BaseException as exc:  # counted, not lost with the thread
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(got) == 8
    assert endpoint.reads == 1 and len(set(got)) == 1


def _read_logged(log: str):
    def read(endpoint: str) -> str:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.1)
        return f"lines of {endpoint}\n"
    return read


def _process(folder: str, log: str, out: str) -> None:
    text, at = node_scrape.read_shared("n1", "h:1", 0.0, slot="s", folder=folder, read=_read_logged(log))
    with open(out, "w") as f:
        f.write(f"{at!r} {text}")


def test_processes_at_once_wait_for_one_read(folder, tmp_path):
    log = tmp_path / "reads.log"
    context = multiprocessing.get_context("fork")
    outs = [tmp_path / f"out{i}" for i in range(4)]
    procs = [context.Process(target=_process, args=(folder, str(log), str(out))) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert len(log.read_text().splitlines()) == 1  # one process read; the others took its read
    assert len({out.read_text() for out in outs}) == 1


def test_a_lock_held_too_long_is_not_waited_for(folder, monkeypatch):
    endpoint, clock = _Endpoint(), _Clock()
    kept = _shared(folder, endpoint, clock, 0.0)
    (lock,) = folder.glob("*.lock")
    monkeypatch.setattr(node_scrape, "LOCK_WAIT_S", 0.05)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process stuck in its read
        clock.t += 10
        text, at = _shared(folder, endpoint, clock, 1005.0)
    finally:
        os.close(fd)
    assert endpoint.reads == 2 and 'read="2"' in text and at == 1010.0
    assert _shared(folder, endpoint, clock, 0.0) == kept  # read on its own, kept nowhere


def test_a_damaged_file_is_read_again_and_files_are_the_users_alone(folder):
    endpoint, clock = _Endpoint(), _Clock()
    _shared(folder, endpoint, clock, 0.0)
    (data,) = folder.glob("*.txt")
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
    data.write_text("not a time\nlines\n")
    text, at = _shared(folder, endpoint, clock, 0.0)
    assert endpoint.reads == 2 and 'read="2"' in text and at == clock.t
    assert not list(folder.glob("*.tmp"))


def test_files_of_reads_not_renewed_for_long_are_removed(folder):
    endpoint, clock = _Endpoint(), _Clock(time.time())
    _shared(folder, endpoint, clock, 0.0, node="old")
    old = set(folder.iterdir())
    for path in old:
        os.utime(path, (clock.t - 2 * node_scrape.PRUNE_AFTER_S,) * 2)
    _shared(folder, endpoint, clock, 0.0, node="new")  # a new slot's first read prunes
    assert not old & set(folder.iterdir()) and len(list(folder.glob("*.txt"))) == 1


def test_the_share_folder_is_private_or_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / f"{node_scrape.SHARE_DIR_PREFIX}{os.getuid()}"
    assert node_scrape.share_dir() == path and stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)  # open to others: another user could plant counts
    assert node_scrape.share_dir() is None
    path.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    path.symlink_to(tmp_path / "elsewhere")
    assert node_scrape.share_dir() is None
    endpoint = _Endpoint()  # without a folder every read goes to the endpoint
    node_scrape.read_shared("n1", "h:1", 0.0, slot="s", read=endpoint)
    node_scrape.read_shared("n1", "h:1", 0.0, slot="s", read=endpoint)
    assert endpoint.reads == 2 and not any((tmp_path / "elsewhere").iterdir())


def test_the_grid_is_shared_by_every_sampler_of_a_period():
    assert node_scrape.period_start(5.0, 1003.7) == 1000.0
    assert node_scrape.period_start(30.0, 1019.0) == 990.0
    assert node_scrape.period_start(5.0, 1005.0) == 1005.0


def test_the_dashboards_snapshot_takes_the_periods_reads_within_a_second(monkeypatch):
    head = "# TYPE ray_willump_requests_total counter\n"  # as Ray's endpoint has it
    line = 'ray_willump_requests_total{{app="a",route="/predict",status="200",WorkerId="{}"}} {}\n'
    reads = {("h:1", 0): (head + line.format("w1", 3.0), 990.2), ("h:2", 0): (head + line.format("w2", 4.0), 995.0),
             ("h:1", 1): (head + line.format("w1", 5.0), 994.5)}
    asked: list[tuple[str, float, str]] = []

    def shared(node, endpoint, fresh_after, *, slot):
        asked.append((endpoint, fresh_after, slot))
        return reads[endpoint, sum(e == endpoint for e, _, _ in asked) - 1]

    monkeypatch.setattr(live, "metric_nodes", lambda: [("n1", "h:1"), ("n2", "h:2")])
    monkeypatch.setattr(live, "read_shared", shared)
    monkeypatch.setattr(node_scrape.time, "time", lambda: 1012.0)
    snap = live.read_totals("a", 30.0)
    # the period's reads (from 990), then the node read 4.8 s before the other read again
    assert asked == [("h:1", 990.0, "dashboard-30"), ("h:2", 990.0, "dashboard-30"),
                     ("h:1", 995.0 - live.READ_SPREAD_S, "dashboard-30")]
    assert snap.t == 994.5
    assert sum(v for (name, _), v in snap.counters.items() if name == "willump_requests") == 9.0


def test_get_metrics_takes_a_read_of_the_last_second(monkeypatch):
    asked: list[tuple[float, str]] = []

    def shared(node, endpoint, fresh_after, *, slot):
        asked.append((fresh_after, slot))
        return "", 0.0

    monkeypatch.setattr(metrics, "metric_nodes", lambda: [("n1", "h:1")])
    monkeypatch.setattr(metrics, "read_shared", shared)
    before = time.time()
    asyncio.run(metrics.exact_totals("a"))
    ((fresh_after, slot),) = asked
    assert slot == metrics.SCRAPE_SLOT and before - metrics.METRICS_SHARE_S <= fresh_after <= time.time() - 0.9


def test_each_sampler_wakes_at_its_own_phase_of_the_shared_grid():
    assert live.next_wake(5.0, 0.0, now=1000.0) == pytest.approx(1000.05)
    assert live.next_wake(5.0, 0.5, now=1001.0) == pytest.approx(1002.5)
    assert live.next_wake(5.0, 0.5, now=1003.0) == pytest.approx(1007.5)  # its phase passed: the next period
    latest = live.next_wake(5.0, 0.999999, now=1000.0)
    assert 1000.0 < latest < 1005.0 - live.GRID_LAG_S + 1e-6  # never at the edge of a period
    with pytest.raises(ValueError, match="phase"):
        live.Dashboard({"name": "a"}, None, phase=1.0)
    # deterministic: seeded by the process id (each replica its own phase, the same on every start)
    assert live.Dashboard({"name": "a"}, None).phase == live.Dashboard({"name": "a"}, None).phase
