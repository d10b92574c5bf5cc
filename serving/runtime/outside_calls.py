"""How a stage replica serves the live audit's calls (the full pipeline on rows no request waits
for): in pieces that each hold the replica for at most about ``PIECE_S``. Calls a request waits
on (the full pipeline while the audit holds gear 0, top-K's scoring) run whole.

An audit call carries up to 128 rows (serving.runtime.audit.AUDIT_BATCH_ROWS: rows of many
requests share it, so it costs what its batch is worth). Where a row costs the stage little (a
TF-IDF level on CPU, 0.2 ms) that is one short call; where it costs much (a deep model, or an
emulated device of 50 ms a row) one such call would hold a device that computes one call at a
time for seconds, and every cascade batch queued behind it would wait that long (a cheaper
gear's batches are a few rows: far shorter than a batch of the stage's full size, so the
stage's batch size is no bound). Split into pieces of ``max(1, PIECE_S / seconds a row)`` rows,
the cascade's batches take turns with the pieces (the device's lock is first come, first
served). The seconds a row takes are these calls' own, measured as they run (decayed per row);
until one has run, a piece is one row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: seconds of the replica one piece of an audit call may take, at the measured cost per row
PIECE_S = 0.1
#: rows over which the measured cost per row halves its weight
COST_HALF_LIFE_ROWS = 512.0


class PieceSize:
    """Rows per piece for one replica's calls outside the levels (module docstring)."""

    def __init__(self, piece_s: float = PIECE_S, half_life_rows: float = COST_HALF_LIFE_ROWS):
        if not piece_s > 0:
            raise ValueError(f"piece_s must be > 0, got {piece_s!r}")
        if not half_life_rows > 0:
            raise ValueError(f"half_life_rows must be > 0, got {half_life_rows!r}")
        self.piece_s, self.half_life_rows = float(piece_s), float(half_life_rows)
        self.busy_s, self.rows = 0.0, 0.0

    def rows_per_piece(self) -> int:
        if self.rows <= 0:
            return 1
        if self.busy_s <= 0:  # measured as free: no reason to split
            return 1 << 30
        return max(1, int(self.piece_s * self.rows / self.busy_s))

    def observe(self, rows: int, busy_s: float) -> None:
        """A piece of ``rows`` rows took ``busy_s`` of the replica's busy seconds."""
        if rows <= 0 or not busy_s >= 0:
            return
        keep = 0.5 ** (rows / self.half_life_rows)
        self.busy_s, self.rows = self.busy_s * keep + busy_s, self.rows * keep + rows

    def pieces(self, frame: Any) -> Iterator[Any]:
        """``frame`` (a data frame) in pieces of :meth:`rows_per_piece` rows, each indexed from 0;
        the frame itself where it fits in one."""
        size = self.rows_per_piece()
        n = len(frame)
        if n <= size:
            yield frame
            return
        for start in range(0, n, size):
            yield frame.iloc[start:start + size].reset_index(drop=True)
