"""Where the test suite's CPU goes: a command (by default `make test`'s pytest) run while every
process on the machine is sampled from /proc, its CPU seconds summed by what the process is.

    python -m benchmarks.suite_cpu [--interval 1.0] [--json PATH] [-- COMMAND ...]

On the 2-core project machine the suite keeps both cores busy (idle 6% in vmstat), so its
wall time follows the CPU it spends, not how its tests are spread over workers: this says
where that CPU went. Kinds: Serve replicas (by app), Ray's idle workers booting (before an
actor or task takes them), Ray's daemons (GCS, raylet, dashboard and its agent, log monitor),
Serve's controller and proxies, HAProxy, the pytest processes (the workers run the in-process
tests, the load generators and the deploy calls), and everything else by executable. A worker
Ray renames counts as a process under each name it had.

A process is read once a second, so the CPU of one that starts and ends between two reads is
missed; one that started after the command did is counted from its start. Ray renames a worker
(``ray::IDLE`` -> ``ray::ServeReplica:...``) when an actor takes it: each second's CPU goes to
the name it has then.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

#: `make test`'s pytest, without ruff
DEFAULT_COMMAND = (sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-q", "-p", "no:warnings")
#: seconds between reads of /proc
INTERVAL_S = 1.0
#: (substring of the command line, kind), first match wins (a worker's names its raylet's socket);
#: Ray's renamed workers are matched before
_DAEMONS = (("default_worker.py", "Ray: worker starting"), ("gcs_server", "Ray: GCS"), ("/raylet", "Ray: raylet"), ("dashboard/agent.py", "Ray: dashboard agent"),
            ("runtime_env/agent", "Ray: runtime-env agent"), ("dashboard/dashboard.py", "Ray: dashboard"),
            ("log_monitor", "Ray: log monitor"), ("autoscaler/_private/monitor.py", "Ray: monitor"),
            ("haproxy", "HAProxy"), (" -m pytest", "pytest"),
            ("execnet", "pytest"))
#: kinds told by the executable's name first: the raylet's arguments name default_worker.py, and
#: a test's subprocess names paths under /tmp/pytest-of-USER (a served app is not pytest)
_EXECUTABLES = {"raylet": "Ray: raylet", "pytest": "pytest"}
_HZ = os.sysconf("SC_CLK_TCK")


def kind(cmdline: str) -> str:
    """What a process is, from its command line."""
    named = re.match(r"ray::(\S+)", cmdline)
    if named:
        name = named.group(1)
        if name.startswith(("ServeReplica:", "SERVE_REPLICA::")):
            app = re.split(r"[:#]+", name.split(":", 1)[1].lstrip(":"))[0]
            return f"Serve replica: {app}"
        if name.startswith(("ServeController", "SERVE_CONTROLLER")):
            return "Serve: controller"
        if "Proxy" in name or "PROXY" in name:
            return "Serve: proxy"
        if name.startswith("IDLE"):
            return "Ray: idle worker"
        return f"Ray actor/task: {name.split('.')[0][:40]}"
    executable = os.path.basename(cmdline.split(" ", 1)[0])
    if executable in _EXECUTABLES:
        return _EXECUTABLES[executable]
    for part, name in _DAEMONS:
        if part in cmdline:
            return name
    if "import sys;exec(eval(sys.stdin.readline()))" in cmdline:
        return "pytest"  # an xdist worker
    return "other: " + os.path.basename(cmdline.split(" ", 1)[0])[:40]


def _read(pid: str) -> tuple[float, float, str] | None:
    """(CPU seconds, start time in seconds since boot, command line) of a process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return (int(stat[11]) + int(stat[12])) / _HZ, int(stat[19]) / _HZ, cmdline


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def sample(command: Sequence[str], interval_s: float = INTERVAL_S) -> dict:
    """Run ``command`` and sum every process's CPU by :func:`kind` until it ends."""
    me = str(os.getpid())
    started_at = _uptime()
    seen: dict[tuple[str, float], float] = {}  # (pid, start) -> CPU seconds at the last read
    named: set[tuple[str, float, str]] = set()  # (pid, start, kind): a renamed worker counts under each name
    cpu: Counter = Counter()
    processes: Counter = Counter()
    t0 = time.monotonic()
    proc = subprocess.Popen(list(command))
    while True:
        ended = proc.poll() is not None
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            read = _read(pid)
            if read is None or not read[2]:
                continue
            used, start, cmdline = read
            key = (pid, start)
            name = kind(cmdline)
            if (*key, name) not in named:
                named.add((*key, name))
                processes[name] += 1
            if key not in seen:
                # a process already running before the command: its past is not the command's
                seen[key] = used if start < started_at else 0.0
            cpu[name] += used - seen[key]
            seen[key] = used
        if ended:
            break
        time.sleep(interval_s)
    elapsed = time.monotonic() - t0
    return {"command": list(command), "returncode": proc.returncode, "elapsed_s": elapsed,
            "cpu_s": dict(cpu.most_common()), "processes": dict(processes), "total_cpu_s": sum(cpu.values()),
            "cores_busy": sum(cpu.values()) / elapsed if elapsed else 0.0}


def _all_apps(by_kind: dict[str, float]) -> Counter:
    """``by_kind`` with every app's replicas summed into one line."""
    out: Counter = Counter()
    for name, value in by_kind.items():
        out["Serve replicas (all apps)" if name.startswith("Serve replica:") else name] += value
    return out


def report(result: dict, top: int = 25) -> str:
    """The figures as a table, largest first, every app's replicas on one line."""
    lines = [f"{result['elapsed_s']:.0f} s, {result['total_cpu_s']:.0f} CPU s ({result['cores_busy']:.2f} cores busy), "
             f"exit {result['returncode']}", f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind"]
    cpu, counts = _all_apps(result["cpu_s"]), _all_apps(result["processes"])
    total = result["total_cpu_s"] or 1.0
    for name, seconds in cpu.most_common(top):
        lines.append(f"{seconds:8.1f} {seconds / total:6.1%} {counts[name]:6d}  {name}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between reads of /proc")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --); default: make test's pytest")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error(f"--interval must be > 0, got {args.interval}")
    command = [c for c in args.command if c != "--"] or list(DEFAULT_COMMAND)
    result = sample(command, args.interval)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
