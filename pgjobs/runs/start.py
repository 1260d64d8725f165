"""What a claimed job's handler is called with and as: the function that runs (the task's, in its
span when tracing is on) and the lease extension of a context outside a worker. A worker's
slots, ``drain`` and ``eager`` all run handlers through these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgjobs import tracing
from pgjobs.context import JobContext
from pgjobs.models import Job
from pgjobs.tasks import Task


def handler(task: Task, job: Job) -> Callable[..., Any]:
    """The function that runs for ``job``: ``task``'s handler (as declared, wrappers included),
    in a ``CONSUMER`` span (``"<task> process"``, child of the trace the job was enqueued in)
    when the application traces with OpenTelemetry.

    Example: ``result = handler(task, job)(**arguments)``
    """
    if tracing.enabled():
        return tracing.process(task.fn, job, is_async=task.is_async)
    return task.fn


def no_extension(context: JobContext, seconds: float) -> None:
    """``JobContext.extend_lease`` where no lease needs extending (``eager``: no database):
    accepted (its value was checked) and nothing to send."""
