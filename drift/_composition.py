"""Whether a segment's shift is only a change of its mix, not of the column.

Why: when dest=DEN grows from 2% to 20% of traffic, every segment that flies to Denver
(carrier=UA, WN, B6) sees its distances and departure times move, because more of its rows are
Denver's. Inside no (carrier, dest) cell did the column change; the carrier's mix of
destinations did. Ranked by how localized it is, carrier=UA's distance shift (nothing outside
UA moved) outranked the real cause, DEN's departures five hours later, in 3 of 8 replays of
the demo's incident.

The test is the composition effect of a reweighting decomposition (DiNardo, Fortin & Lemieux
1996; Oaxaca-Blinder's "explained" part): reweight the reference rows inside the segment so
that another attribute B has the window's mix there, and measure the column's effect again.
Reweighting only mixes reference rows, so a shift to values the reference never held (DEN's
+5 h) survives any reweighting, while one made of more rows of a kind the reference already
had (more DEN rows inside UA) disappears. Only attributes whose own mix inside the segment
passed the categorical gate are tried: reweighting by a stable, sparse attribute (200 clients
with a few rows each) would only add noise to the effect.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drift._column_tests import SortedSample, weighted_categorical_test
from drift._rules import EffectGate
from drift._sample import Sample


def mix_weights(cur_codes: np.ndarray, w_cur: np.ndarray, ref_codes: np.ndarray,
                w_ref: np.ndarray) -> np.ndarray:
    """Reference row weights that give `ref_codes` the current side's mix (each value's
    share of current weight over its share of reference weight; values the window does not
    hold get weight 0, values the reference lacks cannot be matched and stay unmatched)."""
    size = int(max(cur_codes.max(initial=-1), ref_codes.max(initial=-1))) + 1
    cur = np.bincount(cur_codes, weights=w_cur, minlength=size)
    ref = np.bincount(ref_codes, weights=w_ref, minlength=size)
    both = (cur > 0) & (ref > 0)
    factor = np.zeros(size)
    if both.any():
        cur_share = cur / cur[both].sum()
        ref_share = ref / ref[both].sum()
        factor[both] = cur_share[both] / ref_share[both]
    return w_ref * factor[ref_codes]


def mix_reweightings(
    segment_attributes: set[int],
    attributes: list[tuple[str, int]],
    cur: Sample,
    base: Sample,
    in_cur: np.ndarray,
    in_ref: np.ndarray,
    gate: EffectGate,
    design_effect: Any,
) -> list[tuple[str, np.ndarray]]:
    """The attributes whose own mix inside the segment changed (passed the categorical gate),
    each with the reference row weights that give it the window's mix there: the same for every
    column tested inside the segment, so computed once per segment.

    `design_effect(attribute index)` gives the two sides' design effects of an attribute's mix
    inside the segment (rows in requests), (1, 1) for independent rows."""
    out = []
    for name, b in attributes:
        if b in segment_attributes:
            continue
        codes_c, codes_r = cur.cat[b][in_cur], base.cat[b][in_ref]
        w_c, w_r = cur.weight[in_cur], base.weight[in_ref]
        mix = weighted_categorical_test(codes_c, w_c, codes_r, w_r, design_effect(b))
        if not gate.passes({**mix, "p_adjusted": mix.get("p_value")}, "categorical"):
            continue  # the attribute's mix inside the segment did not change
        ref_weight = np.zeros(base.weight.size)
        ref_weight[in_ref] = mix_weights(codes_c, w_c, codes_r, w_r)
        out.append((name, ref_weight))
    return out


def explained_by_mix(
    kind: str,
    column: int,
    reweightings: list[tuple[str, np.ndarray]],
    cur: Sample,
    base: Sample,
    in_cur: np.ndarray,
    in_ref: np.ndarray,
    gate: EffectGate,
    sorted_sample: SortedSample | None,
) -> str | None:
    """The attribute whose change of mix inside the segment accounts for its shift of
    `column` (:func:`mix_reweightings`; against the reweighted reference its effect falls under
    the gate's threshold: an effect, not a test, since reweighting to a few heavy reference rows
    costs a test its power and a shift that merely became insignificant is not thereby
    explained; a share of the effect would explain away a real shift that comes with a change of
    mix), or None when no attribute does."""
    for name, ref_weight in reweightings:
        if kind == "numeric":
            assert sorted_sample is not None
            test = sorted_sample.compare_reweighted(in_cur, ref_weight)
        else:
            test = weighted_categorical_test(cur.cat[column][in_cur], cur.weight[in_cur],
                                             base.cat[column][in_ref], ref_weight[in_ref])
        effect = test.get("effect")
        if effect is not None and effect < gate.threshold(kind):
            return name
    return None
