"""The hedging section of :mod:`benchmarks.deploy_cluster`: hedged stage calls in ``deploy``'s
own apps under an emulated straggler, against the same app unhedged.

Every node is the same emulated device: a fixed time a row per stage (``--hedge-ms-per-row``,
default 0.5 ms a cheap row and 10 ms an expensive one) or ``--hedge-slowdown`` times the compute
time, whichever is longer (default 1: the rows' time). One worker is also a straggler
(``--straggle-factor`` times as long on ``--straggle-share`` of its batches; the file
``serving.runtime.emulated_node.STRAGGLE_SWITCH`` turns it off between phases). Two apps, the
same plan, ``hedging=True`` and off. Per round (the apps' order alternating): open-loop
Poisson load at ``--hedge-rate`` for ``--hedge-requests`` requests with the straggler off,
then on. Work is rows computed by every model-stage replica (``info()['rows']``, a copy's
included, a cancelled one's up to its cancellation) per request answered; ``copies`` counts the
phase's copies by outcome and the hedge delay's backoff changes (from ``/metrics``).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

#: open-loop requests/s: below what the 2-core host carries. At 30/s the hedged app alone kept
#: both cores busy (2026-12-07: its ingress 53% of a core, about 17 ms of CPU a request, mostly
#: Ray's actor calls and router; each Serve proxy 8-13%), so the phases' p99 was the host's CPU
#: queue (no-straggler p50 55-107 ms for a 26 ms device path), not the straggler
HEDGE_RATE = 20.0
#: every node's emulated device time over compute time in this section, at least (1: the rows'
#: fixed time alone)
HEDGE_SLOWDOWN = 1.0
#: the device's milliseconds a row per stage (cheap, expensive). A fixed time, not a multiple of
#: the compute time measured on the host: that multiple (4x until 2026-12-07) multiplied every
#: moment the 2-core host was busy elsewhere, and the no-straggler phases' p50 moved 60-107 ms
#: between phases of one run, more than the straggler moved the p99. At 30 requests/s of 32 rows
#: a cheap replica of three is busy about 16% of its time, an expensive one about 10% (at the
#: default 20/s, about 11% and 7%).
HEDGE_MS_PER_ROW = (0.5, 10.0)
#: requests offered per phase (Poisson arrivals: about this many arrive; at least 2,000 wanted)
HEDGE_REQUESTS = 2100
STRAGGLE_FACTOR = 10.0
STRAGGLE_SHARE = 0.1
#: seconds of load each app gets before the rounds
WARMUP_S = 5.0
#: the unhedged app sends no copy at all (no bound on a silent replica either: it would copy the
#: straggler's calls past 5x the median)
HEDGING_APPS = {"hedged": {"hedging": True}, "unhedged": {"hedging": False, "lost_after_s": None}}
#: with ``--hedge-compare-backoff``: a third app, hedged with the delay's backoff off
#: (serving.runtime.hedge.HedgeBackoff), so the backoff's own effect is measured side by side
NO_BACKOFF_APP = {"hedged_no_backoff": {"hedging": {"min_win_share": 0.0}}}
#: the target: hedged p99 with the straggler over the unhedged p99 without it, at most this
P99_TARGET = 1.5
#: ... at no more than this much extra work
EXTRA_WORK_TARGET = 0.10


def rows_computed(app: str, replicas: int) -> int:
    """Rows every replica of the app's model stages has computed: each replica actor's routing
    stats (the ModelStage's BusyMeter), asked directly, not through a router."""
    import ray

    from benchmarks.deploy_cluster import replicas_of

    total = 0
    for stage in ("cheap", "expensive"):
        actors = replicas_of(app, f"{app}-{stage}")
        if len(actors) < replicas:
            raise RuntimeError(f"{app}-{stage}: {len(actors)} of {replicas} replicas alive")
        stats = ray.get([ray.get_actor(a.name, namespace="serve").record_routing_stats.remote() for a in actors],
                        timeout=60)
        total += sum(int(s.get("rows", 0)) for s in stats)
    return total


def on_straggler(apps: list[str]) -> dict[str, dict[str, int]]:
    """Each app's model-stage replicas on the straggling node (the one labelled with a straggle
    factor): the apps' exposure to the straggler."""
    import ray

    from benchmarks.deploy_cluster import replicas_of
    from serving.runtime.emulated_node import STRAGGLE_FACTOR_LABEL

    slow = {n["NodeID"] for n in ray.nodes() if n.get("Alive") and STRAGGLE_FACTOR_LABEL in (n.get("Labels") or {})}
    return {app: {stage: sum(a.node_id in slow for a in replicas_of(app, f"{app}-{stage}"))
                  for stage in ("cheap", "expensive")} for app in apps}


def _straggler(on: bool) -> None:
    from serving.runtime.emulated_node import STRAGGLE_SWITCH

    switch = Path(STRAGGLE_SWITCH)
    if on:
        switch.unlink(missing_ok=True)
    else:
        switch.touch()


def hedge_counts(url: str) -> dict[str, float]:
    """The app's copies so far by outcome (``won``, ``lost``) and its hedge delay's backoff
    changes by the factor set (``backoff_to_F``), as of the replicas' last metrics export (a
    few seconds behind)."""
    from benchmarks._scrape import counter_by_label, metrics_text

    text = metrics_text(url)
    won = counter_by_label(text, "willump_stage_hedges", "won")
    out = {"won": won.get("true", 0.0), "lost": won.get("false", 0.0)}
    for factor, n in counter_by_label(text, "willump_stage_hedge_backoffs", "factor").items():
        out[f"backoff_to_{factor}"] = n
    return out


def _phase(app: Any, name: str, payloads: list[bytes], args, straggling: bool) -> dict[str, Any]:
    from serving.measure.loadgen import open_loop

    _straggler(straggling)
    before, copies_before = rows_computed(name, args.replicas), hedge_counts(app.url)
    out = asyncio.run(open_loop(app.url + "/predict", payloads, rate=args.hedge_rate,
                                duration=args.hedge_requests / args.hedge_rate, seed=args.seed))
    out["rows_computed"] = rows_computed(name, args.replicas) - before
    out["rows_per_answer"] = out["rows_computed"] / max(out["requests"], 1)
    after = hedge_counts(app.url)
    out["copies"] = {k: v - copies_before.get(k, 0.0) for k, v in after.items()}
    out.pop("by_level", None)
    return out


def hedging(opt: Any, payloads: list[bytes], args) -> dict[str, Any]:
    from benchmarks.deploy_cluster import median, with_cluster
    from serving.runtime.emulated_node import (
        MS_PER_ROW_LABEL,
        SLOWDOWN_LABEL,
        STRAGGLE_FACTOR_LABEL,
        STRAGGLE_SHARE_LABEL,
    )

    cheap_ms, expensive_ms = args.hedge_ms_per_row
    device = {SLOWDOWN_LABEL: f"{args.hedge_slowdown:g}", f"{MS_PER_ROW_LABEL}-cheap": f"{cheap_ms:g}",
              f"{MS_PER_ROW_LABEL}-expensive": f"{expensive_ms:g}"}
    straggler = {**device, STRAGGLE_FACTOR_LABEL: f"{args.straggle_factor:g}",
                 STRAGGLE_SHARE_LABEL: f"{args.straggle_share:g}"}

    def run(apps: dict[str, Any]) -> dict[str, Any]:
        from serving.measure.loadgen import open_loop

        for app in apps.values():  # warm up: the first seconds of a fresh app are not its steady state
            asyncio.run(open_loop(app.url + "/predict", payloads, rate=args.hedge_rate, duration=WARMUP_S))
        exposure = on_straggler(list(apps))
        print(f"hedging: replicas on the straggling node {exposure}")
        rounds: list[dict[str, Any]] = []
        for r in range(args.repeats):
            one: dict[str, Any] = {}
            for name in (list(apps) if r % 2 == 0 else list(reversed(apps))):
                for straggling in (False, True):
                    key = f"{'jitter' if straggling else 'no_jitter'}_{name}"
                    one[key] = _phase(apps[name], name, payloads, args, straggling)
                    p = one[key]
                    print(f"hedging round {r + 1} {key:20s} p50 {p['p50_ms']:6.1f} ms p99 {p['p99_ms']:7.1f} ms "
                          f"({p['requests']} answered, {p['errors']} failed) rows/answer {p['rows_per_answer']:.1f} "
                          f"copies {p['copies']}")
            one["p99_jitter_hedged_over_no_jitter"] = one["jitter_hedged"]["p99_ms"] / one["no_jitter_unhedged"]["p99_ms"]
            one["extra_work"] = one["jitter_hedged"]["rows_per_answer"] / one["jitter_unhedged"]["rows_per_answer"] - 1
            if "jitter_hedged_no_backoff" in one:
                one["p99_jitter_hedged_no_backoff_over_no_jitter"] = (one["jitter_hedged_no_backoff"]["p99_ms"]
                                                                      / one["no_jitter_unhedged"]["p99_ms"])
            rounds.append(one)
        _straggler(False)
        result: dict[str, Any] = {"baseline": "unhedged, same app", "emulated": True, "rounds": rounds,
                                  "rate": args.hedge_rate, "requests_per_phase": args.hedge_requests,
                                  "slowdown": args.hedge_slowdown, "ms_per_row": list(args.hedge_ms_per_row),
                                  "straggle_factor": args.straggle_factor, "straggle_share": args.straggle_share,
                                  "replicas_on_straggler": exposure}
        for key in (f"{phase}_{name}" for name in apps for phase in ("no_jitter", "jitter")):
            result[f"p99_ms_{key}"] = median([x[key]["p99_ms"] for x in rounds])
            result[f"failed_{key}"] = sum(x[key]["errors"] for x in rounds)
        result["p99_jitter_hedged_over_no_jitter"] = median([x["p99_jitter_hedged_over_no_jitter"] for x in rounds])
        result["extra_work"] = median([x["extra_work"] for x in rounds])
        result["targets"] = {
            "p99_within_1.5x_every_round": all(x["p99_jitter_hedged_over_no_jitter"] <= P99_TARGET for x in rounds),
            "extra_work_within_10%_every_round": all(x["extra_work"] <= EXTRA_WORK_TARGET for x in rounds)}
        return result

    try:
        from benchmarks.deploy_cluster import HEAD_CPUS, INGRESS_CPUS, STAGE_CPUS

        apps = {**HEDGING_APPS, **(NO_BACKOFF_APP if getattr(args, "hedge_compare_backoff", False) else {})}
        # each app past the two: its ingress on the head (logical CPUs, not the machine's), and
        # every app's stage replicas smaller, so they spread over the same nodes as two apps' do
        head_cpus = HEAD_CPUS + math.ceil(INGRESS_CPUS * (len(apps) - len(HEDGING_APPS)))  # Ray: whole CPUs
        stage_cpus = STAGE_CPUS * len(HEDGING_APPS) / len(apps)
        return with_cluster(device, [device, straggler], opt, apps, args, run, head_cpus=head_cpus,
                            stage_cpus=stage_cpus)
    finally:
        _straggler(True)  # leave no switch file behind


def summary(h: dict[str, Any]) -> str:
    return (f"hedging: p99 without the straggler {h['p99_ms_no_jitter_unhedged']:.1f} ms (hedged "
            f"{h['p99_ms_no_jitter_hedged']:.1f}); with it unhedged {h['p99_ms_jitter_unhedged']:.1f} ms, hedged "
            f"{h['p99_ms_jitter_hedged']:.1f} ms ({h['p99_jitter_hedged_over_no_jitter']:.2f}x the no-straggler p99); "
            f"extra work {h['extra_work']:+.1%}; failed {h['failed_jitter_hedged']} hedged, "
            f"{h['failed_jitter_unhedged']} unhedged; targets {h['targets']} (medians of {len(h['rounds'])} rounds)")
