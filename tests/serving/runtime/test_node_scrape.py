"""serving.runtime.node_scrape: one read of a node's metrics endpoint serves every replica on
the machine for as long as each asks, in a folder only its user can read."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time

import pytest

from serving.runtime import node_scrape
from serving.runtime.dashboard import live


class _Endpoint:
    """A stand-in for a node's endpoint: counts reads, answers its n-th read's lines."""

    def __init__(self, delay_s: float = 0.0):
        self.reads = 0
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, endpoint: str) -> str:
        with self.lock:
            self.reads += 1
            n = self.reads
        time.sleep(self.delay_s)
        return f'ray_willump_requests_total{{app="a",read="{n}",at="{endpoint}"}} 1.0\n'


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


def test_a_read_is_shared_for_as_long_as_the_caller_allows(folder):
    endpoint, clock = _Endpoint(), _Clock()
    first = node_scrape.read_shared("n1", "h:1", 5.0, folder=folder, read=endpoint, clock=clock)
    clock.t += 4.0
    assert node_scrape.read_shared("n1", "h:1", 5.0, folder=folder, read=endpoint, clock=clock) == first
    assert endpoint.reads == 1 and first[1] == 1000.0
    # the same read is too old for a caller that allows 3 s: a new read, shared from then on
    again = node_scrape.read_shared("n1", "h:1", 3.0, folder=folder, read=endpoint, clock=clock)
    assert endpoint.reads == 2 and 'read="2"' in again[0] and again[1] == 1004.0
    clock.t += 1.0
    assert node_scrape.read_shared("n1", "h:1", 3.0, folder=folder, read=endpoint, clock=clock) == again


def test_another_node_or_endpoint_is_read_on_its_own(folder):
    endpoint, clock = _Endpoint(), _Clock()
    a = node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    # a Ray started again on the same port is another node: its counts are not the old one's
    b = node_scrape.read_shared("n2", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    c = node_scrape.read_shared("n1", "h:2", 60.0, folder=folder, read=endpoint, clock=clock)
    assert endpoint.reads == 3 and len({a[0], b[0], c[0]}) == 3


def test_no_sharing_reads_every_time_and_writes_nothing(folder):
    endpoint, clock = _Endpoint(), _Clock()
    for _ in range(3):
        node_scrape.read_shared("n1", "h:1", 0.0, folder=folder, read=endpoint, clock=clock)
    assert endpoint.reads == 3 and not any(folder.iterdir())


def test_a_clock_that_stepped_back_reads_again(folder):
    endpoint, clock = _Endpoint(), _Clock()
    node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    clock.t -= 30.0
    node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    assert endpoint.reads == 2


def test_callers_at_once_wait_for_one_read(folder):
    endpoint = _Endpoint(delay_s=0.05)
    got: list[tuple[str, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            got.append(node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint))
        except BaseException as exc:  # counted, not lost with the thread
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(got) == 8
    assert endpoint.reads == 1 and len(set(got)) == 1


def test_a_damaged_file_is_read_again_and_files_are_the_users_alone(folder):
    endpoint, clock = _Endpoint(), _Clock()
    node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    (data,) = folder.glob("*.txt")
    assert stat.S_IMODE(data.stat().st_mode) == 0o600
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
    data.write_text("not a time\nlines\n")
    text, at = node_scrape.read_shared("n1", "h:1", 60.0, folder=folder, read=endpoint, clock=clock)
    assert endpoint.reads == 2 and 'read="2"' in text and at == clock.t
    assert not list(folder.glob("*.tmp"))


def test_the_share_folder_is_private_or_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / f"{node_scrape.SHARE_DIR_PREFIX}{os.getuid()}"
    made = node_scrape.share_dir()
    assert made == path and stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)  # open to others: another user could plant counts
    assert node_scrape.share_dir() is None
    path.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    path.symlink_to(tmp_path / "elsewhere")
    assert node_scrape.share_dir() is None
    # without a folder every read goes to the endpoint
    endpoint = _Endpoint()
    node_scrape.read_shared("n1", "h:1", 60.0, read=endpoint)
    node_scrape.read_shared("n1", "h:1", 60.0, read=endpoint)
    assert endpoint.reads == 2


def test_the_dashboards_snapshot_is_timed_at_its_oldest_read(monkeypatch):
    head = "# TYPE ray_willump_requests_total counter\n"  # as Ray's endpoint has it
    reads = {"h:1": (head + 'ray_willump_requests_total{app="a",route="/predict",status="200",WorkerId="w1"} 3.0\n',
                     90.0),
             "h:2": (head + 'ray_willump_requests_total{app="a",route="/predict",status="200",WorkerId="w2"} 4.0\n',
                     95.0)}
    asked: list[float] = []

    def shared(node, endpoint, max_age_s):
        asked.append(max_age_s)
        return reads[endpoint]

    monkeypatch.setattr(live, "metric_nodes", lambda: [("n1", "h:1"), ("n2", "h:2")])
    monkeypatch.setattr(live, "read_shared", shared)
    snap = live.read_totals("a", 30.0)
    assert snap.t == 90.0 and asked == [30.0, 30.0]
    assert sum(v for (name, _), v in snap.counters.items() if name == "willump_requests") == 7.0
