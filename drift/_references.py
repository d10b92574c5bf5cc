"""Named reference baselines: frozen summaries with a large row sample.

Why separate: a reference is built three ways (a batch of records, the first N closed panes of
traffic, a time range of the monitor's own history) and queried the same way. Building one
never mutates a reference a running query may hold: every step returns a new object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drift._summary import Layout, Summary


def iso(ts: float | None) -> str | None:
    """UTC ISO-8601 text of an epoch time (None stays None)."""
    import datetime as _dt

    if ts is None or not math.isfinite(ts):
        return None
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).isoformat()


@dataclass
class Reference:
    """A frozen, named baseline: a summary with a large row sample, and its description."""

    name: str
    summary: Summary
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return bool(self.info.get("pending"))


def empty_reference(layout: Layout, name: str, capacity: int, info: dict[str, Any]) -> Reference:
    return Reference(name, Summary(layout, (capacity, capacity)), {"name": name, **info})


def from_rows(
    base: Reference | None,
    layout: Layout,
    name: str,
    capacity: int,
    rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> Reference:
    """A reference holding `rows` (ts, cat, num, flags, priorities), added to a copy of `base`
    when appending."""
    part = Summary(layout, (capacity, capacity))
    part.add(*rows)
    if base is None:
        ref = empty_reference(layout, name, capacity, {"source": "batch"})
    else:
        ref = Reference(name, base.summary.copy(), dict(base.info))
    ref.summary.merge(part)
    if ref.summary.reservoir is not None:
        ref.summary.reservoir.compact()
    ref.info.update(rows=int(ref.summary.n), start=iso(ref.summary.t_min),
                    end=iso(ref.summary.t_max), pending=False)
    return ref


def auto_step(
    current: Reference | None,
    layout: Layout,
    capacity: int,
    wanted: int,
    closed: dict[int, Summary],
) -> Reference | None:
    """The 'default' reference after merging newly closed panes (the first `wanted` panes of
    traffic); None when nothing changes."""
    if current is not None and not current.pending:
        return None
    if current is None:
        ref = empty_reference(layout, "default", capacity,
                              {"source": "first panes", "pending": True, "panes": []})
    else:
        ref = Reference("default", current.summary.copy(), dict(current.info))
        ref.info["panes"] = list(current.info.get("panes", []))
    panes = ref.info["panes"]
    changed = current is None
    for p in sorted(closed):
        if len(panes) >= wanted or p in panes:
            continue
        ref.summary.merge(closed[p])
        panes.append(p)
        changed = True
    if not changed:
        return None
    if ref.summary.reservoir is not None:
        ref.summary.reservoir.compact()
    ref.info["rows"] = int(ref.summary.n)
    ref.info["panes_needed"] = int(wanted)
    if len(panes) >= wanted:
        ref.info.update(pending=False, start=iso(ref.summary.t_min), end=iso(ref.summary.t_max))
    return ref


def pending_status(ref: Reference | None, wanted: int | None, pane_seconds: float,
                   lateness: float) -> dict[str, Any]:
    """How far an automatic reference is from ready (empty when there is none to wait for)."""
    if not wanted or (ref is not None and not ref.pending):
        return {}
    done = 0 if ref is None else len(ref.info.get("panes", []))
    left = max(int(wanted) - done, 0)
    return {"panes_needed": int(wanted), "panes_done": done,
            "retry_after_s": left * pane_seconds + lateness}
