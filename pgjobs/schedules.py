"""Periodic schedules (``@app.periodic``) by name, in the database: list them, pause and resume
them, run one now, forget one. `pgjobs schedule` and ``/api/v1/schedules`` call these.

A paused schedule enqueues nothing: the scheduler of every worker skips it
(``queries.SCHEDULE_LOCK_DUE``) from its next round on, and its row stays (a worker that still
declares it keeps it paused; a declaration never resumes it). When it is resumed, the
occurrences it missed while paused are due at once and its ``catch_up`` rule decides how many
run, as for occurrences missed while no worker ran: ``"last"`` (the default) runs the latest one,
``"skip"`` none, N the latest N. Pause a schedule declared with ``catch_up="skip"`` to have a
resume run nothing until its next occurrence.

Like ``pgjobs.queues``, every function takes a ``Dsn`` (a connection is opened and closed) or a
psycopg connection of the caller (the change is then a savepoint of the caller's transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError, ScheduleNotDeclared, ScheduleNotFound
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import ScheduleInfo
from pgjobs.periodic import Periodic
from pgjobs.submission import JobSpec, check_name, check_note

Target = db.Target


@dataclass(frozen=True, slots=True)
class ScheduleChange:
    """What a pause or resume did: the schedule as it is now, and whether this call changed it
    (False: it was already paused, or not paused)."""

    schedule: ScheduleInfo
    changed: bool


def pause(
    target: Target, name: str, *, reason: str | None = None, by: str | None = None
) -> ScheduleChange:
    """Pause schedule ``name``: none of its occurrences is enqueued until it is resumed.
    Pausing a paused schedule keeps when and by whom it was paused. ``by`` defaults to the
    database role; ``reason`` is recorded after it (``paused_by`` is "by: reason"). An unknown
    name is a ``ConfigurationError``, and nothing changes.

    Example: ``pause(dsn, "reports.hourly", reason="warehouse migration").changed``
    """
    name = _check(name)
    for option, value in (("reason", reason), ("by", by)):
        check_note(option, value)
    params = {"name": name, "by": by, "reason": reason or None}
    with db.target_connection(target) as conn, conn.transaction():
        rows = db.fetch_all(conn, queries.SCHEDULE_PAUSE, params)
        if not rows:
            raise _unknown(name)
        return ScheduleChange(_get(conn, name), bool(rows[0][0]))


def resume(target: Target, name: str) -> ScheduleChange:
    """Resume schedule ``name``: from the scheduler's next round on, its occurrences are
    enqueued again, those missed while paused as its ``catch_up`` rule says. Resuming a
    schedule that is not paused changes nothing (``changed`` is False); an unknown name is a
    ``ConfigurationError``.

    Example: ``resume(dsn, "reports.hourly")``
    """
    name = _check(name)
    with db.target_connection(target) as conn, conn.transaction():
        rows = db.fetch_all(conn, queries.SCHEDULE_RESUME, {"name": name})
        if not rows:
            raise _unknown(name)
        return ScheduleChange(_get(conn, name), bool(rows[0][0]))


def schedule(target: Target, name: str) -> ScheduleInfo:
    """Schedule ``name`` as the database records it; ``ConfigurationError`` when there is none.

    Example: ``schedule(dsn, "reports.hourly").paused``
    """
    name = _check(name)
    with db.target_connection(target) as conn:
        return _get(conn, name)


def list_schedules(target: Target) -> list[ScheduleInfo]:
    """Every schedule the database records, by name. ``declared`` is False for one no worker
    declared within ``STALE_AFTER`` seconds (nothing enqueues it then).

    Example: ``[s.name for s in list_schedules(dsn) if s.paused]``
    """
    with db.target_connection(target) as conn, db.translate_errors():
        rows = db.fetch_all(conn, queries.SCHEDULE_LIST, {"stale_after": STALE_AFTER})
    return [db.schedule_info_from_row(row) for row in rows]


#: How ``run_now`` enqueues: ``App.enqueue_many`` (the task's defaults, the payload checked),
#: on the caller's connection.
EnqueueMany = Callable[..., list[int]]


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """What ``run_now`` did: the schedule (None when the database does not record it yet: no
    worker declared it so far) and the job it enqueued."""

    name: str
    job_id: int
    schedule: ScheduleInfo | None


def run_now(
    target: Target,
    name: str,
    declared: Mapping[str, Periodic],
    enqueue_many: EnqueueMany,
) -> ScheduleRun:
    """Enqueue one job of schedule ``name`` now, as its occurrences are (its task, payload,
    queue, priority, max attempts), ready at once and outside its cadence: its next occurrence
    stays where it is, and a paused schedule stays paused. ``declared`` are the app's schedules
    (``app.periodics``), which know the payload the database does not store; ``enqueue_many``
    enqueues it (``app.enqueue_many``). An unknown name is ``ScheduleNotFound``; a schedule
    the database records but ``declared`` lacks is ``ScheduleNotDeclared``; nothing is enqueued.

    Example: ``run_now(dsn, "reports.hourly", app.periodics, app.enqueue_many).job_id``
    """
    name = _check(name)
    periodic = declared.get(name)
    with db.target_connection(target) as conn:
        rows = db.fetch_all(conn, queries.SCHEDULE_GET, {"name": name, "stale_after": STALE_AFTER})
        recorded = db.schedule_info_from_row(rows[0]) if rows else None
        if periodic is None:
            if recorded is None:
                raise _unknown(name)
            raise ScheduleNotDeclared(
                f"schedule {name!r} is not declared by this app, so its payload is unknown here: "
                "give the app that declares it (--app; `pgjobs serve --app`)",
                field="name",
            )
        (job_id,) = enqueue_many(_job(periodic), connection=conn)
    return ScheduleRun(name, job_id, recorded)


def _job(periodic: Periodic) -> Iterable[JobSpec]:
    return [
        JobSpec(
            periodic.task,
            periodic.payload,
            queue=periodic.queue,
            priority=periodic.priority,
            max_attempts=periodic.max_attempts,
        )
    ]


def forget(target: Target, name: str) -> None:
    """Delete schedule ``name``'s row (its last run is forgotten). A worker that still declares
    it records it again, from its next occurrence. ``ScheduleNotFound`` when there is none.

    Example: ``forget(dsn, "reports.hourly")``
    """
    name = _check(name)
    with db.target_connection(target) as conn:
        if not db.fetch_all(conn, queries.SCHEDULE_DELETE, {"name": name}):
            raise _unknown(name)


def _get(conn: psycopg.Connection[Any], name: str) -> ScheduleInfo:
    rows = db.fetch_all(conn, queries.SCHEDULE_GET, {"name": name, "stale_after": STALE_AFTER})
    if not rows:
        raise _unknown(name)
    return db.schedule_info_from_row(rows[0])


def _check(name: str) -> str:
    try:
        return check_name("schedule", name)
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc), field="name") from None


def _unknown(name: str) -> ScheduleNotFound:
    return ScheduleNotFound(
        f"no schedule named {name!r} in the database (`pgjobs schedule` lists them)", field="name"
    )
