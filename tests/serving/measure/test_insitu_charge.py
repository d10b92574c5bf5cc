"""The in-situ probe charges a module chain's processes to the stage that calls the chain."""

from __future__ import annotations

import pytest

from serving.measure.insitu import charged, cpu_factors


def test_chain_processes_count_in_the_calling_stage():
    measured = {"ingress": 9.0, "expensive": 12.0, "deep-part0": 10.0, "deep-part1": 21.0, "front": 0.6,
                "total": 52.6}
    got = charged(measured, {"deep-part0": "expensive", "deep-part1": "expensive"})
    assert got == {"ingress": 9.0, "expensive": 43.0, "front": 0.6, "total": 52.6}
    assert measured["expensive"] == 12.0  # the probe's own figures stay as read
    factors = cpu_factors(got, {"ingress": 5.0, "expensive": 22.0, "front": 0.1})
    assert factors["expensive"] == pytest.approx(43.0 / 22.0)  # not 12 / 22: the chain did its module work


def test_roles_not_seen_and_no_chains_change_nothing():
    measured = {"ingress": 9.0, "expensive": 12.0}
    assert charged(measured, {}) == measured
    assert charged(measured, {"deep-part0": "expensive"}) == measured
