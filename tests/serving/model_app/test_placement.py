"""Replica resources for a partitioned model: whole or shared GPUs, and a refusal that says
what is missing (no Ray: the nodes are given)."""

from __future__ import annotations

import pytest

from serving.core.profiles import NodeSpec
from serving.model_app.placement import (
    ReplicaResources,
    check_placeable,
    fits,
    floor_units,
    replica_resources,
)


def _node(cpus: float, gpus: float = 0.0, host: str = "h") -> NodeSpec:
    return NodeSpec(node_id=host, host=host, cpus=cpus, gpus=gpus, head=False)


def test_cpu_replicas_take_cpus_per_replica():
    need = replica_resources(4, "cpu", [_node(2)], cpus_per_replica=0.5)
    assert need == ReplicaResources(num_cpus=0.5, num_gpus=0.0)
    check_placeable(4, need, [_node(2)])


def test_a_gpu_each_when_there_are_enough():
    assert replica_resources(2, "cuda", [_node(8, 4)]).num_gpus == 1.0


def test_replicas_share_one_gpu_and_the_shares_never_add_up_past_it():
    need = replica_resources(3, "cuda", [_node(8, 1)])
    assert need.num_gpus == pytest.approx(0.3333) and 3 * need.num_gpus <= 1.0
    check_placeable(3, need, [_node(8, 1)])
    # rounding up (0.3334) would have left the third replica waiting
    assert fits(3, ReplicaResources(0.0, 0.3334), [_node(8, 1)]) == 2


def test_floor_units_never_rounds_up():
    assert floor_units(1 / 3) == pytest.approx(0.3333)
    assert floor_units(0.5) == 0.5


def test_replicas_never_span_nodes():
    nodes = [_node(1.5, host="a"), _node(1.5, host="b")]
    assert fits(3, ReplicaResources(1.0, 0.0), nodes) == 2  # 3 CPUs in all, but 1.5 per node
    with pytest.raises(ValueError, match=r"needs 3 replicas of 1 CPU and 0 GPU each.*hold 2.*a: 1.5 CPU"):
        check_placeable(3, ReplicaResources(1.0, 0.0), nodes)


def test_no_gpu_in_the_cluster_is_refused_by_name():
    with pytest.raises(ValueError, match="no free GPU"):
        replica_resources(2, "cuda", [_node(8, 0)])


def test_gpus_per_replica_is_checked():
    assert replica_resources(2, "cuda", [_node(8, 1)], gpus_per_replica=0.25).num_gpus == 0.25
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="gpus_per_replica"):
            replica_resources(2, "cuda", [_node(8, 1)], gpus_per_replica=bad)
    with pytest.raises(ValueError, match="replicas"):
        replica_resources(0, "cpu", [_node(8)])
