"""Heterogeneity-aware allocation (Gavel, OSDI'20) for a graph of serving stages.

Gavel writes cluster policies over a *throughput matrix* (job x device type) and solves a
linear program for what each job gets of each device type. Here the jobs are an app's
stages and the unknowns are whole replicas: ``x[s, d]`` replicas of stage ``s`` on devices
of type ``d``. Inputs, all measured (:func:`serving.emulation.hetero_app.measure_matrix`):

* ``rates[s, d]``: calls per second one replica of stage ``s`` sustains on device type ``d``
  (0: the stage cannot run there);
* ``visits[s]``: calls stage ``s`` gets per app request (the expensive stage of a cascade is
  visited only by requests with an unsure row);
* ``devices[d]``: how many devices of type ``d`` the cluster has (one replica per device).

Two objectives, both solved exactly as a mixed-integer LP by scipy's HiGHS:

* :func:`plan_max_rate`: the largest app rate ``R`` with ``sum_d rates[s,d] x[s,d] >= visits[s] R``
  for every stage (then, among plans reaching it, the fewest replicas, or the cheapest);
* :func:`plan_min_cost`: the cheapest replica set (a price per device type) whose capacity at
  ``utilization`` covers a target rate.

Both take ``survive_loss_of``: device types that can vanish together (preemptible pools, a spot
market: Proteus, EuroSys'17; Tributary, ATC'18). With any one of them lost, the replicas left
must still hold the rate (:func:`plan_max_rate`: the rate it maximizes is the one held through
any such loss) or cover the target at ``surge_utilization`` (:func:`plan_min_cost`), as
:func:`serving.planning.tiers.plan_tiers` plans reliable and transient replicas of one speed.

Traffic to a stage is split over its device types in proportion to capacity
(``x[s,d] * rates[s,d]``), so every replica of the stage runs at the same utilization and
the stage saturates only when all of them do; :func:`sustained_rate` gives the rate a
replica set sustains under any split, e.g. the heterogeneity-agnostic uniform one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: plan_min_cost: the share of measured capacity a plan may use at its target rate
#: (queueing headroom, as InferLine and Nexus keep 0.7-0.8)
DEFAULT_UTILIZATION = 0.8
#: plan_max_rate's second pass keeps the rate within this share of the optimum
RATE_TOLERANCE = 1e-6
#: plan_min_cost with ``survive_loss_of`` (and serving.planning.tiers): the share of the capacity
#: left a plan may use while a lost pool comes back
DEFAULT_SURGE_UTILIZATION = 0.95


@dataclass(frozen=True)
class ThroughputMatrix:
    """Calls/s of one replica of each stage on each device type, and visits per request."""

    stages: tuple[str, ...]
    device_types: tuple[str, ...]
    rates: np.ndarray  # shape (stages, device types), calls per second per replica
    visits: tuple[float, ...]  # calls per app request, per stage

    def __post_init__(self) -> None:
        rates = np.asarray(self.rates, dtype=float)
        object.__setattr__(self, "rates", rates)
        if not self.stages or not self.device_types:
            raise ValueError("ThroughputMatrix needs at least one stage and one device type")
        if len(set(self.stages)) != len(self.stages) or len(set(self.device_types)) != len(self.device_types):
            raise ValueError("ThroughputMatrix: stage and device type names must be unique")
        if rates.shape != (len(self.stages), len(self.device_types)):
            raise ValueError(f"ThroughputMatrix: rates has shape {rates.shape}, expected "
                             f"{(len(self.stages), len(self.device_types))} (stages x device types)")
        if not np.all(np.isfinite(rates)) or np.any(rates < 0):
            raise ValueError("ThroughputMatrix: rates must be finite and >= 0")
        if len(self.visits) != len(self.stages) or any(not np.isfinite(v) or v < 0 for v in self.visits):
            raise ValueError("ThroughputMatrix: visits needs one finite value >= 0 per stage")
        for s, name in enumerate(self.stages):
            if self.visits[s] > 0 and not np.any(rates[s] > 0):
                raise ValueError(f"ThroughputMatrix: stage {name!r} runs on no device type (all rates 0)")

    @classmethod
    def from_dict(cls, rates: Mapping[str, Mapping[str, float]], visits: Mapping[str, float]) -> ThroughputMatrix:
        """``rates[stage][device_type]`` (missing: cannot run there), ``visits[stage]``."""
        stages = tuple(rates)
        device_types = tuple(dict.fromkeys(d for row in rates.values() for d in row))
        missing = [s for s in stages if s not in visits]
        if missing:
            raise ValueError(f"ThroughputMatrix.from_dict: visits missing for stages {missing}")
        grid = np.array([[float(rates[s].get(d, 0.0)) for d in device_types] for s in stages])
        return cls(stages, device_types, grid, tuple(float(visits[s]) for s in stages))

    def to_dict(self) -> dict:
        return {"rates": {s: {d: float(self.rates[i, j]) for j, d in enumerate(self.device_types)}
                          for i, s in enumerate(self.stages)},
                "visits": dict(zip(self.stages, map(float, self.visits), strict=True))}


Replicas = dict[tuple[str, str], int]
Weights = dict[str, dict[str, float]]


@dataclass
class HeteroPlan:
    """Replicas per (stage, device type), the traffic split, and what the LP predicts."""

    replicas: Replicas
    weights: Weights
    predicted_rate: float  # app requests per second the plan sustains (saturation)
    cost: float = 0.0  # sum of price x replicas, per hour if prices are per hour
    objective: str = "max_rate"
    notes: list[str] = field(default_factory=list)
    #: with ``survive_loss_of``: app requests/s the replicas sustain with each of those device types lost
    after_loss: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"replicas": {f"{s}@{d}": n for (s, d), n in sorted(self.replicas.items())},
                "weights": self.weights, "predicted_rate": self.predicted_rate, "cost": self.cost,
                "objective": self.objective, "notes": list(self.notes), "after_loss": dict(self.after_loss)}


def _check_devices(matrix: ThroughputMatrix, devices: Mapping[str, int]) -> np.ndarray:
    unknown = sorted(set(devices) - set(matrix.device_types))
    if unknown:
        raise ValueError(f"devices: device types {unknown} are not in the throughput matrix "
                         f"({list(matrix.device_types)})")
    counts = []
    for d in matrix.device_types:
        n = devices.get(d, 0)
        if isinstance(n, bool) or not float(n).is_integer() or n < 0:
            raise ValueError(f"devices[{d!r}] must be a whole number >= 0, got {n!r}")
        counts.append(int(n))
    return np.array(counts, dtype=float)


def _prices(matrix: ThroughputMatrix, prices: Mapping[str, float] | None) -> np.ndarray:
    if prices is None:
        return np.ones(len(matrix.device_types))
    missing = [d for d in matrix.device_types if d not in prices]
    if missing:
        raise ValueError(f"prices: no price for device types {missing}")
    out = np.array([float(prices[d]) for d in matrix.device_types])
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise ValueError("prices must be finite and >= 0")
    return out


def capacity_weights(matrix: ThroughputMatrix, replicas: Mapping[tuple[str, str], int]) -> Weights:
    """Each stage's traffic split over device types in proportion to capacity x * rate."""
    out: Weights = {}
    for i, s in enumerate(matrix.stages):
        caps = {d: replicas.get((s, d), 0) * matrix.rates[i, j] for j, d in enumerate(matrix.device_types)}
        total = sum(caps.values())
        out[s] = {d: float(c / total) for d, c in caps.items() if c > 0} if total > 0 else {}
    return out


def uniform_weights(matrix: ThroughputMatrix, replicas: Mapping[tuple[str, str], int]) -> Weights:
    """The heterogeneity-agnostic split: every replica of a stage gets the same share."""
    out: Weights = {}
    for s in matrix.stages:
        counts = {d: replicas.get((s, d), 0) for d in matrix.device_types}
        total = sum(counts.values())
        out[s] = {d: float(n / total) for d, n in counts.items() if n > 0} if total > 0 else {}
    return out


def sustained_rate(matrix: ThroughputMatrix, replicas: Mapping[tuple[str, str], int],
                   weights: Weights) -> float:
    """App requests/s at which the first (stage, device type) saturates under ``weights``:
    min over routed pairs of ``x * rate / (visits * weight)``."""
    rate = np.inf
    for i, s in enumerate(matrix.stages):
        if matrix.visits[i] == 0:
            continue
        routed = weights.get(s, {})
        if not routed:
            return 0.0
        for j, d in enumerate(matrix.device_types):
            w = routed.get(d, 0.0)
            if w > 0:
                rate = min(rate, replicas.get((s, d), 0) * matrix.rates[i, j] / (matrix.visits[i] * w))
    return float(rate) if np.isfinite(rate) else 0.0


def _solve(c, a_ub, b_ub, bounds, integrality):
    from scipy.optimize import linprog

    return linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, integrality=integrality, method="highs")


def _capacity_rows(matrix: ThroughputMatrix, n_x: int, extra_cols: int) -> np.ndarray:
    """Device-count rows: sum_s x[s, d] <= devices[d]."""
    S, D = matrix.rates.shape
    rows = np.zeros((D, n_x + extra_cols))
    for j in range(D):
        for i in range(S):
            rows[j, i * D + j] = 1.0
    return rows


def _lost_types(matrix: ThroughputMatrix, survive_loss_of: Sequence[str]) -> list[int]:
    """Columns of the device types that may be lost (ValueError naming unknown ones)."""
    lost = list(dict.fromkeys(survive_loss_of))
    unknown = [d for d in lost if d not in matrix.device_types]
    if unknown:
        raise ValueError(f"survive_loss_of: device types {unknown} are not in the throughput matrix "
                         f"({list(matrix.device_types)})")
    return [matrix.device_types.index(d) for d in lost]


def _loss_rows(matrix: ThroughputMatrix, lost: list[int], n_cols: int, scale: float) -> np.ndarray:
    """Per lost device type q and stage s: ``-scale * sum_{d != q} rates[s, d] x[s, d]`` (the
    capacity left with q gone), one row each."""
    S, D = matrix.rates.shape
    rows = np.zeros((len(lost) * S, n_cols))
    for k, q in enumerate(lost):
        for i in range(S):
            for j in range(D):
                if j != q:
                    rows[k * S + i, i * D + j] = -matrix.rates[i, j] * scale
    return rows


def rate_after_loss(matrix: ThroughputMatrix, replicas: Mapping[tuple[str, str], int],
                    lost: str) -> float:
    """App requests/s the replicas sustain with device type ``lost`` gone (every replica there),
    the traffic split again by capacity over what is left."""
    left = {k: n for k, n in replicas.items() if k[1] != lost}
    return sustained_rate(matrix, left, capacity_weights(matrix, left))


def _x_bounds(matrix: ThroughputMatrix, counts: np.ndarray) -> list[tuple[float, float]]:
    S, D = matrix.rates.shape
    return [(0.0, counts[j] if matrix.rates[i, j] > 0 else 0.0) for i in range(S) for j in range(D)]


def _to_replicas(matrix: ThroughputMatrix, x: np.ndarray) -> Replicas:
    S, D = matrix.rates.shape
    out: Replicas = {}
    for i in range(S):
        for j in range(D):
            n = round(float(x[i * D + j]))
            if n > 0:
                out[(matrix.stages[i], matrix.device_types[j])] = n
    return out


def plan_max_rate(matrix: ThroughputMatrix, devices: Mapping[str, int],
                  prices: Mapping[str, float] | None = None, *,
                  survive_loss_of: Sequence[str] = ()) -> HeteroPlan:
    """Replicas per (stage, device type) maximizing the app rate the whole graph sustains.

    With ``survive_loss_of``, first the rate held with any one of those device types lost, then,
    keeping that, the rate with all of them. Among plans within ``RATE_TOLERANCE`` of the best
    rate, the cheapest (``prices`` per device type; without prices, the fewest replicas), so
    spare devices stay free.
    """
    counts = _check_devices(matrix, devices)
    price = _prices(matrix, prices)
    lost = _lost_types(matrix, survive_loss_of)
    S, D = matrix.rates.shape
    n_x = S * D
    visits = np.asarray(matrix.visits, dtype=float)
    # variables: x (S*D integers), R (continuous); maximize R
    cap_rows = _capacity_rows(matrix, n_x, 1)
    bounds = [*_x_bounds(matrix, counts), (0.0, None)]
    integrality = np.concatenate([np.ones(n_x), [0]])
    c = np.zeros(n_x + 1)
    c[n_x] = -1.0
    after = _loss_rows(matrix, lost, n_x + 1, 1.0)
    after_b = np.zeros(len(lost) * S)
    if lost:  # the rate held through a loss: R against the capacity left, then kept as a floor
        held_rows = after.copy()
        held_rows[:, n_x] = np.tile(visits, len(lost))
        res = _solve(c, np.vstack([cap_rows, held_rows]), np.concatenate([counts, after_b]), bounds, integrality)
        held = float(res.x[n_x]) if res.status == 0 else 0.0
        if held <= 0:
            raise ValueError(f"plan_max_rate: the devices cannot hold one replica of every stage with any one of "
                             f"{list(survive_loss_of)} lost (devices={dict(devices)}, stages={list(matrix.stages)})")
        after_b = np.tile(-held * (1 - RATE_TOLERANCE) * visits, len(lost))
    need = np.zeros((S, n_x + 1))
    for i in range(S):
        need[i, i * D:(i + 1) * D] = -matrix.rates[i]
        need[i, n_x] = matrix.visits[i]
    a_ub = np.vstack([cap_rows, need, after])
    b_ub = np.concatenate([counts, np.zeros(S), after_b])
    res = _solve(c, a_ub, b_ub, bounds, integrality)
    if res.status != 0:
        raise ValueError(f"plan_max_rate: the LP failed ({res.message})")
    best = float(res.x[n_x])
    if best <= 0:
        raise ValueError("plan_max_rate: the devices cannot hold one replica of every stage "
                         f"(devices={dict(devices)}, stages={list(matrix.stages)})")
    # second pass: cheapest plan at (almost) the best rate
    floor = np.zeros((1, n_x + 1))
    floor[0, n_x] = -1.0
    a2 = np.vstack([a_ub, floor])
    b2 = np.concatenate([b_ub, [-best * (1 - RATE_TOLERANCE)]])
    c2 = np.concatenate([np.repeat(price[None, :], S, axis=0).ravel(), [0.0]])
    res2 = _solve(c2, a2, b2, bounds, integrality)
    x = res2.x if res2.status == 0 else res.x
    replicas = _to_replicas(matrix, x)
    weights = capacity_weights(matrix, replicas)
    after = {d: rate_after_loss(matrix, replicas, d) for d in dict.fromkeys(survive_loss_of)}
    return HeteroPlan(replicas, weights, sustained_rate(matrix, replicas, weights),
                      cost=_cost(matrix, replicas, price), objective="max_rate", notes=_loss_notes(after),
                      after_loss=after)


def _loss_notes(after: Mapping[str, float]) -> list[str]:
    return [f"with {d} lost: {rate:g}/s" for d, rate in after.items()]


def _cost(matrix: ThroughputMatrix, replicas: Replicas, price: np.ndarray) -> float:
    index = {d: j for j, d in enumerate(matrix.device_types)}
    return float(sum(n * price[index[d]] for (_, d), n in replicas.items()))


def plan_min_cost(matrix: ThroughputMatrix, devices: Mapping[str, int], prices: Mapping[str, float],
                  target_rate: float, *, utilization: float = DEFAULT_UTILIZATION,
                  survive_loss_of: Sequence[str] = (),
                  surge_utilization: float = DEFAULT_SURGE_UTILIZATION) -> HeteroPlan:
    """The cheapest replicas whose capacity, used at ``utilization``, covers ``target_rate``
    app requests/s, and with ``survive_loss_of`` whose capacity left with any one of those
    device types lost covers it at ``surge_utilization``. Raises ValueError naming the largest
    coverable rate when none does."""
    if not np.isfinite(target_rate) or target_rate <= 0:
        raise ValueError(f"target_rate must be > 0 requests/s, got {target_rate!r}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    if not 0 < surge_utilization <= 1:
        raise ValueError(f"surge_utilization must be in (0, 1], got {surge_utilization!r}")
    counts = _check_devices(matrix, devices)
    price = _prices(matrix, prices)
    lost = _lost_types(matrix, survive_loss_of)
    S, D = matrix.rates.shape
    n_x = S * D
    cap_rows = _capacity_rows(matrix, n_x, 0)
    need = np.zeros((S, n_x))
    for i in range(S):
        need[i, i * D:(i + 1) * D] = -matrix.rates[i] * utilization
    visits = np.asarray(matrix.visits, dtype=float)
    a_ub = np.vstack([cap_rows, need, _loss_rows(matrix, lost, n_x, surge_utilization)])
    b_ub = np.concatenate([counts, -target_rate * visits, np.tile(-target_rate * visits, len(lost))])
    c = np.repeat(price[None, :], S, axis=0).ravel() + 1e-9  # ties: fewer replicas
    res = _solve(c, a_ub, b_ub, _x_bounds(matrix, counts), np.ones(n_x))
    if res.status != 0:
        top = plan_max_rate(matrix, devices, prices).predicted_rate
        if lost:
            held = plan_max_rate(matrix, devices, prices, survive_loss_of=survive_loss_of)
            kept = min(rate_after_loss(matrix, held.replicas, d) for d in survive_loss_of)
            raise ValueError(f"plan_min_cost: target_rate {target_rate:g}/s cannot be covered at utilization "
                             f"{utilization:g} and, with any one of {list(survive_loss_of)} lost, at "
                             f"{surge_utilization:g}; these devices hold at most {kept:g}/s at saturation "
                             f"through such a loss ({top:g}/s with every one)")
        raise ValueError(f"plan_min_cost: target_rate {target_rate:g}/s cannot be covered at utilization "
                         f"{utilization:g}; these devices sustain at most {top * utilization:g}/s there "
                         f"({top:g}/s at saturation)")
    replicas = _to_replicas(matrix, res.x)
    weights = capacity_weights(matrix, replicas)
    survive = ([f"any one of {list(survive_loss_of)} lost: the rest at {surge_utilization:g}"] if lost else [])
    after = {d: rate_after_loss(matrix, replicas, d) for d in dict.fromkeys(survive_loss_of)}
    return HeteroPlan(replicas, weights, sustained_rate(matrix, replicas, weights),
                      cost=_cost(matrix, replicas, price), objective="min_cost",
                      notes=[f"target {target_rate:g}/s at utilization {utilization:g}", *survive, *_loss_notes(after)],
                      after_loss=after)


class WeightedRouter:
    """Smooth weighted round robin (nginx's): over any window each target's share of picks
    stays within one pick of its weight; deterministic, no random draws."""

    def __init__(self, weights: Mapping[str, float]):
        clean = {k: float(w) for k, w in weights.items() if w > 0}
        if not clean:
            raise ValueError(f"WeightedRouter needs at least one positive weight, got {dict(weights)}")
        total = sum(clean.values())
        self.weights = {k: w / total for k, w in clean.items()}
        self._current = dict.fromkeys(self.weights, 0.0)

    def pick(self, exclude: Sequence[str] = ()) -> str:
        candidates = [k for k in self.weights if k not in exclude] or list(self.weights)
        for k in candidates:
            self._current[k] += self.weights[k]
        best = max(candidates, key=lambda k: self._current[k])
        self._current[best] -= sum(self.weights[k] for k in candidates)
        return best


def plan_agnostic(matrix: ThroughputMatrix, devices: Mapping[str, int]) -> HeteroPlan:
    """What a heterogeneity-agnostic planner does with the same devices: it sees one rate
    per stage (the device-count-weighted mean over device types), sizes replicas per stage
    with the same LP over interchangeable devices, places each stage's replicas type-blind
    (spread over device types in proportion to their counts, as a type-blind scheduler does
    on average) and routes uniformly. Its ``predicted_rate`` is what that plan sustains on
    the real (heterogeneous) matrix."""
    counts = _check_devices(matrix, devices)
    total = int(counts.sum())
    usable = matrix.rates > 0
    mean = np.array([(matrix.rates[i] * counts).sum() / max(1.0, (counts * usable[i]).sum())
                     for i in range(len(matrix.stages))])
    flat = ThroughputMatrix(matrix.stages, ("any",), mean[:, None], matrix.visits)
    sizing = plan_max_rate(flat, {"any": total})
    per_stage = {s: n for (s, _), n in sizing.replicas.items()}
    # type-blind placement: the device sequence interleaves types by count, the stage
    # sequence interleaves stages by replica count; slot k of one goes to pick k of the other
    types = WeightedRouter({d: float(c) for d, c in zip(matrix.device_types, counts, strict=True) if c > 0})
    left = {d: int(c) for d, c in zip(matrix.device_types, counts, strict=True)}
    stages = WeightedRouter({s: float(n) for s, n in per_stage.items()})
    replicas: Replicas = {}
    for _ in range(sum(per_stage.values())):
        stage = stages.pick()
        i = matrix.stages.index(stage)
        banned = [d for d in left if left[d] == 0 or matrix.rates[i, matrix.device_types.index(d)] <= 0]
        if len(banned) == len(left):
            continue
        device = types.pick(exclude=banned)
        left[device] -= 1
        replicas[(stage, device)] = replicas.get((stage, device), 0) + 1
    weights = uniform_weights(matrix, replicas)
    return HeteroPlan(replicas, weights, sustained_rate(matrix, replicas, weights), objective="agnostic",
                      notes=[f"sized on mean rates {dict(zip(matrix.stages, mean.round(3).tolist(), strict=True))}"])
