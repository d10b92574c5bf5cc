"""What one stage replica sustains on each node pool, measured there (``deploy(pools=...)``).

For each pool, one Ray actor placed on the pool's nodes the way its replicas will be (the
pool's label selector or custom resource) loads the artifact and times each model stage on
the sample rows at the planned batch size, with the earlier levels' feature blocks handed in
as a replica receives them (:func:`serving.measure.stages.time_stage`). A node that emulates a
device (:mod:`serving.runtime.emulated_node`, tests and benchmarks only) holds each batch as
its replicas do, so the rate is the device's. Rows per second per replica go to the
heterogeneity LP (:func:`serving.planning.pools.plan_pools`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serving.planning.pools import PoolSpec

#: timed repeats per stage and pool (median)
POOL_REPEATS = 5
#: seconds one pool's measurement may take (its actor's start included) before deploy refuses
POOL_MEASURE_TIMEOUT_S = 180.0


class _PoolTimer:
    """A worker on one pool that times the stages there."""

    def __init__(self, source: Any):
        self.opt = source.load()

    def rates(self, specs: Sequence[dict[str, Any]], batch_rows: Sequence[int], repeats: int) -> dict[str, Any]:
        import ray

        from serving.core.specs import StageSpec
        from serving.measure.stages import profile_rows, time_stage
        from serving.runtime.emulated_node import node_emulation

        rows = profile_rows(self.opt, None)
        out, emulated = {}, {}
        for spec, batch in zip(specs, batch_rows, strict=True):
            stage = StageSpec(**spec)
            emulation = node_emulation(stage=stage.name)
            wall, _ = time_stage(self.opt, stage, rows, [batch], repeats)
            device_s = wall[batch] + emulation.hold_s(wall[batch], batch)
            out[stage.name], emulated[stage.name] = batch / max(device_s, 1e-9), emulation.info()
        return {"rows_per_s": out, "node": ray.get_runtime_context().get_node_id(), "emulation": emulated}


def pool_nodes(pools: Sequence[PoolSpec], nodes: Sequence[dict[str, Any]] | None = None) -> dict[str, list[str]]:
    """Node ids (hex) of each pool among the cluster's live nodes (``ray.nodes()``)."""
    import ray

    nodes = ray.nodes() if nodes is None else nodes
    out: dict[str, list[str]] = {}
    for p in pools:
        out[p.name] = [n["NodeID"] for n in nodes
                       if n.get("Alive") and p.holds(n.get("Labels") or {}, n.get("Resources") or {})]
    return out


def measure_pool_rates(source: Any, specs: Sequence[Any], pools: Sequence[PoolSpec], batch_rows: Sequence[int],
                       *, repeats: int = POOL_REPEATS,
                       timeout_s: float = POOL_MEASURE_TIMEOUT_S) -> dict[str, dict[str, float]]:
    """``rates[stage][pool]``: rows per second one replica of each stage in ``specs`` sustains on
    each pool at ``batch_rows`` (one per stage). The pools are measured one after the other (two
    at once would time each other's load). TimeoutError naming the pool when its actor does not
    answer within ``timeout_s`` (no room on its nodes)."""
    import ray

    rates: dict[str, dict[str, float]] = {vars(s)["name"]: {} for s in specs}
    payload = [dict(vars(s)) for s in specs]
    for pool in pools:
        actor = ray.remote(_PoolTimer).options(num_cpus=0, **pool.actor_options()).remote(source)
        try:
            ref = actor.rates.remote(payload, list(batch_rows), repeats)
            ready, _ = ray.wait([ref], timeout=timeout_s)
            if not ready:
                raise TimeoutError(f"pools[{pool.name!r}]: no worker started on the pool's nodes within "
                                   f"{timeout_s:g} s to measure its stages (are its labels or resources on a live node?)")
            answer = ray.get(ref)
        finally:
            ray.kill(actor)
        for stage, r in answer["rows_per_s"].items():
            rates[stage][pool.name] = float(r)
    return rates
