"""A replica's heap, settled once it has loaded: what it imported and loaded (Ray, pandas,
scikit-learn, FastAPI, the artifact: about 200,000 objects in an ingress) is collected once and
frozen (``gc.freeze``), so that Python's full collections no longer walk it.

Why: a full (oldest-generation) collection walks every tracked object with the GIL held. In an
ingress-like process it takes about 125 ms on the project machine (`python -m
benchmarks.single_row_tail` prints it), and every request in flight reads the pause as latency.
An async server promotes the objects of requests in flight to the oldest generation, so full
collections come back every few hundred requests. The load generator's own heap had the same
effect on the benchmarks (serving.measure.loadgen.settled_heap). What requests allocate later
is still collected as before; only what existed when the replica finished loading is skipped
(a cycle among those objects that becomes garbage later is not reclaimed: loading is done once).

Only inside a Serve replica: a class built in a test's or a script's process leaves that
process's heap alone. ``WILLUMP_GC_FREEZE=0`` in the replicas' environment turns it off.
"""

from __future__ import annotations

import gc
import os

#: the environment variable that turns the freeze off ("0")
GC_FREEZE_ENV = "WILLUMP_GC_FREEZE"


def settle_replica_heap(*, in_replica: bool | None = None) -> bool:
    """Collect once and freeze what survives (module docstring). False, and nothing done, outside
    a Serve replica (``in_replica`` None: asked of Serve) or where ``WILLUMP_GC_FREEZE=0``."""
    if in_replica is None:
        in_replica = _in_replica()
    if not in_replica or os.environ.get(GC_FREEZE_ENV, "1").strip() == "0":
        return False
    gc.collect()
    gc.freeze()
    return True


def _in_replica() -> bool:
    try:
        from ray import serve

        serve.get_replica_context()
    except Exception:  # outside a replica: Serve raises
        return False
    return True
