"""The replica watcher both ingresses use, on a fake Serve controller (no Ray): counts per named
deployment (0 for one Serve does not list), a failing controller skipped, stop ends it; the
controller's details dict read as running replicas."""

from __future__ import annotations

import asyncio
import enum
import types

import serving.runtime.watch as watch_module
from serving.runtime.watch import ReplicaWatch


class _State(str, enum.Enum):  # how Serve's details dict carries a replica's state
    RUNNING = "RUNNING"
    STARTING = "STARTING"


def _details(running: dict[str, int]) -> dict:
    deployments = {name: {"replicas": [{"state": _State.RUNNING}] * n + [{"state": _State.STARTING}]}
                   for name, n in running.items()}
    return {"applications": {"app": {"deployments": deployments}, "other": {"deployments": {}}}}


def test_running_replicas_counts_the_running_ones_of_the_named_app(monkeypatch):
    import ray.serve.context

    client = types.SimpleNamespace(get_serve_details=lambda: _details({"app-cheap": 2, "app-expensive": 0}))
    monkeypatch.setattr(ray.serve.context, "_get_global_client", lambda: client)
    assert watch_module.running_replicas("app") == {"app-cheap": 2, "app-expensive": 0}


def _status(running: dict[str, int]) -> dict[str, int]:
    return dict(running)


def test_the_watch_reports_running_replicas_and_survives_a_busy_controller(monkeypatch):
    answers = [RuntimeError("controller restarting"), _status({"app-cheap": 2}), _status({"app-cheap": 3, "app-expensive": 1})]
    seen = []

    def status():
        answer = answers.pop(0) if answers else _status({"app-cheap": 3, "app-expensive": 1})
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(watch_module, "running_replicas", lambda app: status())

    async def main():
        watch = ReplicaWatch("app", ["app-cheap", "app-expensive"], seen.append, period_s=0.001)
        watch.start()
        watch.start()  # idempotent
        for _ in range(2000):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.001)
        watch.stop()
        await asyncio.sleep(0)
        return watch

    watch = asyncio.run(main())
    assert seen[0] == {"app-cheap": 2, "app-expensive": 0}  # the failed look was skipped; unlisted counts 0
    assert seen[1] == {"app-cheap": 3, "app-expensive": 1}
    assert watch._task.cancelled() or watch._task.done()


def test_a_watch_of_nothing_never_starts():
    async def main():
        watch = ReplicaWatch("app", [], lambda counts: None)
        watch.start()
        return watch

    assert asyncio.run(main())._task is None
