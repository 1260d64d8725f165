"""Batches: many jobs, and one callback job enqueued once when every one of them has ended.

A batch is written in one transaction (``pgjobs.enqueue.door.batch_plan``): its row in
``pgjobs_batches``, its members (by the statements their shapes need, as any enqueue: the many-row
insert, COPY for many, the keyed insert for keys, the dependencies' insert for members ``after``
others, each row with the batch's id), and its seal, which counts the members it wrote. From then
on the trigger ``pgjobs_job_ended`` (migration 0013) counts each member's first end (succeeded,
dead, cancelled or expired; a redriven member's second end is not counted again) under the batch
row's lock, so that the member that ends last, whichever worker ends it, enqueues the callback,
and only it.

The callback's payload is the one given with a ``"batch"`` key added:
``{"id": ..., "total": ..., "succeeded": ..., "dead": ..., "cancelled": ...}`` (cancelled counts
expired members too). A batch that wrote no member (none given, or each one's key held by an
existing job) is complete at once: its callback is enqueued with counts of 0.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from pgjobs import db, enqueue, queries
from pgjobs.enqueue import PreparedJob
from pgjobs.errors import BatchNotFound, ConfigurationError, InvalidPayload, PgjobsError
from pgjobs.submission import MAX_JOB_ID, JobSpec, Ref
from pgjobs.tasks import Task

#: The key of the callback's payload that holds the batch's id and counts.
BATCH_KEY = "batch"

#: Member ids per status ``members`` returns (the batch page's links).
MEMBERS_SHOWN = 100

# What the trigger adds to the callback's payload, as the callback's handler is checked against
# when the batch is declared (its types: ints).
_SAMPLE = {"id": 1, "total": 1, "succeeded": 1, "dead": 0, "cancelled": 0}

# JobSpec's fields that a callback cannot have (pgjobs_batches stores queue, priority and
# max_attempts).
_NOT_FOR_CALLBACK = (
    "run_at",
    "run_in",
    "expires_at",
    "expires_in",
    "idempotency_key",
    "group",
    "unique_key",
    "on_conflict",
    "debounce",
)

#: What ``App.batch(on_complete=...)`` takes: a task (name or ``Task``), a (task, payload) pair,
#: a ``JobSpec`` (for the callback's queue, priority or max_attempts), or None (no callback).
OnComplete = str | Task | tuple[str | Task, dict[str, Any] | None] | JobSpec | None


class Callback(NamedTuple):
    """A batch's callback, checked and resolved (``BATCH_INSERT``'s parameters)."""

    task: str
    queue: str
    payload: str
    priority: int
    max_attempts: int
    payload_version: int | None


_NO_CALLBACK = {
    "task": None,
    "queue": None,
    "payload": None,
    "priority": None,
    "max_attempts": None,
    "payload_version": None,
}


def callback(on_complete: OnComplete, tasks: Mapping[str, Task] | None) -> Callback | None:
    """``on_complete`` checked as ``enqueue.prepare`` checks a job (its queue, priority and
    max_attempts default to its task's), and, when its task is registered, its handler checked
    to take the payload with the ``"batch"`` key the trigger adds (declare a ``batch``
    parameter, or a field of the handler's model). Raises a ``PgjobsError`` naming
    ``on_complete``.

    Example: ``callback(("reports.summarise", {"report": 7}), app.tasks)``
    """
    if on_complete is None:
        return None
    spec = _spec(on_complete)
    for field in _NOT_FOR_CALLBACK:
        if getattr(spec, field) is not None:
            raise ConfigurationError(
                f"on_complete: a batch's callback takes queue, priority and max_attempts, not "
                f"{field}",
                field=f"on_complete.{field}",
            )
    payload = {} if spec.payload is None else spec.payload
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"on_complete: the payload must be a JSON object (a dict), got "
            f"{type(payload).__name__}",
            field="on_complete.payload",
        )
    if BATCH_KEY in payload:
        raise ConfigurationError(
            f"on_complete: the payload has a {BATCH_KEY!r} key, which the callback gets from the "
            "batch (its id and counts); rename it",
            field="on_complete.payload",
        )
    try:
        # Checked with the key the trigger adds, as the worker will see it; stored without.
        row = enqueue.prepare(spec._replace(payload=payload | {BATCH_KEY: _SAMPLE}), tasks)
        task = tasks.get(row.task) if tasks else None
        if task is not None:
            enqueue.handler_arguments(task, json.loads(row.payload))
    except PgjobsError as exc:
        field = "on_complete" + (f".{exc.field}" if exc.field else "")
        raise type(exc)(f"on_complete: {exc}", field=field) from None
    stored = json.loads(row.payload)
    del stored[BATCH_KEY]
    text = json.dumps(stored, separators=(",", ":"))
    return Callback(row.task, row.queue, text, row.priority, row.max_attempts, row.payload_version)


def _spec(on_complete: OnComplete) -> JobSpec:
    if isinstance(on_complete, JobSpec):
        return on_complete
    if isinstance(on_complete, str | Task):
        return JobSpec(_name(on_complete))
    if isinstance(on_complete, tuple) and len(on_complete) == 2:
        task, payload = on_complete
        if isinstance(task, str | Task):
            return JobSpec(_name(task), payload)
    raise ConfigurationError(
        "on_complete must be a task (name or Task), a (task, payload) pair, a JobSpec or None, "
        f"got {type(on_complete).__name__}",
        field="on_complete",
    )


def _name(task: str | Task) -> str:
    return task.name if isinstance(task, Task) else task


class Batch:
    """Jobs enqueued together, and the callback enqueued once when all of them have ended.

    Made by ``App.batch``; members are collected by ``enqueue`` (checked at once) and written
    with the batch, in one transaction, when the ``with`` block ends without an exception (an
    exception writes nothing), or by ``App.enqueue_many(specs, batch=batch)``. A batch is
    written once. Then ``id`` is the batch's id and ``ids`` its members' ids in the order they
    were given (for a key already held, the holder's id: that job is not a member).

    Example::

        with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
            for page in pages:
                batch.enqueue("reports.render", {"page": page})
        print(batch.id, batch.ids)
    """

    def __init__(
        self,
        callback: Callback | None,
        tasks: Mapping[str, Task] | None,
        write: Callable[[Batch, Any], None],
        connection: Any = None,
        write_async: Callable[[Batch, Any], Awaitable[None]] | None = None,
    ) -> None:
        self.callback = callback
        self.connection = connection
        self._tasks = tasks
        self._write = write
        self._write_async = write_async
        self._rows: list[PreparedJob] = []
        self._id: int | None = None
        self._ids: list[int] = []

    def enqueue(
        self, task: str | Task, payload: dict[str, Any] | None = None, **options: Any
    ) -> None:
        """Add a member: the arguments and options of ``App.enqueue`` (a ``PgjobsError`` at
        once for a bad one). It is written when the batch is. ``after`` may name the batch's
        member n, listed before it, as ``Ref(n)``.

        Example: ``batch.enqueue("reports.render", {"page": 3}, priority=5)``
        """
        self._check_open()
        try:
            spec = JobSpec(_name(task), payload, **options)
        except TypeError:
            raise ConfigurationError(
                f"Batch.enqueue takes the options of App.enqueue, got {', '.join(options)}"
            ) from None
        self._rows.append(enqueue.prepare(spec, self._tasks))

    def add(self, specs: Iterable[JobSpec]) -> None:
        """Add members as ``JobSpec`` (``App.enqueue_many(specs, batch=...)``)."""
        self._check_open()
        rows = enqueue.prepare_many(specs, self._tasks)
        # Every row checked before any is added: a refused call adds none.
        first = len(self._rows)
        self._rows.extend([_member(row, first) for row in rows])

    @property
    def id(self) -> int:
        """The batch's id, once written (``ConfigurationError`` before)."""
        if self._id is None:
            raise ConfigurationError("the batch is not written yet: its id is known after it is")
        return self._id

    @property
    def ids(self) -> list[int]:
        """The members' ids in the order given, once written."""
        return [] if self.id is None else list(self._ids)

    @property
    def rows(self) -> list[PreparedJob]:
        """The members collected so far, checked."""
        return self._rows

    def written(self, batch_id: int, ids: list[int]) -> None:
        """Record what writing the batch returned."""
        self._id, self._ids = batch_id, ids

    def _check_open(self) -> None:
        if self._id is not None:
            raise ConfigurationError(f"batch {self._id} is written already; start another")

    def __enter__(self) -> Batch:
        self._check_open()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        # Written in the block already (by enqueue_many(..., batch=)): not written again.
        if kind is None and self._id is None:
            self._write(self, self.connection)

    async def __aenter__(self) -> Batch:
        """``async with app.batch(...) as batch``: written without blocking the event loop, on
        the app's async pool or the caller's async connection."""
        return self.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None and self._id is None:
            if self._write_async is None:
                raise ConfigurationError("this batch is written by `with`, not `async with`")
            await self._write_async(self, self.connection)


def params(batch: Batch) -> dict[str, Any]:
    """``BATCH_INSERT``'s parameters for ``batch``: its callback's, or NULLs."""
    return _NO_CALLBACK if batch.callback is None else batch.callback._asdict()


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A batch as ``app.batch_status`` and ``pgjobs batch show`` read it.

    ``succeeded``, ``dead`` and ``cancelled`` (cancelled or expired) count each member's first
    end, as the callback's payload does; ``members`` counts the members by their status now
    (a redriven member is counted where it is now), read from the three tables.

    Example::

        status = app.batch_status(batch.id)
        if status.complete:
            print(status.succeeded, "of", status.total, "succeeded")
    """

    id: int
    total: int
    #: Members that have not ended yet.
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    created_at: datetime
    #: When the last member ended (None: not yet).
    completed_at: datetime | None
    #: The callback's task and queue (None: the batch has no callback).
    callback_task: str | None
    callback_queue: str | None
    #: The callback job, once enqueued.
    callback_job_id: int | None
    #: Members per status (``JobStatus`` values) now, statuses with none left out.
    members: dict[str, int]

    @property
    def complete(self) -> bool:
        """Whether every member has ended."""
        return self.completed_at is not None


# BATCH_STATUS's columns before the members' counts.
_STATUS_COLUMNS = tuple(BatchStatus.__dataclass_fields__)[:-1]


def check_id(batch_id: object) -> int:
    """A batch id as given: a whole number in 1..2**63-1, else ``ConfigurationError``."""
    if (
        isinstance(batch_id, bool)
        or not isinstance(batch_id, int)
        or not 0 < batch_id <= MAX_JOB_ID
    ):
        raise ConfigurationError(
            f"a batch id is a whole number in 1..{MAX_JOB_ID}, got {batch_id!r}", field="id"
        )
    return batch_id


def status(target: db.Target, batch_id: int) -> BatchStatus:
    """Batch ``batch_id``'s counts, callback and members by status; ``BatchNotFound`` for an
    unknown id.

    Example: ``batches.status(dsn, 7).pending``
    """
    check_id(batch_id)
    with db.target_connection(target) as conn:
        row = conn.execute(queries.BATCH_STATUS, {"id": batch_id}).fetchone()
    if row is None:
        raise BatchNotFound(f"no batch {batch_id} (never created, or its id is mistyped)")
    values = dict(zip(_STATUS_COLUMNS, row[:-1], strict=True))
    return BatchStatus(**values, members=dict(row[-1]))


def members(target: db.Target, batch_id: int, limit: int = MEMBERS_SHOWN) -> dict[str, list[int]]:
    """Up to ``limit`` member ids of batch ``batch_id`` per status, lowest first."""
    with db.target_connection(target) as conn:
        row = conn.execute(queries.BATCH_MEMBERS, {"id": batch_id, "limit": limit}).fetchone()
    return {} if row is None else dict(row[0])


def batch_of(target: db.Target, job_id: int) -> int | None:
    """The batch job ``job_id`` is a member of, or None."""
    with db.target_connection(target) as conn:
        row = conn.execute(queries.BATCH_OF_JOB, {"id": job_id}).fetchone()
    return None if row is None else int(row[0])


def _member(row: PreparedJob, first: int = 0) -> PreparedJob:
    """``row`` as a batch member; ``first``: the position in the batch of the call's first job,
    so that a ``Ref(n)`` of an ``enqueue_many(..., batch=)`` names that call's job n (a
    ``batch.enqueue``'s names the batch's member n)."""
    if not first or not row.after:
        return row
    moved = tuple(Ref(d.position + first) if isinstance(d, Ref) else d for d in row.after)
    return row._replace(after=moved)
