"""Child process for the persistence tests: ingest seeded batches, print ACK after each."""

from __future__ import annotations

import sys

from drift import Monitor
from tests.drift._helpers import MONITOR_ARGS, T0, records

BATCHES = 60
ROWS = 400


def batch(i: int):
    """Batch i: 20 seconds of traffic, so a pane closes every third batch."""
    return records(ROWS, 100 + i, t0=T0 + 20.0 * i, seconds=20.0,
                   planted={"region": "ap", "version": "v2"} if i >= 20 else None)


def make(directory: str, durability: str) -> Monitor:
    return Monitor(**MONITOR_ARGS, window_panes=4, detail_panes=3, rollup_panes=2,
                   retention_panes=30, reservoir_size=300, flagged_reservoir_size=200,
                   directory=directory, durability=durability)


def main() -> None:
    directory, durability = sys.argv[1], sys.argv[2]
    mon = make(directory, durability)
    mon.set_reference(records(2000, 7, t0=T0 - 3600))
    print("READY", flush=True)
    for i in range(BATCHES):
        receipt = mon.ingest(batch(i))
        print(f"ACK {i} {receipt.durable} {receipt.durable_through}", flush=True)
    print("DONE", flush=True)
    sys.stdin.read()  # wait to be killed


if __name__ == "__main__":
    main()
