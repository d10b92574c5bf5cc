"""A pipeline for serving tests whose expensive stage can be made slow, and whose rows can
fail, on demand: a feature-store lookup that a test can stall (``set_delay``) and a value
that makes a feature raise (``POISON``). Costs are sleeps, not computation, so that tests
behave the same on a fast, a slow or a loaded machine.

The switches are files in ``$WILLUMP_TEST_CONTROL``, a directory the serving conftest
creates before any Ray starts, so that every replica process sees the same directory.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import willump

#: a value of column ``a`` that makes the cheap feature raise (passes schema validation)
POISON = 123456.0
CONTROL_ENV = "WILLUMP_TEST_CONTROL"
#: per-row cost of the expensive lookup (seconds), enforced with sleep
LOOKUP_COST = 100e-6


def control_dir() -> Path:
    return Path(os.environ[CONTROL_ENV])


def _set(name: str, value: float) -> None:
    path = control_dir() / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(float(value)))
    tmp.replace(path)


def set_delay(seconds: float) -> None:
    """Every later call of the expensive lookup stalls this long (0: no stall)."""
    _set("delay", seconds)


def set_row_delay(seconds: float) -> None:
    """Every row through the cheap level's feature costs this long (a lookup per row, which
    every row takes, however confident the cheap level is: the cheap stage's capacity per
    thread becomes 1 / seconds rows/s)."""
    _set("row_delay", seconds)


def stall_once(seconds: float) -> None:
    """The next call of the expensive lookup, in whichever replica makes it, stalls this long;
    the calls after it do not (a straggler, for hedging)."""
    _set("stall_once", seconds)


def _claim_once() -> float:
    """The one-off stall, if this call is the first to take it (a rename is atomic: one
    process wins)."""
    path = Path(os.environ[CONTROL_ENV]) / "stall_once"
    mine = path.with_name(f"stall_once.{os.getpid()}.{time.monotonic_ns()}")
    try:
        os.rename(path, mine)
    except (KeyError, OSError):
        return 0.0
    try:
        return float(mine.read_text())
    except (OSError, ValueError):
        return 0.0
    finally:
        mine.unlink(missing_ok=True)


def _get(name: str) -> float:
    try:
        return float((Path(os.environ[CONTROL_ENV]) / name).read_text())
    except (KeyError, OSError, ValueError):
        return 0.0


@willump.feature
def cheap_a(df):
    if (df["a"] == POISON).any():
        raise ValueError("poisoned row")
    delay = _get("row_delay")
    if delay > 0:
        time.sleep(delay * len(df))
    return df[["a"]].to_numpy()


@willump.feature
def medium_b(df):
    return df[["b"]].to_numpy()


@willump.feature
def lookup_c(df):
    time.sleep(LOOKUP_COST * len(df) + _get("delay") + _claim_once())
    return df[["c"]].to_numpy()


@willump.pipeline
def stallable(df):
    return [cheap_a(df), medium_b(df), lookup_c(df)]


FIXED_COSTS = {"cheap_a": 1e-6, "medium_b": 2e-5, "lookup_c": 2e-4}
