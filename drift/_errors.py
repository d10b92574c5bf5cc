"""Exception and warning types of the monitor, so callers can catch them precisely.

Errors a server turns into HTTP answers carry what it needs: `http_status`, a machine-readable
`reason`, a message that says what to do in terms an HTTP client has (query parameters such as
`reference=-1h`; never "call set_reference") — that is also `str(exc)` — and, when waiting
helps, `retry_after_s`. `to_http()` returns them as a JSON-ready dict; `hint` adds what a Python
caller can do besides.
"""

from __future__ import annotations

from typing import Any


class DriftError(Exception):
    """Base of the errors that carry an HTTP form."""

    http_status = 400
    default_reason = "bad_request"

    def __init__(self, message: str, *, reason: str | None = None,
                 http_message: str | None = None, retry_after_s: float | None = None,
                 hint: str | None = None) -> None:
        # str(exc) is the text an HTTP client can act on (servers that format the exception
        # must not tell a client to call Python); `hint` adds what a Python caller can do
        super().__init__(http_message or message)
        self.reason = reason or self.default_reason
        self.http_message = http_message or message
        self.retry_after_s = retry_after_s
        self.hint = hint

    def to_http(self) -> dict[str, Any]:
        """{'status', 'reason', 'error', 'retry_after_s'}: the body of an HTTP error answer."""
        out: dict[str, Any] = {"status": self.http_status, "reason": self.reason,
                               "error": self.http_message}
        if self.retry_after_s is not None:
            out["retry_after_s"] = round(float(self.retry_after_s), 1)
        return out


class SchemaError(DriftError, ValueError):
    """A batch or configuration does not match what the monitor expects (names the column)."""

    http_status = 422
    default_reason = "schema"


class NoReferenceError(DriftError, LookupError):
    """A query needs a reference baseline that has not been set (HTTP 409; see `reason`:
    'reference_pending' with `retry_after_s`, 'no_reference', 'no_data', 'empty_range')."""

    http_status = 409
    default_reason = "no_reference"


class StateError(DriftError, RuntimeError):
    """The monitor's directory holds state that cannot be used (other owner, other config)."""

    http_status = 409
    default_reason = "state"


class DataWarning(UserWarning):
    """Input was accepted but part of it could not be used (late, quarantined or non-finite)."""
