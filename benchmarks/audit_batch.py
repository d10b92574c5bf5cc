"""What one live-audit call costs per row by its size, in process: the full pipeline called back to
back on the request size; in a thread beside a busy request loop (how the ingress runs the audit
where it holds the full pipeline: serving.runtime.hold.full_proba) on the call sizes the audit
may use; and in slices on the request loop's own thread, one slice between two requests (the
alternative, tried and not kept: docs/benchmarks.md). It sets
serving.runtime.audit.AUDIT_BATCH_ROWS.

    python -m benchmarks.audit_batch [--workload toxic] [--rows-per-request 32] [--sizes 128,256,512]
                                     [--slices 16,32,64] [--calls 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

#: seconds the request loop runs before the audit calls start beside it
LOOP_WARMUP_S = 0.5
#: seconds between two audit calls (the audit's calls are spaced, not back to back)
CALL_GAP_S = 0.05


def _frames(X: Any, size: int, count: int) -> list[Any]:
    last = max(len(X) - size, 1)
    return [X.iloc[start:start + size].reset_index(drop=True) for start in range(0, min(last, size * count), size)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    opt, X = workload.optimize(verbose=False), workload.X_test
    full = opt.baseline.predict_proba
    requests = _frames(X, args.rows_per_request, 200)
    start = time.thread_time()
    for frame in requests[:100]:
        full(frame)
    back_to_back = 1000.0 * (time.thread_time() - start) / sum(len(f) for f in requests[:100])
    stop = threading.Event()

    def request_loop() -> None:
        i = 0
        while not stop.is_set():
            opt.predict_proba(requests[i % len(requests)])
            i += 1

    loop = threading.Thread(target=request_loop, daemon=True)
    loop.start()
    time.sleep(LOOP_WARMUP_S)
    beside: dict[str, float] = {}
    try:
        for size in args.sizes:
            costs = []
            for frame in _frames(X, size, args.calls)[:args.calls]:
                start = time.thread_time()
                full(frame)
                costs.append(1000.0 * (time.thread_time() - start) / len(frame))
                time.sleep(CALL_GAP_S)
            beside[str(size)] = statistics.median(costs)
    finally:
        stop.set()
        loop.join()
    interleaved: dict[str, float] = {}
    for size in args.slices:
        slices = _frames(X, size, args.calls)[:args.calls]
        for frame in requests[:20]:  # the loop warm again
            opt.predict_proba(frame)
        costs = []
        for i, frame in enumerate(slices):
            for j in range(i * 8, (i + 1) * 8):  # requests between two slices (the list taken round)
                opt.predict_proba(requests[j % len(requests)])
            start = time.thread_time()
            full(frame)
            costs.append(1000.0 * (time.thread_time() - start) / len(frame))
        interleaved[str(size)] = statistics.median(costs)
    return {"workload": args.workload, "date": time.strftime("%Y-%m-%d"), "rows_per_request": args.rows_per_request,
            "back_to_back_ms_per_row": back_to_back, "beside_request_loop_ms_per_row": beside,
            "interleaved_on_the_loop_ms_per_row": interleaved}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows-per-request", type=int, default=32)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[128, 256, 512])
    parser.add_argument("--slices", type=lambda s: [int(x) for x in s.split(",")], default=[16, 32, 64],
                        help="slice sizes run on the request loop's thread between its requests")
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(f"{args.workload}: full pipeline, {args.rows_per_request}-row calls back to back: "
          f"{result['back_to_back_ms_per_row']:.3f} ms CPU a row")
    for size, cost in result["beside_request_loop_ms_per_row"].items():
        print(f"  {size}-row calls in a thread beside a busy request loop: {cost:.3f} ms CPU a row")
    for size, cost in result["interleaved_on_the_loop_ms_per_row"].items():
        print(f"  {size}-row slices on the request loop's thread, between its requests: {cost:.3f} ms CPU a row")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
