"""Processes of this machine from /proc: CPU used, parentage, which belong to a Ray session,
and the TCP ports they listen on.

Used to measure what each process of an app costs (serving.measure.calibrate, benchmarks.serving),
to check that an app leaves no process behind (tests), and to check which addresses an app's
processes listen on (serving.launch.control_plane). Linux only; elsewhere every function
returns empty results.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from typing import NamedTuple

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def runqueue_wait_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU (the second field of
    ``/proc/thread-self/schedstat``): the time other processes' turns added to its wall clock.
    0.0 where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pids() -> list[str]:
    return [e for e in os.listdir("/proc") if e.isdigit()] if os.path.isdir("/proc") else []


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) each process has used so far, with its command line, by pid."""
    out: dict[int, tuple[str, float]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            out[int(pid)] = (_cmdline(pid), stat[1])
    return out


def parents() -> dict[int, int]:
    out = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            out[int(pid)] = stat[0]
    return out


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def session_dir(gcs_address: str) -> str | None:
    """The session directory of the Ray whose GCS is at ``gcs_address`` (from its raylet's
    command line), if that Ray runs on this machine."""
    for pid in _pids():
        cmd = _cmdline(pid)
        if gcs_address in cmd:
            match = re.search(r"(/\S*/session_[^/\s]+)", cmd)
            if match:
                return match.group(1)
    return None


def session_processes(session: str) -> set[int]:
    """Every process of a Ray session on this machine: those naming its directory (GCS,
    raylets, agents) and everything they started (workers, HAProxy)."""
    roots = {int(pid) for pid in _pids() if session in _cmdline(pid)}
    return descendants(roots)


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if _stat(str(p)) is not None and not _zombie(p)}


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def group_cpu(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
              groups: dict[str, Callable[[int, str], bool]], rest: set[int] | None = None) -> dict[str, float]:
    """CPU seconds used between two snapshots by each group of processes (the first group
    whose test accepts a process's pid and title gets it); ``rest`` sums the other processes
    (only those in ``rest`` when given: another user's work on the machine is not ours)."""
    out = dict.fromkeys([*groups, "rest"], 0.0)
    for pid, (title, seconds) in after.items():
        used = seconds - before.get(pid, (title, 0.0))[1] if pid in before else seconds
        if used <= 0:
            continue
        for name, test in groups.items():
            if test(pid, title):
                out[name] += used
                break
        else:
            if rest is None or pid in rest:
                out["rest"] += used
    return out


def cpu_per_request(before: dict, after: dict, requests: int, app: str = "",
                    ours: set[int] | None = None) -> dict[str, float]:
    """CPU ms per request over a phase, by role: each Serve deployment of ``app`` (Ray titles
    replica processes ``ray::ServeReplica:APP:DEPLOYMENT``; the role drops the app's name),
    the replicas of every other app on this Ray but the app's own monitor (``other apps``: they
    are not serving the phase's requests), the HTTP front, this load generator, and the rest of this Ray's
    processes (``other``; processes outside ``ours``, e.g. another user's, are left out);
    ``total`` sums them."""
    roles: dict[str, float] = {}
    for pid, (title, seconds) in after.items():
        if pid not in before or requests <= 0:
            continue
        used = seconds - before[pid][1]
        if used <= 0:
            continue
        if pid == os.getpid():
            role = "load generator"
        elif ours is not None and pid not in ours:
            continue
        elif "ServeReplica:" in title:
            owner, _, role = title.split()[0].split("ServeReplica:", 1)[1].partition(":")
            if app and owner not in (app, f"{app}-monitor"):  # the app's monitor is the app's
                role = "other apps"
            else:
                role = role[len(app) + 1:] if app and role.startswith(app + "-") else role
        elif "haproxy" in title or "ProxyActor" in title:
            role = "front"
        else:
            role = "other"
        roles[role] = roles.get(role, 0.0) + 1000.0 * used / requests
    roles["total"] = sum(roles.values())
    return roles


class Listener(NamedTuple):
    """A TCP socket a process listens on."""

    pid: int
    title: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback


#: /proc/net/tcp's state code for a listening socket
_LISTEN = "0A"


def _hex_address(text: str) -> tuple[str, int]:
    """/proc/net/tcp{,6}'s ``ADDRESS:PORT``: the address in 32-bit words of host byte order."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port, 16)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket listening in this network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                out[int(fields[9])] = _hex_address(fields[1])
    return out


def listening_sockets(pids: set[int]) -> list[Listener]:
    """The TCP sockets the processes ``pids`` listen on (sockets shared by several of them,
    e.g. inherited, are reported once per process)."""
    inodes = _listening_inodes()
    found: list[Listener] = []
    for pid in sorted(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        title = _cmdline(str(pid))
        seen: set[int] = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes and inode not in seen:
                    seen.add(inode)
                    found.append(Listener(pid, title, *inodes[inode]))
    return found
