"""This process's capacity routers' policies, by (app, deployment): the ingress asks them whether
a replica of a stage went silent before it copies a call past the bound
(:class:`serving.runtime.calls.StageHedge`), and which node pool has replicas it can count on
(:mod:`serving.runtime.pools`).

Why a module of its own: Serve ships a custom request router by value (``RequestRouterConfig``
registers the router's module with ``cloudpickle.register_pickle_by_value``), so every global of
:mod:`serving.runtime.routing` is a copy in the router that Serve builds, and a registry kept
there was one the ingress never saw (it read "nobody knows" for every stage, and copied every
call at the bound whether or not a replica was silent: the copy could go to the very replica
that held the first call). A module the router imports by name is the process's own.
"""

from __future__ import annotations

from typing import Any

#: (app, deployment) -> the CapacityPolicy of this process's router for it
POLICIES: dict[tuple[str, str], Any] = {}
