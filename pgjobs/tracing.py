"""OpenTelemetry tracing of jobs: a span where a job is enqueued, a span where it runs.

Tracing is on when OpenTelemetry is imported and the application has configured a tracer
provider (``opentelemetry.trace.set_tracer_provider``); pgjobs never configures one itself, and
this module is the only one that imports ``opentelemetry``, only once the application did (it is
looked up in ``sys.modules``): a worker or an app that does not trace loads nothing of it and
pays one dictionary lookup per job.

* Enqueue: a ``PRODUCER`` span ``"<task> publish"``, child of the caller's current span; its
  W3C trace context (``traceparent``, ``tracestate``, through the propagation API, so the
  application's configured propagators apply) is stored with the job (``trace_context``).
* Run: the handler runs in a ``CONSUMER`` span ``"<task> process"`` whose parent is the stored
  context (the same trace as the request that enqueued the job), with the messaging attributes
  of the OpenTelemetry semantic conventions; an exception the handler raises is recorded on the
  span and sets its status to error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from pgjobs.models import Job

#: The instrumentation scope of pgjobs' spans.
TRACER_NAME = "pgjobs"
#: ``messaging.system`` of every span.
MESSAGING_SYSTEM = "pgjobs"


def enabled() -> bool:
    """Whether the application traces with OpenTelemetry: it imported ``opentelemetry.trace``
    and set a tracer provider. Cheap: a dictionary lookup when it did not.

    Example: ``if pgjobs.tracing.enabled(): ...``
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


# The provider last used and its tracer: a provider set later (a test may set another one)
# gets its own. Held by reference, not by id(): a new provider may reuse an old one's id.
_last_tracer: tuple[Any, Any] | None = None


def _tracer() -> Any:
    global _last_tracer
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    last = _last_tracer
    if last is not None and last[0] is provider:
        return last[1]
    tracer = provider.get_tracer(TRACER_NAME)
    _last_tracer = (provider, tracer)
    return tracer


def publish(task: str, queue: str) -> str | None:
    """Open and close the ``PRODUCER`` span of enqueueing a job of ``task`` on ``queue`` (a
    child of the current span), and return its trace context as JSON text to store with the
    job, or None when the propagators wrote nothing.

    Example: ``trace_context = tracing.publish("emails.send", "emails")``
    """
    from opentelemetry import propagate, trace

    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "messaging.pgjobs.job.task": task,
    }
    with _tracer().start_as_current_span(
        f"{task} publish", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else None


def process(fn: Callable[..., Any], job: Job, *, is_async: bool) -> Callable[..., Any]:
    """``fn`` (a handler taking keyword arguments) wrapped to run in the ``CONSUMER`` span of
    ``job``, child of the trace context stored with it (a new trace when there is none).

    Example: ``handler = tracing.process(task.fn, job, is_async=task.is_async)``
    """
    from opentelemetry import propagate, trace

    parent = propagate.extract(job.trace_context or {})
    name = f"{job.task} process"
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "messaging.pgjobs.job.task": job.task,
        "messaging.pgjobs.job.attempt": job.attempts,
    }
    tracer = _tracer()

    def span() -> Any:
        return tracer.start_as_current_span(
            name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
        )

    if is_async:

        async def run_async(**kwargs: Any) -> Any:
            with span() as current:
                try:
                    return await fn(**kwargs)
                except BaseException as exc:
                    _failed(current, exc)
                    raise

        return run_async

    def run(**kwargs: Any) -> Any:
        with span() as current:
            try:
                return fn(**kwargs)
            except BaseException as exc:
                _failed(current, exc)
                raise

    return run


def _failed(span: Any, exc: BaseException) -> None:
    # The span records the exception and the error status itself; error.type is the
    # convention's attribute for what failed.
    span.set_attribute("error.type", f"{type(exc).__module__}.{type(exc).__qualname__}")
