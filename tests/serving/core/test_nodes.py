"""An app given a GPU share (deploy's ``gpus``) plans for that share of the free GPUs, node by node."""

from __future__ import annotations

import pytest

from serving.core.nodes import within_gpus
from serving.core.profiles import NodeSpec


def _nodes() -> list[NodeSpec]:
    return [NodeSpec("a", "h1", 4.0, 1.0, head=True), NodeSpec("b", "h2", 4.0, 2.0), NodeSpec("c", "h2", 2.0, 0.0)]


def test_no_share_leaves_the_nodes_as_they_are():
    nodes = _nodes()
    assert within_gpus(nodes, None) is nodes


def test_a_share_is_taken_node_by_node_and_cpus_are_untouched():
    capped = within_gpus(_nodes(), 1.5)
    assert [n.gpus for n in capped] == [1.0, 0.5, 0.0]
    assert [n.cpus for n in capped] == [4.0, 4.0, 2.0] and capped[0].head
    assert [n.gpus for n in within_gpus(_nodes(), 0.5)] == [0.5, 0.0, 0.0]
    assert [n.gpus for n in within_gpus(_nodes(), 10)] == [1.0, 2.0, 0.0]  # no more than is free


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_bad_share_is_named(bad):
    with pytest.raises(ValueError, match="gpus"):
        within_gpus(_nodes(), bad)


def test_a_ray_started_for_a_share_gets_whole_units(monkeypatch):
    """Ray refuses fractional CPU and GPU counts at start: an app deployed with cpus=1.5 and gpus=0.5 starts it
    with 2 and 1, and the app's plan keeps to its share (``within_gpus``, the cpus budget)."""
    import ray

    import serving.launch.deploy as d

    started: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(d, "use_proxy", lambda *a, **k: "serve")
    monkeypatch.setattr(d, "start_local_ray", lambda **kw: started.update(kw))
    assert d._ensure_ray(None, 1.5, 0.5) is True
    assert started["num_cpus"] == 2 and started["num_gpus"] == 1
    assert isinstance(started["num_cpus"], int) and isinstance(started["num_gpus"], int)
