"""Batch ids a sender attaches so that a batch sent twice is ingested once.

Why: a sender that does not hear back from the monitor (a send timed out, the monitor replica
was being replaced) cannot tell whether the batch arrived. Dropping it loses records; sending
it again without an id counts its rows twice. With an id (Kafka's idempotent producer, in the
small), the sender retries freely and the monitor skips an id it has already ingested.

The monitor remembers the last ``capacity`` ids (a sender retries only its oldest unanswered
batches, so a short memory suffices) and saves them with the rest of its state, in the same
commit as the rows they brought: every row on disk has its batch's id on disk, so a monitor
reopened after a restart skips a retry of a batch it had already saved.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: ids remembered (the oldest forgotten first); each is saved with every commit of the state
RECENT_BATCH_IDS = 1024
#: longest id accepted (characters): it is saved as JSON with every commit
MAX_BATCH_ID_CHARS = 200


def check_batch_id(batch_id: object) -> str | None:
    """The id as given (None: the batch has none); a TypeError or ValueError naming
    ``batch_id`` when it cannot be one."""
    if batch_id is None:
        return None
    if not isinstance(batch_id, str):
        raise TypeError(f"batch_id must be a string or None, got {type(batch_id).__name__}")
    if not batch_id or len(batch_id) > MAX_BATCH_ID_CHARS:
        raise ValueError(f"batch_id must hold 1 to {MAX_BATCH_ID_CHARS} characters, got {len(batch_id)}")
    try:
        batch_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("batch_id holds a lone UTF-16 surrogate (not text)") from None
    return batch_id


class RecentBatchIds:
    """The ids of the last ``capacity`` batches ingested, oldest first."""

    def __init__(self, capacity: int = RECENT_BATCH_IDS, ids: Iterable[str] = ()):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        for batch_id in ids:
            self.add(batch_id)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, batch_id: str) -> None:
        self._ids[batch_id] = None
        self._ids.move_to_end(batch_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def to_json(self) -> list[str]:
        return list(self._ids)
