"""A stage served by one deployment per node pool, called as one handle (``deploy(pools=...)``).

Serve routes a call among one deployment's replicas; a stage whose replicas sit on pools of
different speed has a deployment per pool (:mod:`serving.planning.pools`), so the split over
pools is the caller's. Each call goes to the pool where it would wait least: ``(calls this
caller has in flight there + 1) / (running replicas x rows per second one replica sustains
there)``, the rates measured on each pool when the app was planned. At light load every call
goes to the fastest pool (the shortest wait); under load the split tends to capacity, as the
LP's plan assumes. A pool whose deployment runs no replica (its nodes lost, or not started
yet: the ingress's replica watch says) gets no call while another pool runs one, nor a pool
whose replicas its capacity router has seen all on draining nodes (a preemption notice) or all
silent (a node lost without notice: Serve still lists its replicas as running for a while, and
each call there would wait out the bound before its copy goes elsewhere). Nor, for
``UNRESPONSIVE_S``, a pool one of whose calls had to be rescued (copied past the silence bound,
the copy answering first), unless one of its calls answers or Serve's count of its running
replicas rises first (replicas started again; a fall says nothing good): Serve lists replicas started on a node that then vanished as running for several
seconds, and each call sent there would cost a bound. A call that
fails on a lost replica counts that pool one replica short until the watch looks again, so the
caller's retry (:func:`serving.runtime.calls.call_stage`) goes elsewhere when the pool had one;
a copy of a slow call (hedging, or the bound on a silent replica) goes to another pool than the
call it copies whenever another pool runs a replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from serving.core.specs import pool_deployment

#: seconds a pool whose call was rescued gets no call while another pool can take it (module
#: docstring): about the time Serve takes to see a lost node's replicas gone
UNRESPONSIVE_S = 10.0


class PooledStage:
    """Duck-types a Serve deployment handle (``stage.method.remote(*args)``, ``options``)."""

    def __init__(self, handles: Mapping[str, Any], rates: Mapping[str, float], replicas: Mapping[str, int]):
        if not handles or set(handles) != set(rates) or set(handles) != set(replicas):
            raise ValueError(f"PooledStage: handles, rates and replicas must name the same pools, got "
                             f"{sorted(handles)}, {sorted(rates)}, {sorted(replicas)}")
        self.handles = dict(handles)
        self.rates = {p: max(float(r), 1e-9) for p, r in rates.items()}
        #: running replicas per pool: the plan's until the ingress's watch reads Serve's
        self.running = {p: int(n) for p, n in replicas.items()}
        self.in_flight = dict.fromkeys(self.handles, 0)
        #: calls routed per pool since the start
        self.routed = dict.fromkeys(self.handles, 0)
        #: hears the pool of every call routed (the ingress counts them in /metrics)
        self.on_route: Callable[[str], None] | None = None
        #: a pool's replicas its router can count on (serving.runtime.routing.usable_replicas;
        #: None: unknown, e.g. Serve's own router): a pool with 0 gets no call while another has some
        self.usable: Callable[[str], int | None] | None = None
        #: pool -> (until when it gets no call, the watch's count of its replicas then)
        self.unresponsive: dict[str, tuple[float, int]] = {}
        #: running replicas per pool as the watch last read them (``running`` also drops with a lost call)
        self.listed = dict(self.running)
        self.clock: Callable[[], float] = time.monotonic

    @property
    def pools(self) -> list[str]:
        return list(self.handles)

    def set_running(self, pool: str, count: int) -> None:
        self.running[pool] = self.listed[pool] = int(count)
        mark = self.unresponsive.get(pool)
        if mark is not None and count > mark[1]:  # replicas started there again
            self.unresponsive.pop(pool, None)
        elif mark is not None and count < mark[1]:  # fewer: count a rise from here
            self.unresponsive[pool] = (mark[0], int(count))

    def rescued(self, pool: str) -> None:
        """A call on ``pool`` was rescued: the pool gets no call for ``UNRESPONSIVE_S`` (module docstring)."""
        self.unresponsive[pool] = (self.clock() + UNRESPONSIVE_S, self.listed[pool])

    def answered(self, pool: str) -> None:
        self.unresponsive.pop(pool, None)

    def _responsive(self, pool: str) -> bool:
        mark = self.unresponsive.get(pool)
        return mark is None or self.clock() >= mark[0]

    def pick(self, avoid: str | None = None) -> str:
        """The pool where a new call would wait least: only pools running a replica while any does,
        and not ``avoid`` (the pool of the call a copy is made of) while another one runs."""
        live = [p for p in self.handles if self.running[p] > 0] or list(self.handles)
        if self.usable is not None:
            live = [p for p in live if self.usable(p) != 0] or live
        live = [p for p in live if self._responsive(p)] or live
        live = [p for p in live if p != avoid] or live
        return min(live, key=lambda p: ((self.in_flight[p] + 1) / (max(self.running[p], 1) * self.rates[p]), p))

    def lost_one(self, pool: str) -> None:
        """A call on ``pool`` failed on a lost replica: one replica fewer there until the watch reads Serve's count."""
        self.running[pool] = max(0, self.running[pool] - 1)

    def copy_of(self, response: Any) -> _PooledCopy:
        """Sends the copy of ``response``'s call: to another pool than its own where one runs."""
        return _PooledCopy(self, getattr(response, "pool", None))

    def options(self, **kwargs: Any) -> PooledStage:
        other = PooledStage({p: h.options(**kwargs) for p, h in self.handles.items()}, self.rates, self.running)
        other.running, other.in_flight, other.routed = self.running, self.in_flight, self.routed  # one ledger
        other.listed = self.listed
        other.on_route, other.usable, other.unresponsive, other.clock = (self.on_route, self.usable, self.unresponsive,
                                                                         self.clock)
        return other

    def __getattr__(self, method: str) -> _PooledMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _PooledMethod(self, method)

    async def health(self, timeout_s: float) -> dict[str, Any]:
        """Every pool's health check, each within ``timeout_s``: ``{"pools": {pool: answer}}``, a
        pool that does not answer as ``{"error": ...}``; ``"error"`` at the top only when no pool
        answers (a stage whose other pools answer is served: calls avoid a pool without replicas)."""
        async def one(pool: str) -> Any:
            try:
                return await asyncio.wait_for(_resolve(self.handles[pool].health.remote()), timeout_s)
            except Exception as exc:
                return {"error": f"{type(exc).__name__}: {exc}"[:500], "running": self.running[pool]}

        pools = list(self.handles)
        answers = dict(zip(pools, await asyncio.gather(*(one(p) for p in pools)), strict=True))
        out: dict[str, Any] = {"pools": answers}
        if all(isinstance(a, dict) and "error" in a for a in answers.values()):
            out["error"] = "no pool's replicas answer"
        return out


async def _resolve(response: Any) -> Any:
    return await response


class _PooledMethod:
    def __init__(self, stage: PooledStage, method: str, avoid: str | None = None):
        self.stage, self.method, self.avoid = stage, method, avoid

    def remote(self, *args: Any, **kwargs: Any) -> _PooledResponse:
        stage = self.stage
        pool = stage.pick(self.avoid)
        stage.in_flight[pool] += 1
        stage.routed[pool] += 1
        if stage.on_route is not None:
            stage.on_route(pool)
        try:
            response = getattr(stage.handles[pool], self.method).remote(*args, **kwargs)
        except BaseException:
            stage.in_flight[pool] -= 1
            raise
        return _PooledResponse(response, stage, pool)


class _PooledCopy:
    """``stage.copy_of(response).method.remote(*args)``: the copy's call, away from the first's pool."""

    def __init__(self, stage: PooledStage, avoid: str | None):
        self.stage, self.avoid = stage, avoid

    def __getattr__(self, method: str) -> _PooledMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _PooledMethod(self.stage, method, self.avoid)


class _PooledResponse:
    """A pool's response, awaited or cancelled as Serve's; its call leaves the pool's count once,
    and a call lost with its replica counts the pool one replica short."""

    def __init__(self, response: Any, stage: PooledStage, pool: str):
        self.response, self.stage, self.pool = response, stage, pool
        self._open = True

    def _done(self) -> None:
        if self._open:
            self._open = False
            self.stage.in_flight[self.pool] -= 1

    def __await__(self) -> Generator[Any, None, Any]:
        try:
            out = yield from self.response.__await__()
            self.stage.answered(self.pool)
            return out
        except Exception as exc:
            if _replica_lost(exc):
                self.stage.lost_one(self.pool)
            raise
        finally:
            self._done()

    def cancel(self) -> None:
        try:
            self.response.cancel()
        finally:
            self._done()

    def rescued(self) -> None:
        """This call was copied past the silence bound and the copy answered first."""
        self.stage.rescued(self.pool)


def _replica_lost(exc: BaseException) -> bool:
    try:
        import ray.exceptions as rex
    except ImportError:  # outside Ray nothing is lost this way
        return False
    return isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError))


def pooled_stage(target: Any, entry: Mapping[str, Any] | None) -> Any:
    """A stage target as the app bound it: a dict of pool handles becomes a :class:`PooledStage`
    with the plan's rates and replicas (``entry``: the stage's part of the ingress config's
    ``pools``); any other target is returned as it is."""
    if not isinstance(target, Mapping):
        return target
    if not entry:
        raise ValueError(f"a stage bound to pools {sorted(target)} needs their rates and replicas in the config")
    return PooledStage(target, entry["rates"], entry["replicas"])


def stage_deployments(app: str, stages: list[str], pools: Mapping[str, Any] | None, *,
                      skip_first: bool) -> dict[str, tuple[str, str | None]]:
    """Serve deployment -> (stage, pool or None) for the app's remote stages (``skip_first``: the
    first stage runs in the ingress)."""
    out: dict[str, tuple[str, str | None]] = {}
    for i, stage in enumerate(stages):
        if i == 0 and skip_first:
            continue
        entry = (pools or {}).get(stage)
        if entry:
            out.update({pool_deployment(app, stage, pool): (stage, pool) for pool in entry["replicas"]})
        else:
            out[f"{app}-{stage}"] = (stage, None)
    return out
