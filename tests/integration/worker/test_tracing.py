"""Tracing with OpenTelemetry against a real PostgreSQL and a real worker run: the enqueuing span's
context is stored with the job and the handler runs in a CONSUMER span, its child in the same
trace, with the messaging attributes; nothing of OpenTelemetry is loaded when the application
does not trace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pgjobs import App, JobSpec, NonRetryableError, tracing
from pgjobs.testing import drain, eager
from tests.support.factories import row, work


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A tracer provider configured as an application does, recording in memory; the global
    provider is restored afterwards (OpenTelemetry lets a process set it only once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_the_handler_span_is_a_child_of_the_enqueuing_span_across_a_worker_run(
    make_app, conn, spans: InMemorySpanExporter
) -> None:
    app: App = make_app()
    ran_in: list[Any] = []

    @app.task(name="emails.send", queue="emails")
    def send(to: str) -> None:
        ran_in.append(trace.get_current_span().get_span_context())

    tracer = trace.get_tracer("the-web-app")
    with tracer.start_as_current_span("POST /signup") as request:
        job = app.enqueue("emails.send", {"to": "ada@example.com"})
    stored = row(conn, "queued_jobs", job)
    assert stored is not None
    assert stored["trace_context"]["traceparent"].startswith(
        f"00-{request.get_span_context().trace_id:032x}-"
    )

    assert work(app) == 0

    (publish,) = named(spans, "emails.send publish")
    (process,) = named(spans, "emails.send process")
    trace_id = request.get_span_context().trace_id
    assert publish.kind is SpanKind.PRODUCER
    assert (
        publish.parent is not None and publish.parent.span_id == request.get_span_context().span_id
    )
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == trace_id  # one trace from the request to the handler
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert process.parent.is_remote
    # The handler ran inside its span: what it traces is part of the same trace.
    assert ran_in[0].span_id == process.context.span_id
    assert dict(process.attributes or {}) == {
        "messaging.system": "pgjobs",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "emails",
        "messaging.message.id": str(job),
        "messaging.pgjobs.job.task": "emails.send",
        "messaging.pgjobs.job.attempt": 1,
    }
    assert dict(publish.attributes or {})["messaging.operation.type"] == "send"
    assert process.status.status_code is StatusCode.UNSET


async def _enqueue_async(app: App) -> list[int]:
    async with app:
        one = await app.enqueue_async("t.fail", {"n": 1})
        many = await app.enqueue_many_async([JobSpec("t.fail", {"n": 2})] * 3)
    return [one, *many]


def test_a_failing_handler_s_span_records_the_exception_and_async_handlers_are_traced(
    make_app, conn, spans: InMemorySpanExporter
) -> None:
    import asyncio

    app: App = make_app()

    @app.task(name="t.fail", max_attempts=1)
    async def fail(n: int) -> None:
        raise NonRetryableError(f"card {n} declined")

    with trace.get_tracer("test").start_as_current_span("batch") as batch:
        ids = asyncio.run(_enqueue_async(app))
    assert work(app) == 0

    processed = named(spans, "t.fail process")
    assert len(processed) == 4
    assert {s.context.trace_id for s in processed} == {batch.get_span_context().trace_id}
    assert {dict(s.attributes or {})["messaging.message.id"] for s in processed} == set(
        map(str, ids)
    )
    for span in processed:
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["error.type"] == "pgjobs.errors.NonRetryableError"
        (event,) = [e for e in span.events if e.name == "exception"]
        assert "declined" in str(dict(event.attributes or {})["exception.message"])


def test_a_job_enqueued_without_tracing_runs_in_a_root_span(
    make_app, conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    app: App = make_app()

    @app.task(name="t.plain")
    def plain() -> None: ...

    job = app.enqueue("t.plain")  # no tracer provider configured yet: nothing stored
    stored = row(conn, "queued_jobs", job)
    assert stored is not None and stored["trace_context"] is None

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    assert work(app) == 0
    (process,) = named(exporter, "t.plain process")
    assert process.parent is None


def test_drain_and_eager_run_the_handler_in_its_process_span_as_a_worker_does(
    make_app, spans: InMemorySpanExporter
) -> None:
    app: App = make_app()
    ran_in: list[Any] = []

    @app.task(name="t.traced")
    async def traced(n: int) -> None:
        ran_in.append(trace.get_current_span().get_span_context())

    with trace.get_tracer("the-web-app").start_as_current_span("POST /orders") as request:
        app.enqueue("t.traced", {"n": 1})
    assert drain(app).runs == 1
    with eager(app):
        app.enqueue("t.traced", {"n": 2})

    drained, eagerly = named(spans, "t.traced process")
    assert drained.parent is not None
    assert drained.context.trace_id == request.get_span_context().trace_id
    assert eagerly.parent is None  # nothing was enqueued, so no trace to continue
    assert {drained.kind, eagerly.kind} == {SpanKind.CONSUMER}
    assert ran_in == [drained.context, eagerly.context]


def test_tracing_is_off_until_a_tracer_provider_is_configured(monkeypatch) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert not tracing.enabled()  # imported, but the default (proxy) provider: nothing to do
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert tracing.enabled()


def test_nothing_of_opentelemetry_is_imported_by_pgjobs() -> None:
    code = """
import sys, json
import pgjobs, pgjobs.worker, pgjobs.enqueue, pgjobs.app, pgjobs.tracing
app = pgjobs.App("postgresql://nobody@127.0.0.1:1/none")

@app.task(name="t")
def t(n: int) -> None: ...

from pgjobs import enqueue
from pgjobs.submission import JobSpec
enqueue.prepare(JobSpec("t", {"n": 1}), app.tasks)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
