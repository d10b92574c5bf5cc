"""A ladder of certified plans ("gears"): cheaper plans at looser max_loss, all certified at once.

Serving under load may trade accuracy for work (CascadeServe switches "gears" as queues grow).
Each gear is a plan chosen on the selection split for its own ``max_loss``. Certification tests
every gear's thresholds in one fixed sequence, fixed before any certification label is seen:
the tightest gear's thresholds from the most conservative down to the last one whose selection
bound keeps a margin below its max_loss (``GEAR_MARGIN``), then the next gear's, and so on; the
last gear continues down its grid. Testing stops at the first
bound above its gear's ``max_loss``. Because it is one fixed sequence, the chance that *any*
certified gear's true loss exceeds its own ``max_loss`` is at most ``1 - confidence``: the
certificates hold jointly, and the tightest gear loses no confidence to the others. It does lose
speed: stopping at ``GEAR_MARGIN`` of its max_loss, the plan asked for with gears answers fewer
rows at its cheap level than the same plan certified alone (in a review's run on synthetic rows,
max_loss 0.005: 76% of rows with gears (0.015, 0.04), 96% without).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._planner import Evaluator, Sweep, certification_grid, thin

#: a gear that is not the last stops its part of the sequence at the most aggressive threshold
#: whose selection-split bound (projected to the certification rows) is within this share of its
#: max_loss: a failure there would end the sequence for every looser gear, so it stops well short
#: of the edge selection found (0.8 let a projected-edge failure end a ladder in the tests)
GEAR_MARGIN = 0.6


@dataclass
class GearResult:
    """One gear after certification: its plan on the selection split, the sweeps tested on the
    certification split, and the one certified (None: not certified)."""

    max_loss: float
    chosen: Sweep | None
    tested: list[Sweep] = field(default_factory=list)
    accepted: Sweep | None = None


def certify_ladder(selector: Evaluator, certifier: Evaluator, gears: Sequence[tuple[float, Sweep | None]],
                   probas_select, probas_cert, grids) -> list[GearResult]:
    """Certify the gears (tightest first) in one fixed sequence; see the module docstring."""
    results = [GearResult(m, chosen) for m, chosen in gears]
    previous: Sweep | None = None
    for index, gear in enumerate(results):
        if gear.chosen is None:
            break  # a gear with no plan ends the sequence: later gears stay uncertified
        chain = gear.chosen.chain
        sequence = certification_grid(selector, chain, probas_select, grids[chain], gear.max_loss)
        if previous is not None and previous.chain == chain:  # only thresholds past the last gear's
            sequence = [t for t in sequence if t < previous.threshold]
        last = index == len(results) - 1
        if not last:
            safe = [i for i, t in enumerate(sequence)
                    if selector.evaluate(chain, probas_select, t).bound.within(GEAR_MARGIN * gear.max_loss)]
            sequence = sequence[: (safe[-1] if safe else 0) + 1]
        if certifier.costly:
            sequence = thin(sequence, gear.chosen.threshold)
        for threshold in sequence:
            sweep = certifier.evaluate(chain, probas_cert, threshold)
            gear.tested.append(sweep)
            if not sweep.bound.within(gear.max_loss):
                return results  # the first failure ends the whole sequence
            gear.accepted = sweep
        if gear.accepted is None:
            break
        previous = gear.accepted
    return results
