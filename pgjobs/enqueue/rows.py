"""A submission checked once: ``prepare`` turns a ``JobSpec`` into a ``PreparedJob``, its
defaults resolved, every option checked, and its insert ``Shape`` decided, carried with the row
to the one dispatch (``pgjobs.enqueue.door.plan``) that sends it to the statement that fits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import IntEnum
from typing import NamedTuple

from pgjobs import tags, tracing, uniqueness
from pgjobs.enqueue.checks import handler_arguments, payload_text
from pgjobs.errors import ConfigurationError, PgjobsError, UnknownTask
from pgjobs.submission import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    JobSpec,
    Ref,
    after_names,
    check_after,
    check_key,
    check_max_attempts,
    check_moment,
    check_name,
    check_priority,
    check_seconds,
)
from pgjobs.tags import Tags
from pgjobs.tasks import Task

#: The options of a ``JobSpec`` that gives only a task and a payload.
_PLAIN_OPTIONS = JobSpec("")[2:]
#: Builds a named tuple from a tuple of its fields, unchecked (``_make`` checks the length).
_new_row = tuple.__new__


class Shape(IntEnum):
    """How a job goes in, decided once by ``prepare``; a call of several jobs takes the
    largest of theirs (``of``)."""

    #: Ready now, never expiring, nothing but its task's columns: JOB_INSERT_READY (on the
    #: app's pool through libpq), JOB_INSERT_MANY, JOB_COPY_MANY_READY; group-committed.
    READY = 0
    #: A run time, an expiry, a payload version, a trace context or tags besides: JOB_INSERT,
    #: JOB_INSERT_MANY, JOB_COPY_MANY; group-committed too.
    PLAIN = 1
    #: An idempotency key, a group or a unique key: JOB_INSERT_KEYED.
    KEYED = 2
    #: Waits for other jobs (``after``): DEPENDENCY_INSERT, in one transaction with the check
    #: of its dependencies (``pgjobs.enqueue.waiting``).
    WAITING = 3
    #: Waits for other jobs and has a key or a group: JOB_INSERT_KEYED, then its edges
    #: (DEPENDENCY_ATTACH), in that transaction.
    WAITING_KEYED = 4

    @property
    def keyed(self) -> bool:
        """Whether the job has an idempotency key, a group or a unique key."""
        return self in (Shape.KEYED, Shape.WAITING_KEYED)

    @classmethod
    def of(cls, rows: Iterable[PreparedJob]) -> Shape:
        """The shape of a call of ``rows`` (at least one): the largest of theirs."""
        return max(row.shape for row in rows)


#: What may share one statement and one commit with other callers' jobs (the group commit).
SHARED = Shape.PLAIN


class PreparedJob(NamedTuple):
    """A validated job, ready to bind; its first fields in the order of
    ``uniqueness.KEYED_PARAMS``."""

    queue: str
    task: str
    payload: str
    priority: int
    run_at: datetime | None
    run_in: float
    max_attempts: int
    expires_at: datetime | None
    #: Seconds from the insert's now(), the database's clock (never the producer's): the
    #: statement computes expires_at from it.
    expires_in: float | None
    idempotency_key: str | None
    #: The task's payload version when it declares one above 1 (None is version 1).
    payload_version: int | None = None
    #: The enqueuing span's W3C trace context as JSON text, when tracing (``pgjobs.tracing``).
    trace_context: str | None = None
    # A job with a group or a unique key (pgjobs.uniqueness.Keys; all None for a plain job): the
    # fields after trace_context are in the order of uniqueness.KEYED_PARAMS.
    group_key: str | None = None
    unique_key: str | None = None
    on_conflict: str | None = None
    debounce: float | None = None
    throttle: float | None = None
    #: Its tags (``pgjobs.tags``), None for none: only then do the tagged statements apply.
    tags: Tags | None = None
    #: The jobs it waits for (``submission.check_after``).
    after: tuple[int | Ref, ...] | None = None
    #: The names it gave them (``after={"charge": 41}``; ``submission.after_names``).
    after_names: tuple[tuple[str, int | Ref], ...] | None = None
    #: How it goes in, decided by ``prepare`` from the fields above.
    shape: Shape = Shape.READY


def prepare(
    spec: JobSpec, tasks: Mapping[str, Task] | None, *, complete: bool = False
) -> PreparedJob:
    """Validate ``spec`` and resolve its defaults; raises a ``PgjobsError`` naming the problem.

    ``tasks`` is the app's registry; when it is given and not empty, unknown task names are refused.
    ``complete``: the payload must also call its registered handler (``handler_arguments``, the
    check of the CLI, ``eager()`` and the HTTP API).
    """
    name = check_name("task", spec.task)  # in NFC, as tasks are registered
    task = tasks.get(name) if tasks else None
    if tasks and task is None:
        raise UnknownTask(
            f"unknown task {name!r}: the app registers {', '.join(sorted(tasks))}",
            field="task",
        )
    text = payload_text(spec.payload, task)
    if complete and task is not None:
        handler_arguments(task, json.loads(text))
    # Options left unset take the task's values, which were checked when it was registered.
    if spec.queue is None:
        queue = task.queue if task else DEFAULT_QUEUE
    else:
        queue = check_name("queue", spec.queue)
    priority = check_priority(spec.priority)
    if spec.run_at is not None and spec.run_in is not None:
        raise ConfigurationError("give run_at or run_in, not both", field="run_in")
    run_at = None if spec.run_at is None else check_moment("run_at", spec.run_at)
    run_in = 0.0 if spec.run_in is None else check_seconds("run_in", spec.run_in)
    if spec.max_attempts is None:
        max_attempts = task.max_attempts if task else DEFAULT_MAX_ATTEMPTS
    else:
        max_attempts = spec.max_attempts
        check_max_attempts(max_attempts)
    if spec.expires_at is not None and spec.expires_in is not None:
        raise ConfigurationError("give expires_at or expires_in, not both", field="expires_in")
    expires_at = None if spec.expires_at is None else check_moment("expires_at", spec.expires_at)
    expires_in = None if spec.expires_in is None else check_seconds("expires_in", spec.expires_in)
    key = None if spec.idempotency_key is None else check_key(spec.idempotency_key)
    version = task.version if task is not None and task.version != 1 else None
    keys = uniqueness.check(spec, task)
    trace = tracing.publish(name, queue) if tracing.enabled() else None
    after = None if spec.after is None else check_after(spec.after)
    tagged = tags.check(spec.tags)
    keyed = key is not None or keys.group_key is not None or keys.unique_key is not None
    usual = run_at is None and not run_in and expires_at is None and expires_in is None
    shape = _shape(keyed, bool(after), usual and version is None and trace is None and not tagged)
    return PreparedJob(
        queue,
        name,
        text,
        priority,
        run_at,
        run_in,
        max_attempts,
        expires_at,
        expires_in,
        key,
        version,
        trace,
        *keys,
        tagged,
        after,
        None if spec.after is None else after_names(spec.after),
        shape,
    )


def _shape(keyed: bool, waits: bool, usual: bool) -> Shape:
    """The shape of a job with a key, group or unique key (``keyed``), dependencies (``waits``),
    or nothing but its task's columns (``usual``)."""
    if waits:
        return Shape.WAITING_KEYED if keyed else Shape.WAITING
    if keyed:
        return Shape.KEYED
    return Shape.READY if usual else Shape.PLAIN


def prepare_many(
    specs: Iterable[JobSpec], tasks: Mapping[str, Task] | None, *, complete: bool = False
) -> list[PreparedJob]:
    """``prepare`` every spec; the first invalid one raises, naming its position (in the message,
    and in ``field`` as ``jobs[position].field``). Anything but a ``JobSpec`` is invalid."""
    if isinstance(specs, str | bytes | Mapping | JobSpec) or not isinstance(specs, Iterable):
        raise ConfigurationError(
            f"jobs must be an iterable of JobSpec, got {type(specs).__name__}", field="jobs"
        )
    rows = []
    # A spec with nothing but a task and a payload (most of a bulk enqueue) takes its task's
    # defaults, resolved once per task name in this call: then only its payload is checked.
    plain: dict[str, tuple[PreparedJob, Task | None]] = {}
    traced = tracing.enabled()
    for position, spec in enumerate(specs):
        try:
            if not isinstance(spec, JobSpec):
                raise ConfigurationError(
                    f"expected a JobSpec, got {type(spec).__name__}; "
                    "build each job as JobSpec(task, payload, ...)"
                )
            if traced or spec[2:] != _PLAIN_OPTIONS:
                rows.append(prepare(spec, tasks, complete=complete))
                continue
            known = plain.get(spec.task)
            if known is None:
                row = prepare(spec, tasks, complete=complete)
                plain[spec.task] = (row, tasks.get(row.task) if tasks else None)
                rows.append(row)
                continue
            row, task = known
            text = payload_text(spec.payload, task)
            if complete and task is not None:
                handler_arguments(task, json.loads(text))
            rows.append(_new_row(PreparedJob, (row[0], row[1], text, *row[3:])))
        except PgjobsError as exc:
            where = f"jobs[{position}]" + (f".{exc.field}" if exc.field else "")
            raise type(exc)(f"job #{position}: {exc}", field=where) from None
    return rows
