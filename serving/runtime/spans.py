"""The request's own spans under Ray Serve's tracing (OpenTelemetry): what a traced request
spent parsing, waiting on each stage, and writing its records, and the merged stage calls it
shared with other requests.

Why: Serve traces a request as one span per replica it visits. In a served cascade most of a
request's time is inside the ingress (its parse, the cheap level, the queue before a stage
call), and the ingress merges the rows of concurrent requests into one call per stage
(serving.runtime.coalesce), made from a task that belongs to none of them; Serve's span of
that call in the stage replica then hangs off whichever request's context the task copied.
Here each request gets a child span per phase, and each merged call a span of its own whose
parent is its first request and which links every request it carries (OpenTelemetry's
pattern for batches); the stage replica's spans are that call's children.

Cost: nothing is created unless the current span records (tracing on and this request
sampled); otherwise one context lookup per phase (about 0.6 us). Without OpenTelemetry installed, nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # tracing is off without it (Serve's needs the same package)
    trace = None

#: the instrumentation scope of these spans
TRACER = "willump.serving"
#: what an untraced block enters (reusable: it holds no state)
_NOTHING = contextlib.nullcontext()


def recording() -> Any:
    """The current span's context where it records (a traced, sampled request), else None."""
    if trace is None:
        return None
    current = trace.get_current_span()
    return current.get_span_context() if current.is_recording() else None


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager:
    """A child span of the current one for the block, where the current one records; else a
    shared no-op (about 0.6 us a phase on the project machine: what an untraced request pays). Gives the span (or None)."""
    if recording() is None:
        return _NOTHING
    return trace.get_tracer(TRACER).start_as_current_span(name, attributes=attributes)


def batch_span(name: str, carried: Sequence[Any], rows: Sequence[Any] = ()) -> contextlib.AbstractContextManager:
    """A span for one call that carries several requests: its parent is the first recording
    request's span (``carried``: their span contexts, None for those not traced), and it links
    every one; ``rows``: the call's items (their ``size`` summed, only when traced). Nothing
    where none records."""
    contexts = [c for c in carried if c is not None]
    if not contexts:
        return _NOTHING
    parent = trace.set_span_in_context(trace.NonRecordingSpan(contexts[0]))
    links = [trace.Link(c) for c in contexts]
    return trace.get_tracer(TRACER).start_as_current_span(
        name, context=parent, links=links,
        attributes={"rows": sum(it.size for it in rows), "requests": len(carried), "traced_requests": len(contexts)})
