"""What keeping the served monitor's state on disk costs its replica: ``MonitorStage.ingest`` of
the same record batches in memory and with the default state folder (serving.runtime.monitor_state).

    python -m benchmarks.monitor_persist [--batches 2000] [--rows 32] [--repeats 3] [--json PATH]

Each repeat ingests ``batches`` batches of ``rows`` served records (request ids, one request
attribute of 50 values, the label join on) into a fresh monitor replica of each arm, the arms
alternating; reported: CPU and wall milliseconds per batch, medians over repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

LABELS = {"classes": ["neg", "pos"], "certified": [{"max_loss": 0.02, "baseline_score": 0.9}],
          "segments": ["client"], "metric": "accuracy", "confidence": 0.95}
ARMS = ("memory", "default_folder")


def record_batches(n: int, rows: int, seed: int) -> list[pd.DataFrame]:
    from serving.runtime.records import record_columns

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.uniform(size=rows)
        columns = record_columns(pd.DataFrame({"x": rng.normal(size=rows)}), np.c_[1 - p, p], np.zeros(rows, int),
                                 np.full(rows, "r", dtype=object), 3.0, 1e9 + 0.01 * i, "v1", {"client": f"c{i % 50}"},
                                 {"request_attributes": ["client"]}, request_id=f"req-{i:08d}")
        out.append(pd.DataFrame(columns))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from serving.runtime import monitor_state
    from serving.runtime.replicas import MonitorStage

    folder = Path(tempfile.mkdtemp(prefix="willump-bench-"))
    monitor_state.root = lambda: folder / "states"  # a private root of this run's own
    batches = record_batches(args.batches, args.rows, args.seed)
    seen: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    for r in range(args.repeats):
        for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
            state = None if arm == "memory" else {"app": f"bench{r}", "token": "0123abcd"}
            stage = MonitorStage.func_or_class({"attributes": ["client"], "metrics": ["latency_ms"]}, None, None,
                                               LABELS, state)
            cpu, wall = time.process_time(), time.perf_counter()
            for batch in batches:
                asyncio.run(stage.ingest(batch))
            seen[arm].append((time.process_time() - cpu, time.perf_counter() - wall))
            stage.__del__()
    per = 1000.0 / args.batches
    return {"batches": args.batches, "rows": args.rows, "repeats": args.repeats,
            "arms": {arm: {"cpu_ms_per_batch": per * statistics.median(c for c, _ in v),
                           "wall_ms_per_batch": per * statistics.median(w for _, w in v)} for arm, v in seen.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.rows < 1 or args.repeats < 1:
        parser.error("--batches, --rows and --repeats must be >= 1")
    result = run(args)
    for arm, a in result["arms"].items():
        print(f"{arm}: {a['cpu_ms_per_batch']:.3f} ms CPU, {a['wall_ms_per_batch']:.3f} ms wall per "
              f"{args.rows}-row batch (median of {args.repeats})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
