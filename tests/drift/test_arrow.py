"""Arrow tables are accepted when pyarrow is installed (skipped otherwise)."""

from __future__ import annotations

import pytest

from drift import Monitor

from ._helpers import MONITOR_ARGS, records


def test_ingest_arrow_table() -> None:
    pa = pytest.importorskip("pyarrow")
    frame = records(100, 1)
    mon = Monitor(**MONITOR_ARGS)
    receipt = mon.ingest(pa.Table.from_pandas(frame))
    assert receipt.rows == 100
    mon.set_reference(pa.Table.from_pandas(records(100, 2)))
    assert mon.references == ["default"]
