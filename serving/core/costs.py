"""What serving costs outside the models, per request and per stage call, on a cluster.

The planner and its simulation charge every process of the app with the CPU it spends:
the HTTP front, the ingress's HTTP handling, each stage call on both sides of the hop
(a fixed cost plus a cost per KB of arguments and results), Ray's own processes, and the
load generator when it shares a host. These figures describe the machine, so they are
measured (:func:`serving.measure.calibrate.calibrate` deploys probe deployments and reads each
process's CPU), cached per cluster, and stored with every plan. :meth:`HostCosts.unmeasured`
is what a plan uses when the caller opts out of measuring (``calibrate=False``); such a
plan says so in its notes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

#: where measured costs are cached (one entry per cluster fingerprint)
CACHE_ENV = "WILLUMP_SERVING_CACHE"
#: cached measurements older than this are measured again (seconds)
CACHE_MAX_AGE_S = 7 * 24 * 3600.0


@dataclass
class HostCosts:
    """CPU milliseconds per request / per call that the app spends outside its models."""

    #: the ingress process's HTTP handling per request (Serve's replica HTTP server,
    #: ASGI, FastAPI routing), excluding what the route itself does
    http_ms: float
    http_ms_per_kb: float
    #: the HTTP front (HAProxy or Serve's proxy actor) per request, and per KB of body+answer
    front_ms: float
    front_ms_per_kb: float
    #: one stage call (a hop): the caller's side and the callee's side, per call, per KB of
    #: arguments plus results, and per request the call carries (the ingress merges requests)
    hop_caller_ms: float
    hop_caller_ms_per_kb: float
    hop_callee_ms: float
    hop_callee_ms_per_kb: float
    #: Ray's and Serve's own processes (raylet, GCS, controller, metrics) per request
    other_ms: float
    #: cores those processes use when the app is idle, per host
    background_cores: dict[str, float] = field(default_factory=dict)
    #: cores they use on top of that while an app serves, whatever its rate (the controller's
    #: loops, replicas' and handles' metrics pushes, health checks), per host; ``other_ms`` is
    #: what grows with each request
    serving_cores: dict[str, float] = field(default_factory=dict)
    #: physical cores per host (nodes sharing a machine share its cores)
    cores: dict[str, float] = field(default_factory=dict)
    #: an aiohttp load generator's CPU per request (benchmarks.serving charges it to its host)
    client_ms: float = 0.0
    hop_caller_request_ms: float = 0.0
    hop_callee_request_ms: float = 0.0
    #: a fused ingress running its first stage in-process: the batching and thread hand-off
    #: around it, per request (the stage's own work is in its profile)
    local_request_ms: float = 0.0
    front: str = "haproxy"
    transport: str = "grpc"
    measured: bool = False
    measured_at: str = ""
    notes: list[str] = field(default_factory=list)

    @classmethod
    def unmeasured(cls, cores: dict[str, float] | None = None, front: str = "haproxy",
                   transport: str = "grpc") -> HostCosts:
        """Placeholder costs for a plan made without measuring (``calibrate=False``): the
        order of magnitude calibrate found on a 2-core development VM; not this machine's."""
        return cls(http_ms=1.5, http_ms_per_kb=0.01, front_ms=0.3, front_ms_per_kb=0.005,
                   hop_caller_ms=1.0, hop_caller_ms_per_kb=0.005, hop_callee_ms=1.0,
                   hop_callee_ms_per_kb=0.005, other_ms=0.3,
                   cores=dict(cores or {"localhost": float(os.cpu_count() or 1)}),
                   front=front, transport=transport, measured=False,
                   notes=["serving costs not measured (calibrate=False): placeholder figures"])

    def busy_cores(self, host: str) -> float:
        """Cores of ``host`` that Ray's own processes take while an app serves (not per request)."""
        return self.background_cores.get(host, 0.0) + self.serving_cores.get(host, 0.0)

    def cores_of(self, host: str) -> float:
        if host in self.cores:
            return self.cores[host]
        return float(os.cpu_count() or 1) if not self.cores else max(self.cores.values())

    def hop_ms(self, kb: float) -> tuple[float, float]:
        """(caller, callee) CPU ms of one stage call moving ``kb`` KB in all."""
        return (self.hop_caller_ms + self.hop_caller_ms_per_kb * kb,
                self.hop_callee_ms + self.hop_callee_ms_per_kb * kb)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostCosts:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "willump")
    return Path(root) / "serving-costs.json"


def load_cached(fingerprint: str, max_age_s: float = CACHE_MAX_AGE_S) -> HostCosts | None:
    """Costs measured earlier on the cluster with this fingerprint, if fresh enough."""
    try:
        entries = json.loads(cache_path().read_text())
        entry = entries[fingerprint]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if time.time() - float(entry.get("stamp", 0)) > max_age_s:
        return None
    try:
        return HostCosts.from_dict(entry["costs"])
    except (TypeError, KeyError):
        return None


def store_cached(fingerprint: str, costs: HostCosts) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            entries = {}
        entries[fingerprint] = {"stamp": time.time(), "costs": costs.to_dict()}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError:  # a read-only home: measure again next time
        pass
