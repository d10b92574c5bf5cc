"""The live guarantee's verdicts as Prometheus metrics: one gauge family per verdict and one
counter family per count, labelled by gear (drift.GuaranteeLedger; registered beside the
monitor's own collector)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from drift._guarantee import GuaranteeLedger

#: gauges per gear: the verdict's field and what it says
GAUGES = {"alarm": "1 when the served disagreement rate is above what certification saw",
          "alarm_rang": "1 once the alarm has rung under this certificate (later rows may dilute it)",
          "loss_upper": "label-free anytime-valid upper bound on the served loss",
          "disagreement_rate": "served rows whose answer differs from the full pipeline's (point)",
          "disagreement_lower": "anytime-valid lower bound of that rate",
          "alarm_reference": "the rate the alarm compares with",
          "max_loss": "the gear's certified max_loss"}
#: ... with holds
HELD_GAUGE = "1 while the alarm holds the gear (the app serves a more conservative one)"
#: counters per gear: (metric name, the verdict's field, what it counts)
COUNTERS = (("audited_rows", "audited_rows", "cheap-level rows audited"),
            ("shed_audits", "shed_audits", "sampled rows whose audit was shed"),
            ("degraded_rows", "degraded_rows", "rows served degraded (a later stage late): outside every certificate"))


def guarantee_families(ledger: GuaranteeLedger, prefix: str = "drift") -> Iterator[Any]:
    """``{prefix}_guarantee_<gauge>`` per gear (and ``_held`` with holds), then the counters."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    verdicts = [ledger.verdict(g) for g in range(len(ledger.gears))]
    gauges = {**GAUGES, **({"held": HELD_GAUGE} if ledger.hold else {})}
    for name, text in gauges.items():
        family = GaugeMetricFamily(f"{prefix}_guarantee_{name}", text, labels=["gear"])
        for v in verdicts:
            value = v[name]
            family.add_metric([str(v["gear"])], math.nan if value is None else float(value))
        yield family
    for name, key, text in COUNTERS:
        family = CounterMetricFamily(f"{prefix}_guarantee_{name}", text, labels=["gear"])
        for v in verdicts:
            family.add_metric([str(v["gear"])], float(v[key]))
        yield family


class GuaranteeCollector:
    """A prometheus_client collector of one ledger (register it beside MonitorCollector)."""

    def __init__(self, ledger: GuaranteeLedger, prefix: str = "drift") -> None:
        self.ledger, self.prefix = ledger, prefix

    def collect(self) -> Iterator[Any]:
        yield from guarantee_families(self.ledger, self.prefix)
