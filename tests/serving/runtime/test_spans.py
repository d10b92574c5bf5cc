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
