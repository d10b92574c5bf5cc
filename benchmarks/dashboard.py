"""What the live dashboard costs: ``python -m benchmarks.dashboard``.

Prints medians over repeats, on synthetic but realistically sized inputs:

* the sampler (every 5 s in each ingress replica): one node's Ray metrics endpoint text with
  the app's families among a few thousand lines of Ray's and Serve's own, filtered, summed and
  parsed into a snapshot; CPU ms per sample;
* the monitor's answers (at most every 15 s while someone watches, in the monitor replica):
  :func:`serving.runtime.dashboard.data.monitor_snapshot` on a monitor holding a reference and a
  window with a planted cause;
* the page (in the dashboard's child process): a full drawing, and a redraw while the
  monitor's answers are unchanged (its plots reused).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from serving.runtime.dashboard.data import monitor_snapshot
from serving.runtime.dashboard.page import render
from serving.runtime.dashboard.timeseries import MetricRing, Snapshot
from serving.runtime.dashboard.view import model
from serving.runtime.metrics import BUCKET_LABELS, aggregate

T0 = 1_700_000_040.0
INFO = {
    "name": "bench", "model_version": "v1", "stages": ["cheap", "expensive"], "levels": [["a"], ["a", "b"]],
    "first_stage_last_level": 0, "monitor": {"app": "bench-monitor"},
    "report": {"levels": [{"index": 0, "fraction_answered": 0.8}, {"index": 1, "fraction_answered": 0.2}]},
    "plan": {"target_p99_ms": 30.0, "layout": "fused", "ingress_replicas": 2, "predicted": {"p99_ms": 12.0},
             "stages": [{"name": "cheap", "replicas": 2}, {"name": "expensive", "replicas": 1}]},
}


def endpoint_text(step: int, replicas: int = 2, other_lines: int = 3000) -> str:
    """One node's metrics endpoint: the app's families per replica, and Ray's own lines."""
    lines = [f'ray_serve_some_family{{deployment="d{i % 40}",replica="r{i}"}} {i}' for i in range(other_lines)]
    for r in range(replicas):
        w = f'WorkerId="w{r}",app="bench"'
        lines += ["# TYPE ray_willump_rows_total counter",
                  f'ray_willump_rows_total{{{w},level="0"}} {80 * step}', f'ray_willump_rows_total{{{w},level="1"}} {20 * step}',
                  "# TYPE ray_willump_requests_total counter",
                  f'ray_willump_requests_total{{{w},route="predict",status="200"}} {100 * step}']
        for family, labels in (("request_latency_seconds", 'route="predict"'), ("stage_latency_seconds", 'stage="cheap"'),
                               ("stage_compute_seconds", 'stage="expensive"')):
            # as an ingress publishes a histogram: three counters (serving.runtime.metrics)
            lines.append(f"# TYPE ray_willump_{family}_bucket_total counter")
            for i, le in enumerate(BUCKET_LABELS):
                lines.append(f'ray_willump_{family}_bucket_total{{{w},{labels},le="{le}"}} '
                             f'{step * min(100, 10 * (i + 1))}')
            lines += [f"# TYPE ray_willump_{family}_count_total counter",
                      f"ray_willump_{family}_count_total{{{w},{labels}}} {100 * step}",
                      f"# TYPE ray_willump_{family}_sum_total counter",
                      f"ray_willump_{family}_sum_total{{{w},{labels}}} {step * 0.8}"]
    return "\n".join(lines) + "\n"


def sample_once(text: str, t: float) -> Snapshot:
    kept = "\n".join(line for line in text.splitlines() if "willump_" in line) + "\n"
    return Snapshot.parse(aggregate([kept], "bench"), t=t)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        cpu0 = time.process_time()
        fn()
        times.append(1e3 * (time.process_time() - cpu0))
    return statistics.median(times)


def records(n: int, seed: int, t0: float, planted: bool, pane_s: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "timestamp": t0 + np.sort(rng.random(n)) * pane_s, "model_version": "v1",
        "replica": rng.choice(["r0", "r1"], n), "level": rng.choice(["0", "1"], n, p=[0.8, 0.2]),
        "region": rng.choice(["eu", "us", "ap", "sa"], n), "carrier": rng.choice([f"c{i}" for i in range(12)], n),
        "latency_ms": rng.lognormal(2.0, 0.3, n), "score": rng.random(n), "confidence": 0.5 + 0.5 * rng.random(n),
        "error": np.zeros(n), "a": rng.normal(0.0, 1.0, n), "b": rng.normal(0.0, 1.0, n)})
    if planted:
        frame.loc[frame.region == "sa", "latency_ms"] *= 6.0
        frame["a"] += 1.0
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows-per-pane", type=int, default=2000)
    parser.add_argument("--panes", type=int, default=30)
    args = parser.parse_args(argv)
    from drift import Monitor

    text = endpoint_text(10)
    print(f"sampler: one endpoint of {len(text.splitlines())} lines ({len(text) / 1024:.0f} KiB): "
          f"{median_ms(lambda: sample_once(text, T0), args.repeats):.1f} ms CPU per sample (every 5 s)")
    ring = MetricRing(900.0, 5.0)
    for i in range(180):  # 15 minutes of samples
        ring.add(sample_once(endpoint_text(i, other_lines=0), T0 + 5.0 * i))
    pane_s = 10.0
    monitor = Monitor(attributes=["model_version", "replica", "level", "region", "carrier"],
                      metrics=["latency_ms", "score"], features=["a", "b"], level_column="level", cheap_level="0",
                      confidence_column="confidence", error_column="error", pane_seconds=pane_s, window_panes=6,
                      auto_reference_panes=6, clock=None)
    for p in range(args.panes):
        monitor.ingest(records(args.rows_per_pane, p, T0 + pane_s * p, planted=p >= args.panes - 6, pane_s=pane_s))
    monitor.flush()
    snap = monitor_snapshot(monitor, {"slo_ms": 30.0})
    print(f"monitor snapshot ({args.panes} panes of {args.rows_per_pane} rows, 5 attributes): "
          f"{median_ms(lambda: monitor_snapshot(monitor, {'slo_ms': 30.0}), args.repeats):.0f} ms CPU "
          "(in the monitor replica, at most every 15 s while watched, for the whole app)")
    shared = {"slo_ms": 30.0, "max_age_s": 3600.0}
    monitor_snapshot(monitor, shared)
    print(f"the same snapshot answered to another ingress replica: "
          f"{median_ms(lambda: monitor_snapshot(monitor, shared), args.repeats):.2f} ms CPU (a lookup: "
          "the monitor's query load does not grow with the replicas)")
    view = model(INFO, ring, snap, monitor_age_s=2.0, monitor_error=None, refresh_s=10.0, now=T0 + 900.0)
    render(view, cache={})  # imports and font cache
    page = render(view, cache={})
    cache: dict = {}
    render(view, cache=cache)
    print(f"page ({len(page) / 1024:.0f} KiB): full drawing {median_ms(lambda: render(view, cache={}), args.repeats):.0f} ms "
          f"CPU, redraw with the monitor's answers unchanged {median_ms(lambda: render(view, cache=cache), args.repeats):.0f}"
          " ms CPU (in the dashboard's child process, at most once per 3 s however many viewers)")
    young = MetricRing(900.0, 5.0)  # a replica's first seconds: two snapshots, one rate per plot
    for i in range(2):
        young.add(sample_once(endpoint_text(i, other_lines=0), T0 + 5.0 * i))
    first = model(INFO, young, snap, monitor_age_s=2.0, monitor_error=None, refresh_s=10.0, now=T0 + 10.0)
    page = render(first, cache={})
    print(f"a replica's first page (two metric snapshots; 41 MB and 124 s CPU before time axes were bounded): "
          f"{len(page) / 1024:.0f} KiB, {median_ms(lambda: render(first, cache={}), args.repeats):.0f} ms CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
