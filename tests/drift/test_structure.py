"""Each part of the monitor alone: the pane log's change sets, the store's atomic writes, the
read-only view, and the decision rules as swappable objects."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from drift import EffectGate, Monitor, Persistence
from drift._changes import ChangeSet
from drift._panes import Horizons, PaneLog
from drift._rules import benjamini_hochberg, bonferroni_level
from drift._store import Store
from drift._summary import Layout, Summary

from ._helpers import MONITOR_ARGS, T0, records

LAYOUT = Layout(n_cat=1, n_num=1, n_clf=1, max_values=16, relative_accuracy=0.01,
                min_value=1e-9, max_bins=4096, offsets=(10.0,))
HORIZONS = Horizons(pane_seconds=10.0, window_panes=2, allowed_lateness_seconds=0.0,
                    detail_panes=2, rollup_panes=2, retention_panes=12, capacity=(50, 20),
                    history_capacity=(10, 5))


def _rows(log: PaneLog, pane: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ts = pane * 10.0 + rng.random(n) * 10.0
    log.add(np.full(n, pane, dtype=np.int64), ts, rng.integers(0, 3, (1, n)).astype(np.int32),
            rng.normal(10, 1, (1, n)), np.zeros(n, dtype=np.uint32), rng.random(n), False)


def _state(log: PaneLog) -> tuple:
    return (sorted(log.full), sorted(log.detail), sorted(log.rollups), sorted(log.series),
            log.closed_upto, log.newest, {p: s.n for p, s in log.full.items()})


def _scalars(s: Summary) -> dict[str, float]:
    return {"rows": float(s.n)}


def test_pane_log_plans_without_changing_anything_and_applies_exactly() -> None:
    log = PaneLog(LAYOUT, HORIZONS)
    for p in range(10):
        _rows(log, p, 100, p)
    before = _state(log)
    cs = log.plan(watermark=100.0, scalars=_scalars)
    assert _state(log) == before  # planning is side-effect free
    # panes 0-9 close; 6 and 7 leave the window (full keeps window + 2 = 4 panes), 4-5 are
    # detail, older ones roll up in pairs
    assert cs.closed_upto == 10 and set(cs.series_put) == set(range(10))
    assert cs.full_drop == set(range(6))
    assert set(cs.detail_put) == {4, 5} and set(cs.rollup_put) == {0, 1}
    assert all(s.reservoir.size <= 15 for s in cs.detail_put.values())
    log.apply(cs)
    assert sorted(log.full) == [6, 7, 8, 9] and sorted(log.detail) == [4, 5]
    assert sorted(log.rollups) == [0, 1] and log.rows_retained() == 1000
    assert log.plan(watermark=100.0, scalars=_scalars).empty  # nothing left to do
    # retention: far later, everything but the newest panes' series goes
    _rows(log, 30, 10, 30)
    cs = log.plan(watermark=310.0, scalars=_scalars)
    log.apply(cs)
    assert min(log.series) >= 30 - 12 and not log.rollups.get(0)


def test_store_writes_a_change_set_all_or_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    good = Summary(LAYOUT, (5, 5))
    cs = ChangeSet()
    cs.full_put[1] = good
    cs.series_put[1] = {"rows": 0.0}
    store.apply(cs)

    class Broken(Summary):
        def to_bytes(self) -> bytes:
            raise OSError("disk full")

    bad = ChangeSet()
    bad.series_put[2] = {"rows": 5.0}
    bad.full_drop.add(1)
    bad.full_put[3] = Broken(LAYOUT, (5, 5))
    with pytest.raises(OSError):
        store.apply(bad)
    store.close()
    conn = sqlite3.connect(tmp_path / "monitor.sqlite")
    assert [r[0] for r in conn.execute("SELECT pane FROM panes")] == [1]
    assert [r[0] for r in conn.execute("SELECT pane FROM series")] == [1]
    conn.close()


def test_a_view_is_a_snapshot() -> None:
    # frontier_batches=1: one batch 10 minutes ahead moves the window at once (by default a
    # jump beyond max_future_seconds waits for most of the recent batches; test_clock_skew)
    mon = Monitor(**MONITOR_ARGS, frontier_batches=1)
    mon.set_reference(records(2000, 0, t0=T0 - 3600))
    mon.ingest(records(1000, 1))
    view = mon._view()
    before = view.window_info()["rows"]
    mon.ingest(records(1000, 2))  # the same (open) pane grows after the snapshot
    mon.ingest(records(1000, 3, t0=T0 + 600))
    assert view.window_info()["rows"] == before == 1000
    assert mon.window_info()["rows"] == 1000  # 10-pane window ending at the newest pane
    assert mon.window_info(window="20m")["rows"] == 3000
    ten = view.select(window="10m")
    assert ten.length == 10 and view.select(window=(T0, T0 + 120)).length == 2
    with pytest.raises(ValueError, match="duration"):
        view.select(window="soon")
    with pytest.raises(TypeError, match="reference"):
        view.reference(42)


def test_decision_rules_are_small_swappable_objects() -> None:
    gate = EffectGate(alpha=0.05, numeric_effect=0.1)
    row = {"p_adjusted": 0.001, "effect": 0.3, "effect_error": 0.05, "n_current": 500,
           "n_reference": 500}
    assert gate.passes(row, "numeric") and not gate.undetectable(row, "numeric")
    assert not gate.passes({**row, "effect_error": 0.25}, "numeric")
    assert gate.undetectable({**row, "effect_error": 0.1}, "numeric")
    assert not gate.passes({**row, "n_current": 10}, "numeric")
    with pytest.raises(ValueError, match="alpha"):
        EffectGate(alpha=1.5)
    rule = Persistence.of((2, 3))
    assert rule.window_ends(100, 10) == [100, 90, 80]
    assert rule.decide([True, False, True]) and not rule.decide([True, False, False])
    with pytest.raises(ValueError, match="persistence"):
        Persistence.of((3, 2))
    p = [0.01, 0.04, None, 0.03, float("nan")]
    adj = benjamini_hochberg(p)
    ref = stats.false_discovery_control([0.01, 0.04, 0.03], method="bh")
    assert adj[2] is None and adj[4] is None
    assert np.allclose([adj[0], adj[1], adj[3]], ref)
    assert math.isclose(bonferroni_level(0.99, 100), 1e-4)


def test_a_stricter_gate_object_changes_the_verdict() -> None:
    mon = Monitor(**MONITOR_ARGS, window_panes=2)
    mon.set_reference(records(4000, 0, t0=T0 - 3600))
    for i in range(6):
        f = records(2000, 10 + i, t0=T0 + 60 * i)
        f["f1"] += 0.5
        mon.ingest(f)
    default = next(r for r in mon.drift() if r["column"] == "f1")
    strict = next(r for r in mon.drift(gate=EffectGate(numeric_effect=1.0)) if r["column"] == "f1")
    once = next(r for r in mon.drift(persistence=Persistence(1, 1)) if r["column"] == "f1")
    assert default["drifted"] and not strict["drifted"] and once["drifted"]
    assert pd.notna(default["effect"])


def test_no_module_imports_another_modules_private_names() -> None:
    """A helper two modules share has a public name in the module that owns it (drift's modules
    are private to the package; the names inside them that start with _ are private to each)."""
    import ast

    offenders = []
    for path in sorted((Path(__file__).resolve().parents[2] / "drift").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("drift"):
                for alias in node.names:
                    if node.module == "drift":
                        modules.add(alias.asname or alias.name)
                    elif alias.name.startswith("_"):
                        offenders.append(f"{path.name}: from {node.module} import {alias.name}")
        offenders += [f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id in modules and node.attr.startswith("_")]
    assert not offenders, offenders
