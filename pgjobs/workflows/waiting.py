"""What a workflow waits for without holding a worker slot: an event (``ctx.wait_for``) and its
children (``ctx.run``, ``ctx.map``).

Each wait is a place of the history (kind ``event`` or ``children``), decided in one transaction
that first locks the workflow's own row in ``queued_jobs``, fenced by the run's lease: the event
is taken, or the children are found ended, or the job gives its slot back in that same
transaction (its attempt refunded) and the run ends with ``WorkflowSuspended(settled=True)``,
which leaves the worker nothing to send. A sender of the event, and the last child's end, lock
the same rows, so whichever comes second sees the first: nothing is missed, and nothing polls.
An async workflow's waits run this on a thread, on the app's sync pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from pgjobs import db, events, queries
from pgjobs.errors import (
    ChildFailed,
    ConfigurationError,
    EventTimeout,
    InvalidPayload,
    UnknownTask,
    WorkflowDiverged,
    WorkflowError,
    WorkflowSuspended,
)
from pgjobs.models import Job
from pgjobs.submission import JobSpec
from pgjobs.workflow_entries import WorkflowEntryKind, WorkflowEntryStatus
from pgjobs.workflows.history import Entry, WorkflowLeaseLost

if TYPE_CHECKING:
    from pgjobs.context import JobContext
    from pgjobs.pools import Pools


class _Run(Protocol):
    """What the waits read of the run (``pgjobs.workflows.context.Run``)."""

    job: JobContext
    app: Any

    def require_active(self, method: str) -> None: ...

    def place(self, kind: str, name: str) -> tuple[int, Entry | None]: ...

    def where(self) -> str: ...


#: The longest a wait for an event may last (ten years, in seconds), as a sleep.
MAX_WAIT = 10 * 366 * 86_400.0
#: The most children one ``ctx.map`` enqueues: their ids are kept in its history entry.
MAX_CHILDREN = 100_000

EVENT = WorkflowEntryKind.EVENT.value
CHILDREN = WorkflowEntryKind.CHILDREN.value
_WAITING = WorkflowEntryStatus.WAITING.value
_DONE = WorkflowEntryStatus.DONE.value
_FAILED = WorkflowEntryStatus.FAILED.value
#: A suspended job's run time when nothing but a wake makes it ready.
_FOREVER = "infinity"


def wait_seconds(timeout: object) -> float | None:
    """``wait_for``'s timeout: seconds from 0 to ten years, or None (wait as long as it takes)."""
    if timeout is None:
        return None
    value = math.nan
    if isinstance(timeout, int | float) and not isinstance(timeout, bool):
        try:
            value = float(timeout)
        except OverflowError:
            value = math.inf
    if not 0 <= value <= MAX_WAIT:
        raise WorkflowError(
            f"ctx.wait_for's timeout is seconds from 0 to {MAX_WAIT:.0f} (ten years), or None, "
            f"got {timeout!r:.40}",
            field="timeout",
        )
    return value


def event_name(name: object) -> str:
    """An event's name as ``app.send_event`` checks it; a ``WorkflowError`` otherwise."""
    try:
        return events.check_event_name(name)
    except ConfigurationError as exc:
        raise WorkflowError(f"ctx.wait_for: {exc}", field="name") from None


@dataclass(frozen=True, slots=True)
class Spawn:
    """The children of one ``ctx.map`` (or ``ctx.run``), checked before anything is written."""

    task: str
    specs: list[JobSpec]


def spawn_of(task: Any, payloads: object, options: dict[str, Any]) -> Spawn:
    """``ctx.map``'s arguments checked: a task (a name or a ``Task``), an iterable of payload
    dicts (at most ``MAX_CHILDREN``), and ``enqueue``'s options but ``after``,
    ``idempotency_key`` and ``connection`` (the children are written in the workflow's own
    transaction, once: its place in the history names them)."""
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise WorkflowError(f"ctx.map's task is a task or its name, got {task!r:.60}")
    for refused in ("after", "idempotency_key", "batch", "connection"):
        if refused in options:
            raise WorkflowError(
                f"ctx.map and ctx.run take enqueue's options but {refused!r}: the children are "
                "enqueued once, in the workflow's own transaction, at its place in the history",
                field=refused,
            )
    if isinstance(payloads, str | bytes | dict) or not isinstance(payloads, Iterable):
        raise WorkflowError(
            f"ctx.map's payloads are an iterable of payload dicts, got {type(payloads).__name__}",
            field="payloads",
        )
    specs: list[JobSpec] = []
    for payload in payloads:
        if len(specs) == MAX_CHILDREN:
            raise WorkflowError(
                f"ctx.map enqueues at most {MAX_CHILDREN:,} children at once; split the work",
                field="payloads",
            )
        try:
            specs.append(JobSpec(name, payload, **options))
        except TypeError as exc:
            raise WorkflowError(f"ctx.map: {exc}") from None
    return Spawn(name, specs)


class Waits:
    """How one run of a workflow waits: on the app's sync pool (``pools``), enqueueing its
    children through ``app``. ``where`` names the workflow in messages."""

    def __init__(self, job: Job, pools: Pools, app: Any, where: str) -> None:
        self.job = job
        self.pools = pools
        self.app = app
        self.where = where

    def wait_for(self, seq: int, entry: Entry | None, name: str, timeout: float | None) -> Any:
        """The payload of event ``name`` for the place ``seq`` (``entry``: what the history
        holds there)."""
        if entry is not None and entry.status != _WAITING:
            if entry.done:
                return entry.result
            raise EventTimeout(name, f"{self.where}: {entry.error}")
        job = self.job
        timed_out = None
        with self._locked() as conn:
            taken = events.take(conn, job_id=job.id, name=name)
            if taken is not None:
                self._record(conn, seq, EVENT, name, _DONE, result=taken.payload)
                return taken.payload
            due, until = self._record(conn, seq, EVENT, name, _WAITING, seconds=timeout)
            if due:
                timed_out = f"no event {name!r} came within the wait's timeout"
                self._record(conn, seq, EVENT, name, _FAILED, error=timed_out)
                events.give_up(conn, job_id=job.id, name=name)
            else:
                self._suspend(conn, name, until if until is not None else _FOREVER)
        if timed_out is not None:
            raise EventTimeout(name, f"{self.where}: {timed_out}")
        raise WorkflowSuspended(0, settled=True)

    def map(self, seq: int, entry: Entry | None, spawn: Spawn) -> list[Any]:
        """The results of the children of the place ``seq``, in order: enqueued (and the run
        suspended) the first time, collected once all have ended."""
        if entry is None or not entry.done:
            with self._locked() as conn:
                if entry is None:
                    batch_id, ids = self._spawn(conn, spawn)
                    record = {"batch": batch_id, "ids": ids}
                    self._record(conn, seq, CHILDREN, spawn.task, _WAITING, result=record)
                else:
                    batch_id, ids = int(entry.result["batch"]), list(entry.result["ids"])
                row = conn.execute(queries.CHILDREN_PENDING, {"batch_id": batch_id}).fetchone()
                if row is not None and int(row[0]) > 0:
                    self._suspend(conn, None, _FOREVER)
                    raise WorkflowSuspended(0, settled=True)
                self._record(conn, seq, CHILDREN, spawn.task, _DONE)
        else:
            ids = list(entry.result["ids"])
        with self.pools.sync().connection() as conn, db.translate_errors(self.pools.dsn):
            ends = conn.execute(queries.CHILDREN_ENDS, {"ids": ids}).fetchall()
        return self._results(ends, ids)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on a pooled connection that holds the job's own row, fenced by the
        run's lease (``WorkflowLeaseLost`` when it no longer holds the job). A
        ``WorkflowSuspended`` raised inside ends the wait as decided: its writes commit."""
        job = self.job
        suspended = False
        with (
            self.pools.sync().connection() as conn,
            db.translate_errors(self.pools.dsn),
            conn.transaction(),
        ):
            if not events.lock_own(
                conn, job_id=job.id, worker=str(job.lease_owner), attempt=job.attempts
            ):
                raise WorkflowLeaseLost(
                    f"{self.where}: this run no longer holds the job's lease; it waits for nothing"
                )
            try:
                yield conn
            except WorkflowSuspended:
                suspended = True
        if suspended:
            raise WorkflowSuspended(0, settled=True)

    def _suspend(self, conn: psycopg.Connection[Any], name: str | None, until: Any) -> None:
        job = self.job
        events.suspend(
            conn,
            job_id=job.id,
            worker=str(job.lease_owner),
            attempt=job.attempts,
            name=name,
            until=until,
        )

    def _spawn(self, conn: psycopg.Connection[Any], spawn: Spawn) -> tuple[int, list[int]]:
        """The children enqueued as one batch (without a callback) whose parent is this job, in
        the workflow's transaction: none can start before it commits."""
        try:
            batch = self.app.batch(connection=conn)
            with batch:
                ids = self.app.enqueue_many(spawn.specs, connection=conn, batch=batch)
        except (ConfigurationError, InvalidPayload, UnknownTask) as exc:
            raise WorkflowError(f"ctx.map({spawn.task!r}): {exc}", field=exc.field) from None
        conn.execute(queries.CHILDREN_ADOPT, {"job_id": self.job.id, "batch_id": batch.id})
        return int(batch.id), [int(i) for i in ids]

    def _record(
        self,
        conn: psycopg.Connection[Any],
        seq: int,
        kind: str,
        name: str,
        status: str,
        *,
        result: Any = None,
        error: str | None = None,
        seconds: float | None = None,
    ) -> tuple[bool, str | None]:
        """Record the wait at ``seq``; returns whether its deadline has passed, and the deadline
        as PostgreSQL spells it (``infinity`` included, which no datetime holds)."""
        params = {
            "job_id": self.job.id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "status": status,
            "result": None if result is None else json.dumps(result),
            "error": error,
            "error_type": "pgjobs.errors.EventTimeout" if error else None,
            # No deadline: NULL (the history reads wake_at - now(), which infinity would break).
            "until": None,
            "seconds": seconds,
        }
        row = conn.execute(queries.WORKFLOW_WAIT_RECORD, params).fetchone()
        if row is None:
            raise WorkflowDiverged(
                f"{self.where} diverged at entry {seq}: another entry is recorded there than "
                f"this {kind} {name!r}"
            )
        return bool(row[1]), row[2]

    def _results(self, ends: Sequence[Sequence[Any]], ids: Sequence[int]) -> list[Any]:
        """The children's results in order; ``ChildFailed`` when any did not succeed."""
        results: list[Any] = []
        failures: list[tuple[int, int, str, str | None]] = []
        for (position, home, status, result, error, _type), child in zip(ends, ids, strict=True):
            if home is None or home == "queued_jobs":
                state = "still queued" if home else "in no table (pruned with the archive)"
                raise WorkflowError(f"{self.where}: child job {child} is {state}")
            results.append(result if status == "succeeded" else None)
            if status != "succeeded":
                failures.append((int(position) - 1, int(child), str(status), error))
        if failures:
            position, child, status, error = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise ChildFailed(
                f"{self.where}: child {position} (job {child}) ended {status}: {error}{more}",
                failures,
                results,
            )
        return results


class WaitingMethods:
    """``WorkflowContext``'s waits: ``wait_for``, ``run`` and ``map`` (awaitable in an async
    workflow). A mixin: the context holds the run (``_run``), its store and whether it is async."""

    __slots__ = ()
    _run: _Run
    _store: Any
    _async: bool

    def wait_for(self, name: str, *, timeout: float | None = None) -> Any:
        """Suspend the workflow until event ``name`` comes (``app.send_event``, ``pgjobs event
        send``, ``POST /api/v1/jobs/{id}/events/{name}``) and return its payload: at once when
        it came before. ``timeout``: seconds (None: as long as it takes), after which
        ``pgjobs.EventTimeout`` is raised. The slot is given back while it waits."""
        run = self._run
        run.require_active("wait_for")
        name = event_name(name)
        seconds = wait_seconds(timeout)
        seq, entry = run.place(EVENT, name)
        waits = self._waits()
        if self._async:
            return asyncio.to_thread(waits.wait_for, seq, entry, name, seconds)
        return waits.wait_for(seq, entry, name, seconds)

    def map(self, task: Any, payloads: Iterable[dict[str, Any]], **options: Any) -> Any:
        """Enqueue one child job of ``task`` per payload (with ``enqueue``'s options), suspend
        the workflow until all have ended, and return their results in order. A child that
        did not succeed raises ``pgjobs.ChildFailed`` (catchable; its ``results`` hold the
        others'). The children are enqueued once, however often the workflow runs again."""
        run = self._run
        run.require_active("map")
        spawn = spawn_of(task, payloads, options)
        seq, entry = run.place(CHILDREN, spawn.task)
        waits = self._waits()
        if self._async:
            return asyncio.to_thread(waits.map, seq, entry, spawn)
        return waits.map(seq, entry, spawn)

    def run(self, task: Any, payload: dict[str, Any] | None = None, **options: Any) -> Any:
        """``map`` of one child: its result (``pgjobs.ChildFailed`` when it did not succeed)."""
        results = self.map(task, [{} if payload is None else payload], **options)
        if self._async:
            return _first(results)
        return results[0]

    def _waits(self) -> Waits:
        run = self._run
        if run.app is None:
            raise WorkflowError(f"{run.where()}: waits need the App that declared the workflow")
        return Waits(run.job.job, self._store.pools, run.app, run.where())


async def _first(results: Any) -> Any:
    return (await results)[0]
