"""``eager``: under it, an app's enqueue runs each job's handler at once, with no database at
all."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pgjobs import enqueue
from pgjobs.app import App
from pgjobs.context import JobContext, call_async, call_sync
from pgjobs.errors import ConfigurationError
from pgjobs.models import Job
from pgjobs.runs import handler, no_extension
from pgjobs.submission import JobSpec
from pgjobs.tasks import Task
from pgjobs.testing.assertions import task_name
from pgjobs.testing.drain import run_coroutine


@dataclass(frozen=True, slots=True)
class EagerRun:
    """One job ``eager`` took at enqueue: its fake id, task, payload (as the handler received
    it), and what the handler returned. ``ran`` is False for an external task (a worker would
    deliver it over HTTP: nothing runs in process)."""

    id: int
    task: str
    payload: dict[str, Any]
    result: Any
    ran: bool = True


@dataclass(slots=True)
class EagerLog:
    """The jobs taken under one ``eager`` block, in order."""

    runs: list[EagerRun] = field(default_factory=list)

    def of(self, task: str | Task) -> list[EagerRun]:
        """The runs of ``task``."""
        name = task_name(task)
        return [run for run in self.runs if run.task == name]


_fake_ids = itertools.count(1)
_fake_ids_lock = threading.Lock()
_EAGER_METHODS = ("enqueue", "enqueue_many", "enqueue_async", "enqueue_many_async")


class _Eager:
    """What ``eager`` puts in place of an app's enqueue methods."""

    def __init__(self, app: App) -> None:
        self.tasks = dict(app.tasks)
        self.log = EagerLog()

    def prepare(self, spec: JobSpec) -> tuple[JobContext, Task, dict[str, Any]]:
        """Validate ``spec`` as enqueue does, and build the job its handler would see and the
        handler's keyword arguments (a model's instance for a handler that takes one)."""
        prepared = enqueue.prepare(spec, self.tasks)
        task = self.tasks.get(prepared.task)
        if task is None:
            raise ConfigurationError(
                f"eager mode runs handlers: no task named {prepared.task!r} is registered",
                field="task",
            )
        payload = json.loads(prepared.payload)  # what a worker reads back from jsonb
        arguments = enqueue.handler_arguments(task, payload)
        with _fake_ids_lock:
            job_id = -next(_fake_ids)
        now = datetime.now(UTC)
        job = Job(
            id=job_id,
            queue=prepared.queue,
            task=prepared.task,
            payload=payload,
            priority=prepared.priority,
            run_at=prepared.run_at or now,
            attempts=1,
            max_attempts=prepared.max_attempts,
            lease_owner="pgjobs.testing.eager",
            lease_expires_at=None,
            last_error=None,
            created_at=now,
            expires_at=(
                prepared.expires_at
                if prepared.expires_in is None
                else now + timedelta(seconds=prepared.expires_in)  # no database: this clock
            ),
            idempotency_key=prepared.idempotency_key,
            payload_version=prepared.payload_version,
            group_key=prepared.group_key,
            unique_key=prepared.unique_key,
        )
        return JobContext(job, no_extension), task, arguments

    def done(self, context: JobContext, result: Any, *, ran: bool = True) -> int:
        job = context.job
        self.log.runs.append(EagerRun(job.id, job.task, job.payload, result, ran))
        return job.id

    def run(self, spec: JobSpec) -> int:
        context, task, arguments = self.prepare(spec)
        if task.external is not None:
            return self.done(context, None, ran=False)
        fn = handler(task, context.job)  # what a worker runs: the task's, in its span
        if task.is_async:
            result = run_coroutine(lambda: call_async(context, fn, arguments))
        else:
            result = call_sync(context, fn, arguments)
        return self.done(context, result)

    async def run_async(self, spec: JobSpec) -> int:
        context, task, arguments = self.prepare(spec)
        if task.external is not None:
            return self.done(context, None, ran=False)
        fn = handler(task, context.job)
        if task.is_async:
            result = await call_async(context, fn, arguments)
        else:
            result = call_sync(context, fn, arguments)
        return self.done(context, result)

    def specs(self, jobs: Iterable[JobSpec]) -> list[JobSpec]:
        specs = [_run_now(spec) for spec in jobs]
        enqueue.prepare_many(specs, self.tasks)  # all valid before any handler runs
        return specs

    def methods(self) -> dict[str, Callable[..., Any]]:
        def enqueue(task: str | Task, payload: dict[str, Any] | None = None, **kw: Any) -> int:
            return self.run(_spec(task, payload, kw))

        def enqueue_many(jobs: Iterable[JobSpec], *, connection: Any = None) -> list[int]:
            return [self.run(spec) for spec in self.specs(jobs)]

        async def enqueue_async(
            task: str | Task, payload: dict[str, Any] | None = None, **kw: Any
        ) -> int:
            return await self.run_async(_spec(task, payload, kw))

        async def enqueue_many_async(
            jobs: Iterable[JobSpec], *, connection: Any = None
        ) -> list[int]:
            return [await self.run_async(spec) for spec in self.specs(jobs)]

        return {
            "enqueue": enqueue,
            "enqueue_many": enqueue_many,
            "enqueue_async": enqueue_async,
            "enqueue_many_async": enqueue_many_async,
        }


def _spec(task: str | Task, payload: dict[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    """The ``JobSpec`` of ``app.enqueue(task, payload, **options)``; ``connection`` is dropped."""
    options.pop("connection", None)
    return _run_now(JobSpec(task.name if isinstance(task, Task) else task, payload, **options))


def _run_now(spec: JobSpec) -> JobSpec:
    """``spec`` without its ``after``: jobs run as they are enqueued, so the jobs it waits for
    have run already (and their fake ids, below 0, are no job ids to check)."""
    return spec._replace(after=None) if isinstance(spec, JobSpec) and spec.after else spec


@contextlib.contextmanager
def eager(app: App) -> Iterator[EagerLog]:
    """Within the block, ``app.enqueue`` and ``app.enqueue_many`` (and their ``_async`` forms)
    run each job's handler at once instead of writing to the database (none is needed): the job
    is validated as enqueue validates it (unknown task, payload not JSON, bad options raise the
    same errors), the handler receives the payload as a worker would (JSON round trip: tuples
    become lists) and ``pgjobs.current_job()`` works. A payload that does not fit the handler
    raises ``InvalidPayload`` (a worker would dead-letter it); what the handler raises comes out
    of ``enqueue`` (no retry). Ids are negative, so they never match a real job. ``connection=``
    is ignored: the handler runs even if the caller's transaction rolls back later. Jobs of
    external tasks are validated and logged, not run (``EagerRun.ran`` is False).

    Example::

        with eager(app) as ran:
            app.enqueue("emails.welcome", {"to": "ada@example.com"})
        assert ran.of("emails.welcome")[0].result == "sent"
    """
    state = _Eager(app)
    saved = {name: app.__dict__[name] for name in _EAGER_METHODS if name in app.__dict__}
    for name, method in state.methods().items():
        setattr(app, name, method)
    try:
        yield state.log
    finally:
        for name in _EAGER_METHODS:
            if name in saved:
                setattr(app, name, saved[name])
            else:
                app.__dict__.pop(name, None)
