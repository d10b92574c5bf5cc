"""Capture a torch module as a chain of blocks that can be cut between any two of them.

Three routes, tried in order (the first that applies wins):

1. ``nn.Sequential`` (nested ones flattened): each child is a block, and the activation
   between two blocks is whatever the child returns (a tensor or a tuple of tensors),
   handed on as one argument, exactly as ``nn.Sequential`` does.
2. ``torch.export`` (batch and other dimensions left dynamic with ``Dim.AUTO``): the
   exported aten graph, cut only where the module owning the nodes changes
   (``nn_module_stack``), at the deepest module level that gives at most ``max_blocks``.
3. ``torch.fx.symbolic_trace``: the same module-boundary grouping on the traced graph.

For routes 2 and 3 everything alive at a cut crosses it: a transformer's hidden state and
its attention mask, symbolic sizes, the model's own input if a later block reads it.
A model whose Python branches on tensor values cannot be captured by either tracer; the
error names the construct and the line.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
from torch import fx, nn

from .graph import Block, CaptureError, Graph
from .split import check_composition

#: blocks a captured graph is coarsened to at most (the DP is quadratic in it)
MAX_BLOCKS = 200
#: nodes that carry no computation of their own in an exported graph
_SKIPPED_MODULES = ("_guards_fn",)


def _as_args(example: Any) -> tuple:
    if isinstance(example, tuple):
        return example
    if isinstance(example, list):
        return tuple(example)
    return (example,)


def _flatten_sequential(module: nn.Sequential, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, nn.Sequential):
            out.extend(_flatten_sequential(child, path + "."))
        else:
            out.append((path, child))
    return out


def _even_groups(count: int, groups: int) -> list[range]:
    """``count`` items in ``groups`` consecutive runs of near-equal length."""
    bounds = [round(i * count / groups) for i in range(groups + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(groups) if bounds[i + 1] > bounds[i]]


def _capture_sequential(module: nn.Sequential, args: tuple, max_blocks: int) -> Graph:
    if len(args) != 1:
        raise CaptureError(f"an nn.Sequential takes one input, the example has {len(args)}")
    children = _flatten_sequential(module)
    if not children:
        raise CaptureError("the nn.Sequential has no children")
    blocks = []
    for run in _even_groups(len(children), min(max_blocks, len(children))):
        part = [children[i] for i in run]
        mod = part[0][1] if len(part) == 1 else nn.Sequential(*(m for _, m in part))
        name = part[0][0] if len(part) == 1 else f"{part[0][0]}..{part[-1][0]}"
        blocks.append(Block(name, module=mod))
    return Graph(module, args, blocks, "sequential")


def _dynamic_shapes(args: tuple) -> tuple:
    auto = torch.export.Dim.AUTO
    return tuple({d: auto for d in range(a.dim())} if isinstance(a, torch.Tensor) else None for a in args)


def _widen_batch(args: tuple) -> tuple:
    """A batch of 1 would be specialized by export (0/1 specialization): use 2 rows."""
    return tuple(torch.cat([a, a]) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == 1 else a
                 for a in args)


def _module_path(node: fx.Node, depth: int) -> str:
    """The owning module's path, cut at ``depth`` levels below the root ("" = the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if v and v[0] and not str(v[0]).startswith("_")]
    if not paths:
        return ""
    return paths[min(depth, len(paths)) - 1]


def _computing(node: fx.Node) -> bool:
    if node.op in ("placeholder", "get_attr", "output"):
        return False
    return not (node.op == "call_module" and node.target in _SKIPPED_MODULES)


def _group(nodes: list[fx.Node], depth: int) -> list[tuple[str, list[int]]]:
    runs: list[tuple[str, list[int]]] = []
    for i, node in enumerate(nodes):
        key = _module_path(node, depth)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(i)
        else:
            runs.append((key, [i]))
    return runs


def _blocks_from_nodes(nodes: list[fx.Node], max_blocks: int) -> list[Block]:
    """Runs of nodes owned by one module, at the deepest level with at most ``max_blocks``."""
    deepest = max((len(n.meta.get("nn_module_stack") or {}) for n in nodes), default=1)
    best = _group(nodes, 1)
    for depth in range(2, deepest + 2):
        runs = _group(nodes, depth)
        if len(runs) > max_blocks:
            break
        if len(runs) == len(best) and depth > 2:
            continue
        best = runs
    if len(best) > max_blocks:  # even the top level has too many runs: merge neighbours
        merged = []
        for run in _even_groups(len(best), max_blocks):
            part = [best[i] for i in run]
            name = part[0][0] if len(part) == 1 else f"{part[0][0] or '<root>'}..{part[-1][0] or '<root>'}"
            merged.append((name, [i for _, idx in part for i in idx]))
        best = merged
    names: dict[str, int] = {}
    blocks = []
    for key, idx in best:
        key = key or "<root>"
        names[key] = names.get(key, 0) + 1
        blocks.append(Block(key if names[key] == 1 else f"{key}#{names[key]}", nodes=idx))
    return blocks


def _user_frame(exc: BaseException) -> str:
    """``file:line: source`` of the innermost frame outside torch, where the construct is."""
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(torch_dir) and frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}: `{(frame.line or '').strip()}`"
    return "an unknown line"


def _control_flow_error(exc: BaseException, module: nn.Module) -> CaptureError:
    where = _user_frame(exc)
    return CaptureError(
        f"cannot capture {type(module).__name__}: data-dependent control flow (a Python `if`, "
        f"`while` or `bool()` on a tensor's value) at {where}. A cut needs one graph for every "
        "input: rewrite the branch with torch.where / torch.cond, or make the module an "
        "nn.Sequential whose children hold the branches (each child is then one block)."
    )


def _is_control_flow(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(s in text for s in ("control flow", "data-dependent", "GuardOnDataDependent",
                                   "Dynamic control flow", "item()"))


def _traced(module: nn.Module, args: tuple, max_blocks: int) -> Graph:
    notes: list[str] = []
    export_error: BaseException | None = None
    gm = None
    kind = "export"
    out_spec = None
    try:
        with torch.no_grad():
            ep = torch.export.export(module, _widen_batch(args), dynamic_shapes=_dynamic_shapes(args),
                                     strict=False)
        exported = ep.module()
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for node in exported.graph.nodes:
            if node.op == "call_module" and node.target in _SKIPPED_MODULES:
                continue
            env[node] = graph.node_copy(node, lambda a: env[a])
        gm = fx.GraphModule(exported, graph)
        out_spec = ep.call_spec.out_spec
    except Exception as exc:  # fall back to fx, which names the line of a Python branch
        export_error = exc
        notes.append(f"torch.export failed ({type(exc).__name__}); captured with torch.fx")
    if gm is None:
        kind = "fx"
        try:
            gm = fx.symbolic_trace(module)
        except Exception as exc:
            if _is_control_flow(exc) or (export_error is not None and _is_control_flow(export_error)):
                raise _control_flow_error(exc, module) from exc
            raise CaptureError(
                f"cannot capture {type(module).__name__}: torch.export failed with "
                f"{type(export_error).__name__}: {str(export_error)[:300]}; torch.fx failed with "
                f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    nodes = [n for n in gm.graph.nodes if _computing(n)]
    if not nodes:
        raise CaptureError(f"{type(module).__name__} has no operations to cut")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise CaptureError(f"the traced graph takes {len(placeholders)} inputs but the example has "
                           f"{len(args)}; pass the example as a tuple of the forward's tensor arguments")
    return Graph(module, args, _blocks_from_nodes(nodes, max_blocks), kind, gm=gm, nodes=nodes, notes=notes,
                 out_spec=out_spec)


def capture(module: nn.Module, example: Any, *, max_blocks: int = MAX_BLOCKS) -> Graph:
    """``module`` as a chain of at most ``max_blocks`` blocks (see the module docstring).

    ``example`` is the forward's input: a tensor, or a tuple of tensors for several
    arguments. The module is put in eval mode. The composition of the blocks is checked
    against the module on the example (allclose); a mismatch is an error.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(max_blocks, int) or max_blocks < 1:
        raise ValueError(f"max_blocks must be a positive int, got {max_blocks!r}")
    args = _as_args(example)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("example must be a tensor or a tuple of tensors (the forward's arguments)")
    module.eval()
    if isinstance(module, nn.Sequential):
        graph = _capture_sequential(module, args, max_blocks)
    else:
        graph = _traced(module, args, max_blocks)
    check_composition(graph)
    return graph
