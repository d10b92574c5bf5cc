"""A cascade whose deep level does not fit one device: deploy(module_memory=...) serves the
module group as a chain of partition stages inside the expensive stage.

The mechanism is checked without Ray first (the chain planned, cut and written; the stages
called through stand-in handles in place of the module: answers equal to the cascade in
process), then served through Ray Serve on the CPU with a memory cap that forces a split."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest
import torch

from serving.core.specs import stage_specs
from serving.launch.module_chains import chain_cpus, plan_module_chains
from serving.model_app.stage_replica import PartitionStageImpl
from serving.runtime.module_chain import RemoteModule, attach_chains

from .module_cascade import optimized_with, rows

#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = pytest.mark.starts_ray

#: bytes per device: each 256x256 layer (263 KiB) fits, the module (~530 KiB) does not
CAP = 400_000.0


@pytest.fixture(scope="module")
def optimized():
    torch.manual_seed(0)
    opt, _ = optimized_with(torch.nn.Sequential(
        torch.nn.Linear(3, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
        torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4)))
    return opt


class _Response:
    def __init__(self, value):
        self.value = value

    def result(self, timeout_s=None):
        return self.value


class _Handle:
    """A stand-in for a Serve handle: calls the stage replica's code in this process."""

    def __init__(self, replica: PartitionStageImpl):
        self.replica = replica

    def remote(self, arg):
        return _Response(self.replica.run(arg.value if isinstance(arg, _Response) else arg))


def test_a_module_over_the_cap_is_planned_as_a_chain_and_one_that_fits_is_not(optimized, tmp_path):
    chains, notes = plan_module_chains(optimized, stage_specs(optimized), module_memory=CAP, devices=2, device="cpu",
                                       cpus_per_replica=0.5, name="t", workdir=tmp_path)
    chain = chains["deep"]
    assert len(chain.stages) >= 2 and chain.stages[0].blocks[0] == 0
    assert all((tmp_path / f"deep-stage{k}.pt").stat().st_mode & 0o777 == 0o600 for k in range(len(chain.stages)))
    assert chain_cpus(chains) == 0.5 * sum(s.replicas for s in chain.stages)
    assert "partition stages" in notes[0]
    fits, notes = plan_module_chains(optimized, stage_specs(optimized), module_memory=1e9, devices=2, device="cpu",
                                     cpus_per_replica=0.5, name="t", workdir=tmp_path / "b")
    assert fits == {} and "fits module_memory" in notes[0]
    assert plan_module_chains(optimized, stage_specs(optimized), module_memory=None, devices=2, device="cpu",
                              cpus_per_replica=0.5, name="t") == ({}, [])
    with pytest.raises(ValueError, match="does not fit 2 device"):  # no cut leaves a 256x256 layer under 100 kB
        plan_module_chains(optimized, stage_specs(optimized), module_memory=100_000.0, devices=2, device="cpu",
                           cpus_per_replica=0.5, name="t", workdir=tmp_path / "c")
    with pytest.raises(ValueError, match="module_memory"):
        plan_module_chains(optimized, stage_specs(optimized), module_memory=-1.0, devices=2, device="cpu",
                           cpus_per_replica=0.5, name="t")


def test_chain_replicas_on_a_gpu_share_it_and_leave_the_stages_a_share():
    """Two chain replicas on one GPU ask a third of it each (one share kept for the plan's GPU
    stages), the stages' plan sees the third that is left, and chains no GPU can hold are refused
    at once, naming the shortfall, rather than waiting forever for a whole GPU each."""
    from serving.core.profiles import NodeSpec
    from serving.core.specs import ChainStageSpec, ModuleChainSpec
    from serving.launch.module_chains import chain_resources, free_after_chains

    one_gpu = [NodeSpec("n0", "h0", cpus=8.0, gpus=1.0)]
    need = chain_resources(2, "cuda", one_gpu, cpus_per_replica=0.5)
    assert need.num_gpus == pytest.approx(0.3333, abs=1e-4) and need.num_cpus == 0.0
    chain = ModuleChainSpec(device="cuda", num_cpus=0.0, num_gpus=need.num_gpus, stages=[
        ChainStageSpec(path="a", sha256="0" * 64, replicas=1, blocks=(0, 3)),
        ChainStageSpec(path="b", sha256="0" * 64, replicas=1, blocks=(3, 9))])
    left = free_after_chains(one_gpu, {"deep": chain})
    assert left[0].gpus == pytest.approx(1 - 2 * need.num_gpus, abs=1e-4) and left[0].cpus == 8.0
    assert one_gpu[0].gpus == 1.0  # the caller's nodes are not changed
    assert chain_resources(2, "cpu", one_gpu, cpus_per_replica=0.5).num_gpus == 0.0
    with pytest.raises(ValueError, match="no free GPU"):
        chain_resources(2, "cuda", [NodeSpec("n0", "h0", cpus=8.0)], cpus_per_replica=0.5)
    with pytest.raises(ValueError, match="needs 40 replicas of 0.5 CPU"):
        chain_resources(40, "cpu", one_gpu, cpus_per_replica=0.5)


def test_the_chain_called_in_place_of_the_module_answers_like_the_cascade(optimized, tmp_path):
    chains, _ = plan_module_chains(optimized, stage_specs(optimized), module_memory=CAP, devices=2, device="cpu",
                                   cpus_per_replica=0.5, name="t", workdir=tmp_path)
    handles = [_Handle(PartitionStageImpl(s.path, "cpu", sha256=s.sha256)) for s in chains["deep"].stages]
    served = cloudpickle.loads(cloudpickle.dumps(optimized))  # a replica's own copy of the artifact
    notes = attach_chains(served, {"deep": handles})
    assert isinstance(served.pipeline.graph_features()["deep"].module, RemoteModule) and "chain of" in notes[0]
    X, _ = rows(300, 9)
    np.testing.assert_allclose(served.predict_proba(X), optimized.predict_proba(X), atol=1e-6)
    with pytest.raises(ValueError, match="not a willump.module_feature"):
        attach_chains(served, {"cheap_a": handles})
    with pytest.raises(ValueError, match="at least one"):
        RemoteModule([])


def test_served_with_its_deep_level_split_across_stage_deployments(ray_cluster, optimized):
    """On the CPU, a memory cap that forces >= 2 stages: answers equal to in process; the
    chain's deployments exist; every stage's canary (the expensive one through the chain) answers."""
    import requests
    from ray import serve

    from serving import deploy
    from serving.launch.insitu import chain_roles

    app = deploy(optimized, name="chained", port=ray_cluster, cpus=3, device="cpu", calibrate="never",
                 insitu="never", module_memory=CAP, module_cpus=0.25)
    try:
        assert app.spec.module_chains is not None and len(app.spec.module_chains["deep"].stages) >= 2
        deployments = serve.status().applications["chained"].deployments
        parts = [d for d in deployments if "-deep-part" in d]
        assert len(parts) == len(app.spec.module_chains["deep"].stages)
        # the in-situ probe charges the chain's processes to the stage that calls it
        roles = chain_roles(app.spec, optimized, app.plan)
        assert sorted(f"chained-{r}" for r in roles) == sorted(parts)
        (caller,) = set(roles.values())
        assert f"chained-{caller}" in deployments and caller != "ingress"
        X, _ = rows(64, 11)
        r = requests.post(app.url + "/predict", json={"rows": X.to_dict("records")}, timeout=120)
        assert r.status_code == 200, r.text
        want_proba, want_level = optimized.predict_with_levels(X)
        np.testing.assert_allclose(np.asarray(r.json()["probabilities"]), want_proba, atol=1e-5)
        assert r.json()["level"] == want_level.tolist() and 0 < sum(r.json()["level"]) < len(X)
        ready = requests.get(app.url + "/readyz", timeout=60)
        assert ready.status_code == 200, ready.text
        assert any("partition stages" in n for n in app.notes)
    finally:
        app.shutdown(stop_ray=False)
