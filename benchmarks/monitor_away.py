"""A served app's monitor away for longer than a send may take: are the records of the rows
answered meanwhile delivered once, dropped, or counted twice?

    python -m benchmarks.monitor_away [--workload spam] [--away-s 20] [--clients 2] [--json PATH]

Deploys the workload's cascade with the monitor (its defaults: state folder, 60 s panes; no audit),
starts ``clients`` closed-loop threads posting 8-row requests, then SIGKILLs the monitor replica
and holds its state folder's lock for ``away-s`` seconds: the replica Serve starts in its place
waits for the folder (as it does while a predecessor still holds it), so no monitor answers for
that long (above serving.runtime.records.SEND_TIMEOUT_S, 10 s). The lock is let go, the load goes
on ``AFTER_S`` seconds after the first record delivered again, and the records settle.

Reported: rows answered 200; the ingress's records sent, sent again (retried) and dropped by
reason (``willump_monitor_records_*``); the monitor's batches skipped as copies, rows ingested and
rows too late to merge (``drift_duplicate_batches_total``, ``drift_rows_ingested_total``,
``drift_rows_late_dropped_total``). The rows the killed replica held in its open pane are lost
with it (durability='pane': see drift/README.md): the monitor's count falls short of the rows
answered by the rows answered before the kill (printed); the ingress's accounting (sent +
dropped = answered) is exact.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.handover import Clients
from serving.launch.proxy import metrics_interval_s

#: rows in each request the clients send
ROWS_PER_REQUEST = 8
#: seconds of load before the monitor goes, and after its first delivered record once back
BEFORE_S, AFTER_S = 5.0, 10.0
#: seconds, beyond one export period of the replicas' metrics (serving.launch.proxy.metrics_interval_s),
#: the records' counts in /metrics must stay unchanged to count as settled
SETTLED_S = 1.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="spam")
    parser.add_argument("--away-s", type=float, default=20.0, help="seconds no monitor answers (below 30: the "
                        "new replica's wait for its folder)")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not 0 < args.away_s < 30 or args.clients < 1:
        parser.error(f"--away-s must be in (0, 30) and --clients >= 1, got {args.away_s}, {args.clients}")
    return args


def metric_sums(url: str) -> dict[str, float]:
    """The app's /metrics summed per family and label set of interest."""
    import requests

    out: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        family = name.split("{", 1)[0].removesuffix("_total")
        if family.startswith(("willump_monitor_records_", "drift_rows_ingested", "drift_duplicate_batches",
                              "drift_rows_late_dropped")):
            key = family
            if 'reason="' in name:
                key += ":" + name.split('reason="', 1)[1].split('"', 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def monitor_pid(app: str) -> int:
    """The process of ``app``'s monitor replica (Ray names a replica's worker process after it)."""
    from serving.core.procstat import process_cpu

    found = [pid for pid, (command, _) in process_cpu().items()
             if command.startswith(f"ray::ServeReplica:{app}-monitor:")]
    if len(found) != 1:
        raise RuntimeError(f"expected one monitor replica process of {app}, found {found}")
    return found[0]


def hold_lock(folder: Path, wait_s: float = 10.0) -> Any:
    """The state folder's lock, taken as soon as the killed replica's is gone."""
    deadline = time.monotonic() + wait_s
    lock = open(folder / "monitor.lock", "a+")  # drift._store.LOCK_NAME
    while True:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except OSError:
            if time.monotonic() > deadline:
                lock.close()
                raise RuntimeError("the monitor's state folder stayed locked (a new replica took it first?)") \
                    from None
            time.sleep(0.01)


def wait_settled(url: str, timeout_s: float = 120.0) -> dict[str, float]:
    last, since = None, time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = metric_sums(url)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= metrics_interval_s() + SETTLED_S:
            return now
        time.sleep(0.5)
    raise RuntimeError(f"the records did not settle within {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    import pipelines
    from serving import deploy
    from serving.launch.proxy import use_proxy
    from serving.model_app.deploy import free_port
    from serving.runtime import monitor_state

    workload = pipelines.build(args.workload, seed=args.seed)
    opt = workload.optimize(verbose=False)
    rows = workload.X_test.iloc[:ROWS_PER_REQUEST].to_dict("records")
    use_proxy("haproxy")
    from serving.core.local_ray import ray_system_config

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
             _system_config=ray_system_config())
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    name = "away"
    try:
        app = deploy(opt, name=name, port=port, cpus=2, device="cpu", layout="fused", insitu="never",
                     calibrate="never", monitor=dict(), audit_rate=0.0)
        folders = [p for p in (monitor_state.root() / monitor_state.app_folder(name)).iterdir() if p.is_dir()]
        if len(folders) != 1:
            raise RuntimeError(f"expected one state folder of {name}, found {folders}")
        clients = Clients(app.url + "/predict", {"rows": rows}, args.clients)
        try:
            time.sleep(BEFORE_S)
            pid = monitor_pid(name)
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            lock = hold_lock(folders[0])
            time.sleep(max(args.away_s - (time.monotonic() - t_kill), 0.0))
            lock.close()  # the waiting replica opens the folder now
            t_back = time.monotonic()
            sent_then = metric_sums(app.url).get("willump_monitor_records_sent", 0.0)
            deadline = time.monotonic() + 60
            while metric_sums(app.url).get("willump_monitor_records_sent", 0.0) <= sent_then:
                if time.monotonic() > deadline:
                    raise RuntimeError("no record was delivered within 60 s of the monitor's return")
                time.sleep(0.2)
            t_delivered = time.monotonic()
            time.sleep(AFTER_S)
        finally:
            calls = clients.stop()
        settled = wait_settled(app.url)
        app.shutdown(stop_ray=False)
    finally:
        serve.shutdown()
        ray.shutdown()
    answered = sum(c[2] == 200 for c in calls) * ROWS_PER_REQUEST
    dropped = {k.split(":", 1)[1]: v for k, v in settled.items() if k.startswith("willump_monitor_records_dropped:")}
    return {
        "workload": args.workload, "clients": args.clients, "away_s": args.away_s,
        "requests": len(calls), "failed_requests": sum(c[2] != 200 for c in calls),
        "rows_answered": answered,
        "records_sent": settled.get("willump_monitor_records_sent", 0.0),
        "records_retried": settled.get("willump_monitor_records_retried", 0.0),
        "records_dropped": dropped,
        "monitor_duplicate_batches": settled.get("drift_duplicate_batches", 0.0),
        "monitor_rows_ingested": settled.get("drift_rows_ingested", 0.0),
        "monitor_rows_late_dropped": settled.get("drift_rows_late_dropped", 0.0),
        "rows_answered_before_the_kill": sum(c[2] == 200 and c[1] < t_kill for c in calls) * ROWS_PER_REQUEST,
        "first_delivery_after_return_s": t_delivered - t_back,
    }


def summary(r: dict[str, Any]) -> str:
    return (f"monitor away {r['away_s']:g} s under {r['clients']} clients ({r['workload']}): {r['rows_answered']:.0f} "
            f"rows answered ({r['failed_requests']} requests failed); records sent {r['records_sent']:.0f}, sent again "
            f"{r['records_retried']:.0f}, dropped {r['records_dropped'] or 0}; the monitor skipped "
            f"{r['monitor_duplicate_batches']:.0f} copies, dropped {r['monitor_rows_late_dropped']:.0f} as too late and "
            f"holds {r['monitor_rows_ingested']:.0f} rows; {r['rows_answered_before_the_kill']} rows were answered "
            f"before the kill (the killed replica's open pane); first delivery "
            f"{r['first_delivery_after_return_s']:.1f} s after its return")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(summary(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
