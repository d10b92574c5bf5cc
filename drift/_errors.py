"""Exception and warning types of the monitor, so callers can catch them precisely."""

from __future__ import annotations


class SchemaError(ValueError):
    """A batch or configuration does not match what the monitor expects (names the column)."""


class NoReferenceError(LookupError):
    """A query needs a reference baseline that has not been set."""


class StateError(RuntimeError):
    """The monitor's directory holds state that cannot be used (other owner, other config)."""


class DataWarning(UserWarning):
    """Input was accepted but part of it could not be used (late or non-finite values)."""
