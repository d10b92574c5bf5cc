"""Strings that cannot hurt: a lone UTF-16 surrogate never reaches the store (so one request
cannot stop a persisted monitor, before or after a restart), long values are cut and counted,
and the memory of string values is counted as it is held."""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from drift import Monitor
from drift._encode import (
    DEFAULT_MAX_VALUE_LENGTH,
    REPLACEMENT_CHARACTER,
    TRUNCATION_MARKER,
    Encoder,
    clean_text,
)

from ._helpers import MONITOR_ARGS, T0, records

LONE = "\ud800"


def _text(obj: object) -> None:
    """`obj` is sendable as UTF-8 JSON (what serving and the dashboard do with answers)."""
    json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")


def _every_call(mon: Monitor, t0: float) -> None:
    mon.ingest(records(300, 11, t0=t0))
    _text(mon.explain(metric="latency_ms").to_dict())
    _text(mon.mix_shift().to_dict())
    _text(mon.drift().to_dict())
    _text(mon.change_points().to_dict())
    mon.series()
    _text(mon.stats())
    mon.flush()


@pytest.mark.parametrize("durability", ["batch", "pane"])
def test_a_lone_surrogate_cannot_stop_a_persisted_monitor(tmp_path: Path, durability: str) -> None:
    mon = Monitor(**MONITOR_ARGS, directory=tmp_path, durability=durability)
    mon.set_reference(records(1000, 7, t0=T0 - 3600))
    bad = records(300, 1)
    bad.loc[3, "region"] = LONE
    bad.loc[4:6, "replica"] = "a\udfffb"
    mon.ingest(bad)
    assert mon.stats()["invalid_unicode_values"] == {"region": 1, "version": 0, "replica": 3}
    for i in range(1, 4):  # panes close and commit after the bad batch
        _every_call(mon, T0 + 60 * i)
    mon.close()

    with Monitor.open(tmp_path, durability=durability) as again:
        values = again._encoders[0].values
        assert REPLACEMENT_CHARACTER in values and LONE not in values
        assert "a\ufffdb" in again._encoders[2].values
        for i in range(4, 7):
            _every_call(again, T0 + 60 * i)
        again.ingest(bad.assign(timestamp=bad["timestamp"] + 420))  # the same value again
        again.flush()
        assert again.stats()["distinct_values"]["region"] == len(values)


def test_a_surrogate_admitted_by_frequency_is_repaired_and_found_again() -> None:
    """Past the first-sight codes (admission by frequency) the repaired form is what gets a
    code, and later batches of the same value map to it rather than to `<other>`."""
    enc = Encoder("c", max_codes=8)
    enc.encode(pd.Series(["a", "b", "c", "d"], dtype=object))  # first-sight codes used up
    batch = pd.Series([LONE] * 100 + ["e"], dtype=object)
    first = enc.encode(batch)
    assert enc.label(int(first[0])) == REPLACEMENT_CHARACTER
    assert (enc.encode(batch)[:100] == first[:100]).all()
    assert enc.invalid_unicode == 200


def test_dates_admitted_by_frequency_map_to_their_code() -> None:
    """Values kept by their text (dates) match their code after first-sight admission too."""
    enc = Encoder("d", max_codes=8)
    enc.encode(pd.Series(["a", "b", "c", "d"], dtype=object))
    day = pd.Timestamp("2026-01-01")
    codes = enc.encode(pd.Series([day] * 100, dtype=object))
    assert enc.label(int(codes[0])) == str(day) and enc.overflow == 0
    assert (enc.encode(pd.Series([day] * 5, dtype=object)) == codes[0]).all()


def test_long_values_are_cut_counted_and_stable(tmp_path: Path) -> None:
    cap = 32
    long_a, long_b, exact = "a" * 100, "a" * 40, "e" * cap
    mon = Monitor(**MONITOR_ARGS, directory=tmp_path, durability="batch", max_value_length=cap)
    batch = records(200, 3)
    batch.loc[:9, "region"] = long_a
    batch.loc[10:14, "region"] = long_b  # same first 31 characters: the same cut value
    batch.loc[15:16, "region"] = exact
    mon.ingest(batch)
    enc = mon._encoders[0]
    cut = "a" * (cap - 1) + TRUNCATION_MARKER
    assert cut in enc.values and exact in enc.values and long_a not in enc.values
    assert max(len(v) for v in enc.values if isinstance(v, str)) == cap
    assert mon.stats()["truncated_values"]["region"] == 15
    assert enc.code_of(long_a) == enc.code_of(cut) is not None  # queries by the full value
    mon.close()
    with Monitor.open(tmp_path, durability="batch") as again:
        assert again.config.max_value_length == cap
        distinct = again.stats()["distinct_values"]["region"]
        again.ingest(batch.assign(timestamp=batch["timestamp"] + 60))
        assert again.stats()["distinct_values"]["region"] == distinct
        assert again.stats()["truncated_values"]["region"] == 15  # since this process opened it


def test_the_cut_knob() -> None:
    assert Monitor(**MONITOR_ARGS).config.max_value_length == DEFAULT_MAX_VALUE_LENGTH == 256
    with pytest.raises(ValueError, match="max_value_length"):
        Monitor(**MONITOR_ARGS, max_value_length=1)
    assert clean_text("x" * 300) == ("x" * 255 + TRUNCATION_MARKER, 2)
    text = "ok \u00e9"
    assert clean_text(text)[0] is text  # clean text is kept as the same object


def test_a_reference_name_must_be_text() -> None:
    mon = Monitor(**MONITOR_ARGS)
    with pytest.raises(ValueError, match="surrogate"):
        mon.set_reference(records(100, 1), name=LONE)
    mon.set_reference(records(100, 1), name="ok")
    assert mon.references == ["ok"]


def _long(i: int) -> str:
    return f"{i:05d}" + "v" * 2043  # 2 KB, distinct


def test_encoder_memory_matches_what_is_allocated() -> None:
    """nbytes() against tracemalloc's count of what the encoder keeps alive once the batch that
    brought the values is gone."""
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        enc = Encoder("c", max_value_length=4096)
        batch = pd.Series([_long(i) for i in range(500)], dtype=object)
        enc.encode(batch)
        del batch
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert measured > 500 * 2048
    assert enc.nbytes() == pytest.approx(measured, rel=0.10)


def test_monitor_memory_counts_2kb_values() -> None:
    """Two monitors fed the same rows, one with 2 KB distinct values: memory_bytes() differs by
    the strings' own sizes (it used to count 64 bytes a value, 19x too little)."""
    n = 400

    def fed(values: list[str]) -> int:
        mon = Monitor(**MONITOR_ARGS, max_value_length=4096)
        batch = records(n, 5)
        batch["replica"] = values
        mon.ingest(batch)
        return mon.memory_bytes()

    short = [f"r{i:05d}" for i in range(n)]
    long = [_long(i) for i in range(n)]
    expected = sum(map(sys.getsizeof, long)) - sum(map(sys.getsizeof, short))
    assert fed(long) - fed(short) == pytest.approx(expected, rel=0.05)
    with_cap = Monitor(**MONITOR_ARGS)  # the default cap: each value held as 256 characters
    batch = records(n, 5)
    batch["replica"] = long
    with_cap.ingest(batch)
    assert with_cap._encoders[2].nbytes() >= n * sys.getsizeof("v" * DEFAULT_MAX_VALUE_LENGTH)
    assert with_cap.stats()["truncated_values"]["replica"] == n


def test_encoder_state_is_read_under_the_lock() -> None:
    mon = Monitor(**MONITOR_ARGS)
    mon.ingest(records(50, 1))
    entered = []

    class Recording:
        def __enter__(self) -> None:
            entered.append(True)

        def __exit__(self, *exc: object) -> None:
            return None

    mon._lock = Recording()  # type: ignore[assignment]
    mon.label(0, 0)
    assert entered
    entered.clear()
    assert mon.references == []
    assert entered
