"""A traced request's own spans (serving.runtime.spans) and the merged stage call's span
(serving.runtime.coalesce): children of the request where it records, one span per merged call
parented on its first traced request and linking each, nothing where no span records. An
in-memory OpenTelemetry exporter, no Ray."""

from __future__ import annotations

import asyncio

import pytest

trace_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace as otel_trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from serving.runtime import spans  # noqa: E402
from serving.runtime.calls import Deadline  # noqa: E402
from serving.runtime.coalesce import Coalescer  # noqa: E402


class _Tracing:
    """serving.runtime.spans's ``trace`` with a provider of the test's own (the global one stays
    untouched for the rest of the run)."""

    def __init__(self, provider):
        self.provider = provider

    def get_tracer(self, name):
        return self.provider.get_tracer(name)

    def __getattr__(self, name):
        return getattr(otel_trace, name)


@pytest.fixture
def exported(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = trace_sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(spans, "trace", _Tracing(provider))
    return provider.get_tracer("test"), exporter


def test_no_recording_span_no_spans(exported):
    _, exporter = exported
    seen = []

    async def run(items, deadline):
        seen.append(otel_trace.get_current_span().is_recording())
        return [it.rows for it in items]

    async def main():
        with spans.span("willump.parse") as s:
            assert s is None
        co = Coalescer(run, stage="s", max_rows=8, limit=1)
        return await asyncio.gather(*(co.submit([i], None, Deadline.after(30.0)) for i in range(3)))

    assert asyncio.run(main()) == [[0], [1], [2]]
    assert exporter.get_finished_spans() == () and seen and not any(seen)


def test_a_merged_call_is_parented_on_its_first_traced_request_and_links_each(exported):
    tracer, exporter = exported
    inside = []

    async def run(items, deadline):
        inside.append(otel_trace.get_current_span().get_span_context())
        await asyncio.sleep(0.01)
        return [it.rows for it in items]

    async def request(co, i, traced):
        if not traced:
            return await co.submit([i], None, Deadline.after(30.0))
        with tracer.start_as_current_span(f"request {i}"):
            with spans.span("willump.stage s", rows=1):
                return await co.submit([i], None, Deadline.after(30.0))

    async def main():
        co = Coalescer(run, stage="s", max_rows=8, limit=1)
        first = asyncio.ensure_future(co.submit([99], None, Deadline.after(30.0)))  # holds the one slot
        await asyncio.sleep(0)
        outs = await asyncio.gather(*(request(co, i, traced=i != 1) for i in range(3)))
        await first
        return outs

    assert asyncio.run(main()) == [[0], [1], [2]]
    finished = {s.name: s for s in exporter.get_finished_spans() if s.name != "willump.stage s"}
    stages = [s for s in exporter.get_finished_spans() if s.name == "willump.stage s"]
    call = finished["willump.call s"]
    assert {s.parent.span_id for s in stages} == {finished[f"request {i}"].context.span_id for i in (0, 2)}
    assert {link.context.span_id for link in call.links} == {s.context.span_id for s in stages}
    assert call.parent.span_id in {s.context.span_id for s in stages}
    assert call.attributes["requests"] == 3 and call.attributes["traced_requests"] == 2
    assert call.attributes["rows"] == 3
    assert inside[-1].span_id == call.context.span_id  # the stage is called inside the call's span


def test_an_untraced_call_after_a_traced_one_belongs_to_no_trace(exported):
    """The merged calls run in the coalescer's own context, not in a copy of whichever request
    dispatched them: an untraced request's call after a traced one carries no span of it (else
    Serve's sampler, keyed on the parent's flag, records unrelated calls in that trace)."""
    tracer, _ = exported
    current = []

    async def run(items, deadline):
        current.append((otel_trace.get_current_span().get_span_context(), [it.rows for it in items]))
        await asyncio.sleep(0.05)
        return [it.rows for it in items]

    async def traced(co):
        with tracer.start_as_current_span("request x"):
            with spans.span("willump.stage s"):
                return await co.submit([1], None, Deadline.after(30.0))

    async def untraced(co):
        await asyncio.sleep(0.01)  # queued while x's call holds the one slot: x's call dispatches it
        return await co.submit([2], None, Deadline.after(30.0))

    async def main():
        co = Coalescer(run, stage="s", max_rows=1, limit=1)
        return await asyncio.gather(traced(co), untraced(co))

    assert asyncio.run(main()) == [[1], [2]]
    (x_context, x_rows), (y_context, y_rows) = current
    assert x_rows == [[1]] and y_rows == [[2]]
    assert x_context.is_valid and not y_context.is_valid


def test_a_request_retried_alone_keeps_its_trace(exported):
    """A merged call that fails is retried request by request (Coalescer._alone): each traced
    request's retry is a call span of its own under that request."""
    tracer, exporter = exported

    async def run(items, deadline):
        await asyncio.sleep(0.01)
        if len(items) > 1:
            raise ValueError("one request's rows broke the merged call")
        return [it.rows for it in items]

    async def request(co, i):
        with tracer.start_as_current_span(f"request {i}"):
            with spans.span("willump.stage s"):
                return await co.submit([i], None, Deadline.after(30.0))

    async def main():
        co = Coalescer(run, stage="s", max_rows=8, limit=1)
        first = asyncio.ensure_future(co.submit([99], None, Deadline.after(30.0)))  # holds the one slot
        await asyncio.sleep(0)
        outs = await asyncio.gather(request(co, 0), request(co, 1))
        await first
        return outs, co.isolated

    outs, isolated = asyncio.run(main())
    assert outs == [[0], [1]] and isolated == 1
    finished = exporter.get_finished_spans()
    stages = {s.context.span_id for s in finished if s.name == "willump.stage s"}
    calls = [s for s in finished if s.name == "willump.call s"]
    alone = [c for c in calls if c.attributes["requests"] == 1]
    assert len(alone) == 2 and {c.parent.span_id for c in alone} == stages
