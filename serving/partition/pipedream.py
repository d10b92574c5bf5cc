"""Read PipeDream's published per-layer GPU profiles (``profiler/*/graph.txt``) as a Profile.

Format (``../shared/datasets/PROVENANCE.md``): one line per layer,
``nodeN -- <module> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
activation_size=<bytes>, parameter_size=<bytes>`` (an activation may be a list
``[a; b; c]`` for modules returning several tensors), then tab-indented edges
``nodeA -- nodeB``. The graph is a DAG (ResNet branches, GNMT's residuals); it is
linearized in topological order (ties broken by node number, which follows the model's
own order), and the bytes crossing a cut are the activations of every node before the
cut that feeds a node after it. Input nodes are not blocks: their activations are the
model's input (their "compute time" is PipeDream's data loading, not device work).
Times were measured at batch size 64 on a GPU; only forward times are used (inference).
"""

from __future__ import annotations

import heapq
import os
import re
from pathlib import Path

from .profile import Profile, Transport

#: the batch size PipeDream's profiles were taken at
PIPEDREAM_BATCH = 64

_NODE = re.compile(r"^(node\d+) -- (.*) -- forward_compute_time=([\d.eE+-]+), backward_compute_time=([\d.eE+-]+), "
                   r"activation_size=(\[[^\]]*\]|[\d.eE+-]+), parameter_size=([\d.eE+-]+)\s*$")
_EDGE = re.compile(r"^\s+(node\d+) -- (node\d+)\s*$")


def _size(text: str) -> float:
    text = text.strip()
    if text.startswith("["):
        return float(sum(float(v) for v in text.strip("[]").split(";") if v.strip()))
    return float(text)


def read_pipedream(path: str | os.PathLike, *, transport: Transport | None = None,
                   name: str | None = None) -> Profile:
    """The profile in ``path`` as a :class:`Profile` at batch size 64 on device "gpu"."""
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        m = _NODE.match(line)
        if m:
            nid, desc, fwd, _bwd, act, par = m.groups()
            nodes[nid] = {"desc": desc.strip(), "ms": float(fwd), "act": _size(act), "params": float(par)}
            continue
        e = _EDGE.match(line)
        if e:
            edges.append((e.group(1), e.group(2)))
            continue
        raise ValueError(f"{path}:{lineno}: not a PipeDream node or edge line: {line[:80]!r}")
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    indeg = dict.fromkeys(nodes, 0)
    for a, b in edges:
        if a not in nodes or b not in nodes:
            raise ValueError(f"{path}: edge {a} -- {b} names an unknown node")
        succ[a].append(b)
        indeg[b] += 1
    key = lambda n: int(n[4:])  # noqa: E731
    ready = [(key(n), n) for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (key(s), s))
    if len(order) != len(nodes):
        raise ValueError(f"{path}: the graph has a cycle")
    inputs = [n for n in order if nodes[n]["desc"].startswith("Input")]
    blocks = [n for n in order if n not in inputs]
    pos = {n: i for i, n in enumerate(blocks)}
    for n in inputs:
        pos[n] = -1
    last_use = {n: max((pos[s] for s in succ[n]), default=len(blocks)) for n in nodes}
    # a node nobody reads is an output of the model
    outputs = [n for n in blocks if not succ[n]]
    for n in outputs:
        last_use[n] = len(blocks)
    cuts = []
    for c in range(len(blocks) + 1):
        cuts.append(sum(nodes[n]["act"] for n in nodes if pos[n] < c <= last_use[n]))
    compute = [[nodes[n]["ms"]] for n in blocks]
    workspace = [[cuts[i] + cuts[i + 1]] for i in range(len(blocks))]
    return Profile(
        name=name or Path(path).stem, device="gpu", batch_sizes=[PIPEDREAM_BATCH],
        block_names=[f"{n}:{nodes[n]['desc'][:40]}" for n in blocks], compute_ms=compute,
        cut_bytes=[[c] for c in cuts], param_bytes=[nodes[n]["params"] for n in blocks],
        workspace_bytes=workspace, transport=transport or Transport(source="none"),
        meta={"source": str(path), "format": "pipedream graph.txt", "batch": PIPEDREAM_BATCH},
    )
