"""The live dashboard in a real browser: an app with the monitor, traffic with a planted cause
(every request from region "sa" carries a row only the stalled expensive stage can answer), the page
loaded in headless Chromium, its plots drawn with data and the cause named; a screenshot is
saved under the test's temporary directory.

Nothing here depends on the machine's speed: every wait polls for a state (the monitor's
reference frozen, the cause named) with a generous timeout, and the planted stall (1 s per
expensive call) dwarfs what a loaded machine adds to the other requests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from itertools import pairwise

import numpy as np
import pandas as pd
import pytest
import requests

from serving import deploy
from tests.serving.conftest import wait_for
from tests.serving.pipelines import set_delay

PLANTED = "sa"
OTHERS = ("eu", "us", "ap")
STALL_S = 1.0
BROWSER_TIMEOUT_S = 180
#: the front's (HAProxy's) page for a 502/503/504 from an ingress replica
FRONT_ERROR = "Internal Server Error"


def browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


#: starts Ray, servers, subprocess apps or a browser: `make test` runs it in a Ray lane
pytestmark = [pytest.mark.starts_ray,
              pytest.mark.skipif(browser() is None, reason="no headless Chromium on this machine "
                                                           "(.ci/run installs Debian's chromium with apt-get)")]


@pytest.fixture(scope="module")
def app(ray_cluster, stallable_opt):
    set_delay(0.0)
    served = deploy(stallable_opt, name="dash", port=ray_cluster, cpus=2, device="cpu", calibrate="never", insitu="never",
                    layout="fused", p99_ms=250.0, monitor=dict(attributes=["region"], features=["a"], pane_seconds=1.0,
                                               window_panes=600, auto_reference_panes=3))
    yield served
    set_delay(0.0)
    served.shutdown(stop_ray=False)


#: plots the page must draw with data
PLOTS = ("traffic", "latency", "shares", "explanations", "level-latency", "series")


def plot_points(page: str) -> dict[str, int]:
    """Data points per plot of a page; every plot is an inline SVG with lines drawn."""
    points: dict[str, int] = {}
    for name, n, svg in re.findall(r'<figure data-plot="([^"]+)" data-points="(\d+)">(.*?)</figure>', page, re.S):
        assert "<svg" in svg and "<path" in svg, name
        points[name] = points.get(name, 0) + int(n)
    return points


def chrome(tmp_path, *args: str) -> subprocess.CompletedProcess:
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)


def test_dashboard_in_a_browser_names_the_planted_cause(app, stallable_opt, request_rows, tmp_path):
    _, level = stallable_opt.predict_with_levels(request_rows)
    sure, unsure = request_rows[level == 0], request_rows[level > 0]
    assert len(unsure) >= 2 and len(sure) >= 4
    session = requests.Session()
    rng = np.random.default_rng(7)

    def send(frame, region: str) -> None:
        r = session.post(app.url + "/predict", json={"rows": frame.to_dict("records"), "attributes": {"region": region}},
                         headers={"X-Deadline-Ms": "60000"}, timeout=120)  # slow, not failed: above the SLO
        assert r.status_code == 200, r.text

    def normal_round() -> None:
        for region in (*OTHERS, PLANTED):
            send(request_rows.sample(4, random_state=int(rng.integers(1 << 30))), region)

    def reference_frozen() -> bool:
        normal_round()
        return requests.get(app.url + "/explain", params={"metric": "latency_ms"}, timeout=120).status_code == 200

    phases = {"start": time.monotonic()}
    wait_for(reference_frozen, timeout=240, interval=0.2, message="the monitor's reference to freeze")
    phases["reference"] = time.monotonic()

    seen: list[str] = []

    def cause_named() -> bool:
        for region in OTHERS:  # rows the cheap stage answers: they never wait for the stall
            send(sure.sample(4, random_state=int(rng.integers(1 << 30))), region)
        # one row only the stalled stage answers makes the whole request slow: rows of every level
        # and every replica, so region is the one attribute their slowness has in common
        send(pd.concat([unsure.sample(1, random_state=int(rng.integers(1 << 30))),
                        sure.sample(5, random_state=int(rng.integers(1 << 30)))]), PLANTED)
        monitor = requests.get(app.url + "/ui", params={"format": "json"}, timeout=120).json().get("monitor") or {}
        parts = [monitor.get(p) or {} for p in ("explain_slo", "explain_latency")]
        seen[:] = [str(p.get("summary")) for p in parts] + [str(monitor.get("errors"))]
        return any(row.get("region") == PLANTED for p in parts for row in p.get("rows") or [])

    set_delay(STALL_S)
    try:
        try:
            wait_for(cause_named, timeout=300, interval=0.5, message=f"the dashboard to name region={PLANTED}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the monitor said: {seen}") from None
    finally:
        set_delay(0.0)
    phases["cause named (JSON)"] = time.monotonic()

    url = app.url + "/ui?refresh=0"
    # Each ingress replica keeps its own copy of the monitor's answers (refreshed at most every
    # MONITOR_TTL_S while watched), so a load may show an older copy, with its age: load again
    # until the page itself names the cause
    tries: list[str] = []

    def page_names_the_cause() -> str | None:
        for region in OTHERS:  # traffic goes on while someone watches (the per-pane plots need it)
            send(sure.sample(4, random_state=int(rng.integers(1 << 30))), region)
        dom = chrome(tmp_path, "--dump-dom", url)
        page = dom.stdout
        if FRONT_ERROR in page and "<figure" not in page:
            # HAProxy's own page for a 502/503/504 from the ingress: counted, and the test fails
            # below if it was ever seen (a replica's first page, drawn with years-wide time axes,
            # used to take minutes, past the front's timeout; the page now answers in time)
            tries.append("the front's error page")
            return None
        if 'id="drawing"' in page:  # the page was still being drawn: it says so and loads again
            tries.append("being drawn")
            return None
        assert dom.returncode == 0 and "<figure" in page, (page[:500], dom.stderr[-2000:])
        why = page[page.index('id="why"'):page.index('id="drift"')]
        if not re.search(rf"<li>Rows with [^<]*region={PLANTED}", why):
            tries.append(re.sub(r"<[^>]+>", " ", why)[:300])
            return None
        empty = [name for name in PLOTS if plot_points(page).get(name, 0) == 0]
        if empty:  # a part the monitor had not answered yet when this copy was drawn (shown as such)
            tries.append(f"plots without data: {empty}")
            return None
        return page

    try:
        page = wait_for(page_names_the_cause, timeout=300, interval=2.0, message="the page to name the cause")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; loads: {tries}") from None
    phases["page"] = time.monotonic()
    marks = list(phases.items())
    print("phases: " + ", ".join(f"{name} {t - prev:.1f} s" for (_, prev), (name, t) in pairwise(marks)),
          f"; page loads before the last: {tries}")
    assert "the front's error page" not in tries, tries
    points = plot_points(page)
    for name in PLOTS:
        assert points.get(name, 0) > 0, (name, points)
    assert "monitor answers computed" in page and "The monitor is off" not in page

    from PIL import Image

    # the screenshot is of the very page checked above, saved as one file: it needs nothing from
    # the app or elsewhere (and another load could land on a replica still drawing its first page)
    saved = tmp_path / "dashboard.html"
    saved.write_text(page)
    shot = tmp_path / "dashboard.png"
    taken = chrome(tmp_path, "--window-size=1400,5200", f"--screenshot={shot}", saved.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    inked = (np.asarray(Image.open(shot).convert("L")) < 200).mean()
    assert inked > 0.02, inked  # drawn, not a blank page
    print(f"dashboard screenshot: {shot}")


def test_index_links_to_the_dashboard_and_ui_refuses_bad_input(app):
    index = requests.get(app.url + "/", timeout=60)
    assert index.status_code == 200 and 'href="/dash/ui"' in index.text
    r = requests.get(app.url + "/ui", params={"format": "pdf"}, timeout=60)
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "format"
    wanted = ('willump_slo_p99_seconds{app="dash"} 0.25', 'willump_certified_answered_share{app="dash",level="0"}')
    # the gauges reach /metrics with the replicas' next export (RAY_metrics_report_interval_ms)
    wait_for(lambda: all(w in requests.get(app.url + "/metrics", timeout=60).text for w in wanted), timeout=60,
             message="the app's gauges in /metrics")


def test_the_sampler_fills_the_ring_off_the_request_path(app):
    def sampled():
        view = requests.get(app.url + "/ui", params={"format": "json"}, timeout=120).json()
        return view["sampler"]["snapshots"] >= 2 and view["sampler"]

    sampler = wait_for(sampled, timeout=120, interval=1.0, message="two metric snapshots")
    assert sampler["cpu_ms"] >= 0 and sampler["every_s"] > 0
    print(f"sampler: {sampler['cpu_ms']:.1f} ms CPU, {sampler['wall_ms']:.1f} ms wall per snapshot "
          f"every {sampler['every_s']:g} s")
