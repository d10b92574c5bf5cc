"""The Ray cluster as serving sees it: its nodes, their machines' cores, how the project's
code reaches them, and which address the HTTP servers listen on.

* Nodes: every alive node with the logical CPUs/GPUs still free on it (the planner places
  replicas node by node; Serve cannot place a replica bigger than any node's free CPUs).
* Machines: nodes on one machine share its cores (a test cluster of several raylets on one
  host, or several pods on one VM); each machine's usable cores (CPU affinity and cgroup
  quota) are read by a task on one of its nodes.
* Code: when deploy() joins a cluster it connects with the project's packages (``serving``,
  ``willump``, and ``drift`` for the monitor) as the job's ``runtime_env`` py_modules, which
  Ray uploads and Serve's deployments inherit, so worker nodes need only the third-party
  dependencies installed.
* Host: with more than one node, HTTP must listen where other nodes' fronts can reach it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from serving.core.nodes import nodes
from serving.core.profiles import NodeSpec

__all__ = ["SHIP_CODE", "check_code_reaches", "listen_host", "machine_cores", "nodes", "shipped_modules", "ships_code",
           "usable_cores"]

#: deploy(ship_code=...): "auto" ships the project's packages when joining an existing
#: cluster (``address=``) or when the cluster has more than one node
SHIP_CODE = ("auto", "always", "never")


def usable_cores() -> float:
    """Cores this process may use: CPU affinity, capped by a cgroup v2 quota if one is set."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = float(os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, float(quota) / float(period))
    except (OSError, ValueError):
        pass
    return cores


def _node_facts() -> tuple[str, float]:
    import ray

    return ray.util.get_node_ip_address(), usable_cores()


def machine_cores(node_list: list[NodeSpec]) -> dict[str, float]:
    """Usable cores of each machine (host), read by a zero-CPU task on one of its nodes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here, cores_here = _node_facts()
    out = {here: cores_here}
    task = ray.remote(num_cpus=0)(_node_facts)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote()
            for n in node_list if n.host not in out]
    for host, cores in ray.get(refs, timeout=120):
        out[host] = cores
    return out


def shipped_modules(monitor: bool) -> dict[str, Any]:
    """The job-level runtime_env that ships the project's packages to every node (Ray uploads
    local py_modules only for a job, i.e. in ``ray.init``; Serve deployments inherit it)."""
    import willump

    modules = [str(Path(__file__).resolve().parents[1]), str(Path(willump.__file__).parent)]
    if monitor:
        import drift

        modules.append(str(Path(drift.__file__).parent))
    return {"py_modules": modules, "excludes": ["__pycache__", "*.pyc"]}


def ships_code(ship: str, address: str | None) -> bool:
    """Whether deploy connects to the cluster with the project's packages shipped."""
    if ship not in SHIP_CODE:
        raise ValueError(f"ship_code must be one of {SHIP_CODE}, got {ship!r}")
    return ship == "always" or (ship == "auto" and address is not None)


def check_code_reaches(ship: str, n_nodes: int) -> str | None:
    """A note when the cluster has other nodes but this job ships no code to them."""
    import ray

    env = ray.get_runtime_context().runtime_env or {}
    if n_nodes <= 1 or env.get("py_modules") or env.get("working_dir") or ship == "never":
        return None
    message = ("this driver joined the cluster without shipping the project's code: other nodes must have "
               "serving, willump (and drift) installed; deploy(address=...) ships them")
    if ship == "always":
        raise ValueError("ship_code='always' but Ray was initialized before deploy without the project's "
                         f"packages in its runtime_env: {message}, or ray.init(runtime_env="
                         "serving.launch.cluster.shipped_modules(...))")
    return message


def listen_host(host: str | None, n_nodes: int) -> str:
    """Where Serve's HTTP servers listen: the caller's choice, else loopback on one node and
    all interfaces when other nodes' fronts must reach this node's replicas."""
    if host is not None:
        return host
    return "127.0.0.1" if n_nodes <= 1 else "0.0.0.0"
