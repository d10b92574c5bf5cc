"""Cut a captured graph into stage modules whose composition is the original module.

Calling convention, the same for every route: the first stage takes the module's
arguments; every stage but the last returns a tuple, the next stage's arguments (for a
traced graph, every value alive at the cut: hidden state, attention mask, sizes...);
the last stage returns the module's output. :class:`Pipeline` composes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from .graph import CaptureError, Graph

#: tolerances of the composition check done at capture and by tests
RTOL = 1e-4
ATOL = 1e-5


class SequentialStage(nn.Module):
    """Consecutive children of an ``nn.Sequential``; passes the activation on as one object."""

    def __init__(self, blocks: Sequence[nn.Module], last: bool):
        super().__init__()
        self.body = nn.Sequential(*blocks)
        self.last = last

    def forward(self, x: Any) -> Any:
        y = self.body(x)
        return y if self.last else (y,)


class Unflatten(nn.Module):
    """The last stage of an exported graph: folds the flat outputs back into the module's
    output structure (a tensor, a tuple, a dict...)."""

    def __init__(self, body: fx.GraphModule, out_spec: Any):
        super().__init__()
        self.body = body
        self.out_spec = out_spec

    def __getstate__(self) -> dict:
        # a TreeSpec pickles through a deprecated path: store its JSON form instead
        state = dict(self.__dict__)
        state["out_spec"] = pytree.treespec_dumps(self.out_spec)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["out_spec"] = pytree.treespec_loads(state["out_spec"])
        self.__dict__.update(state)

    def forward(self, *args: Any) -> Any:
        return pytree.tree_unflatten(list(self.body(*args)), self.out_spec)


class Pipeline(nn.Module):
    """Stage modules run one after the other: equal to the captured module."""

    def __init__(self, stages: Sequence[nn.Module]):
        super().__init__()
        self.stages = nn.ModuleList(stages)

    def forward(self, *args: Any) -> Any:
        out: Any = args
        for i, stage in enumerate(self.stages):
            out = stage(*out) if i == 0 or isinstance(out, tuple) else stage(out)
        return out


def stage_ranges(graph: Graph, cuts_or_plan: Any) -> list[tuple[int, int]]:
    """Normalize a plan, a list of stages ``(start, end[, replicas])`` / objects with
    ``.start``/``.end``, or a list of cut positions, into contiguous ``(start, end)`` ranges
    covering all blocks."""
    n = len(graph)
    stages = getattr(cuts_or_plan, "stages", cuts_or_plan)
    if not isinstance(stages, (list, tuple)):
        raise TypeError("cuts must be a Plan, a list of stages (start, end[, replicas]) or a list of cut positions")
    if all(isinstance(c, int) for c in stages):
        cuts = sorted(set(stages))
        if any(not 0 < c < n for c in cuts):
            raise ValueError(f"cut positions must lie strictly between 0 and {n} (the number of blocks), got {list(stages)}")
        bounds = [0, *cuts, n]
        return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    ranges = []
    for s in stages:
        if hasattr(s, "start") and hasattr(s, "end"):
            ranges.append((int(s.start), int(s.end)))
        elif isinstance(s, (tuple, list)) and len(s) in (2, 3):
            ranges.append((int(s[0]), int(s[1])))
        else:
            raise TypeError(f"a stage must be (start, end[, replicas]) or have .start/.end, got {s!r}")
    if not ranges or ranges[0][0] != 0 or ranges[-1][1] != n or any(
            a >= b for a, b in ranges) or any(ranges[i][1] != ranges[i + 1][0] for i in range(len(ranges) - 1)):
        raise ValueError(f"stages must be contiguous non-empty block ranges covering 0..{n}, got {ranges}")
    return ranges


def _liveness(graph: Graph) -> tuple[dict[fx.Node, int], dict[fx.Node, int], list[fx.Node], fx.Node]:
    """Definition and last-use position of every value (placeholders at -1, the output at N)."""
    assert graph.gm is not None
    pos = {node: i for i, node in enumerate(graph.nodes)}
    placeholders = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.gm.graph.nodes if n.op == "output")
    end = len(graph.nodes)
    defined = {p: -1 for p in placeholders} | pos
    last_use: dict[fx.Node, int] = {}
    for value in defined:
        uses = [end if u.op == "output" else pos.get(u, -1) for u in value.users]
        last_use[value] = max(uses, default=-1)
    return defined, last_use, placeholders, output


def live_values(graph: Graph, cut: int) -> list[fx.Node]:
    """Values crossing a cut placed before node position ``cut`` (in definition order)."""
    defined, last_use, _, _ = _liveness(graph)
    return [v for v, d in defined.items() if d < cut <= last_use[v]]


def _graph_stage(graph: Graph, first: int, last: int, is_first: bool, is_last: bool) -> nn.Module:
    assert graph.gm is not None
    defined, last_use, placeholders, output = _liveness(graph)
    start = min(graph.blocks[first].nodes)
    stop = max(graph.blocks[last - 1].nodes) + 1
    inputs = placeholders if is_first else [v for v, d in defined.items() if d < start <= last_use[v]]
    outputs = [] if is_last else [v for v, d in defined.items() if d < stop <= last_use[v]]
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for v in inputs:
        env[v] = g.placeholder(v.name)

    def lookup(a: fx.Node) -> fx.Node:
        if a not in env:
            if a.op != "get_attr":
                raise CaptureError(f"value {a.name} is used in a stage but neither computed in it nor passed in")
            env[a] = g.node_copy(a, lookup)
        return env[a]

    for node in graph.nodes[start:stop]:
        env[node] = g.node_copy(node, lookup)
    if is_last:
        g.node_copy(output, lookup)
    else:
        g.output(tuple(env[v] for v in outputs))
    g.lint()
    body = fx.GraphModule(graph.gm, g)
    if is_last and graph.out_spec is not None:
        return Unflatten(body, graph.out_spec)
    return body


def split(graph: Graph, cuts_or_plan: Any) -> list[nn.Module]:
    """One ``nn.Module`` per stage of ``cuts_or_plan`` (a Plan, stage ranges or cut positions);
    ``Pipeline(split(graph, plan))(*example)`` equals the module (allclose)."""
    ranges = stage_ranges(graph, cuts_or_plan)
    stages: list[nn.Module] = []
    for i, (a, b) in enumerate(ranges):
        is_first, is_last = i == 0, i == len(ranges) - 1
        if graph.kind == "sequential":
            stage: nn.Module = SequentialStage([blk.module for blk in graph.blocks[a:b]], is_last)
        else:
            stage = _graph_stage(graph, a, b, is_first, is_last)
        stages.append(stage.eval())
    return stages


def _close(a: Any, b: Any) -> bool:
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.shape != y.shape:
                return False
            if x.is_floating_point():
                if not torch.allclose(x, y, rtol=RTOL, atol=ATOL):
                    return False
            elif not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def check_composition(graph: Graph, example: Any = None) -> None:
    """Cut at every block boundary and compare the composition with the module."""
    args = graph.example if example is None else (example if isinstance(example, tuple) else (example,))
    with torch.inference_mode():
        want = graph.module(*args)
        got = Pipeline(split(graph, list(range(1, len(graph)))))(*args)
    if not _close(want, got):
        raise CaptureError(f"the {len(graph)} captured blocks of {type(graph.module).__name__} do not "
                           "reproduce its output on the example (a module with hidden state or "
                           "in-place side effects?)")


def allclose(a: Any, b: Any) -> bool:
    """Outputs equal within the split tolerances (nested structures compared leaf by leaf)."""
    return _close(a, b)
