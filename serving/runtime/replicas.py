"""The deployments behind the ingress: model stages and the monitor, plus the in-process
stage a fused ingress runs.

Composition follows Ray Serve's own examples: one class per deployment, bound deployments
passed to the ingress constructor, ``@serve.batch`` for batching rows from many calls at a
stage. A replica loads the artifact by reference (:mod:`serving.core.artifacts`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ray import serve

from serving.core.artifacts import ArtifactSource
from serving.core.constants import CONCURRENT_BATCHES
from serving.core.specs import StageSpec
from serving.runtime import monitor_state
from serving.runtime.dashboard.data import monitor_snapshot
from serving.runtime.emulated_node import node_emulation
from serving.runtime.feedback import KINDS as FEEDBACK_KINDS
from serving.runtime.feedback import Feedback
from serving.runtime.gears import GearRunners
from serving.runtime.outside_calls import PieceSize
from serving.runtime.routing import BusyMeter
from serving.runtime.single_flight import SingleFlight
from serving.runtime.stage_runner import (
    StageRunner,
    merge_chunks,
    place_models,
    serial_when_inline,
    split_rows,
    with_busy_s,
)

logger = logging.getLogger(__name__)

#: seconds a readiness probe waits on a stage replica's canary (the ingress waits READY_TIMEOUT_S)
HEALTH_TIMEOUT_S = 30.0


def _rows_in(items: list) -> int:
    return sum(len(rows) for rows, _ in items)


def _count(rows: Any) -> int:
    """Rows in a stage call's frame (0 for anything without a length: a probe's stand-in)."""
    try:
        return len(rows)
    except TypeError:
        return 0


def _retrieved(task: asyncio.Future) -> None:
    """The outcome of a shielded call whose caller was cancelled: a failure is logged here rather
    than as asyncio's "exception never retrieved"."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning("a replica call whose caller had gone failed: %r", task.exception())


async def _in_turn(lock: asyncio.Lock | None, work: Callable[[], Awaitable[Any]]) -> Any:
    """``await work()`` holding ``lock`` (None: none). The lock is taken unshielded: a caller
    cancelled while it waits its turn leaves, and its work never runs. The work is a task a
    cancellation of the caller does not stop: its thread cannot be stopped either, so it runs to
    its end (its ``finally`` blocks with it) and releases the lock then, not when the caller left."""
    if lock is not None:
        await lock.acquire()

    async def held() -> Any:
        try:
            return await work()
        finally:
            if lock is not None:
                lock.release()

    task = asyncio.ensure_future(held())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieved)  # nobody awaits it now
        raise


def replica_id(default: str) -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (tests, local mode)
        return default


def _code_location() -> dict[str, Any]:
    """Where this replica imported serving from, and the py_modules its runtime_env shipped."""
    import ray

    env = ray.get_runtime_context().runtime_env or {}
    return {"serving": str(Path(__file__).resolve().parents[1] / "__init__.py"), "py_modules": list(env.get("py_modules") or [])}


@serve.deployment
class ModelStage:
    """One stage replica: loads the artifact, runs its levels, batches across calls."""

    def __init__(
        self,
        artifact: ArtifactSource | None,
        spec: StageSpec | None,
        *,
        baseline: bool = False,
        device: str = "cpu",
        runtime: str = "native",
        batching: bool = True,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.002,
        fallback: bool = False,
        runner: Any = None,
        module_chains: dict[str, list] | None = None,
        inline: bool = False,
    ):
        if runner is not None:  # serving.measure.calibrate's probe: this code path around a stand-in model
            self.notes, self.runner = [], runner
        else:
            opt = artifact.load()
            self.notes = place_models(opt, device, runtime) + serial_when_inline(opt, inline)
            # a deep level too big for one device: its module runs as partition stages elsewhere
            if module_chains:  # torch is imported only where a chain runs (a replica starts faster without)
                from serving.runtime.module_chain import attach_chains

                self.notes += attach_chains(opt, module_chains)
            self.runner = StageRunner(opt, spec, baseline=baseline, fallback=fallback)
        self.batching = batching
        #: run batches on this replica's event loop (a CPU-bound stage: StageProfile.runs_inline)
        self.inline = inline
        self.max_batch_size = max(1, int(max_batch_size))
        if batching:
            self.run_batch.set_max_batch_size(self.max_batch_size)
            self.run_batch.set_batch_wait_timeout_s(float(batch_wait_timeout_s))
        self.replica = replica_id("local")
        #: rows per busy second, reported to the callers' routers (serving.runtime.routing)
        self.meter = BusyMeter()
        #: the calls outside the levels, served in pieces (serving.runtime.outside_calls)
        self.pieces = PieceSize()
        #: an emulated device where this node's labels ask for one (tests and benchmarks only)
        self.emulation = node_emulation(seed=zlib.crc32(self.replica.encode()),
                                        stage=getattr(getattr(self.runner, "spec", None), "name", None))
        self._emulated = asyncio.Lock() if self.emulation.active else None

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve asks every ``request_routing_stats_period_s``; CapacityRouter ranks by it."""
        return self.meter.report()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve asks at every metrics push; the planner's autoscaling policy reads the rows
        answered (serving.planning.autoscale)."""
        return self.meter.autoscaling_stats()

    async def run(self, rows: pd.DataFrame, blocks: dict | None = None, gear: int = 0,
                  backlog: tuple | None = None) -> dict[str, Any]:
        """The stage on ``rows`` at ``gear``; ``backlog``: (the calling ingress replica, rows it
        still queues for this stage[, how many times these rows the gear the replicas are sized
        for would have sent]), for the autoscaler (serving.planning.autoscale)."""
        if backlog is not None:
            self.meter.note_backlog(backlog[0], backlog[1])
            self.meter.note_demand(_count(rows), backlog[2] if len(backlog) > 2 else 1.0)
        if gear:  # a cheaper certified gear (serving.runtime.gears); the ingress merged the rows of its calls
            if getattr(self, "gears", None) is None:

                self.gears = GearRunners(self.runner)
            out = await self._compute(self.gears.get(gear).run, rows, blocks, rows=_count(rows))
            out["replica"] = self.replica
            return out
        if not self.batching:
            out = await self._compute(self.runner.run, rows, blocks, rows=_count(rows))
        else:
            chunks = list(split_rows(rows, blocks, self.max_batch_size))
            outs = await asyncio.gather(*(self.run_batch((r, b)) for r, b in chunks))
            for part in outs:
                if isinstance(part, Exception):  # this call's rows failed; other calls' did not
                    raise part
            out = merge_chunks(outs, [len(r) for r, _ in chunks])
        out["replica"] = self.replica
        return out

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002, batch_size_fn=_rows_in,
                 max_concurrent_batches=CONCURRENT_BATCHES)
    async def run_batch(self, items: list) -> list[dict[str, Any] | Exception]:
        return await self._compute(self.runner.run_many, items, rows=_rows_in(items))

    async def _compute(self, fn: Any, *args: Any, rows: int = 0) -> Any:
        """``fn(*args)`` as the stage's levels run (:meth:`_metered`), the busy seconds in a dict
        answer (:func:`with_busy_s`)."""
        out, busy = await self._metered(fn, *args, rows=rows, inline=self.inline)
        return with_busy_s(out, busy)

    async def _metered(self, fn: Any, *args: Any, rows: int, inline: bool, unscaled: bool = False,
                       deferrable: bool = False) -> tuple[Any, float]:
        """``fn(*args)`` on the event loop where ``inline`` (a CPU-bound stage:
        StageProfile.runs_inline), in a thread otherwise; its busy time and rows counted for the
        routers and the autoscaler (``unscaled``: work every gear gives the stage alike;
        ``deferrable``: such work no request waits on, the live audit's; BusyMeter).
        Returns the answer and the call's busy seconds. On an emulated device
        (serving.runtime.emulated_node) one call at a time, each held as long as the node's
        labels ask (the hold counts as busy).

        A call cancelled once it started (a hedge's losing copy, a call past its deadline, a
        client gone) is cancelled for its caller only: its thread cannot be stopped, so the
        meter keeps counting it busy, and an emulated device stays held, until the work ends.
        Unshielded, the cancel stopped both at once: the replica read as faster than it was
        (its rows counted, its busy time cut short) exactly where copies left it, and an
        emulated device ran two calls at a time. One cancelled while it waits its turn on an
        emulated device never runs."""
        lock = self._emulated
        if lock is None and inline:  # no await: nothing can cancel it half done
            mark = self.meter.start(unscaled, deferrable)
            try:
                out = fn(*args)
                return out, self.meter.call_busy_s(mark)
            finally:
                self.meter.stop(rows, unscaled, mark, deferrable)

        async def work() -> tuple[Any, float]:
            mark = self.meter.start(unscaled, deferrable)
            try:
                t0 = time.perf_counter()
                out = fn(*args) if inline else await asyncio.to_thread(fn, *args)
                if lock is not None:
                    await asyncio.sleep(self.emulation.hold_s(time.perf_counter() - t0, rows))
                return out, self.meter.call_busy_s(mark)
            finally:
                self.meter.stop(rows, unscaled, mark, deferrable)

        return await _in_turn(lock, work)

    # Calls outside the cascade's levels, metered as work every gear gives the stage alike (the
    # autoscaler and an emulated device see it: a live audit at 1% sends the expensive stage about
    # as many rows as toxic's cheapest gear), always in a thread (an audit batch is up to 512 rows)
    async def topk_filter(self, rows: pd.DataFrame, k: int, label_index: int) -> dict | None:
        return (await self._metered(self.runner.topk_filter, rows, k, label_index, rows=_count(rows),
                                    inline=False, unscaled=True))[0]

    async def topk_rank(self, rows: pd.DataFrame, blocks: dict, label_index: int, check: dict) -> dict:
        """The rows the filter kept, scored in full; the busy seconds in the answer (``busy_s``,
        for the gears' step back: top-K's calls cost the stage the same in every gear)."""
        out, busy = await self._metered(self.runner.topk_rank, rows, blocks, label_index, check, rows=_count(rows),
                                        inline=False, unscaled=True)
        return with_busy_s(out, busy)

    async def _in_pieces(self, fn: Any, rows: pd.DataFrame) -> tuple[np.ndarray, float]:
        """``fn(rows)`` (an array per row) in pieces (serving.runtime.outside_calls), each metered
        as work every gear gives the stage alike that can wait: a call no request waits on takes
        turns with the cascade's batches. The rows' answers and the busy seconds."""
        outs, busy = [], 0.0
        self.meter.hold_deferrable(True)
        try:
            for piece in self.pieces.pieces(rows):
                out, piece_busy = await self._metered(fn, piece, rows=len(piece), inline=False, unscaled=True,
                                                      deferrable=True)
                self.pieces.observe(len(piece), piece_busy)
                outs.append(np.asarray(out))
                busy += piece_busy
        finally:
            self.meter.hold_deferrable(False)
        return (outs[0] if len(outs) == 1 else np.concatenate(outs)), busy

    async def full_scores(self, rows: pd.DataFrame, label_index: int, timed: bool = False) -> np.ndarray | dict:
        """Every row scored in full (top-K without a certified filter: a request waits on it, in
        one call); ``timed`` as :meth:`full_proba`'s."""
        scores, busy = await self._metered(self.runner.full_scores, rows, label_index, rows=_count(rows),
                                           inline=False, unscaled=True)
        return {"scores": scores, "busy_s": busy} if timed else scores

    async def full_proba(self, rows: pd.DataFrame, timed: bool = False,
                         pieces: bool | None = None) -> np.ndarray | dict[str, Any]:
        """The full pipeline's probabilities: for rows the live audit sampled
        (serving.runtime.audit), and for every row the cascade answered below its full level
        while the audit's alarm holds gear 0 (serving.runtime.hold). ``pieces``: in pieces that
        take turns with the cascade's batches (serving.runtime.outside_calls; by default where
        not ``timed``: a request waits on a timed call, an audit's asks for pieces); ``timed``:
        as ``{"proba": ..., "busy_s": ...}``, the busy seconds for the gears' step back (an
        ingress of earlier code asks with the rows alone and gets the array)."""
        if pieces is None:
            pieces = not timed
        if pieces:
            proba, busy = await self._in_pieces(self.runner.full_proba, rows)
        else:
            proba, busy = await self._metered(self.runner.full_proba, rows, rows=_count(rows), inline=False,
                                              unscaled=True)
        return {"proba": proba, "busy_s": busy} if timed else proba

    def check_health(self) -> None:
        """Ray Serve calls this every ``health_check_period_s``: an exception marks the replica
        unhealthy and Serve replaces it. The canary runs one sample row on the stage's device."""
        canary = getattr(self.runner, "canary", None)
        if canary is not None:
            canary()

    async def health(self, timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, Any]:
        """The canary's answer, for the ingress's readiness route: one canary at a time, shared
        by the probes that come while it runs (serving.runtime.single_flight)."""
        canary = getattr(self.runner, "canary", None)
        if canary is None:
            return {"replica": self.replica, "canary": "none"}
        if getattr(self, "_canary", None) is None:
            self._canary = SingleFlight(canary)
        return {"replica": self.replica, **await self._canary(timeout_s)}

    def info(self) -> dict[str, Any]:
        import ray

        return {"replica": self.replica, "notes": self.notes, "batching": self.batching,
                "max_batch_size": self.max_batch_size, "emulated": self.emulation.info(),
                "rows_per_s": self.meter.rows_per_s, "rows": self.meter.total_rows, "node_id": ray.get_runtime_context().get_node_id(),
                "code": _code_location(), "calls": getattr(self.runner, "calls", None)}


def coerce(value: str) -> Any:
    """A query-string value as the Python value it spells (bools, None, numbers, text)."""
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


@serve.deployment
class MonitorStage:
    """The drift monitor as a deployment of its own, fed off the request path."""

    QUERIES = ("explain", "mix_shift", "conditional_shift", "drift", "sequential_drift", "change_points",
               "cascade_health")

    def __init__(self, config: dict[str, Any], reference: list[dict[str, Any]] | None = None,
                 guarantee: dict[str, Any] | None = None, labels: dict[str, Any] | None = None,
                 state: dict[str, str] | None = None):
        from drift import Monitor

        directory = config.get("directory")
        #: the default state directory (serving.runtime.monitor_state), where the user named none
        #: and deploy gave ``state`` ({"app": ..., "token": ...}): it outlives this replica
        self.default_state = None
        if directory is False:  # monitor=dict(directory=False): in memory
            directory = None
        elif directory is None and state:
            self.default_state = monitor_state.default_directory(state["app"], state["token"])
        if self.default_state is not None:
            self.monitor = monitor_state.open_default(lambda d: Monitor(**{**config, "directory": d}),
                                                      self.default_state)
            directory = self.monitor.directory
            if directory is None:  # the root is not private: in memory
                self.default_state = None
            else:
                monitor_state.clear_others(self.default_state)
        else:  # the user's directory (or none): waiting while a replica it replaces still holds it
            self.monitor = monitor_state.open_when_free(lambda: Monitor(**{**config, "directory": directory}))
        #: the live audit's ledger and the labels fed back (serving.runtime.feedback)
        self.feedback = Feedback(directory, guarantee, labels)
        self.reference_rows = 0
        if reference:
            self.monitor.set_reference(reference)
            self.reference_rows = len(reference)
        self.ingested = 0
        self.lock = asyncio.Lock()  # the monitor is not thread-safe: one call at a time
        self.registry = None
        try:  # the monitor's verdicts in Prometheus form, for the app's GET /metrics
            from prometheus_client import CollectorRegistry

            from drift import MonitorCollector

            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(MonitorCollector(self.monitor))
            for collector in self.feedback.collectors():
                self.registry.register(collector)
        except ImportError:  # a drift without its Prometheus collector
            pass

    async def ingest(self, records: Any, batch_id: str | None = None) -> dict[str, Any]:
        """Ingest a batch of served rows; a row the monitor refuses (a malformed value in a
        monitored column) is rejected alone, not with its batch. ``batch_id``: the sender's id
        for the batch (serving.runtime.records.RecordBuffer), so a batch sent again after a
        send that never answered is ingested once (drift.Monitor.ingest). Returns the running
        total ingested, how many of these rows were rejected and the first reason, and how many
        were skipped as already ingested."""
        def both() -> tuple[int, str | None, int]:  # one thread hop: the monitor, then the label join
            kept, rejected, why, duplicate = ingest_row_by_row_on_error(self.monitor, records, batch_id)
            if duplicate:  # the label join keeps what an earlier try left out (what it has, it skips)
                self.feedback.served(records, repeat=True)
                return 0, None, len(records)
            self.ingested += kept  # here, not after the await: counted even where the caller is gone
            # a failure here fails the call: the sender sends the batch again, and the repeat
            # above gives the label join its rows
            self.feedback.served(records)
            return rejected, why, 0

        rejected, why, duplicate = await self._one_at_a_time(both)
        return {"ingested": self.ingested, "rejected": rejected, "error": why, "duplicate": duplicate}

    async def _one_at_a_time(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a thread, one call at a time (the monitor and the label join are not
        thread-safe). A caller cancelled while it waits its turn (its deadline passed, the
        sender gave up) leaves without running; one cancelled once its thread runs leaves the
        call to finish with the lock held. Unshielded, that cancellation freed the lock while
        the thread still ran, so the next call ran beside it, and what ran after the await
        (the ingested count) was lost while the monitor kept the rows: the sender's retry then
        read as a duplicate, counted nowhere."""
        return await _in_turn(self.lock, lambda: asyncio.to_thread(fn, *args))

    async def audit(self, entries: list[dict[str, Any]], batch_id: str | None = None) -> dict[str, Any]:
        """The live audit's counts (serving.runtime.audit.LiveAudit.flush), under the sender's
        id for them (a send repeated after a lost answer is counted once)."""
        return await self._one_at_a_time(self.feedback.audit, entries, batch_id)

    async def labels(self, body: Any) -> dict[str, Any]:
        """``POST /labels``: labels joined to served rows (serving.runtime.feedback)."""
        return await self._one_at_a_time(self.feedback.label, body)

    async def flush(self) -> dict[str, Any]:
        await self._one_at_a_time(self.monitor.flush)
        return {"ingested": self.ingested}

    def state_token(self) -> str | None:
        """The token of this monitor's default state directory (None: the user's or none), for
        the deploy that replaces this app to hand on."""
        return None if self.default_state is None else self.default_state.name

    async def discard_state(self) -> dict[str, Any]:
        """Close the monitor and remove its default state directory (the app is shutting down)."""
        async with self.lock:
            self.__del__()
            if self.default_state is not None:
                monitor_state.discard(self.default_state)
        return {"discarded": self.default_state is not None}

    def __del__(self) -> None:
        # Serve calls __del__ on graceful replica shutdown: persist the open pane.
        for part in (getattr(self, "monitor", None), getattr(self, "feedback", None)):
            if part is not None:
                try:
                    part.close()
                except Exception:  # shutting down: nothing left to report to
                    pass

    async def prometheus(self) -> str:
        """The monitor's counters and verdicts (drift_*) in Prometheus text format."""
        if self.registry is None:
            return ""
        from prometheus_client import generate_latest

        return (await self._one_at_a_time(generate_latest, self.registry)).decode()

    async def dashboard(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Everything the app's dashboard shows from the monitor, in one call
        (:func:`serving.runtime.dashboard.data.monitor_snapshot`)."""

        def both() -> dict[str, Any]:  # the live guarantee, fresh on every ask
            return {**monitor_snapshot(self.monitor, options), **self.feedback.snapshot()}

        return await self._one_at_a_time(both)

    async def query(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._one_at_a_time(self._query, name, params)

    def _query(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """Run a monitor query; client mistakes come back as {"status": 4xx, ...}, not raised.
        The monitor's own errors (``drift.DriftError``) keep their status, ``reason`` and
        ``retry_after_s`` (``exc.to_http()``), so a client can tell "wait" from "ask otherwise"."""
        from drift import DriftError

        if name in FEEDBACK_KINDS:
            return {**self.feedback.query(name, params), "ingested": self.ingested}
        if name not in self.QUERIES:
            return {"status": 404, "error": f"unknown monitor query {name!r}", "fields": []}
        method = getattr(self.monitor, name)
        signature = inspect.signature(method).parameters
        accepted = [p for p in signature if p != "self"]
        for key, value in list(params.items()):  # list-typed parameters arrive comma-separated
            annotation = str(signature[key].annotation) if key in signature else ""
            if isinstance(value, str) and ("Sequence" in annotation or "tuple" in annotation):
                parts = [coerce(v.strip()) for v in value.split(",") if v.strip()]
                params[key] = tuple(parts) if "tuple" in annotation else parts
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            return {"status": 422, "error": f"unknown query parameter(s) {unknown} for {name}",
                    "fields": [{"field": p, "error": f"accepted: {accepted}"} for p in unknown]}
        out_of_bounds = query_bounds_error(params)
        if out_of_bounds is not None:
            return out_of_bounds
        try:
            result = method(**params)
        except DriftError as exc:  # before ValueError: a SchemaError is both
            return {**exc.to_http(), "fields": []}
        except (TypeError, ValueError, KeyError) as exc:
            return {"status": 422, "error": f"{name}: {exc}", "fields": []}
        data = result.to_dict() if hasattr(result, "to_dict") else result
        return {"status": 200, "query": name, "ingested": self.ingested, "result": data}


def ingest_row_by_row_on_error(monitor: Any, records: pd.DataFrame, batch_id: str | None = None,
                               ) -> tuple[int, int, str | None, bool]:
    """``monitor.ingest(records, batch_id=...)``; when the monitor refuses the batch
    (``drift.SchemaError``: it validates before it changes any state), the batch is halved
    until the refused rows stand alone, so k bad rows cost O(k log n) calls and every good row
    is kept; then the batch's id is recorded alone (an empty ingest under it), so a batch sent
    again is skipped whole, however many pieces it was ingested in. Returns (rows kept, rows
    rejected, the first refusal's text, whether the batch was skipped as already ingested)."""
    from drift import SchemaError

    try:
        receipt = monitor.ingest(records, batch_id=batch_id)
    except SchemaError:
        kept, rejected, why = _ingest_halves(monitor, records)
        if batch_id is not None:
            monitor.ingest(records.iloc[:0], batch_id=batch_id)
        return kept, rejected, why, False
    if getattr(receipt, "duplicate", False):
        return 0, 0, None, True
    return len(records), 0, None, False


def _ingest_halves(monitor: Any, records: pd.DataFrame) -> tuple[int, int, str | None]:
    """The halving of :func:`ingest_row_by_row_on_error`: (rows kept, rows rejected, first reason)."""
    from drift import SchemaError

    try:
        monitor.ingest(records)
        return len(records), 0, None
    except SchemaError as exc:
        if len(records) <= 1:
            return 0, len(records), str(exc)[:300]
    mid = len(records) // 2
    kept_a, bad_a, why_a = _ingest_halves(monitor, records.iloc[:mid])
    kept_b, bad_b, why_b = _ingest_halves(monitor, records.iloc[mid:])
    return kept_a + kept_b, bad_a + bad_b, why_a or why_b


#: what an HTTP client may ask of the parameters that set a monitor query's cost (the
#: monitor answers one query at a time under its lock, so one costly query delays them all):
#: segments searched, the smallest segment share and support, the combination order. The
#: library's own calls are not bounded; the defaults sit well inside.
HTTP_QUERY_BOUNDS: dict[str, tuple[float, float]] = {
    "max_segments": (1, 200),
    "min_share": (0.01, 1.0),
    "min_support": (0.001, 1.0),
    "max_order": (1, 3),
    "min_samples": (5, 1e9),
}


def query_bounds_error(params: dict[str, Any]) -> dict[str, Any] | None:
    """A 422 answer naming the first cost parameter outside :data:`HTTP_QUERY_BOUNDS`."""
    for key, (low, high) in HTTP_QUERY_BOUNDS.items():
        if key not in params:
            continue
        value = params[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not low <= number <= high:  # NaN fails both sides
            why = f"must be between {low:g} and {high:g} over HTTP (it bounds the query's cost), got {value!r}"
            return {"status": 422, "error": f"{key} {why}", "fields": [{"field": key, "error": why}]}
    return None


class LocalStage:
    """A stage run inside the ingress process (layout="fused"): no hop for the cheap
    levels, which answer most rows; only unsure rows travel to the expensive stage."""

    def __init__(self, artifact: ArtifactSource | None, spec: StageSpec | None, device: str = "cpu",
                 runtime: str = "native", fallback: bool = False, runner: Any = None, inline: bool = False):
        if runner is not None:
            self.notes, self.runner = [], runner
        else:
            opt = artifact.load()
            self.notes = place_models(opt, device, runtime) + serial_when_inline(opt, inline)
            self.runner = StageRunner(opt, spec, fallback=fallback)
        self.replica = replica_id("ingress")  # records name the ingress replica that answered
        #: run batches on the ingress's event loop (a CPU-bound stage: StageProfile.runs_inline)
        self.inline = inline

    def run_many(self, items: list) -> list[dict[str, Any] | Exception]:
        outs = self.runner.run_many(items)
        for out in outs:
            if isinstance(out, dict):
                out["replica"] = self.replica
        return outs
