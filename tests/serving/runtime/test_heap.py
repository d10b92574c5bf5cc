"""A replica settles its heap once it has loaded (serving.runtime.heap): collected and frozen
inside a Serve replica, left alone elsewhere or where WILLUMP_GC_FREEZE=0; every replica class
of the request path and the model app does it at the end of its constructor."""

from __future__ import annotations

import gc
import inspect

import pytest

from serving.runtime.heap import GC_FREEZE_ENV, settle_replica_heap


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_replica_freezes_what_it_loaded(unfrozen, monkeypatch):
    monkeypatch.delenv(GC_FREEZE_ENV, raising=False)
    loaded = [{"row": i} for i in range(1000)]
    assert settle_replica_heap(in_replica=True)
    assert gc.get_freeze_count() >= len(loaded)


def test_outside_a_replica_or_when_turned_off_nothing_is_frozen(unfrozen, monkeypatch):
    monkeypatch.delenv(GC_FREEZE_ENV, raising=False)
    assert not settle_replica_heap()  # this test's process is no Serve replica
    monkeypatch.setenv(GC_FREEZE_ENV, "0")
    assert not settle_replica_heap(in_replica=True)
    assert gc.get_freeze_count() == 0


def test_every_replica_class_settles_its_heap_last():
    from serving.model_app.stages import ModelIngress, PartitionStage
    from serving.runtime.ingress import Ingress
    from serving.runtime.replicas import ModelStage, MonitorStage

    for deployment in (Ingress, ModelStage, MonitorStage, PartitionStage, ModelIngress):
        # the project's own constructor (Serve's ingress wrapper subclasses the class)
        init = next(c.__dict__["__init__"] for c in deployment.func_or_class.__mro__
                    if getattr(c.__dict__.get("__init__"), "__module__", "").startswith("serving."))
        body = [line.strip() for line in inspect.getsource(init).strip().splitlines()]
        assert body[-1].startswith("settle_replica_heap()"), (deployment.name, body[-1])
