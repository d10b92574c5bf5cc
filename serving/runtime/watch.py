"""How many replicas each deployment runs, read from Serve's controller every few seconds.

Ingresses act on it: the pipeline app keeps CONCURRENT_BATCHES calls in flight per running
replica of a stage (so replicas that the plan or Serve's autoscaler adds get work); the
heterogeneous app takes a replica whose deployment runs none out of routing (its node is gone)
and back in once it runs again. One watcher serves both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from serving.runtime.loop_task import LoopTask

log = logging.getLogger(__name__)

#: seconds between looks at Serve's status
WATCH_S = 1.0


def running_replicas(app: str) -> dict[str, int]:
    """Running replicas per deployment of ``app``, from the controller's details as a plain dict.

    Not ``serve.status()``: that builds Serve's pydantic status objects, which cloudpickle each
    deployment's request-router class and walk ``sys.modules`` to do it; in an ingress replica
    (sklearn, pandas, torch imported) it cost about 7% of the replica's CPU under load at one
    look per second (``docs/benchmarks.md``, lean request path). The dict costs a tenth of it.
    """
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    deployments = details["applications"][app]["deployments"]
    return {name: sum(_state(r.get("state")) == "RUNNING" for r in d.get("replicas", ()))
            for name, d in deployments.items()}


def _state(value: object) -> str:
    return str(getattr(value, "value", value))


class ReplicaWatch(LoopTask):
    """Calls ``on_counts({deployment: running replicas})`` every ``period_s`` for the named
    deployments of ``app`` (a deployment Serve does not list counts 0). A controller that is
    busy or restarting skips a look; the last counts stay in force."""

    def __init__(self, app: str, deployments: Iterable[str], on_counts: Callable[[dict[str, int]], None],
                 period_s: float = WATCH_S):
        self.app = app
        self.deployments = sorted(set(deployments))
        self.on_counts = on_counts
        self.period_s = float(period_s)

    def _wanted(self) -> bool:
        return bool(self.deployments)

    async def _loop(self) -> None:
        while True:
            try:
                running = await asyncio.to_thread(running_replicas, self.app)
                self.on_counts({name: running.get(name, 0) for name in self.deployments})
            except Exception as exc:  # the controller is busy or restarting: look again later
                log.debug("replica watch: %s", exc)
            await asyncio.sleep(self.period_s)
