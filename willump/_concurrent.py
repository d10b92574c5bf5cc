"""Independent feature groups run at once: a thread pool for the body's top-level calls.

When a pipeline runs with ``workers > 1``, each top-level feature call the body makes is
submitted to a thread pool and the body gets a :class:`Pending` stand-in; calls nested inside
a group run in that group's thread. Groups that wait on I/O (a remote lookup) or release the
GIL (numpy, LightGBM) then overlap; Willump ran its remote lookups concurrently the same way.
A body that does more with a feature's output than return it or pass it to another feature
cannot run this way: capture checks, and such pipelines run sequentially.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .errors import PipelineError

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads (created once, reused by every run)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix=f"willump-{workers}")
        return _POOLS[workers]


class ConcurrentUseError(PipelineError):
    """The body used a feature output computed in another thread before it was ready."""

    def __init__(self, node: str):
        super().__init__(
            f"the pipeline body used the output of feature '{node}' directly (not only returning it "
            "or passing it to another feature), so its groups cannot run concurrently"
        )
        self.node = node


class Pending:
    """Stand-in for a top-level feature output being computed in a worker thread."""

    __slots__ = ("future", "node")

    def __init__(self, node: str):
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "future", Future())

    def run(self, fn: Any, *args: Any) -> None:
        """Compute in the worker thread and hand the outcome to whoever waits."""
        try:
            self.future.set_result(fn(*args))
        except BaseException as exc:  # the run re-raises it where it waits
            self.future.set_exception(exc)

    def result(self) -> Any:
        return self.future.result()

    def wait(self) -> None:
        """Block until the work finished, whatever its outcome."""
        self.future.exception()

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise ConcurrentUseError(self.node)

    __getattr__ = _fail
    __getitem__ = _fail
    __iter__ = _fail
    __len__ = _fail
    __array__ = _fail
    __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = _fail

    def __setattr__(self, *_: Any) -> None:
        raise ConcurrentUseError(self.node)

    def __repr__(self) -> str:
        return f"<pending feature output {self.node!r}>"


def resolved(value: Any) -> Any:
    """``value`` with Pending stand-ins (also inside tuples and lists) replaced by results."""
    if isinstance(value, Pending):
        return value.result()
    if isinstance(value, (tuple, list)) and any(isinstance(v, Pending) for v in value):
        return type(value)(resolved(v) for v in value)
    return value
