"""A captured graph moved to a device without touching the caller's module.

Two traps this module exists for:

- ``torch.export`` bakes the example's device into the graph: an ``arange`` or ``zeros``
  in the forward becomes ``aten.arange(..., device=cpu)``. Moving the parameters to a GPU
  leaves those constants on the CPU, and the first block that mixes them fails.
  :func:`retarget` rewrites every device constant of a graph module (what
  ``torch.export.passes.move_to_device_pass`` does for an ``ExportedProgram``).
- Blocks and stage modules share their parameters with the captured module, so
  ``stage.to("cuda")`` moves the *caller's* model as a side effect. :func:`to_device`
  works on a deep copy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from .graph import Block, Graph
from .split import check_composition


def as_device(device: str | torch.device) -> torch.device:
    """``"gpu"`` / ``"cuda"`` / ``"cuda:1"`` / ``"cpu"`` as a ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a string or torch.device, got {type(device).__name__}")
    return torch.device("cuda" if device == "gpu" else device)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Equal devices, where ``cuda`` without an index means the current GPU."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def graph_device(graph: Graph) -> torch.device:
    """Where the graph's module lives: its first parameter or buffer, else its example."""
    for t in [*graph.module.parameters(), *graph.module.buffers()]:
        return t.device
    for a in graph.example:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def retarget(gm: fx.GraphModule, device: str | torch.device) -> int:
    """Rewrite every device constant in ``gm``'s graph to ``device`` (in place, recompiled);
    returns how many nodes changed. Parameters are not moved: call ``gm.to(device)``."""
    dev = as_device(device)

    def swap(value: Any) -> Any:
        return dev if isinstance(value, torch.device) and not same_device(value, dev) else value

    changed = 0
    for node in gm.graph.nodes:
        args = pytree.tree_map(swap, node.args)
        kwargs = pytree.tree_map(swap, dict(node.kwargs))
        if isinstance(kwargs.get("device"), str) and not same_device(torch.device(kwargs["device"]), dev):
            kwargs["device"] = dev
        if args != node.args or kwargs != dict(node.kwargs):
            node.args, node.kwargs = args, kwargs
            changed += 1
    if changed:
        gm.recompile()
    return changed


def retarget_module(module: nn.Module, device: str | torch.device) -> nn.Module:
    """``module`` (a stage loaded from disk, say) moved to ``device`` with the device
    constants of every graph module inside it rewritten; returns the module."""
    for sub in module.modules():
        if isinstance(sub, fx.GraphModule):
            retarget(sub, device)
    return module.to(as_device(device))


def to_device(graph: Graph, device: str | torch.device, *, check: bool = True) -> Graph:
    """A copy of ``graph`` whose module, blocks and example live on ``device``.

    The caller's module is never moved (the copy is deep; parameters shared between the
    module, the traced graph and the blocks stay shared inside the copy). With ``check``
    the copy's blocks are composed on the device and compared with its module
    (:func:`serving.partition.split.check_composition`), which is "split == model" there.
    """
    dev = as_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but torch sees no GPU here")
    memo: dict[int, Any] = {}
    module = copy.deepcopy(graph.module, memo)
    gm = copy.deepcopy(graph.gm, memo) if graph.gm is not None else None
    block_modules = copy.deepcopy([b.module for b in graph.blocks], memo)
    nodes: list[fx.Node] = []
    if gm is not None:
        by_name = {n.name: n for n in gm.graph.nodes}
        missing = [n.name for n in graph.nodes if n.name not in by_name]
        if missing:  # pragma: no cover - fx keeps node names when it copies a graph
            raise RuntimeError(f"the copied graph lost nodes {missing[:5]}")
        nodes = [by_name[n.name] for n in graph.nodes]
        retarget(gm, dev)
        gm.to(dev)
    module.to(dev)
    for m in block_modules:
        if m is not None:
            m.to(dev)
    blocks = [Block(b.name, module=m, nodes=list(b.nodes)) for b, m in zip(graph.blocks, block_modules, strict=True)]
    example = tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in graph.example)
    moved = Graph(module.eval(), example, blocks, graph.kind, gm=gm, nodes=nodes, notes=list(graph.notes),
                  out_spec=graph.out_spec)
    if check:
        check_composition(moved)
    return moved


def on_device(graph: Graph, device: str | torch.device, *, check: bool = True) -> Graph:
    """``graph`` itself when it already lives on ``device``, else :func:`to_device`."""
    dev = as_device(device)
    return graph if same_device(graph_device(graph), dev) else to_device(graph, dev, check=check)
