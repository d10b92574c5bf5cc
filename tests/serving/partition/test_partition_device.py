"""A captured graph moved to a device: device constants follow it, the caller's module stays.

The GPU is stood in for by torch's ``meta`` device: the copy's device constants and
parameters must all name it, and the copy must run there. (``meta`` tolerates a stray CPU
constant that CUDA refuses, so the tests read the graph's constants rather than wait for
an error; ``benchmarks.gpu_check`` runs the same path on a GPU.)
"""

from __future__ import annotations

import torch
from torch import nn

from serving import partition as sp
from serving.partition.device import graph_device, retarget


class Positional(nn.Module):
    """Like BERT's embeddings: a position index made with ``arange`` inside the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Embedding(64, 8)
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.proj(x + self.pos(positions)[None])
        return self.out(torch.relu(h)).mean(dim=1)


def _captured() -> tuple[Positional, sp.Graph]:
    torch.manual_seed(0)
    module = Positional()
    graph = sp.capture(module, torch.randn(3, 5, 8))
    assert graph.kind == "export" and len(graph) >= 2
    return module, graph


def _device_constants(gm: torch.fx.GraphModule) -> set[str]:
    return {str(v) for n in gm.graph.nodes for v in n.kwargs.values() if isinstance(v, torch.device)}


def test_export_bakes_the_example_device_and_retarget_rewrites_it():
    _, graph = _captured()
    assert _device_constants(graph.gm) == {"cpu"}  # the trap: arange(device=cpu) in the graph
    moved = sp.to_device(graph, "meta", check=False)
    assert _device_constants(moved.gm) == {"meta"}
    out = sp.Pipeline(sp.split(moved, [1]))(torch.randn(4, 5, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (4, 2)


def test_to_device_leaves_the_callers_module_and_graph_alone():
    module, graph = _captured()
    before = {k: v.data_ptr() for k, v in module.state_dict().items()}
    moved = sp.to_device(graph, "meta", check=False)
    assert all(p.device.type == "cpu" for p in module.parameters())
    assert {k: v.data_ptr() for k, v in module.state_dict().items()} == before
    assert graph_device(graph).type == "cpu" and graph_device(moved).type == "meta"
    assert all(p.device.type == "meta" for p in moved.gm.parameters())
    # a copy on the same kind of device composes to the module (split == model there)
    copy = sp.to_device(graph, "cpu", check=True)
    x = torch.randn(2, 5, 8)
    assert sp.allclose(sp.Pipeline(sp.split(copy, [1]))(x), module(x))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(copy.module.parameters(), module.parameters(), strict=True))


def test_on_device_returns_the_graph_itself_where_it_already_lives():
    _, graph = _captured()
    assert sp.on_device(graph, "cpu") is graph


def test_profile_on_another_device_does_not_move_the_callers_model():
    module, graph = _captured()
    prof = sp.profile(graph, batch_sizes=(2,), device="meta", repeats=1, warmup=0)
    assert prof.device == "meta" and all(p.device.type == "cpu" for p in module.parameters())
    assert graph_device(graph).type == "cpu"


def test_retarget_module_rewrites_graph_modules_inside_a_stage():
    _, graph = _captured()
    stage = sp.split(graph, [1])[0]
    assert isinstance(stage, torch.fx.GraphModule)
    sp.retarget_module(stage, "meta")
    assert _device_constants(stage) <= {"meta"}
    assert all(p.device.type == "meta" for p in stage.parameters())


def test_retarget_counts_nothing_when_the_graph_is_already_there():
    _, graph = _captured()
    assert retarget(graph.gm, "cpu") == 0


def test_sequential_graphs_move_with_their_blocks():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = sp.capture(module, torch.randn(3, 4))
    moved = sp.to_device(graph, "meta", check=False)
    assert all(p.device.type == "meta" for b in moved.blocks for p in b.module.parameters())
    assert all(p.device.type == "cpu" for p in module.parameters())
