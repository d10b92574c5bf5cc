"""A captured model as data: a chain of blocks that can be cut between any two of them.

:mod:`.capture` builds a :class:`Graph`; :mod:`.split` turns one into stage modules. Both
read this vocabulary, so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn


class CaptureError(ValueError):
    """The module cannot be cut into blocks; the message says which construct and where."""


@dataclass
class Block:
    """One unit the planner may put a cut before or after."""

    name: str
    #: ``sequential``: the child module; traced: the indices of its nodes in ``Graph.nodes``
    module: nn.Module | None = None
    nodes: list[int] = field(default_factory=list)


@dataclass
class Graph:
    """A module captured as blocks; ``len(graph)`` is the number of blocks."""

    module: nn.Module
    example: tuple
    blocks: list[Block]
    kind: str  # "sequential" | "export" | "fx"
    #: traced routes: the flat graph module and its computing nodes in execution order
    gm: fx.GraphModule | None = None
    nodes: list[fx.Node] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: export route: how the flat outputs fold back into the module's output structure
    out_spec: Any = None

    def __len__(self) -> int:
        return len(self.blocks)

    def __repr__(self) -> str:
        names = ", ".join(b.name for b in self.blocks[:6])
        more = ", ..." if len(self.blocks) > 6 else ""
        return f"Graph({self.kind}, {len(self)} blocks: {names}{more})"

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.blocks]
