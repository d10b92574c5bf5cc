"""Capture, split and profile on real torch modules (no Ray; no assertion on speed)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import serving.partition as sp


class Residual(nn.Module):
    """Skip connections, two inputs and a nested output: everything alive must cross a cut."""

    def __init__(self, layers: int = 12, width: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> dict:
        first = x
        for layer in self.layers:
            x = x + torch.relu(layer(x)) * scale
        return {"logits": self.head(x + first), "norm": (x.norm(dim=1), scale.shape[1])}


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:  # a branch on a tensor's value
            return self.b(h)
        return h


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 16)), nn.Tanh(),
                         nn.Linear(16, 2))


def test_sequential_blocks_are_its_flattened_children():
    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(3, 6))
    assert g.kind == "sequential" and len(g) == 5 and g.names == ["0", "1.0", "1.1", "2", "3"]
    x = torch.randn(7, 6)
    for cuts in ([1], [2, 4], [1, 2, 3, 4]):
        stages = sp.split(g, cuts)
        assert len(stages) == len(cuts) + 1
        assert sp.allclose(mlp(x), sp.Pipeline(stages)(x))


def test_traced_module_splits_anywhere_and_composes():
    torch.manual_seed(1)
    model = Residual().eval()
    g = sp.capture(model, (torch.randn(2, 8), torch.randn(2, 8)))
    assert g.kind == "export" and 12 <= len(g) <= sp.MAX_BLOCKS
    x, s = torch.randn(5, 8), torch.randn(5, 8)  # another batch size than the example's
    with torch.inference_mode():
        want = model(x, s)
        for cuts in ([len(g) // 2], [1, 3, len(g) - 1], list(range(1, len(g)))):
            got = sp.Pipeline(sp.split(g, cuts))(x, s)
            assert sp.allclose(want, got)
            assert got["norm"][1] == 8


def test_split_takes_a_plan_and_stage_ranges():
    model = Residual().eval()
    g = sp.capture(model, (torch.randn(2, 8), torch.randn(2, 8)))
    prof = sp.profile(g, batch_sizes=(2,), repeats=1, warmup=0)
    p = sp.evaluate(prof, [(0, 4, 1), (4, len(g), 2)], devices=3)
    for spec in (p, [(0, 4), (4, len(g))], [4]):
        stages = sp.split(g, spec)
        assert len(stages) == 2
    with pytest.raises(ValueError, match="contiguous"):
        sp.split(g, [(0, 4), (5, len(g))])
    with pytest.raises(ValueError, match="strictly between"):
        sp.split(g, [0])
    with pytest.raises(TypeError):
        sp.split(g, "3")


def test_max_blocks_coarsens():
    model = Residual(layers=30).eval()
    g = sp.capture(model, (torch.randn(2, 8), torch.randn(2, 8)), max_blocks=7)
    assert len(g) <= 7
    x, s = torch.randn(3, 8), torch.randn(3, 8)
    assert sp.allclose(model(x, s), sp.Pipeline(sp.split(g, list(range(1, len(g)))))(x, s))
    long = nn.Sequential(*[nn.Linear(4, 4) for _ in range(50)])
    g2 = sp.capture(long, torch.randn(2, 4), max_blocks=8)
    assert len(g2) == 8
    x = torch.randn(3, 4)
    assert sp.allclose(long(x), sp.Pipeline(sp.split(g2, [3, 6]))(x))


def test_stage_modules_survive_torch_save():
    """deploy_model writes each stage to its own file; a replica loads only its stage."""
    model = Residual().eval()
    g = sp.capture(model, (torch.randn(2, 8), torch.randn(2, 8)))
    stages = sp.split(g, [3, 7])
    loaded = []
    for st in stages:
        buf = io.BytesIO()
        torch.save(st, buf)
        buf.seek(0)
        loaded.append(torch.load(buf, weights_only=False))
    x, s = torch.randn(4, 8), torch.randn(4, 8)
    assert sp.allclose(model(x, s), sp.Pipeline(loaded)(x, s))


def test_data_dependent_control_flow_names_the_construct():
    with pytest.raises(sp.CaptureError) as info:
        sp.capture(Branchy(), torch.randn(3, 4))
    msg = str(info.value)
    assert "control flow" in msg and "test_partition_capture.py" in msg and "h.sum() > 0" in msg


def test_bad_arguments():
    with pytest.raises(TypeError, match="module"):
        sp.capture("not a module", torch.randn(2))
    with pytest.raises(TypeError, match="example"):
        sp.capture(_mlp(), [1, 2, 3])
    with pytest.raises(ValueError, match="max_blocks"):
        sp.capture(_mlp(), torch.randn(2, 6), max_blocks=0)
    with pytest.raises(sp.CaptureError, match="one input"):
        sp.capture(_mlp(), (torch.randn(2, 6), torch.randn(2, 6)))


def test_profile_records_bytes_and_parameters():
    mlp = _mlp()
    g = sp.capture(mlp, torch.randn(3, 6))
    prof = sp.profile(g, batch_sizes=(1, 4), repeats=2, warmup=1)
    assert prof.batch_sizes == [1, 4] and len(prof) == len(g) and prof.device == "cpu"
    assert prof.model_bytes == sum(p.numel() * 4 for p in mlp.parameters())
    # cut c carries block c-1's output: rows x width x 4 bytes
    widths = [6, 16, 16, 16, 16, 2]
    assert [c[1] for c in prof.cut_bytes] == [4 * w * 4 for w in widths]
    assert [c[0] for c in prof.cut_bytes] == [1 * w * 4 for w in widths]
    assert all(t >= 0 for row in prof.compute_ms for t in row)
    assert prof.meta["threads"] == 1 and prof.meta["kind"] == "sequential"
    with pytest.raises(ValueError, match="batch_sizes"):
        sp.profile(g, batch_sizes=(0,))
    with pytest.raises(ValueError, match="GPU"):
        if not torch.cuda.is_available():
            sp.profile(g, batch_sizes=(1,), device="cuda")
        else:  # pragma: no cover
            raise ValueError("GPU present; nothing to check")


def test_profile_of_a_traced_model_plans_and_splits_consistently():
    model = Residual().eval()
    g = sp.capture(model, (torch.randn(2, 8), torch.randn(2, 8)))
    prof = sp.profile(g, batch_sizes=(2, 8), repeats=1, warmup=0)
    # the bytes crossing each cut are what the split stage really returns
    stages = sp.split(g, [5])
    with torch.inference_mode():
        mid = stages[0](*sp.batch_of(g.example, 8))
    assert prof.cut_bytes[5][1] == sp.nbytes(mid)
    p = sp.plan(prof, devices=3, memory_per_device=prof.model_bytes * 0.6)
    assert p.feasible and len(p.stages) >= 2
    assert all(s.memory_bytes <= prof.model_bytes * 0.6 for s in p.stages)
    x, s = torch.randn(3, 8), torch.randn(3, 8)
    assert sp.allclose(model(x, s), sp.Pipeline(sp.split(g, p))(x, s))


def test_emulated_model_matches_its_profile(monkeypatch):
    from serving.partition import emulate

    base = sp.Profile("b", "gpu", [64], ["a", "b", "c"], [[4.0], [2.0], [6.0]],
                      [[1e6], [64 * 4 * 1000.0], [64 * 4 * 4000.0], [1e3]], [10.0, 20.0, 30.0],
                      [[0.0]] * 3, sp.Transport(1.0, 1e9, "t"))
    module, example, prof = sp.emulated(base, max_cut_bytes=64 * 4 * 2000.0)
    assert len(module) == 3 and prof.param_bytes == base.param_bytes
    assert [c[0] for c in prof.compute_ms] == [4.0, 2.0, 6.0]
    # inner cuts scaled so the largest is max_cut_bytes; input and output are the model's own
    assert [c[0] for c in prof.cut_bytes] == [64 * 4 * 8.0, 64 * 4 * 500.0, 64 * 4 * 2000.0, 64 * 4 * 10.0]
    slept = []
    monkeypatch.setattr(emulate.time, "sleep", slept.append)
    monkeypatch.setattr(emulate._sleep_state, "credit", 0.0, raising=False)
    x = torch.randn(32, 8)
    mid = module[0](x)
    assert mid.shape == (32, 500) and mid.stride()[1] == 0  # a broadcast view: full size only on the wire
    assert module(x).shape == (32, 10)
    g = sp.capture(module, example)
    assert len(g) == 3 and sp.allclose(module(x), sp.Pipeline(sp.split(g, [1]))(x))
    # half the profiled batch sleeps half the profiled time
    assert slept[0] == pytest.approx(0.002, abs=1e-4)


def test_device_sleep_takes_overshoot_off_the_next_sleep(monkeypatch):
    from serving.partition import emulate

    clock = [0.0]
    calls = []

    def fake_sleep(s):  # every sleep overshoots by 1 ms
        calls.append(s)
        clock[0] += s + 0.001

    monkeypatch.setattr(emulate.time, "sleep", fake_sleep)
    monkeypatch.setattr(emulate.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(emulate._sleep_state, "credit", 0.0, raising=False)
    for _ in range(10):
        emulate.device_sleep(0.004)
    assert calls[0] == pytest.approx(0.004) and calls[1] == pytest.approx(0.003)
    assert clock[0] == pytest.approx(0.040 + 0.001)  # ten 4 ms sleeps cost 41 ms, not 50
    emulate.device_sleep(0.0005)  # shorter than the credit: no sleep at all
    assert len(calls) == 10


def test_a_stage_file_changed_after_deploy_wrote_it_is_refused_before_loading(tmp_path):
    """deploy_model writes each stage file 0600 and hands its replicas the digest; a replica
    refuses a file that does not match it, before torch.load unpickles anything."""
    import hashlib

    from serving.model_app.stage_replica import PartitionStageImpl

    path = tmp_path / "stage0.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert PartitionStageImpl(str(path), sha256=digest).module is not None
    with path.open("ab") as fh:
        fh.write(b"x")
    with pytest.raises(RuntimeError, match="does not match"):
        PartitionStageImpl(str(path), sha256=digest)
