"""The gears section of ``python -m benchmarks.cluster`` (``--only gears``): a 3x burst
above the planned rate, served with load-adaptive gears and with one gear.

The app is the emulated-device app of :mod:`serving.emulation.hetero_app` (one replica per stage on
the fast device type), whose stage replicas run the workload's real cascade for the gear a
request is served by and then hold their device for ``fixed_ms + per_row_ms * rows``: a
cheaper gear sends fewer rows to the expensive stage, so it frees device time the way it
would free an accelerator. The ingress switches gears with the same
:class:`serving.runtime.gears.GearSwitch` / :class:`serving.runtime.gears.GearPolicy` the served app uses.

The planned rate is the rate a plan at ``PLAN_UTILIZATION`` of gear 0's capacity is sized
for; capacities per gear are predicted from the emulated device time and each gear's unsure
rows on the bench's requests (printed). Load is open loop (Poisson): ``PRE_S`` at the planned
rate, ``BURST_S`` at ``BURST`` x that, ``POST_S`` back at the planned rate; the same arrival
times for both modes, alternating, ``--repeats`` times (median p99). Accuracy: the answers of
the adaptive runs against the labels, next to the full pipeline's accuracy on the same rows;
each answer is also checked against its gear's in-process prediction (``wrong``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

#: emulated device time per stage call (ms): fixed + per row
GEAR_FIXED_MS = {"cheap": 4.0, "expensive": 10.0, "model": 10.0}
GEAR_PER_ROW_MS = {"cheap": 0.4, "expensive": 8.0, "model": 1.0}
#: the device type the stages run on (the head node's), one replica each
GEAR_DEVICE = "dev_fast"
#: a plan keeps its bottleneck at this utilization at the planned rate (headroom for the p99)
PLAN_UTILIZATION = 0.5
#: the burst: this many times the planned rate
BURST = 3.0
#: seconds at the planned rate before the burst, of the burst, and after it
PRE_S = 3.0
BURST_S = 10.0
POST_S = 8.0
#: the p99 target the gears hold (ms)
GEAR_SLO_MS = 500.0
#: looser max_loss values certified as gears, as multiples of the workload's max_loss
GEAR_LADDER = (2.0, 4.0)


def geared_workload(args) -> tuple[Any, Any, np.ndarray]:
    """The workload optimized with a ladder of gears; its held-out rows and labels."""
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed, n_rows=args.n_rows)
    opt = workload.optimize(verbose=False, gears=tuple(m * workload.max_loss for m in GEAR_LADDER))
    return opt, workload.X_test, np.asarray(workload.y_test)


def _device_s(stage: str, rows: int) -> float:
    return (GEAR_FIXED_MS.get(stage, 0.0) + GEAR_PER_ROW_MS.get(stage, 0.0) * rows) / 1000.0


def predicted_capacity(opt, specs, requests) -> list[dict[str, float]]:
    """Per gear: mean emulated device seconds per request at each stage and the requests/s the
    bottleneck stage sustains (one replica per stage)."""
    out = []
    for g in range(len(opt.gears_)):
        gear = opt.gear(g)
        per_stage = {s.name: 0.0 for s in specs}
        for rows in requests:
            _, level = gear.predict_with_levels(rows)
            per_stage[specs[0].name] += _device_s(specs[0].name, len(rows))
            unsure = int((level > 0).sum())
            if len(specs) > 1 and unsure:
                per_stage[specs[1].name] += _device_s(specs[1].name, unsure)
        per_stage = {k: v / len(requests) for k, v in per_stage.items()}
        out.append({"device_s_per_request": per_stage, "requests_per_s": 1.0 / max(per_stage.values()),
                    "unsure_share": float(np.mean([(gear.predict_with_levels(r)[1] > 0).mean() for r in requests]))})
    return out


def arrivals(rate: float, seed: int, phases: tuple[tuple[float, float], ...] | None = None) -> np.ndarray:
    """Poisson arrival times over ``phases`` ((seconds, times ``rate``), ...; default PRE_S at
    ``rate``, BURST_S at BURST x rate, POST_S at ``rate``)."""
    rng = np.random.default_rng(seed)
    times, t, until = [], 0.0, 0.0
    for seconds, factor in phases or ((PRE_S, 1.0), (BURST_S, BURST), (POST_S, 1.0)):
        until, r = until + seconds, factor * rate
        while True:
            t += float(rng.exponential(1.0 / r))
            if t >= until:
                t = until
                break
            times.append(t)
    return np.asarray(times)


async def _drive(app, requests, times: np.ndarray) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = []

    async def one(i: int, at: float):
        j = i % len(requests)
        t0 = time.perf_counter()
        out = await app.ingress.predict.remote(requests[j])
        log.append({"i": j, "at": at, "ms": (time.perf_counter() - t0) * 1000.0, "gear": int(out["gear"]),
                    "proba": np.asarray(out["proba"])})

    await at_times(times, one)
    return log


async def at_times(times: np.ndarray, send: Any) -> None:
    """``send(i, at)`` started at ``times[i]`` seconds from now (open loop: whatever the earlier
    ones take), all awaited."""
    start = time.perf_counter()
    tasks = []
    for i, at in enumerate(times):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(send(i, float(at))))
    await asyncio.gather(*tasks)


def score(opt: Any, log: list[dict[str, Any]], expected: dict[int, list], labels: list, full: list,
          served: dict[str, int], *, accuracy: bool, atol: float) -> None:
    """Count, into ``served``, the answers that differ from their gear's in-process prediction
    (``wrong``) and, with ``accuracy``, the rows answered right next to the full pipeline's."""
    for x in log:
        if not np.allclose(x["proba"], expected[x["gear"]][x["i"]], atol=atol):
            served["wrong"] += 1
        if accuracy:
            y = labels[x["i"]]
            served["rows"] += len(y)
            served["correct"] += int((opt.classes_[x["proba"].argmax(axis=1)] == y).sum())
            served["full_correct"] += int((full[x["i"]] == y).sum())


def _gear_by_second(log: list[dict[str, Any]]) -> list[float]:
    """The mean gear of the requests sent in each second of the run (when it switched, and back)."""
    seconds = int(PRE_S + BURST_S + POST_S)
    return [round(float(np.mean([x["gear"] for x in log if s <= x["at"] < s + 1] or [np.nan])), 2)
            for s in range(seconds)]


def gears(opt, source, requests, labels, args) -> dict[str, Any]:
    from serving.core.specs import stage_specs
    from serving.emulation.hetero_app import DeviceEmulation, deploy_hetero
    from serving.runtime.gears import GearPolicy, gear_info, ladder

    specs = stage_specs(opt)
    if len(opt.gears_) < 2:
        return {"error": f"the optimizer certified no cheaper gear for {args.workload} (gears {GEAR_LADDER} x max_loss)"}
    names = [s.name for s in specs]
    emulation = DeviceEmulation(fixed_ms={n: GEAR_FIXED_MS[n] for n in names},
                                per_row_ms={n: GEAR_PER_ROW_MS[n] for n in names})
    capacity = predicted_capacity(opt, specs, requests)
    planned = PLAN_UTILIZATION * capacity[0]["requests_per_s"]
    print(f"  gears {ladder(opt)}")
    print("  predicted capacity per gear (requests/s): "
          + ", ".join(f"{g}: {c['requests_per_s']:.1f} (unsure {c['unsure_share']:.1%})" for g, c in enumerate(capacity))
          + f"; planned rate {planned:.1f}/s, burst {BURST * planned:.1f}/s")
    expected = {g: [opt.gear(g).predict_proba(r) for r in requests] for g in range(len(opt.gears_))}
    full = [opt.baseline.predict(r) for r in requests]
    app = deploy_hetero(source, specs, {(n, GEAR_DEVICE): 1 for n in names}, {n: {GEAR_DEVICE: 1.0} for n in names},
                        emulation, name="gears", device_share=0.5)
    modes = {"single_gear": gear_info(0, None, opt, None),
             "with_gears": gear_info("adaptive", None, opt, args.gear_slo_ms)}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    served = {"rows": 0, "correct": 0, "full_correct": 0, "wrong": 0}
    try:
        for r in range(args.repeats):
            times = arrivals(planned, args.seed + r)
            for mode, info in modes.items():
                app.set_gears(info)
                log = asyncio.run(_drive(app, requests, times))
                stats = app.stats()
                ms = np.array([x["ms"] for x in log])
                burst = np.array([x["ms"] for x in log if PRE_S <= x["at"] < PRE_S + BURST_S])
                row = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                       "p99_ms_burst": float(np.percentile(burst, 99)), "requests": len(log),
                       "gear_rows": {str(k): v for k, v in stats["gear_rows"].items()},
                       "switches": stats["gear_switches"], "gear_by_second": _gear_by_second(log),
                       "p90_ms_before_burst": float(np.percentile([x["ms"] for x in log if x["at"] < PRE_S], 90))}
                score(opt, log, expected, labels, full, served, accuracy=mode == "with_gears", atol=1e-9)
                runs[mode].append(row)
                print(f"  {mode}: p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms (burst {row['p99_ms_burst']:.0f}"
                      f" ms), rows per gear {row['gear_rows']}, switches {row['switches']}, p90 before the burst "
                      f"{row['p90_ms_before_burst']:.0f} ms, gear by second {row['gear_by_second']}")
    finally:
        app.shutdown()
    med = {m: {f: float(np.median([row[f] for row in v])) for f in ("p50_ms", "p99_ms", "p99_ms_burst")}
           for m, v in runs.items()}
    accuracy = served["correct"] / served["rows"]
    full_accuracy = served["full_correct"] / served["rows"]
    worst = max(g.loss_bound for g in opt.gears_ if g.loss_bound is not None)
    out = {
        "slo_ms": args.gear_slo_ms,
        "p99_ms_with_gears": med["with_gears"]["p99_ms"],
        "p99_ms_single_gear": med["single_gear"]["p99_ms"],
        "p99_ms_burst_with_gears": med["with_gears"]["p99_ms_burst"],
        "p99_ms_burst_single_gear": med["single_gear"]["p99_ms_burst"],
        "p50_ms_with_gears": med["with_gears"]["p50_ms"], "p50_ms_single_gear": med["single_gear"]["p50_ms"],
        "accuracy_loss": full_accuracy - accuracy,
        "accuracy_served": accuracy, "accuracy_full_pipeline": full_accuracy, "rows_scored": served["rows"],
        "worst_certified_bound": worst,
        "wrong": served["wrong"],
        "ladder": ladder(opt), "policy": GearPolicy(len(opt.gears_), **modes["with_gears"]["policy"]).to_dict(),
        "planned_rate_per_s": planned, "burst_rate_per_s": BURST * planned,
        "predicted_capacity": capacity, "phases_s": {"pre": PRE_S, "burst": BURST_S, "post": POST_S},
        "emulation_ms": {"fixed": GEAR_FIXED_MS, "per_row": GEAR_PER_ROW_MS},
        "runs": runs,
    }
    out["targets"] = {
        "p99 within the SLO with gears": out["p99_ms_with_gears"] <= out["slo_ms"],
        "a single gear misses the SLO": out["p99_ms_single_gear"] > out["slo_ms"],
        "accuracy loss <= worst certified bound": out["accuracy_loss"] <= worst,
    }
    return out


def run_section(geared: tuple[Any, Any, np.ndarray], requests: list, args) -> dict[str, Any]:
    """The section for ``geared`` (:func:`geared_workload`): the artifact shared with the
    cluster, each request's labels, then :func:`gears`."""
    from serving.core.artifacts import resolve

    opt, _, y = geared
    rpr = args.rows_per_request
    labels = [y[i * rpr:(i + 1) * rpr] for i in range(len(requests))]
    return gears(opt, resolve(opt, "bench-gears", "auto")[0], requests, labels, args)


def summary(g: dict[str, Any]) -> str:
    """One line for the end of the bench's output."""
    return (f"gears: SLO {g['slo_ms']:g} ms, p99 with gears {g['p99_ms_with_gears']:.0f} ms, single gear "
            f"{g['p99_ms_single_gear']:.0f} ms; accuracy loss {g['accuracy_loss']:.4f} (worst certified bound "
            f"{g['worst_certified_bound']:.4f}); targets {g['targets']}")
