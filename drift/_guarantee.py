"""The live guarantee: what a served cascade's audit says about its certified loss.

A share of the rows the cheap level answers is also run through the full pipeline (the
*audit*). For every row the answer it got and the full pipeline's answer either agree or not;
rows answered by a later level agree by construction. The rate ``d`` at which served answers
differ from the full pipeline's bounds the loss of any per-row 0/1 metric from above
(accuracy, error rate: a row can lose the metric only where the answers differ), with no label.

Per gear (each certified plan serves under its own certificate) the ledger keeps counts only:
rows served, rows the cheap level answered, cheap rows audited, and how many of those disagreed.
Then ``d = share * d_cheap``, ``share`` the served rows' cheap share (counted on every row: its
sampling error is negligible beside the audit's, and it is the share of the traffic the
guarantee is about) and ``d_cheap`` the disagreement rate among cheap rows, bounded by an
anytime-valid confidence sequence (:mod:`drift._confseq`). An audit shed under load removes a
cheap row from the audit, never from ``share``; shedding comes with load, and load may come with
harder rows, so a shed audit counts as a disagreement in the upper bound and as an agreement in
the alarm's lower one (both stay valid however rows are shed; heavy shedding widens them). A held
gear's decisions the full pipeline answered (every one audited) count for its release test only:
they were not served, and a census pooled with a sample would outweigh the rest.

Two verdicts per gear, both valid at every moment at once:

* ``loss_upper`` = share x upper(d_cheap): a label-free upper bound on the served loss, for
  per-row metrics (``None`` for the others, whose loss a disagreement rate does not bound).
  ``supported`` says whether it is at most the gear's ``max_loss``; early on, with few audits,
  it is not yet, which is no alarm.
* ``alarm``: the served disagreement rate is, with confidence, above what certification saw:
  share x lower(d_cheap) exceeds the upper Clopper-Pearson bound of the certification rows'
  disagreement rate (or ``max_loss`` where the artifact did not record them). The certificate
  is a statement about rows like the certification rows; this says the served rows no longer
  are, in the one respect the certificate rests on.

With ``hold=True`` an alarm also *holds* its gear: the app stops serving it (and every cheaper
gear) and serves a more conservative one, or the full pipeline when gear 0 is held. A held gear
goes on being audited where its answers can still be computed (while the full pipeline serves,
gear 0's cheap level runs on every row and every row it would have answered is compared with the
full pipeline's answer, which the row pays for anyway); the hold is released once the rows
audited since it began show, at the live level, a served disagreement rate at most the alarm's
reference (an anytime-valid upper bound under it). The alarm then tests only the epochs since the
release: a release starts a new epoch, and the runs it tests are a subset of those the union
bound already pays for, so releases spend no extra error budget.

Error budget: ``1 - confidence`` split evenly over the gears (Bonferroni), and within a gear
half to the certification bound and half to the live sequence, so the chance of any false alarm,
over unlimited time, is at most ``1 - confidence``. Segments (attribute=value) get the same
bounds at the same level, reported for reading; only the gear-level verdict raises the alarm
(a segment may rightly disagree more than the average, and hundreds of segments would spend the
error budget on noise).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from drift._batch_ids import RecentBatchIds, check_batch_id
from drift._confseq import (
    DEFAULT_HORIZON,
    broad_prior,
    lower_bound,
    rejects_at_most,
    tuned_prior,
    upper_bound,
)

#: the certificates' confidence, and so the live verdicts' (1 - the chance of any false alarm)
DEFAULT_CONFIDENCE = 0.95
#: rise of the disagreement rate over the certified one the alarm's prior is centred on: the
#: sequence is tightest for a doubling, valid for any rise
DEFAULT_RISE = 2.0
#: values of one attribute followed as segments; rarer ones are counted under ``OTHER``
DEFAULT_MAX_SEGMENTS = 50
#: audited rows per epoch: the alarm also tests every run of recent epochs (see ``verdict``), so a
#: rise late in a long quiet life is judged on the rows since it, not diluted by all before
DEFAULT_EPOCH_ROWS = 2000
#: the segment value rare values are pooled under
OTHER = "(other)"


@dataclass
class AuditCounts:
    """Counts of one gear or segment: served rows, cheap-level rows, audited cheap rows, their
    disagreements, and audits shed under load."""

    served: int = 0
    cheap: int = 0
    audited: int = 0
    disagreed: int = 0
    shed: int = 0
    #: rows served degraded (an earlier level's answer, a later stage late or overloaded): outside
    #: every certificate and every other count here
    degraded: int = 0

    def add(self, other: AuditCounts) -> None:
        self.served += other.served
        self.cheap += other.cheap
        self.audited += other.audited
        self.disagreed += other.disagreed
        self.shed += other.shed
        self.degraded += other.degraded


@dataclass
class GearTerms:
    """What certification says of one gear: its max_loss and the certification rows' count and
    class disagreements under its plan (``None`` where the artifact did not record them)."""

    gear: int
    max_loss: float | None
    cert_rows: int | None = None
    cert_disagreed: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GearTerms:
        return cls(int(d.get("gear", 0)), _opt_float(d.get("max_loss")), _opt_int(d.get("cert_rows")),
                   _opt_int(d.get("cert_disagreed")))


@dataclass
class GuaranteeLedger:
    """Live audit counts per gear and segment and their anytime-valid verdicts (module docstring).

    ``gears``: one :class:`GearTerms` (or dict) per certified gear, in gear order.
    ``rowwise``: whether the certified metric is a per-row 0/1 metric (then the disagreement
    rate bounds its loss). ``segments``: the attributes whose values are followed."""

    gears: list[GearTerms]
    rowwise: bool = True
    confidence: float = DEFAULT_CONFIDENCE
    rise: float = DEFAULT_RISE
    horizon: int = DEFAULT_HORIZON
    segments: list[str] = field(default_factory=list)
    max_segments: int = DEFAULT_MAX_SEGMENTS
    epoch_rows: int = DEFAULT_EPOCH_ROWS
    counts: dict[int, AuditCounts] = field(default_factory=dict)
    #: per gear, the counts of each epoch of about ``epoch_rows`` audited rows, oldest first
    epochs: dict[int, list[AuditCounts]] = field(default_factory=dict)
    by_segment: dict[int, dict[str, dict[str, AuditCounts]]] = field(default_factory=dict)
    #: reference_rate per gear (a function of the gear's terms and the confidence only)
    _references: dict[int, tuple[float | None, str]] = field(default_factory=dict, repr=False, compare=False)
    #: whether an alarm holds its gear until the release test passes (module docstring)
    hold: bool = False
    #: per held gear, the counts audited since its hold began (the release test's rows)
    held: dict[int, AuditCounts] = field(default_factory=dict)
    #: per gear, how many times it was held
    holds: dict[int, int] = field(default_factory=dict)
    #: per gear, the epoch its alarm's runs start from (0; after a release, the epoch it began)
    alarm_from: dict[int, int] = field(default_factory=dict)
    #: per gear, the audited rows counted when its alarm first rang under this certificate: kept
    #: when later rows dilute the alarm away (``alarm`` is the verdict now; this, that it rang)
    alarmed_at: dict[int, int] = field(default_factory=dict)
    #: the ids of the last count batches added (:meth:`add_batch`), saved with the counts they
    #: brought: a batch sent again after its answer was lost is added once
    batch_ids: RecentBatchIds = field(default_factory=RecentBatchIds, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.gears = [g if isinstance(g, GearTerms) else GearTerms.from_dict(g) for g in self.gears]
        if not self.gears:
            raise ValueError("gears must name at least one certified gear")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not self.rise > 1.0:
            raise ValueError(f"rise must be above 1, got {self.rise!r}")
        if self.horizon < 4:
            raise ValueError(f"horizon must be at least 4 audited rows, got {self.horizon!r}")
        if self.epoch_rows < 1:
            raise ValueError(f"epoch_rows must be at least 1, got {self.epoch_rows!r}")
        self.segments = list(self.segments)

    # ------------------------------------------------------------------ counting
    def add_batch(self, entries: Sequence[Mapping[str, Any]], batch_id: str | None = None) -> bool:
        """Count the entries of one send (each a gear's, optionally a segment's, counts:
        ``gear, served, cheap, audited, disagreed[, shed][, segment]``), the holds decided once
        after the last. ``batch_id``: the sender's id for the send; a send whose id was added
        already is skipped whole (the sender did not hear the first answer and sent it again),
        and False is returned."""
        batch_id = check_batch_id(batch_id)
        if batch_id is not None and batch_id in self.batch_ids:
            return False
        for e in entries:
            self.add(int(e["gear"]), e["served"], e["cheap"], e["audited"], e["disagreed"], e.get("shed", 0),
                     segment=e.get("segment"), decide=False, shadow=bool(e.get("shadow", False)),
                     degraded=e.get("degraded", 0))
        gears = sorted({int(e["gear"]) for e in entries})
        if self.hold:
            self.decide_holds(gears)
        else:
            self.note_alarms(gears)
        if batch_id is not None:
            self.batch_ids.add(batch_id)
        return True

    def add(self, gear: int, served: int, cheap: int, audited: int, disagreed: int, shed: int = 0,
            segment: Mapping[str, Any] | None = None, *, decide: bool = True, shadow: bool = False,
            degraded: int = 0) -> None:
        """Count one batch of one gear (optionally of one segment: attribute -> value). With
        ``hold``, the gear's hold is then decided (:meth:`decide_holds`) unless ``decide`` is
        False: a caller adding many entries at once decides once, after the last. ``shadow``:
        the decisions of a held gear that the full pipeline answered instead, every one audited;
        they were not served, and a census of one stretch pooled with a 1% sample of the others
        would outweigh them, so they count for the release test only."""
        self._check_gear(gear)
        batch = AuditCounts(int(served), int(cheap), int(audited), int(disagreed), int(shed), int(degraded))
        if min(batch.served, batch.cheap, batch.audited, batch.disagreed, batch.shed, batch.degraded) < 0:
            raise ValueError(f"counts must be non-negative, got {batch}")
        if batch.disagreed > batch.audited or batch.cheap > batch.served:
            raise ValueError(f"need disagreed <= audited and cheap <= served, got {batch}")
        if shadow:
            if gear in self.held:
                self.held[gear].add(batch)
            if self.hold and decide:
                self.decide_holds([gear])
            return
        self.counts.setdefault(gear, AuditCounts()).add(batch)
        epochs = self.epochs.setdefault(gear, [])
        if not epochs or epochs[-1].audited >= self.epoch_rows:  # a boundary set by counts (or a release)
            epochs.append(AuditCounts())
        epochs[-1].add(batch)
        for attribute, value in (segment or {}).items():
            if attribute in self.segments:
                self._add_segment(gear, attribute, _segment_value(value), batch)
        if gear in self.held:  # the release test's rows
            self.held[gear].add(batch)
        if self.hold and decide:
            self.decide_holds([gear])

    def note_alarms(self, gears: Sequence[int] | None = None) -> None:
        """Record the first time each of ``gears`` (default: all) alarms (:attr:`alarmed_at`);
        :meth:`add_batch` does after each send, a hold does as it begins."""
        for gear in range(len(self.gears)) if gears is None else gears:
            if gear not in self.alarmed_at and self._alarm(gear, self.reference_rate(gear)[0],
                                                           self._live_alpha(gear))[0]:
                self.alarmed_at[gear] = self.counts.get(gear, AuditCounts()).audited

    def decide_holds(self, gears: Sequence[int] | None = None) -> list[int]:
        """Hold each of ``gears`` (default: all) whose alarm rings; release a held one whose rows
        since the hold pass the release test, and start its alarm's runs again from a new epoch.
        Returns the gears held now."""
        for gear in range(len(self.gears)) if gears is None else gears:
            self._decide_hold(gear)
        return sorted(self.held)

    def _decide_hold(self, gear: int) -> None:
        if gear in self.held:
            upper = self.release_upper(gear)
            if upper is not None and upper <= self.reference_rate(gear)[0]:
                del self.held[gear]
                self.epochs[gear].append(AuditCounts())
                self.alarm_from[gear] = len(self.epochs[gear]) - 1
        elif self._alarm(gear, self.reference_rate(gear)[0], self._live_alpha(gear))[0]:
            self.held[gear] = AuditCounts()
            self.holds[gear] = self.holds.get(gear, 0) + 1
            self.alarmed_at.setdefault(gear, self.counts.get(gear, AuditCounts()).audited)

    def release_upper(self, gear: int) -> float | None:
        """A held gear's anytime-valid upper bound on its served disagreement rate over the rows
        audited since the hold began (None: not held, or nothing audited yet). The hold lifts
        once it is at most the alarm's reference."""
        c = self.held.get(gear)
        reference = self.reference_rate(gear)[0]
        if c is None or not c.audited or not c.served or reference is None:
            return None
        share = c.cheap / c.served
        return share * upper_bound(c.audited + c.shed, c.disagreed + c.shed, self._live_alpha(gear),
                                   broad_prior(_clip(reference / max(share, 1e-9))))

    def add_rows(self, gear: np.ndarray, cheap: np.ndarray, audited: np.ndarray, disagreed: np.ndarray,
                 shed: np.ndarray | None = None, attributes: Mapping[str, Sequence[Any]] | None = None) -> None:
        """Count rows: per row its gear, whether the cheap level answered it, whether it was
        audited, whether the audit disagreed, whether its audit was shed; ``attributes`` the
        segment values per row."""
        gear = np.asarray(gear, dtype=np.int64)
        cols = [np.asarray(c, dtype=bool) for c in (cheap, audited, disagreed,
                                                      np.zeros(len(gear), bool) if shed is None else shed)]
        if any(len(c) != len(gear) for c in cols):
            raise ValueError("gear, cheap, audited, disagreed and shed must have one value per row")
        cheap, audited, disagreed, shed = cols
        if np.any(audited & ~cheap) or np.any(disagreed & ~audited):
            raise ValueError("only cheap rows are audited, and only audited rows disagree")
        attrs = {a: list(v) for a, v in (attributes or {}).items() if a in self.segments}
        for a, v in attrs.items():
            if len(v) != len(gear):
                raise ValueError(f"attribute {a!r} must have one value per row")
        for g in np.unique(gear):  # every gear checked before any is counted
            self._check_gear(int(g))
        for g in np.unique(gear):
            m = gear == g
            self.add(int(g), int(m.sum()), int(cheap[m].sum()), int(audited[m].sum()), int(disagreed[m].sum()),
                     int(shed[m].sum()))
            for a, values in attrs.items():
                column = np.asarray([_segment_value(x) for x in values], dtype=object)[m]
                for value in dict.fromkeys(column.tolist()):
                    s = m.copy()
                    s[m] = column == value
                    self._add_segment(int(g), a, value, AuditCounts(int(s.sum()), int(cheap[s].sum()),
                                                                    int(audited[s].sum()), int(disagreed[s].sum()),
                                                                    int(shed[s].sum())))

    def _add_segment(self, gear: int, attribute: str, value: str, batch: AuditCounts) -> None:
        values = self.by_segment.setdefault(gear, {}).setdefault(attribute, {})
        if value not in values and len(values) >= self.max_segments:
            value = OTHER
        values.setdefault(value, AuditCounts()).add(batch)

    def _check_gear(self, gear: int) -> None:
        if not 0 <= gear < len(self.gears):
            raise ValueError(f"gear must be in [0, {len(self.gears) - 1}], got {gear!r}")

    # ------------------------------------------------------------------ verdicts
    @property
    def alpha_gear(self) -> float:
        """Error budget of one gear's verdicts (Bonferroni over the gears)."""
        return (1.0 - self.confidence) / len(self.gears)

    def reference_rate(self, gear: int) -> tuple[float | None, str]:
        """The rate the alarm compares with, and where it comes from: the upper Clopper-Pearson
        bound of the certification rows' disagreement rate, else the gear's max_loss."""
        if gear not in self._references:
            self._references[gear] = self._reference_rate(gear)
        return self._references[gear]

    def _reference_rate(self, gear: int) -> tuple[float | None, str]:
        terms = self.gears[gear]
        if terms.cert_rows:
            k, n = int(terms.cert_disagreed or 0), int(terms.cert_rows)
            upper = 1.0 if k >= n else float(stats.beta.ppf(1.0 - self.alpha_gear / 2.0, k + 1, n - k))
            return upper, "certification"
        if terms.max_loss is not None:
            return terms.max_loss, "max_loss"
        return None, "none"

    def verdict(self, gear: int, counts: AuditCounts | None = None) -> dict[str, Any]:
        """One gear's (or, with ``counts``, one segment's) figures and verdicts."""
        self._check_gear(gear)
        c = counts if counts is not None else self.counts.get(gear, AuditCounts())
        terms = self.gears[gear]
        reference, _ = self.reference_rate(gear)
        live_alpha = self._live_alpha(gear)
        share = c.cheap / c.served if c.served else 0.0
        d_cheap = c.disagreed / c.audited if c.audited else None
        centre = _clip((reference or terms.max_loss or 0.01) / max(share, 1e-9))
        # a shed audit's row was sampled like the others but never compared: the upper bound
        # counts it as a disagreement, the lower as an agreement, so that shedding (which comes
        # with load, and load may come with harder rows) can only widen the interval
        upper_cheap = upper_bound(c.audited + c.shed, c.disagreed + c.shed, live_alpha, broad_prior(centre))
        lower_cheap = lower_bound(c.audited + c.shed, c.disagreed, live_alpha,
                                  tuned_prior(_clip(self.rise * centre), self.horizon))
        loss_upper = share * upper_cheap if self.rowwise and c.served else None
        if counts is None:
            alarm, alarm_rows = self._alarm(gear, reference, live_alpha)
        else:  # a segment: read, never alarmed on (module docstring)
            alarm, alarm_rows = bool(reference is not None and c.audited + c.shed and share * lower_cheap > reference), None
        return {
            "gear": gear, "max_loss": terms.max_loss, "served_rows": c.served, "cheap_rows": c.cheap,
            "cheap_share": share, "audited_rows": c.audited, "disagreed_rows": c.disagreed,
            "shed_audits": c.shed, "degraded_rows": c.degraded,
            "disagreement_rate": None if d_cheap is None else share * d_cheap,
            "disagreement_lower": share * lower_cheap, "disagreement_upper": share * upper_cheap,
            "loss_upper": loss_upper,
            "supported": None if loss_upper is None or terms.max_loss is None else loss_upper <= terms.max_loss,
            "certified_rate": None if not terms.cert_rows else (terms.cert_disagreed or 0) / terms.cert_rows,
            "alarm_reference": reference, "alarm_reference_source": self.reference_rate(gear)[1], "alarm": alarm,
            "alarm_audited_rows": alarm_rows,
            **({"alarm_rang": gear in self.alarmed_at or alarm,
                "alarm_rang_at_audited_rows": self.alarmed_at.get(gear, c.audited if alarm else None)}
               if counts is None else {}),
            **({"held": gear in self.held, "holds": self.holds.get(gear, 0),
                "release_upper": self.release_upper(gear)} if counts is None and self.hold else {}),
        }

    def _live_alpha(self, gear: int) -> float:
        """The live sequence's share of the gear's budget (half when certification's bound takes the other)."""
        return self.alpha_gear / 2.0 if self.reference_rate(gear)[1] == "certification" else self.alpha_gear

    def _alarm(self, gear: int, reference: float | None, alpha: float) -> tuple[bool, int | None]:
        """Whether the served disagreement rate of the audited rows since the start of some epoch
        is, at level ``alpha``, above ``reference``; and over how many audited rows it was found.

        The runs of epochs ending now are tested from the newest start back to the oldest (the
        whole history); the run that starts at epoch j (0 the first) spends ``alpha * 6 / (pi**2 *
        (j + 1)**2)``, so the budgets sum to ``alpha`` over unlimited time (a union bound over
        start times fixed by audited-row counts). A rise after a long quiet stretch is then tested
        on the rows since it at a slightly higher threshold, where the whole history would dilute it."""
        if reference is None:
            return False, None
        suffix = AuditCounts()
        epochs = self.epochs.get(gear, [])
        for j in range(len(epochs) - 1, self.alarm_from.get(gear, 0) - 1, -1):  # since the last release
            suffix.add(epochs[j])
            if not suffix.audited or not suffix.cheap:
                continue
            share = suffix.cheap / suffix.served
            rate = reference / share
            budget = alpha * 6.0 / (math.pi ** 2 * (j + 1) ** 2)
            prior = tuned_prior(_clip(self.rise * rate), self.horizon)
            # shed audits as agreements (see verdict): shedding never raises the alarm
            if rate < 1.0 and rejects_at_most(suffix.audited + suffix.shed, suffix.disagreed, rate, budget, prior):
                return True, suffix.audited
        return False, None

    def report(self, segment: str | None = None) -> dict[str, Any]:
        """Every gear's verdict; with ``segment`` (an attribute), one per value of it too."""
        if segment is not None and segment not in self.segments:
            raise ValueError(f"segment must be one of the followed attributes {self.segments}, got {segment!r}")
        gears = []
        for g in range(len(self.gears)):
            entry = self.verdict(g)
            if segment is not None:
                values = self.by_segment.get(g, {}).get(segment, {})
                entry["segments"] = [{"attribute": segment, "value": v, **_segment_fields(self.verdict(g, c))}
                                     for v, c in sorted(values.items(), key=lambda kv: -kv[1].served)]
            gears.append(entry)
        return {"kind": "guarantee", "confidence": self.confidence, "rowwise": self.rowwise,
                "alarm": any(e["alarm"] for e in gears), "gears": gears,
                "segments_followed": list(self.segments),
                **({"held": sorted(self.held)} if self.hold else {})}

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """The ledger as plain JSON-able values (counts only: the verdicts follow from them)."""
        return {
            "gears": [vars(g).copy() for g in self.gears], "rowwise": self.rowwise, "confidence": self.confidence,
            "rise": self.rise, "horizon": self.horizon, "segments": self.segments, "max_segments": self.max_segments,
            "epoch_rows": self.epoch_rows,
            "counts": {str(g): vars(c).copy() for g, c in self.counts.items()},
            "epochs": {str(g): [vars(c).copy() for c in e] for g, e in self.epochs.items()},
            "by_segment": {str(g): {a: {v: vars(c).copy() for v, c in vals.items()} for a, vals in attrs.items()}
                           for g, attrs in self.by_segment.items()},
            "hold": self.hold, "held": {str(g): vars(c).copy() for g, c in self.held.items()},
            "holds": {str(g): n for g, n in self.holds.items()},
            "alarm_from": {str(g): j for g, j in self.alarm_from.items()},
            "alarmed_at": {str(g): n for g, n in self.alarmed_at.items()},
            "batch_ids": self.batch_ids.to_json(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> GuaranteeLedger:
        ledger = cls([GearTerms.from_dict(g) for g in state["gears"]], rowwise=bool(state["rowwise"]),
                     confidence=float(state["confidence"]), rise=float(state["rise"]), horizon=int(state["horizon"]),
                     segments=list(state["segments"]), max_segments=int(state["max_segments"]),
                     epoch_rows=int(state.get("epoch_rows", DEFAULT_EPOCH_ROWS)))
        ledger.counts = {int(g): AuditCounts(**c) for g, c in state["counts"].items()}
        ledger.epochs = {int(g): [AuditCounts(**c) for c in e] for g, e in state.get("epochs", {}).items()}
        ledger.by_segment = {int(g): {a: {v: AuditCounts(**c) for v, c in vals.items()} for a, vals in attrs.items()}
                             for g, attrs in state["by_segment"].items()}
        ledger.hold = bool(state.get("hold", False))
        ledger.held = {int(g): AuditCounts(**c) for g, c in state.get("held", {}).items()}
        ledger.holds = {int(g): int(n) for g, n in state.get("holds", {}).items()}
        ledger.alarm_from = {int(g): int(j) for g, j in state.get("alarm_from", {}).items()}
        ledger.alarmed_at = {int(g): int(n) for g, n in state.get("alarmed_at", {}).items()}
        ledger.batch_ids = RecentBatchIds(ids=state.get("batch_ids", ()))
        return ledger

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`state` to ``path`` atomically (a crash leaves the old file or the new)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.state(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def open(cls, path: str | os.PathLike | None, **terms: Any) -> GuaranteeLedger:
        """The ledger saved at ``path`` when there is one for the same gears, else a new one
        from ``terms`` (the counts of a different certificate do not carry over)."""
        fresh = cls(**terms)
        if path is None or not os.path.exists(path):
            return fresh
        with open(path) as f:
            saved = cls.from_state(json.load(f))
        if [vars(g) for g in saved.gears] != [vars(g) for g in fresh.gears]:
            return fresh
        saved.hold = fresh.hold  # the deploy's choice now; holds kept only while it holds
        if not saved.hold:
            saved.held = {}
        # the deploy's settings now (the counts hold under any of them); the epochs keep the size
        # they were cut at
        for name in ("rowwise", "confidence", "rise", "horizon", "segments", "max_segments"):
            setattr(saved, name, getattr(fresh, name))
        saved.by_segment = {g: {a: v for a, v in attrs.items() if a in saved.segments}
                            for g, attrs in saved.by_segment.items()}
        saved._references = {}
        return saved


def _segment_fields(verdict: dict[str, Any]) -> dict[str, Any]:
    keep = ("served_rows", "cheap_share", "audited_rows", "disagreed_rows", "shed_audits", "degraded_rows",
            "disagreement_rate", "disagreement_lower", "disagreement_upper", "loss_upper", "supported")
    return {k: verdict[k] for k in keep}


def _segment_value(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    return str(value)[:256]


def _clip(rate: float) -> float:
    return min(max(rate, 1e-6), 0.999)


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
