"""Tiered reliability (Proteus, EuroSys'17; Tributary, ATC'18): reliable (on-demand) and
transient (preemptible, cheaper, can vanish) replicas per stage, mixed at minimum cost.

Transient devices come in *pools* that are preempted together (a node, a spot market). The
plan keeps the SLO in two regimes:

* normal: every stage's capacity, used at ``utilization``, covers the target rate;
* after losing any one transient pool (until its capacity comes back): the capacity left,
  used at ``surge_utilization``, still covers the target. Reliable capacity is what this
  forces: with several pools, losing one leaves the others, so few reliable replicas are
  needed; with one pool, reliable capacity alone must hold the target.

Solved exactly as a mixed-integer LP by scipy's HiGHS; :func:`all_reliable_cost` is the
baseline the saving is measured against. Prices are per device per hour (simulated in the
benchmark and said so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from serving.planning.hetero import DEFAULT_SURGE_UTILIZATION

#: share of capacity a plan may use in normal operation
DEFAULT_UTILIZATION = 0.8


@dataclass
class TierPlan:
    """Reliable replicas per stage and transient replicas per (stage, pool), with the cost."""

    reliable: dict[str, int]
    transient: dict[tuple[str, str], int]
    cost: float
    all_reliable_cost: float
    notes: list[str] = field(default_factory=list)

    @property
    def cost_vs_reliable(self) -> float:
        return self.cost / self.all_reliable_cost if self.all_reliable_cost > 0 else 1.0

    def to_dict(self) -> dict:
        return {"reliable": dict(self.reliable),
                "transient": {f"{s}@{p}": n for (s, p), n in sorted(self.transient.items())},
                "cost": self.cost, "all_reliable_cost": self.all_reliable_cost,
                "cost_vs_reliable": self.cost_vs_reliable, "notes": list(self.notes)}


def _check(rates, visits, target_rate, utilization, surge_utilization, price_reliable, price_transient, pools):
    if set(rates) != set(visits):
        raise ValueError(f"rates and visits must name the same stages, got {sorted(rates)} and {sorted(visits)}")
    if any(not np.isfinite(r) or r <= 0 for r in rates.values()):
        raise ValueError(f"rates must be > 0 calls/s per replica, got {dict(rates)}")
    if any(not np.isfinite(v) or v < 0 for v in visits.values()):
        raise ValueError(f"visits must be >= 0, got {dict(visits)}")
    if not np.isfinite(target_rate) or target_rate <= 0:
        raise ValueError(f"target_rate must be > 0 requests/s, got {target_rate!r}")
    if not 0 < utilization <= 1 or not 0 < surge_utilization <= 1:
        raise ValueError(f"utilization and surge_utilization must be in (0, 1], got {utilization}, {surge_utilization}")
    if price_reliable < 0 or price_transient < 0:
        raise ValueError("prices must be >= 0")
    if any(isinstance(n, bool) or not float(n).is_integer() or n < 0 for n in pools.values()):
        raise ValueError(f"pools: transient devices per pool must be whole numbers >= 0, got {dict(pools)}")


def all_reliable_cost(rates: Mapping[str, float], visits: Mapping[str, float], target_rate: float,
                      price_reliable: float, *, utilization: float = DEFAULT_UTILIZATION) -> float:
    """The cost of covering the target with reliable replicas only."""
    need = sum(int(np.ceil(target_rate * visits[s] / (utilization * rates[s]) - 1e-9)) for s in rates)
    return need * price_reliable


def plan_tiers(rates: Mapping[str, float], visits: Mapping[str, float], target_rate: float, *,
               price_reliable: float, price_transient: float, pools: Mapping[str, int],
               utilization: float = DEFAULT_UTILIZATION,
               surge_utilization: float = DEFAULT_SURGE_UTILIZATION) -> TierPlan:
    """The cheapest mix of reliable replicas (unbounded supply) and transient replicas (at
    most ``pools[p]`` devices in pool ``p``) holding the target in both regimes (module doc).

    ``rates[stage]``: calls/s one replica sustains (reliable and transient devices alike);
    ``visits[stage]``: calls per request."""
    from scipy.optimize import linprog

    _check(rates, visits, target_rate, utilization, surge_utilization, price_reliable, price_transient, pools)
    stages, names = list(rates), [p for p in pools if pools[p] > 0]
    S, P = len(stages), len(names)
    n = S + S * P  # reliable[s], transient[s, p]
    c = np.concatenate([np.full(S, price_reliable), np.full(S * P, price_transient)]) + 1e-9
    rows, b = [], []
    for i, s in enumerate(stages):
        need = target_rate * visits[s] / rates[s]
        row = np.zeros(n)
        row[i] = -1.0
        row[S + i * P:S + (i + 1) * P] = -1.0
        rows.append(row)
        b.append(-need / utilization)
        for lost in range(P):  # any one pool gone
            row = np.zeros(n)
            row[i] = -1.0
            for p in range(P):
                if p != lost:
                    row[S + i * P + p] = -1.0
            rows.append(row)
            b.append(-need / surge_utilization)
    for p in range(P):  # devices per pool
        row = np.zeros(n)
        for i in range(S):
            row[S + i * P + p] = 1.0
        rows.append(row)
        b.append(float(pools[names[p]]))
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(b), bounds=[(0, None)] * n,
                  integrality=np.ones(n), method="highs")
    if res.status != 0:
        raise ValueError(f"plan_tiers: the LP failed ({res.message})")
    x = np.rint(res.x).astype(int)
    reliable = {s: int(x[i]) for i, s in enumerate(stages)}
    transient = {(s, names[p]): int(x[S + i * P + p]) for i, s in enumerate(stages) for p in range(P)
                 if x[S + i * P + p] > 0}
    cost = float(sum(reliable.values()) * price_reliable + sum(transient.values()) * price_transient)
    base = all_reliable_cost(rates, visits, target_rate, price_reliable, utilization=utilization)
    return TierPlan(reliable, transient, cost, base,
                    notes=[f"target {target_rate:g}/s at utilization {utilization:g}; any one transient pool "
                           f"lost: the rest at {surge_utilization:g}"])


def deployment_of(plan: TierPlan, reliable_device: str) -> tuple[dict[tuple[str, str], int], dict[str, dict[str, float]]]:
    """The tier plan as :func:`serving.emulation.hetero_app.deploy_hetero` takes it: replicas per
    (stage, device type), the reliable ones on ``reliable_device`` and the transient ones on
    their pool's device type, and routing weights in proportion to replicas (the planner
    counts reliable and transient replicas as equally fast)."""
    replicas: dict[tuple[str, str], int] = {}
    for stage, n in plan.reliable.items():
        if n > 0:
            replicas[(stage, reliable_device)] = n
    for (stage, pool), n in plan.transient.items():
        if n > 0:
            replicas[(stage, pool)] = replicas.get((stage, pool), 0) + n
    weights: dict[str, dict[str, float]] = {}
    for (stage, device), n in replicas.items():
        weights.setdefault(stage, {})[device] = float(n)
    missing = sorted(set(plan.reliable) - set(weights))
    if missing:
        raise ValueError(f"the tier plan gives stages {missing} no replica")
    return replicas, weights
