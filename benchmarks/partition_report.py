"""Markdown tables from a ``benchmarks.partition`` JSON file:
``python -m benchmarks.partition_report bench_partition.json``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def _n(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _x(ratio: float | None) -> str:
    return "no even split fits" if ratio is None else f"{ratio:.2f}x"


def plan_table(d: dict[str, Any], transport: str) -> str:
    rows = [r for r in d["plan"]["rows"] if r["transport"] == transport]
    out = ["| model | M | memory / device (whole model) | DP + replication | DP, no replication | even by layers "
           "| even by params | whole-model replicas | DP / better even | DP / best even, any k "
           "| p99 Poisson / bursty: DP | p99 Poisson / bursty: better even |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = r["plans"]

        def thr(k: str, p=p) -> str:
            return _n(p[k]["throughput"]) if p[k]["feasible"] else "does not fit"

        def p99(k: str, p=p) -> str:
            if not p[k]["feasible"]:
                return "-"
            return f"{_n(p[k].get('p99_ms_poisson'))} / {_n(p[k].get('p99_ms_bursty'))} ms"

        better = max(("even by layers", "even by params"), key=lambda k, p=p: p[k]["throughput"])
        out.append(f"| {r['model']} | {r['devices']} | {_n(r['memory_per_device'] / 2**20)} MiB "
                   f"({_n(r['footprint'] / 2**20)}) | {thr('dp+replication')} | {thr('dp, no replication')} "
                   f"| {thr('even by layers')} | {thr('even by params')} | {thr('whole-model replicas')} "
                   f"| **{r['dp_over_best_even']:.2f}x** | {_x(r['dp_over_best_even_any_k'])} "
                   f"| {p99('dp+replication')} | {p99(better)} |")
    return "\n".join(out)


def served_table(runs: list[dict[str, Any]], label: str = "model") -> str:
    out = ["| run | stages (start, end, replicas) | hop (fixed ms, MB/s) | rows/s predicted | rows/s measured "
           "| measured / predicted | p50 sim / measured | p99 sim / measured | p99 measured / sim | load |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        name = r.get("name") or f"{r.get(label, '')} M={r.get('devices', '')} {r.get('plan', '')}".strip()
        hop = r["hop"]
        bw = "inf" if hop["bytes_per_s"] is None else _n(hop["bytes_per_s"] / 1e6)
        out.append(f"| {name} | {r['stages']} | {hop['fixed_ms']:.1f}, {bw} | {_n(r['predicted_rows_per_s'], 1)} "
                   f"| {_n(r['measured_rows_per_s'], 1)} | **{r['throughput_ratio']:.2f}** "
                   f"| {_n(r['simulated_p50_ms'])} / {_n(r['poisson']['p50_ms'])} ms "
                   f"| {_n(r['simulated_p99_ms'])} / {_n(r['poisson']['p99_ms'])} ms | **{r['p99_ratio']:.2f}** "
                   f"| {r['load']} |")
    return "\n".join(out)


def report(d: dict[str, Any]) -> str:
    parts = [f"Run {d['date']}, {d['cpus']} CPUs, GPU: {d['gpu'] or 'none'}, load average before "
             f"{d['load_before']}, after {d['load_after']}. Serve hop at the start: "
             f"{d['serve_hop']['fixed_ms']:.2f} ms + bytes / "
             + ("inf" if d["serve_hop"]["bytes_per_s"] is None else f"{d['serve_hop']['bytes_per_s'] / 1e6:,.0f}")
             + " MB/s."]
    if "plan" in d:
        for t in ("assumed-gpu", "serve-measured"):
            parts += [f"\nPlanner at cluster scale, transport `{t}`:\n", plan_table(d, t)]
    if "emulated" in d:
        parts += ["\nEmulated accelerators:\n", served_table(d["emulated"]["runs"])]
    if "cpu" in d:
        parts += ["\nReal CPU, all-MiniLM-L6-v2 in 2 stages:\n", served_table([{**d["cpu"], "name": "minilm cpu"}])]
    if "deep" in d:
        acc = d["deep"]["accuracy"]
        parts += ["\ntoxic_deep full pipeline served alone (2 CPUs):\n",
                  served_table([{**d["deep"], "name": "toxic_deep full"}]),
                  f"\nTest accuracy: cheap level {acc['cheap_word_tfidf']:.4f}, MiniLM embeddings alone "
                  f"{acc.get('embeddings_only', acc.get('transformer_level', math.nan)):.4f}, full pipeline "
                  f"{acc['full_pipeline']:.4f}; served equals in-process: {d['deep']['served_matches_in_process']}."]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.partition_report BENCH.json", file=sys.stderr)
        return 2
    print(report(json.loads(Path(args[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
