"""The monitor replica's side of the live guarantee: the audit's ledger and the labels fed back.

Both live beside the monitor's own state (its directory, when it has one): the audit counts in
``guarantee.json`` (:class:`drift.GuaranteeLedger`), the served rows waiting for labels and the
counts the labels taught in ``labels.sqlite`` (:class:`drift.LabelJoin`). Every answer is a dict
with an HTTP ``status``, as the monitor's other queries are (client mistakes are 4xx, never raised).
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from serving.runtime.records import REQUEST_COLUMN, ROW_COLUMN, SERVED_CLASS_COLUMN

#: the monitor query kinds answered here, not by drift.Monitor
KINDS = ("guarantee", "accuracy")


class Feedback:
    """The audit ledger (``guarantee``: :class:`drift.GuaranteeLedger`'s arguments) and the label
    join (``labels``: :class:`drift.LabelJoin`'s keyword arguments with ``classes``); either may
    be None (that part is off)."""

    def __init__(self, directory: str | os.PathLike | None, guarantee: dict[str, Any] | None,
                 labels: dict[str, Any] | None):
        from drift import GuaranteeLedger, LabelJoin

        directory = None if directory is None else os.fspath(directory)
        self.ledger_path = None if directory is None else os.path.join(directory, "guarantee.json")
        self.ledger = None if guarantee is None else GuaranteeLedger.open(self.ledger_path, **guarantee)
        #: counts added whose save failed (the next audit call saves them before it answers)
        self._unsaved = False
        self.labels = None if labels is None else LabelJoin(
            None if directory is None else os.path.join(directory, "labels.sqlite"), **labels)

    def collectors(self) -> list[Any]:
        from drift import GuaranteeCollector

        return [] if self.ledger is None else [GuaranteeCollector(self.ledger)]

    # --- writes -------------------------------------------------------------------------------
    def audit(self, entries: list[dict[str, Any]], batch_id: str | None = None) -> dict[str, Any]:
        """Add the live audit's counts (serving.runtime.audit.LiveAudit.flush), saved before the
        answer so that an acknowledged count survives a restart; with the ledger's ``hold``,
        the answer names the gears held now (serving.runtime.hold). ``batch_id``: the sender's
        id for these counts; counts sent again under an id already added are skipped
        (``duplicate``), so a send whose answer was lost is counted once."""
        if self.ledger is None:
            return {"accepted": 0, "error": "this monitor has no live audit (deploy with audit_rate > 0)"}
        added = self.ledger.add_batch(entries, batch_id)
        if self.ledger_path is not None and (added or self._unsaved):
            # a repeat of counts whose save failed is answered only once they are saved: the
            # sender drops what it hears acknowledged
            self._unsaved = True
            self.ledger.save(self.ledger_path)
            self._unsaved = False
        return {"accepted": len(entries) if added else 0, **({} if added else {"duplicate": len(entries)}),
                **({"held": sorted(self.ledger.held)} if self.ledger.hold else {})}

    def served(self, records: Any, *, repeat: bool = False) -> None:
        """Keep a batch of served records for the labels that may follow (``repeat``: a batch
        sent before, whose rows already kept are skipped: drift.LabelJoin.served)."""
        if self.labels is None:
            return
        frame = records if isinstance(records, pd.DataFrame) else pd.DataFrame(records)
        if len(frame) == 0 or ROW_COLUMN not in frame or SERVED_CLASS_COLUMN not in frame:
            return
        self.labels.served(
            frame[REQUEST_COLUMN].tolist() if REQUEST_COLUMN in frame else [None] * len(frame),
            frame[ROW_COLUMN].to_numpy(), frame[SERVED_CLASS_COLUMN].to_numpy(),
            frame["gear"].astype(int).to_numpy() if "gear" in frame else None,
            frame["confidence"].to_numpy(dtype=float),
            {a: frame[a].tolist() for a in self.labels.segments if a in frame}, repeat=repeat)

    def label(self, body: Any) -> dict[str, Any]:
        """``POST /labels``: accepted, unknown and duplicate counts, or a 4xx naming the field."""
        from drift import LabelError

        if self.labels is None:
            return {"status": 404, "error": "this app keeps no served rows for labels (deployed without the monitor)",
                    "fields": []}
        try:
            return {"status": 200, **self.labels.label(body)}
        except LabelError as exc:
            return {"status": 422, "error": str(exc), "fields": [{"field": exc.field, "error": exc.message}]}

    # --- reads ----------------------------------------------------------------------------------
    def query(self, kind: str, params: dict[str, Any]) -> dict[str, Any]:
        """``GET /drift?kind=guarantee|accuracy[&segment=ATTRIBUTE]``."""
        part = self.ledger if kind == "guarantee" else self.labels
        if part is None:
            why = ("runs no live audit: nothing to audit where the plan serves the full pipeline; on a cascade, "
                   "deploy it with audit_rate > 0"
                   if kind == "guarantee" else "keeps no served rows for labels (deployed without the monitor)")
            return {"status": 404, "error": f"this app {why}", "fields": []}
        unknown = sorted(set(params) - {"segment"})
        if unknown:
            return {"status": 422, "error": f"unknown query parameter(s) {unknown} for {kind}",
                    "fields": [{"field": p, "error": "accepted: ['segment']"} for p in unknown]}
        segment = params.get("segment")
        if segment is not None and str(segment) not in part.segments:
            return {"status": 422, "error": f"segment must be one of {part.segments}, got {segment!r}",
                    "fields": [{"field": "segment", "error": "not a followed attribute"}]}
        return {"status": 200, "query": kind, "result": part.report(None if segment is None else str(segment))}

    def snapshot(self) -> dict[str, Any]:
        """What the dashboard draws of the live guarantee (fresh: counts only)."""
        out: dict[str, Any] = {}
        if self.ledger is not None:
            out["guarantee"] = self.ledger.report()
        if self.labels is not None:
            out["accuracy"] = self.labels.report()
        return out

    def close(self) -> None:
        if self.labels is not None:
            self.labels.close()
