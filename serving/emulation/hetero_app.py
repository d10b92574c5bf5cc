"""Stages on mixed device types: one Serve deployment per (stage, device type), pinned by a
custom resource that names the device type, and an ingress that splits each stage's
traffic over its device types by weight (:class:`serving.planning.hetero.WeightedRouter`).

This machine has no accelerators, so a device is *emulated*: a replica runs the stage's
real code (the cascade levels, so answers are the pipeline's) and then holds its device, one
batch at a time (an ``asyncio.Lock``), for ``fixed_ms + per_row_ms * rows`` times the
device type's slowdown for that stage (:class:`DeviceEmulation`). The slowdowns stand in for
hardware (:mod:`serving.emulation.device`); the planner never reads them: it reads the
throughput matrix that
:func:`serving.emulation.measure.measure_matrix` measures by driving each (stage, device type)
on the cluster.
Jitter (a replica ``factor`` times slower on a share of its calls) is injected the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError

from serving.core.serve_apps import delete_app, run_app
from serving.core.specs import StageSpec
from serving.emulation.device import MAX_ONGOING, DeviceEmulation, DeviceStage, check_jitter
from serving.planning.hetero import WeightedRouter, Weights
from serving.runtime.gears import GearSwitch
from serving.runtime.hedge import (
    HEDGE_FLOOR_OVER_MEDIAN,
    HEDGE_IDLE_ONLY,
    HEDGE_QUANTILE,
    PROBATION_S,
    LatencyWindow,
    SlowReplicas,
)
from serving.runtime.watch import ReplicaWatch

#: errors meaning a replica is gone (its node was removed or preempted), not a bad request
LOST = (RayActorError, ActorUnavailableError)
log = logging.getLogger("ray.serve")


async def _resolve(response: Any) -> Any:
    return await response


#: seconds between the ingress's looks at which replicas Serve runs: a replica lost without
#: notice is taken out of routing, and the calls waiting on it are sent elsewhere (a call
#: routed to a deployment whose only replica is gone waits for Serve to start another, which
#: may never come); a lost replica running again gets calls again
WATCH_S = 1.0


def deployment_name(app: str, stage: str, device_type: str, index: int) -> str:
    """One deployment per replica, so the ingress knows which replica it calls (hedges go to
    another one; a slow one is routed around)."""
    return f"{app}-{stage}-{device_type}-{index}"


def key_deployment(app: str, key: str) -> str:
    """The deployment of the replica ``key`` ("stage@device/k")."""
    stage, replica = key.split("@", 1)
    device_type, index = replica.split("/")
    return deployment_name(app, stage, device_type, int(index))


def replica_key(device_type: str, index: int) -> str:
    return f"{device_type}/{index}"


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class HeteroIngress:
    """Runs the cascade stage by stage. Each stage call goes to a replica picked by weight
    (a device type's weight shared equally by its replicas), skipping replicas on probation
    for being far slower than their peers; with hedging on, a call still unanswered after
    the stage's own latency quantile is sent to another replica, the first answer kept and
    the other cancelled."""

    def __init__(self, stages: Sequence[str], keys: Sequence[tuple[str, str]], handles: Sequence[Any],
                 weights: Weights, hedging: bool = False, hedge_quantile: float = HEDGE_QUANTILE,
                 probation_s: float = PROBATION_S, hedge_floor: float = HEDGE_FLOOR_OVER_MEDIAN,
                 hedge_idle_only: bool = HEDGE_IDLE_ONLY):
        self.stages = list(stages)
        self.handles: dict[str, dict[str, Any]] = {}
        for (stage, replica), handle in zip(keys, handles, strict=True):
            self.handles.setdefault(stage, {})[replica] = handle
        self.hedge_quantile, self.probation_s, self.hedge_floor = hedge_quantile, probation_s, hedge_floor
        self.hedge_idle_only = hedge_idle_only
        self.hedging = hedging
        self.set_weights(weights)
        self.set_gears(None)

    def set_gears(self, info: dict[str, Any] | None) -> dict[str, Any]:
        """Serve the certified gears as ``info`` says (serving.runtime.gears.gear_info: adaptive or a
        pinned gear; None: gear 0); resets the gear counts."""

        self.gear_switch = GearSwitch(info)
        self.gear_rows: dict[int, int] = {}
        return {"mode": self.gear_switch.mode}

    def set_weights(self, weights: Weights) -> dict[str, dict[str, float]]:
        """Per device type weights (each stage's); resets the routing statistics."""
        routers = {}
        for stage in self.stages:
            w = {d: float(x) for d, x in weights.get(stage, {}).items() if x > 0}
            replicas = self.handles.get(stage, {})
            unknown = sorted(d for d in w if not any(r.split("/")[0] == d for r in replicas))
            if unknown:
                raise ValueError(f"weights for stage {stage!r} name device types without a deployment: {unknown}")
            per_replica = {}
            for d, x in w.items():
                mine = [r for r in replicas if r.split("/")[0] == d]
                per_replica.update({r: x / len(mine) for r in mine})
            routers[stage] = WeightedRouter(per_replica)
        self.routers = routers
        self.reset()
        return {s: {d: sum(x for r, x in router.weights.items() if r.split("/")[0] == d)
                    for d in {r.split("/")[0] for r in router.weights}} for s, router in routers.items()}

    def set_hedging(self, enabled: bool) -> bool:
        self.hedging = bool(enabled)
        self.reset()
        return self.hedging

    def reset(self) -> None:
        self.picks: dict[str, int] = {}
        self.windows = {s: LatencyWindow(quantile=self.hedge_quantile, floor_over_median=self.hedge_floor)
                        for s in self.stages}
        self.slow = SlowReplicas(probation_s=self.probation_s)
        self.counts = {"calls": 0, "hedges": 0, "hedge_wins": 0, "hedges_skipped_busy": 0, "retried": 0}
        self.winner_device_s = 0.0
        self.in_flight: dict[str, int] = getattr(self, "in_flight", {})
        #: replicas taken out of routing: drained (a preemption notice) or lost (a call failed
        #: because its actor died); kept across resets until restored
        self.unavailable: set[str] = getattr(self, "unavailable", set())
        self.restored_at: dict[str, float] = getattr(self, "restored_at", {})
        #: of those, the ones the watch found without a running replica (back once one runs)
        self.lost_seen: set[str] = getattr(self, "lost_seen", set())
        self.lost_events: dict[str, asyncio.Event] = getattr(self, "lost_events", {})
        self._watch: ReplicaWatch | None = getattr(self, "_watch", None)
        self.counts["lost_seen"] = 0

    def drain(self, keys: Sequence[str]) -> dict[str, int]:
        """Stop routing to these replicas ("stage@device/k"); calls already sent finish.
        Returns their calls still in flight (0 everywhere: safe to remove them)."""
        unknown = sorted(k for k in keys if k.split("@", 1)[0] not in self.handles
                         or k.split("@", 1)[1] not in self.handles[k.split("@", 1)[0]])
        if unknown:
            raise ValueError(f"drain: no such replicas {unknown}")
        self.unavailable.update(keys)
        return {k: self.in_flight.get(k, 0) for k in keys}

    def restore(self, keys: Sequence[str]) -> list[str]:
        """Route to these replicas again (back from preemption); returns those unavailable. A
        call sent to one of them before this (stuck on the lost replica, failing later) does
        not take it out of routing again."""
        self.unavailable.difference_update(keys)
        self.lost_seen.difference_update(keys)
        now = time.monotonic()
        self.restored_at.update(dict.fromkeys(keys, now))
        for key in keys:
            self._lost_event(key).clear()
        return sorted(self.unavailable)

    def _lost_event(self, key: str) -> asyncio.Event:
        return self.lost_events.setdefault(key, asyncio.Event())

    def _start_watch(self) -> None:
        if self._watch is None:
            app = serve.get_replica_context().app_name
            self._watch_keys = {key_deployment(app, key): key
                                for key in (f"{stage}@{r}" for stage, replicas in self.handles.items() for r in replicas)}
            self._watch = ReplicaWatch(app, self._watch_keys, self._follow_replicas, WATCH_S)
            self._watch.start()

    def _follow_replicas(self, running: dict[str, int]) -> None:
        """A replica whose deployment runs no replica (its node is gone) leaves routing and
        its waiting calls are re-sent; one found lost this way that runs again comes back.
        A drained replica stays out until ``restore``."""
        for name, count in running.items():
            key = self._watch_keys[name]
            if count == 0 and key not in self.unavailable:
                self.unavailable.add(key)
                self.lost_seen.add(key)
                self.counts["lost_seen"] += 1
                self._lost_event(key).set()
            elif count > 0 and key in self.lost_seen:
                self.restore([key])

    async def _send(self, stage: str, replica: str, rows: pd.DataFrame, blocks: dict | None, gear: int = 0):
        key = f"{stage}@{replica}"
        self.picks[key] = self.picks.get(key, 0) + 1
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        return self.handles[stage][replica].run.remote(rows, blocks, *((gear,) if gear else ()))

    async def _await(self, stage: str, replica: str, response: Any) -> dict[str, Any]:
        key = f"{stage}@{replica}"
        sent = time.monotonic()
        answer = asyncio.ensure_future(_resolve(response))
        gone = asyncio.ensure_future(self._lost_event(key).wait())
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():  # the watch found the replica gone: send the call elsewhere
                response.cancel()
                answer.cancel()
                raise _ReplicaLost(key)
            return answer.result()
        except LOST as exc:
            if sent >= self.restored_at.get(key, -math.inf):  # not a call from before a restore
                self.unavailable.add(key)
            raise _ReplicaLost(key) from exc
        except asyncio.CancelledError:  # a hedged call whose twin answered first
            answer.cancel()
            raise
        finally:
            gone.cancel()
            self.in_flight[key] -= 1

    def _done(self, stage: str, replica: str, seconds: float, out: dict | None) -> None:
        self.windows[stage].add(seconds)
        if out is not None:
            self._judge(stage, replica, seconds)
            self.winner_device_s += float(out.get("device_s", 0.0))

    def _judge(self, stage: str, replica: str, seconds: float) -> None:
        """A call's latency (or a lower bound of it) on ``replica``, judged against its peers of
        the same device type."""
        self.slow.observe(f"{stage}@{replica}", f"{stage}@{replica.split('/')[0]}", seconds)

    async def _call(self, stage: str, rows: pd.DataFrame, blocks: dict | None, gear: int = 0) -> dict[str, Any]:
        """A stage call; a call whose replica was lost (its actor died) is sent again to
        another replica, at most once per replica of the stage."""
        for _ in range(len(self.routers[stage].weights)):
            try:
                return await self._call_once(stage, rows, blocks, gear)
            except _ReplicaLost:
                self.counts["retried"] += 1
        return await self._call_once(stage, rows, blocks, gear)

    async def _call_once(self, stage: str, rows: pd.DataFrame, blocks: dict | None, gear: int = 0) -> dict[str, Any]:
        router = self.routers[stage]
        gone = [r for r in router.weights if f"{stage}@{r}" in self.unavailable]
        if len(gone) == len(router.weights):
            raise RuntimeError(f"stage {stage!r}: every replica is drained or lost ({sorted(gone)})")
        slow = [r.split("@", 1)[1] for r in self.slow.slow(f"{stage}@{r}" for r in router.weights
                                                          if r not in gone)]
        slow += gone
        first = router.pick(exclude=slow)
        self.counts["calls"] += 1
        t0 = time.perf_counter()
        response = await self._send(stage, first, rows, blocks, gear)
        delay = self.windows[stage].delay() if self.hedging and len(router.weights) > 1 else None
        if delay is None:
            out = await self._await(stage, first, response)
            self._done(stage, first, time.perf_counter() - t0, out)
            return out
        task = asyncio.ensure_future(self._await(stage, first, response))
        done, _ = await asyncio.wait({task}, timeout=delay)
        if done:
            out = task.result()
            self._done(stage, first, time.perf_counter() - t0, out)
            return out
        others = [r for r in router.weights if r != first and r not in gone]
        if self.hedge_idle_only:  # only to a replica with nothing in flight (serving.runtime.hedge)
            others = [r for r in others if not self.in_flight.get(f"{stage}@{r}", 0)]
            if not others:
                self.counts["hedges_skipped_busy"] += 1
        second = router.pick(exclude=[r for r in router.weights if r not in others or r in slow])
        if second not in others:
            second = others[0] if others else None
        if second is None:  # no other replica is up (or idle): wait for the first
            out = await task
            self._done(stage, first, time.perf_counter() - t0, out)
            return out
        self.counts["hedges"] += 1
        t1 = time.perf_counter()
        response2 = await self._send(stage, second, rows, blocks, gear)
        task2 = asyncio.ensure_future(self._await(stage, second, response2))
        pending = {task, task2}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = next((t for t in done if t.exception() is None), None)
            if winner is not None:
                break
        else:  # both failed: the first failure is the answer
            return task.result()
        loser, loser_response = (task2, response2) if winner is task else (task, response)
        loser_response.cancel()
        loser.cancel()
        out = winner.result()
        now = time.perf_counter()
        if winner is task:
            self._done(stage, first, now - t0, out)
        else:
            self.counts["hedge_wins"] += 1
            self._done(stage, second, now - t1, out)
            # the first call took at least this long: its replica is judged on that lower bound
            # too, or a replica whose stalled calls are always cancelled would never be judged slow
            self.windows[stage].add(now - t0)
            self._judge(stage, first, now - t0)
        return out

    async def predict(self, rows: pd.DataFrame) -> dict[str, Any]:
        self._start_watch()
        token, gear = self.gear_switch.begin()
        try:
            out = await self._predict(rows, gear)
        finally:
            self.gear_switch.end(token)
        self.gear_rows[gear] = self.gear_rows.get(gear, 0) + len(rows)
        return {**out, **self.gear_switch.fields(gear)}

    async def _predict(self, rows: pd.DataFrame, gear: int) -> dict[str, Any]:
        n = len(rows)
        proba, level, devices = None, np.zeros(n, dtype=np.int64), np.empty(n, dtype=object)
        todo = np.arange(n)
        frame, blocks = rows, None
        for stage in self.stages:
            out = await self._call(stage, frame, blocks, gear)
            part = np.asarray(out["proba"])
            if proba is None:
                proba = np.zeros((n, *part.shape[1:]))
            proba[todo], level[todo], devices[todo] = part, out["level"], out["device"]
            unsure = np.asarray(out["unsure"], dtype=np.int64)
            if not unsure.size:
                break
            todo = todo[unsure]
            frame, blocks = frame.iloc[unsure].reset_index(drop=True), out["blocks"]
        return {"proba": proba, "level": level, "device": devices}

    def stats(self) -> dict[str, Any]:
        return {"picks": dict(self.picks), **self.counts, "reassigned": self.slow.reassigned,
                "winner_device_s": self.winner_device_s, "in_flight": dict(self.in_flight),
                "unavailable": sorted(self.unavailable), "gear_rows": dict(self.gear_rows),
                "gear_switches": 0 if self.gear_switch.policy is None else self.gear_switch.policy.switches,
                "hedge_delay_s": {s: w.delay() for s, w in self.windows.items()}}


class _ReplicaLost(Exception):
    """A stage call failed because its replica's actor died (the call may be sent again)."""


@dataclass
class HeteroApp:
    """A deployed heterogeneous app: its ingress handle, deployments, and how to stop it."""

    name: str
    ingress: Any
    deployments: dict[tuple[str, str], int]
    stages: list[str]

    def set_weights(self, weights: Weights) -> dict[str, dict[str, float]]:
        return self.ingress.set_weights.remote(weights).result()

    def set_hedging(self, enabled: bool) -> bool:
        return self.ingress.set_hedging.remote(enabled).result()

    def set_gears(self, info: dict[str, Any] | None) -> dict[str, Any]:
        return self.ingress.set_gears.remote(info).result()

    def stats(self) -> dict[str, Any]:
        return self.ingress.stats.remote().result()

    def drain(self, keys: Sequence[str], *, timeout_s: float = 30.0) -> float:
        """A preemption notice: stop routing to these replicas ("stage@device/k") and wait
        until their calls in flight finished; returns the seconds it took."""
        t0 = time.monotonic()
        while any(self.ingress.drain.remote(list(keys)).result().values()):
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"drain: calls still in flight on {list(keys)} after {timeout_s:g}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def restore(self, keys: Sequence[str]) -> list[str]:
        return self.ingress.restore.remote(list(keys)).result()

    def handle(self, stage: str, device_type: str, index: int = 0) -> Any:
        return serve.get_deployment_handle(deployment_name(self.name, stage, device_type, index), self.name)

    def replica_info(self) -> list[dict[str, Any]]:
        return [self.handle(stage, device, k).info.remote().result()
                for (stage, device), n in sorted(self.deployments.items()) for k in range(n)]

    def shutdown(self) -> None:
        delete_app(self.name)


def deploy_hetero(source: Any, specs: Sequence[StageSpec], replicas: Mapping[tuple[str, str], int],
                  weights: Weights, emulation: DeviceEmulation, *, name: str = "hetero", seed: int = 0,
                  device_share: float = 1.0, jitter: Mapping[str, tuple[float, float]] | None = None,
                  hedging: bool = False, hedge_quantile: float = HEDGE_QUANTILE,
                  probation_s: float = PROBATION_S, hedge_floor: float = HEDGE_FLOOR_OVER_MEDIAN,
                  hedge_idle_only: bool = HEDGE_IDLE_ONLY,
                  ingress_resources: Mapping[str, float] | None = None) -> HeteroApp:
    """Deploy ``replicas[(stage, device type)]`` replicas, each its own one-replica
    deployment requesting ``device_share`` of one device of its type (custom resource), so
    it lands on a node carrying that type; and the ingress (no CPU reserved).

    ``device_share`` < 1 lets several apps hold the same devices while only one is driven
    at a time (a benchmark's side-by-side plans); ``jitter["stage@device/k"]`` = (share of
    calls, factor) slows that replica on that share of its calls; ``hedging``,
    ``hedge_quantile``, ``hedge_floor`` (over the median), ``hedge_idle_only`` and
    ``probation_s`` steer straggler mitigation (:mod:`serving.runtime.hedge`);
    ``ingress_resources`` pins the ingress (e.g. to a reliable node: a transient node's loss
    must not take the router with it)."""
    names = [s.name for s in specs]
    unknown = sorted({s for s, _ in replicas} - set(names))
    if unknown:
        raise ValueError(f"replicas name stages {unknown} the pipeline does not have ({names})")
    for stage in names:
        if not any(n > 0 for (s, _), n in replicas.items() if s == stage):
            raise ValueError(f"replicas: stage {stage!r} has no replica")
    if not 0 < device_share <= 1:
        raise ValueError(f"device_share must be in (0, 1], got {device_share!r}")
    jitter = dict(jitter or {})
    check_jitter(jitter)
    _check_free_devices(replicas, device_share)
    by_name = {s.name: s for s in specs}
    keys, bound, known = [], [], set()
    for (stage, device), n in sorted(replicas.items()):
        for k in range(int(n)):
            key = replica_key(device, k)
            known.add(f"{stage}@{key}")
            dep = DeviceStage.options(
                name=deployment_name(name, stage, device, k), num_replicas=1,
                ray_actor_options={"num_cpus": 0, "resources": {device: device_share}})
            keys.append((stage, key))
            bound.append(dep.bind(source, by_name[stage], device, emulation, seed * 1000 + len(keys),
                                  jitter.get(f"{stage}@{key}", (0.0, 1.0))))
    stray = sorted(set(jitter) - known)
    if stray:
        raise ValueError(f"jitter names replicas this plan does not have: {stray} (known: {sorted(known)})")
    ingress_options: dict[str, Any] = {"num_cpus": 0}
    if ingress_resources:
        ingress_options["resources"] = dict(ingress_resources)
    app = HeteroIngress.options(name=f"{name}-ingress", num_replicas=1, ray_actor_options=ingress_options).bind(
        names, keys, bound, weights, hedging, hedge_quantile, probation_s, hedge_floor, hedge_idle_only)
    run_app(app, name)
    handle = serve.get_app_handle(name)
    return HeteroApp(name, handle, {k: int(n) for k, n in replicas.items() if n > 0}, names)


#: seconds a shortfall of free devices may last before a plan is refused: an app deleted just
#: before gives its devices back a moment after its replicas' actors are gone (the cluster's
#: resource view lags; a loaded machine saw both device types at 0 free right after a delete)
FREE_DEVICES_WAIT_S = 15.0


def _check_free_devices(replicas: Mapping[tuple[str, str], int], device_share: float,
                        wait_s: float = FREE_DEVICES_WAIT_S) -> None:
    """Refuse a plan the cluster's free devices cannot hold (Serve would wait for them forever),
    once the shortfall outlasts ``wait_s``."""
    import ray

    need: dict[str, float] = {}
    for (_, device), n in replicas.items():
        need[device] = need.get(device, 0.0) + n * device_share
    deadline = time.monotonic() + wait_s
    while True:
        free = ray.available_resources()
        short = {d: (n, float(free.get(d, 0.0))) for d, n in need.items() if n > free.get(d, 0.0) + 1e-9}
        total = ray.cluster_resources()
        # wait only for what the cluster has at all: a plan beyond its totals is refused at once
        if not short or time.monotonic() > deadline or any(n > total.get(d, 0.0) + 1e-9 for d, n in need.items()):
            break
        time.sleep(0.25)
    if short:
        raise ValueError("the cluster's free devices cannot hold these replicas (device type: needed, free): "
                         + ", ".join(f"{d}: {n:g}, {f:g}" for d, (n, f) in sorted(short.items())))
