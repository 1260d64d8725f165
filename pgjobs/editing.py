"""Edit a queued job that is not running: its priority, run time, payload, max attempts and tags,
and the record of who changed which field, when, from what to what.

The CLI (`pgjobs job edit`), the HTTP API (``PATCH /api/v1/jobs/{id}``) and the dashboard's job
page all call ``edit``. One transaction: the job's row is locked without waiting
(``queries.JOB_EDIT_LOCK``, ``FOR UPDATE NOWAIT``), checked, changed and its edit recorded in
``pgjobs_job_edits``. A claim skips a row an edit holds and an edit refuses a row a claim holds or
a worker leased, so of an edit and a claim that race exactly one wins: the job runs either with
its old fields, the edit refused, or with its new ones.

What may be edited, and what is refused (``JobStateConflict``, ``JobNotFound`` or
``ConfigurationError``/``InvalidPayload`` naming the field; nothing is written):

- a job that is running (leased by a worker), or held by another transaction at that moment;
- a job that has finished (archived) or is dead (redrive it first), or an id no table holds;
- a payload that its handler could not be called with, checked as enqueue and the CLI's enqueue
  check it when the app is known (``tasks``): the stored payload then takes the task's payload
  version. Without the app only its form is checked (a JSON object within the limits) and it
  keeps the job's version;
- ``max_attempts`` not above the attempts the job has already spent (it could never run again).

A job waiting for its dependencies may be edited too; its new run time is the one it takes once
they have all succeeded (until then it stays waiting).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgjobs import admin, db, enqueue, queries
from pgjobs import tags as tag_checks
from pgjobs.errors import ConfigurationError, JobStateConflict, LockTimeout
from pgjobs.models import JobHistory
from pgjobs.submission import (
    JobSpec,
    check_max_attempts,
    check_moment,
    check_note,
    check_priority,
    check_seconds,
)
from pgjobs.tasks import Task

#: The fields an edit may change, in the order the record lists them.
FIELDS = ("priority", "run_at", "payload", "max_attempts", "tags")


@dataclass(frozen=True, slots=True)
class JobEdit:
    """One recorded edit of a job: when, by whom (the CLI's user@host or ``--by``, the HTTP
    principal, else the database role), and each changed field's ``{"old": ..., "new": ...}``
    (times as ISO 8601 text, tags as a list or null)."""

    id: int
    edited_at: datetime
    edited_by: str
    changes: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Edited:
    """What an edit did: the job as it is now, and the edit recorded (None when every value
    given was the job's already, so nothing changed and nothing was recorded)."""

    job: JobHistory
    edit: JobEdit | None


@dataclass(frozen=True, slots=True)
class _Locked:
    """The fields of the locked job, as JOB_EDIT_LOCK reads them."""

    task: str
    leased: bool
    attempts: int
    values: dict[str, Any]
    waiting: bool


def edit(
    target: db.Target,
    job_id: int,
    *,
    priority: int | None = None,
    run_at: datetime | None = None,
    run_in: float | timedelta | None = None,
    payload: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    tags: Sequence[str] | None = None,
    by: str | None = None,
    tasks: Mapping[str, Task] | None = None,
) -> Edited:
    """Change the given fields of queued job ``job_id`` (None: left as it is; ``tags=[]``
    removes its tags; ``run_in``: seconds from the database's now) and record the edit as
    ``by``. Refusals, and the check of the payload against ``tasks`` (the app's registry), are
    the module's. Returns the job and the edit.

    Example: ``editing.edit(dsn, 42, priority=7, by="ops@example.com").edit.changes``
    """
    given = _checked_input(priority, run_at, run_in, max_attempts, tags, by)
    if not given and payload is None:
        raise ConfigurationError(
            "nothing to edit: give at least one of priority, run_at (or run_in), payload, "
            "max_attempts, tags"
        )
    try:
        with db.target_connection(target) as conn, conn.transaction():
            locked = _lock(conn, job_id)
            if "run_in" in given:
                now = conn.execute(queries.DATABASE_NOW).fetchone()
                assert now is not None
                given["run_at"] = now[0] + timedelta(seconds=given.pop("run_in"))
            version = None
            if payload is not None and payload == locked.values["payload"]:
                given["payload"] = payload  # unchanged: not checked again, not recorded
            elif payload is not None:
                given["payload"], version = _checked_payload(locked, payload, tasks)
            _check_attempts(job_id, locked, given.get("max_attempts"))
            changes = _changes(locked.values, given)
            recorded = None
            if changes:
                row = conn.execute(
                    queries.JOB_EDIT_APPLY, _params(job_id, given, version, changes, by)
                ).fetchone()
                assert row is not None  # the row is locked and was not leased
                recorded = JobEdit(int(row[0]), row[1], "", changes)
    except LockTimeout:
        raise JobStateConflict(
            f"job {job_id} is held by another transaction right now (a worker claiming it, a "
            "cancel or another edit): nothing was changed; try again"
        ) from None
    found = admin.job(target, job_id)
    if recorded is not None:
        recorded = next(e for e in edits(target, job_id) if e.id == recorded.id)
    return Edited(found, recorded)


def edits(target: db.Target, job_id: int) -> tuple[JobEdit, ...]:
    """The recorded edits of job ``job_id``, oldest first (empty for a job never edited).

    Example: ``[e.edited_by for e in editing.edits(dsn, 42)]``
    """
    with db.target_connection(target) as conn:
        rows = conn.execute(queries.JOB_EDITS_OF, {"id": job_id}).fetchall()
    return tuple(JobEdit(int(i), at, by, _in_order(changes)) for i, at, by, changes in rows)


def _in_order(changes: dict[str, Any]) -> dict[str, Any]:
    """The fields of an edit in ``FIELDS``' order (jsonb keeps keys in an order of its own)."""
    rank = {name: n for n, name in enumerate(FIELDS)}
    return dict(sorted(changes.items(), key=lambda item: rank.get(item[0], len(rank))))


def forget_gone(target: db.Target) -> int:
    """Delete the edits of jobs no table holds any more (purged, pruned); returns how many.

    Example: ``editing.forget_gone(dsn)``
    """
    with db.target_connection(target) as conn:
        row = conn.execute(queries.JOB_EDITS_FORGET_GONE).fetchone()
    return 0 if row is None else int(row[0])


def _checked_input(
    priority: int | None,
    run_at: datetime | None,
    run_in: float | timedelta | None,
    max_attempts: int | None,
    tags: Sequence[str] | None,
    by: str | None,
) -> dict[str, Any]:
    """The fields given, checked as enqueue checks them (payload aside: it needs the job)."""
    check_note("by", by)
    given: dict[str, Any] = {}
    if priority is not None:
        given["priority"] = check_priority(priority)
    if run_at is not None and run_in is not None:
        raise ConfigurationError("give run_at or run_in, not both", field="run_in")
    if run_at is not None:
        given["run_at"] = check_moment("run_at", run_at)
    if run_in is not None:
        given["run_in"] = check_seconds("run_in", run_in)
    if max_attempts is not None:
        check_max_attempts(max_attempts)
        given["max_attempts"] = max_attempts
    if tags is not None:
        checked = tag_checks.check(list(tags) if isinstance(tags, tuple) else tags)
        given["tags"] = None if checked is None else list(checked)
    return given


def _lock(conn: Any, job_id: int) -> _Locked:
    """Lock queued job ``job_id`` (and its waiting row), or refuse saying where it is."""
    row = conn.execute(queries.JOB_EDIT_LOCK, {"id": job_id}).fetchone()
    if row is None:
        found = admin.job(conn, job_id)  # JobNotFound when no table holds it
        hint = f"; redrive it first (`pgjobs dead redrive --id {job_id}`)"
        raise JobStateConflict(
            f"job {job_id} already finished: it is {found.status} (in {found.table}); only a "
            "queued job that is not running can be edited"
            + (hint if found.table == "dead_letter" else "")
        )
    task, _queue, leased, attempts, priority, run_at, waiting, payload, _version, most, tags = row
    if leased:
        found = admin.job(conn, job_id)
        raise JobStateConflict(
            f"job {job_id} is running on worker {found.lease_owner} (attempt {found.attempts} "
            f"of {found.max_attempts}): only a job that is not running can be edited; wait "
            "for this attempt to end"
        )
    if waiting:
        waited = conn.execute(queries.JOB_EDIT_LOCK_WAITING, {"id": job_id}).fetchone()
        run_at = None if waited is None else waited[0]
    values = {
        "priority": priority,
        "run_at": run_at,
        "payload": payload,
        "max_attempts": most,
        "tags": None if tags is None else list(tags),
    }
    return _Locked(task, bool(leased), int(attempts), values, bool(waiting))


def _checked_payload(
    locked: _Locked, payload: dict[str, Any], tasks: Mapping[str, Task] | None
) -> tuple[Any, int | None]:
    """``payload`` checked for the job's task as enqueue checks it (and, with the task known, as
    the CLI's enqueue does: its handler could be called with it), as stored; and the payload
    version to store with it."""
    prepared = enqueue.prepare(JobSpec(locked.task, payload), tasks)
    stored = json.loads(prepared.payload)
    task = tasks.get(locked.task) if tasks else None
    if task is None:
        # Without the app its version is unknown here: the payload keeps the job's.
        return stored, _KEEP_VERSION
    enqueue.handler_arguments(task, stored)
    return stored, prepared.payload_version


#: The payload version parameter that keeps the job's own.
_KEEP_VERSION = -1


def _check_attempts(job_id: int, locked: _Locked, max_attempts: int | None) -> None:
    if max_attempts is not None and max_attempts <= locked.attempts:
        raise ConfigurationError(
            f"job {job_id} has spent {locked.attempts} attempts already: max_attempts must be "
            f"at least {locked.attempts + 1} for it to run again",
            field="max_attempts",
        )


def _changes(old: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each field given whose value differs from the job's: {"old": ..., "new": ...}, as JSON."""
    changes = {}
    for name in FIELDS:
        if name in given and given[name] != old[name]:
            changes[name] = {"old": _shown(old[name]), "new": _shown(given[name])}
    return changes


def _shown(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _params(
    job_id: int,
    given: Mapping[str, Any],
    version: int | None,
    changes: Mapping[str, Any],
    by: str | None,
) -> dict[str, Any]:
    payload = given.get("payload") if "payload" in changes else None
    return {
        "id": job_id,
        "priority": given.get("priority"),
        "run_at": given.get("run_at") if "run_at" in changes else None,
        "payload": None if payload is None else json.dumps(payload, ensure_ascii=False),
        "payload_version": version,
        "keep_version": version == _KEEP_VERSION,
        "max_attempts": given.get("max_attempts"),
        "set_tags": "tags" in changes,
        "tags": given.get("tags"),
        "changes": json.dumps(changes, ensure_ascii=False),
        "by": by,
    }
