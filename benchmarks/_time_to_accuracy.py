"""Time-to-accuracy (DAWNBench) for ``python -m benchmarks.serving``: throughput alone is a poor
metric when approximations change accuracy, so every configuration's speed is reported *at*
the accuracy its answers measured.

Per configuration (the JSON fields each phase gains):

* ``accuracy``: the configuration's answers on the workload's labelled held-out rows; for a
  served configuration the rows are posted to the app once after the timed phase and the
  answers it sent back are scored (not the in-process pipeline's);
* ``accuracy_loss``: the full pipeline's accuracy on the same rows minus that;
* ``certified_loss_bound`` / ``max_loss``: what the optimizer certified for the plan served
  (0 for the full pipeline, which approximates nothing);
* ``rows_per_s_at_accuracy`` / ``p99_ms_at_accuracy``: the phase's measured rows/s and p99,
  named with the accuracy they were reached at;
* ``cost_per_million_predictions``: the CPUs the configuration holds (``--cpus`` for a served
  one, 1 for in-process) at ``PRICE_PER_CPU_HOUR`` (the simulated on-demand price of
  :mod:`benchmarks._tiers`, 1.0 per device-hour), over its measured rows/s.

And once per run, ``time_to_first_answer_s``: wall seconds from starting ``willump serve`` on
the optimized artifact (a fresh process and Ray, plan measured as ``willump serve`` does) to
its first 200 answer to ``POST /predict`` once it says it serves (an app answers during
deploy's in-situ probe too, then is redeployed: those answers do not count), measured after
the phases, when the benchmark's own Ray is down; ``ready_s``: when it said so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from serving.core.jsonsafe import clean

#: simulated on-demand price of one CPU for an hour (benchmarks._tiers.PRICE_RELIABLE)
PRICE_PER_CPU_HOUR = 1.0
#: rows per request when the held-out rows are posted for scoring
SCORE_ROWS_PER_REQUEST = 256
#: longest wait for `willump serve`'s first answer, and the polling interval (seconds)
FIRST_ANSWER_TIMEOUT_S = 600.0
POLL_S = 0.25


def labelled(args: Any) -> tuple[Any, np.ndarray] | None:
    """The workload's labelled held-out rows (None for ``--artifact``: an artifact carries none)."""
    if getattr(args, "artifact", None):
        return None
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed)
    return workload.X_test, np.asarray(workload.y_test)


def _accuracy(predicted: Any, y: np.ndarray) -> float:
    return float(np.mean(np.asarray(predicted) == y))


def served_predictions(url: str, X: Any) -> list[Any]:
    """POST the rows to ``url`` in chunks; the predictions the app answered, in order."""
    import requests

    out: list[Any] = []
    for start in range(0, len(X), SCORE_ROWS_PER_REQUEST):
        rows = X.iloc[start:start + SCORE_ROWS_PER_REQUEST]
        body = json.dumps(clean({"rows": rows.to_dict("records")}))
        r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)
        r.raise_for_status()
        out += r.json()["predictions"]
    return out


def at_accuracy(phase: dict[str, Any], opt: Any, data: tuple[Any, np.ndarray] | None, *, baseline: bool,
                cpus: float, url: str | None = None) -> dict[str, Any]:
    """The fields this module adds to a phase (see the module docstring)."""
    rows_s = float(phase.get("measured_rows_per_s", phase.get("rows_per_s", 0.0)))
    p99 = float(phase.get("measured_p99_ms", phase.get("p99_ms", float("nan"))))
    gear = opt.gears_[0]
    out: dict[str, Any] = {
        "rows_per_s_at_accuracy": rows_s, "p99_ms_at_accuracy": p99,
        "certified_loss_bound": 0.0 if baseline else gear.loss_bound,
        "max_loss": None if baseline else opt.report().max_loss,
        "cost_per_million_predictions": cpus * PRICE_PER_CPU_HOUR / (rows_s * 3600.0) * 1e6 if rows_s > 0 else None,
        "price_per_cpu_hour": PRICE_PER_CPU_HOUR, "cpus_held": cpus,
    }
    if data is None:
        return {**out, "accuracy": None, "accuracy_loss": None}
    X, y = data
    full = _accuracy(opt.baseline.predict(X), y)
    if url is not None:
        answered = served_predictions(url, X)
        predicted = np.asarray(answered, dtype=np.asarray(opt.classes_).dtype)
    else:
        predicted = opt.baseline.predict(X) if baseline else opt.predict(X)
    accuracy = _accuracy(predicted, y)
    return {**out, "accuracy": accuracy, "accuracy_full_pipeline": full, "accuracy_loss": full - accuracy,
            "accuracy_rows": len(y)}


#: what ``willump serve`` prints once deploy returned (serving.cli.cmd_serve)
READY_LINE = "willump: serving "


def time_to_first_answer(opt: Any, rows: Any, *, cpus: float, port: int, name: str = "tta") -> dict[str, Any]:
    """Start ``willump serve`` on the saved artifact and time its first answer (see the module
    docstring); the server is stopped with SIGINT afterwards, as a user would."""
    import requests

    folder = tempfile.mkdtemp(prefix="willump-tta-")
    path = os.path.join(folder, "artifact")
    opt.save(path)
    body = json.dumps(clean({"rows": rows.iloc[:1].to_dict("records")}))
    url = f"http://127.0.0.1:{port}/{name}/predict"
    log = open(os.path.join(folder, "serve.log"), "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "serve", path, "--name", name, "--port", str(port),
                             "--cpus", f"{cpus:g}", "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    seconds, ready, error = None, None, None
    try:
        while time.perf_counter() - t0 < FIRST_ANSWER_TIMEOUT_S:
            if proc.poll() is not None:
                error = f"willump serve exited with {proc.returncode} (log: {log.name})"
                break
            if ready is None:  # the app answers for good once willump serve says it serves
                with open(log.name) as f:
                    if READY_LINE not in f.read():
                        time.sleep(POLL_S)
                        continue
                ready = time.perf_counter() - t0
            try:
                r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
                if r.status_code == 200:
                    seconds = time.perf_counter() - t0
                    break
            except requests.RequestException:
                pass
            time.sleep(POLL_S)
        else:
            error = f"no answer within {FIRST_ANSWER_TIMEOUT_S:g} s (log: {log.name})"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    return {"time_to_first_answer_s": seconds, "ready_s": ready, "error": error,
            "command": f"willump serve ARTIFACT --cpus {cpus:g}"}
