"""How a stage replica serves the calls outside the cascade's levels (the live audit's rows and
the full pipeline while the audit holds gear 0, top-K's scoring of every row): in pieces that
each hold the replica about as long as one of its batches at most.

An audit call carries up to 128 rows (serving.runtime.audit.AUDIT_BATCH_ROWS: rows of many
requests share it, so it costs what its batch is worth). Where a row costs the stage little (a
TF-IDF level on CPU, 0.2 ms) that is one short call; where it costs much (a deep model, or an
emulated device of 50 ms a row) one such call would hold a device that computes one call at a
time for seconds, and every cascade batch queued behind it would wait that long. Split into
pieces of at most ``max(batch rows, PIECE_S / seconds a row)``, the cascade's batches take
turns with the pieces (the device's lock is first come, first served). The seconds a row takes
are these calls' own, measured as they run (decayed per row); until one has run, a piece is one
batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: seconds of the replica one piece of a call outside the levels may take, at the measured cost
#: per row (a piece is never below the stage's batch rows)
PIECE_S = 0.1
#: rows over which the measured cost per row halves its weight
COST_HALF_LIFE_ROWS = 512.0


class PieceSize:
    """Rows per piece for one replica's calls outside the levels (module docstring)."""

    def __init__(self, batch_rows: int, piece_s: float = PIECE_S, half_life_rows: float = COST_HALF_LIFE_ROWS):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows!r}")
        if not piece_s > 0:
            raise ValueError(f"piece_s must be > 0, got {piece_s!r}")
        self.batch_rows, self.piece_s, self.half_life_rows = int(batch_rows), float(piece_s), float(half_life_rows)
        self.busy_s, self.rows = 0.0, 0.0

    def rows_per_piece(self) -> int:
        if self.rows <= 0 or self.busy_s <= 0:
            return self.batch_rows
        return max(self.batch_rows, int(self.piece_s * self.rows / self.busy_s))

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
