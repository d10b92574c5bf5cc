"""A throwaway local redis-server for the Redis feature store (benchmark and tests).

Uses Debian's ``redis-server`` binary (``apt-get install -y redis-server``) and the
``redis`` Python client. The server listens on 127.0.0.1 at a free port, keeps
nothing on disk, and is stopped when the context exits. Set ``WILLUMP_REDIS_URL`` to
use a server of your own instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

#: environment variable naming an existing Redis server to use instead of starting one
REDIS_URL_ENV = "WILLUMP_REDIS_URL"
#: seconds to wait for a started server to answer PING
START_TIMEOUT_S = 10.0
#: seconds to wait for the server to exit before killing it
STOP_TIMEOUT_S = 5.0
#: attempts at starting on a free port (another process may take the port in between)
START_ATTEMPTS = 3


def redis_unavailable_reason() -> str | None:
    """None when a Redis store can be used here, else why not (for skips and messages)."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis Python client is not installed (pip install 'redis>=5')"
    if os.environ.get(REDIS_URL_ENV):
        return None
    if shutil.which("redis-server") is None:
        return ("redis-server is not installed (apt-get install -y redis-server) and "
                f"{REDIS_URL_ENV} is not set")
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.exceptions.RedisError:
        return False


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """Yield the URL of a Redis server: $WILLUMP_REDIS_URL, or a private one started here."""
    reason = redis_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot provide a Redis server: {reason}")
    existing = os.environ.get(REDIS_URL_ENV)
    if existing:
        if not _ping(existing):
            raise RuntimeError(f"{REDIS_URL_ENV}={existing} does not answer PING")
        yield existing
        return
    with tempfile.TemporaryDirectory(prefix="willump-redis-") as workdir:
        for attempt in range(START_ATTEMPTS):
            port = _free_port()
            url = f"redis://127.0.0.1:{port}/0"
            proc = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", workdir, "--protected-mode", "yes"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline and not _ping(url):
                time.sleep(0.05)
            if proc.poll() is None and _ping(url):
                break
            _stop(proc)
            if attempt == START_ATTEMPTS - 1:
                raise RuntimeError(f"redis-server did not start on 127.0.0.1 after {START_ATTEMPTS} attempts")
        try:
            yield url
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
