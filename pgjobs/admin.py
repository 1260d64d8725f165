"""Operations for the people who run pgjobs: dead-letter triage (list, show, group, redrive,
purge), finding a job wherever it is, replaying and cancelling jobs, and recording the outcomes
that external workers report.

Every function takes a ``Dsn`` (it opens a connection and closes it) or a psycopg connection
of the caller (used as is). Large redrives and purges move rows in batches, each batch one
transaction on an autocommit connection, so an interruption between or during batches loses and
duplicates nothing: a batch either moved whole or not at all. On a connection with an open
transaction the batches are savepoints and commit with the caller's transaction.

The SQL lives in ``queries``; ``db`` translates errors and builds the models.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError, JobNotFound, JobStateConflict, StaleOutcome
from pgjobs.models import DeadGroup, DeadJob, JobHistory, JobStatus
from pgjobs.retry import RetryPolicy
from pgjobs.submission import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE  # re-exported
from pgjobs.submission import check_moment, check_seconds, in_nfc
from pgjobs.tags import check_filter

#: Rows `pgjobs dead list` shows unless told otherwise.
DEFAULT_LIST_LIMIT = 50
# Ids named in a "not in dead_letter" error before "...".
_MAX_IDS_SHOWN = 10
_FINGERPRINT_ID = re.compile(r"[0-9a-fA-F]{8}")

#: Where an operation runs: a DSN (pgjobs opens and closes a connection) or a psycopg connection.
Target = db.Target


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead jobs an operation applies to; every field left None matches all.

    ``since``/``until`` bound ``failed_at`` (``until`` exclusive); ``error`` is a
    case-insensitive substring of the error message; ``fingerprint`` is an error fingerprint as
    `pgjobs dead group` prints it, or its 8-digit id.

    Example: ``DeadFilter(task="images.resize", fingerprint="3fa2c1d9")``
    """

    ids: tuple[int, ...] | None = None
    queue: str | None = None
    task: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    error: str | None = None
    fingerprint: str | None = None
    #: Jobs carrying every one of these tags (``tags @> ARRAY[...]``).
    tags: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.ids is not None and not self.ids:
            raise ConfigurationError("ids is empty: pass at least one job id, or None for all")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigurationError(
                f"since ({self.since.isoformat()}) is not before until ({self.until.isoformat()})"
            )
        for name in ("queue", "task", "error", "fingerprint"):
            if getattr(self, name) == "":
                raise ConfigurationError(f"{name} is empty: leave it out to match every value")
        if self.tags is not None:
            if not self.tags:
                raise ConfigurationError("tags is empty: leave it out to match every value")
            check_filter(self.tags)

    @property
    def matches_all(self) -> bool:
        """Whether no field narrows the selection."""
        return self == DeadFilter()

    def params(self) -> dict[str, Any]:
        """The filter as the parameters of ``queries._DEAD_WHERE``."""
        fingerprint = self.fingerprint
        if fingerprint is not None and _FINGERPRINT_ID.fullmatch(fingerprint):
            fingerprint = fingerprint.lower()
        return {
            "ids": list(self.ids) if self.ids is not None else None,
            "queue": in_nfc(self.queue),  # names are stored in NFC
            "task": in_nfc(self.task),
            "since": self.since,
            "until": self.until,
            "error": self.error,
            "fingerprint": fingerprint,
            "tags": check_filter(self.tags),
        }


@dataclass(frozen=True, slots=True)
class DeadSelection:
    """The dead jobs a redrive or purge is about to move: the ids that matched its filter when
    it was selected, and the filter with ``until`` pinned to the database's clock then (each batch
    checks it again, so a redriven job that fails again during the redrive stays dead)."""

    filter: DeadFilter
    ids: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.ids)


# -- dead_letter --------------------------------------------------------------------------------


def dead_jobs(
    target: Target,
    where: DeadFilter | None = None,
    *,
    limit: int = DEFAULT_LIST_LIMIT,
    tracebacks: bool = False,
) -> list[DeadJob]:
    """Dead jobs matching ``where``, newest first, at most ``limit``; with their tracebacks only
    when ``tracebacks`` (they can be long).

    Example: ``admin.dead_jobs(dsn, DeadFilter(queue="emails", error="timeout"), limit=20)``
    """
    if limit < 1:
        raise ConfigurationError(f"limit must be >= 1, got {limit}")
    params = {**(where or DeadFilter()).params(), "limit": limit}
    statement = queries.DEAD_LIST_WITH_TRACEBACK if tracebacks else queries.DEAD_LIST
    with db.target_connection(target) as conn:
        rows = db.fetch_rows(conn.execute(statement, params))
    return [db.dead_job_from_row(row) for row in rows]


def dead_job(target: Target, job_id: int) -> DeadJob:
    """One dead job with its traceback; ``JobNotFound`` (saying where it is) when not dead.

    Example: ``print(admin.dead_job(dsn, 42).traceback)``
    """
    with db.target_connection(target) as conn:
        found = db.fetch_row(conn.execute(queries.DEAD_GET, {"id": job_id}))
        if found is None:
            raise JobNotFound(_not_dead_message(conn, [job_id]))
    return db.dead_job_from_row(found)


def dead_groups(target: Target, where: DeadFilter | None = None) -> list[DeadGroup]:
    """Dead jobs matching ``where``, counted by task and error fingerprint, largest first.

    Example: ``[(g.task, g.fingerprint, g.count) for g in admin.dead_groups(dsn)]``
    """
    params = (where or DeadFilter()).params()
    with db.target_connection(target) as conn:
        rows = conn.execute(queries.DEAD_GROUP, params).fetchall()
    return [db.dead_group_from_row(row) for row in rows]


def select_dead(target: Target, where: DeadFilter) -> DeadSelection:
    """Select (by id, evaluating the filters once) the dead jobs a redrive or purge of ``where``
    would move, pinned to now. Named ids must all be in dead_letter, else ``JobNotFound``.

    Example: ``admin.select_dead(dsn, DeadFilter(task="billing.charge")).count``
    """
    with db.target_connection(target) as conn:
        if where.ids is not None:
            found = conn.execute(queries.DEAD_FIND_IDS, {"ids": list(where.ids)}).fetchall()
            missing = sorted(set(where.ids) - {row[0] for row in found})
            if missing:
                raise JobNotFound(f"{_not_dead_message(conn, missing)}; nothing was changed")
        row = conn.execute(queries.DEAD_SELECT_IDS, where.params()).fetchone()
    assert row is not None  # an aggregate always returns a row
    ids, now = row
    until = now if where.until is None else min(where.until, now)
    return DeadSelection(replace(where, until=until), tuple(ids))


def redrive_batches(
    target: Target, selection: DeadSelection, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> Generator[list[int], None, None]:
    """Move the selected dead jobs back to queued_jobs, ``batch_size`` per transaction, and yield
    the ids of each batch as it commits: ready now, attempts 0, ``redrive_count`` + 1,
    ``redriven_at`` now. Stopping the iteration (or an interruption) between batches leaves
    every job in exactly one table.

    Example: ``for ids in admin.redrive_batches(dsn, admin.select_dead(dsn, f)): print(len(ids))``
    """
    return _batches(target, queries.DEAD_REDRIVE_BATCH, selection, batch_size)


def purge_batches(
    target: Target, selection: DeadSelection, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> Generator[list[int], None, None]:
    """Delete the selected dead jobs for good, ``batch_size`` per transaction, yielding the ids
    of each batch as it commits.

    Example: ``sum(map(len, admin.purge_batches(dsn, admin.select_dead(dsn, f))))``
    """
    return _batches(target, queries.DEAD_PURGE_BATCH, selection, batch_size)


def redrive(target: Target, where: DeadFilter, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Move the dead jobs matching ``where`` back to queued_jobs with fresh attempts; returns
    how many moved. ``DeadFilter()`` redrives every dead job.

    Example: ``admin.redrive(dsn, DeadFilter(ids=(41, 42)))``
    """
    selection = select_dead(target, where)
    return sum(len(ids) for ids in redrive_batches(target, selection, batch_size=batch_size))


def purge(target: Target, where: DeadFilter, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Delete the dead jobs matching ``where`` for good; returns how many were deleted.

    Example: ``admin.purge(dsn, DeadFilter(task="reports.nightly", until=last_week))``
    """
    selection = select_dead(target, where)
    return sum(len(ids) for ids in purge_batches(target, selection, batch_size=batch_size))


def _batches(
    target: Target, statement: str, selection: DeadSelection, batch_size: int
) -> Generator[list[int], None, None]:
    if batch_size < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {batch_size}")
    params = {**selection.filter.params(), "limit": batch_size}
    with db.target_connection(target) as conn:
        for start in range(0, len(selection.ids), batch_size):
            params["ids"] = list(selection.ids[start : start + batch_size])
            with conn.transaction():
                ids = [row[0] for row in conn.execute(statement, params).fetchall()]
            # Empty when another redrive or purge took these jobs first.
            if ids:
                yield ids


def _not_dead_message(conn: psycopg.Connection[Any], ids: list[int]) -> str:
    if len(ids) == 1:
        found = db.fetch_row(conn.execute(queries.JOB_LOOKUP, {"id": ids[0]}))
        if found is None:
            return f"no job {ids[0]} in any pgjobs table (purged, pruned, or never enqueued)"
        where = db.job_history_from_row(found)
        return f"job {ids[0]} is not in dead_letter: it is {where.status} (in {where.table})"
    shown = ", ".join(map(str, ids[:_MAX_IDS_SHOWN])) + (
        ", ..." if len(ids) > _MAX_IDS_SHOWN else ""
    )
    return (
        f"{len(ids)} of the jobs named are not in dead_letter: {shown} (see `pgjobs job show ID`)"
    )


# -- any job ------------------------------------------------------------------------------------


def job(target: Target, job_id: int) -> JobHistory:
    """A job wherever it is (queued, archived or dead), with its whole record; ``JobNotFound``
    when it is in none of the three tables.

    Example: ``admin.job(dsn, 42).status is JobStatus.RUNNING``
    """
    with db.target_connection(target) as conn:
        found = db.fetch_row(conn.execute(queries.JOB_LOOKUP, {"id": job_id}))
    if found is None:
        raise JobNotFound(
            f"no job {job_id} in any pgjobs table (purged, pruned, or never enqueued)"
        )
    return db.job_history_from_row(found)


def replay(
    target: Target,
    job_id: int,
    *,
    expires_at: datetime | None = None,
    expires_in: float | timedelta | None = None,
) -> int:
    """Enqueue a finished (archived) or dead job again as a new job with ``replay_of`` set to
    ``job_id``, and return the new id. The original stays where it is. A job still queued is
    refused (``JobStateConflict``): it will run, or can be cancelled first.

    The copy expires at ``expires_at`` (or ``expires_in`` seconds from now) when one is given.
    Without one, the copy of a job that *expired* keeps the original's expiry, which has passed:
    it is archived at once as expired and never runs, as the expirer would have done; the copy of
    any other job never expires. A given expiry that has already passed archives the copy at once
    too.

    Example: ``new_id = admin.replay(dsn, 42, expires_in=3600)``
    """
    if expires_at is not None and expires_in is not None:
        raise ConfigurationError("give expires_at or expires_in, not both", field="expires_in")
    params = {
        "id": job_id,
        "expires_at": None if expires_at is None else check_moment("expires_at", expires_at),
        "expires_in": None if expires_in is None else check_seconds("expires_in", expires_in),
    }
    with db.target_connection(target) as conn:
        inserted = conn.execute(queries.JOB_REPLAY, params).fetchone()
        if inserted is not None:
            return int(inserted[0])
    found = job(target, job_id)
    raise JobStateConflict(
        f"job {job_id} is still queued ({found.status}): it has not finished, so there is "
        "nothing to replay; wait for it, or `pgjobs cancel` it first"
    )


def cancel(target: Target, job_id: int, *, force: bool = False) -> JobHistory:
    """Archive a queued job as cancelled, unrun, in one transaction, and return its record.

    A running job (leased by a worker) is refused with ``JobStateConflict`` naming the worker,
    unless ``force``: then it is archived as cancelled at once and its worker is told at commit
    (a NOTIFY on the channel every worker listens to) to stop the handler: an async handler is
    cancelled, a sync one sees ``pgjobs.current_job().cancelled`` become True (and is given up
    at its task's timeout, if it has one). Whatever the handler does after that is discarded by
    the fence (no retry, no dead-letter, no second archive). A finished job is refused.

    Example: ``admin.cancel(dsn, 42).status is JobStatus.CANCELLED``
    """
    with db.target_connection(target) as conn:
        cancelled = conn.execute(queries.JOB_CANCEL, {"id": job_id, "force": force}).fetchone()
    found = job(target, job_id)
    if cancelled is not None:
        return found
    if found.status is JobStatus.RUNNING:
        raise JobStateConflict(
            f"job {job_id} is running on worker {found.lease_owner} (attempt {found.attempts} "
            f"of {found.max_attempts}): wait for it, or pass --force (force=True) to archive it "
            "as cancelled now and ask its handler to stop"
        )
    raise JobStateConflict(
        f"job {job_id} already finished: it is {found.status} (in {found.table}); "
        "only a queued job can be cancelled"
    )


def report_outcome(
    target: Target,
    job_id: int,
    *,
    attempt: int,
    status: str,
    retryable: bool = True,
    error: str | None = None,
    result: Any = None,
    retry: RetryPolicy | None = None,
    external: bool | None = None,
) -> JobHistory:
    """Record the outcome an external worker reports for attempt ``attempt`` of a running job,
    and return the job's record afterwards.

    ``status`` is ``"succeeded"`` (the job is archived with ``result``) or ``"failed"``: retried
    after ``retry``'s backoff (the default ``RetryPolicy()`` when None) while attempts remain and
    ``retryable``, else moved to dead_letter (``exhausted``, or ``non_retryable`` when not
    ``retryable``). The attempt fences the report: only the attempt that holds the job's live
    lease may settle it. A report for another attempt, for a job that is not running or whose
    lease has ended raises ``StaleOutcome`` and changes nothing (the lease rules decide what
    happens to the job then); an unknown id raises ``JobNotFound``. Only an attempt that a
    worker claimed to deliver to an external task's downstream may be settled: a running job
    whose attempt was not (a Python handler runs it), or whose task the caller's app declares
    as a Python one (``external=False``), raises ``NotExternal`` and changes nothing.

    Example: ``admin.report_outcome(dsn, 42, attempt=1, status="succeeded", result={"ok": 1})``
    """
    # Here, not at the top: the outcome path (pgjobs.completer) is the worker's; the other
    # operations, and `pgjobs serve` until an external worker reports, never load it.
    from pgjobs.completer.reports import ReportedOutcome, check_delivered

    outcome = ReportedOutcome.of(attempt, status, retryable, error, result)
    settled = False
    with db.target_connection(target) as conn, conn.transaction():
        holder = conn.execute(queries.JOB_LEASE_HOLDER, {"id": job_id}).fetchone()
        if holder is not None:
            attempts, max_attempts, owner, lease_live, task, external_attempt = holder
            if owner is not None and lease_live:
                check_delivered(job_id, task, attempts, external_attempt, external)
            if attempts == outcome.attempt and owner is not None and lease_live:
                params = outcome.settle(owner, job_id, max_attempts, retry or RetryPolicy())
                settled = bool(conn.execute(queries.JOB_SETTLE_MANY, params.bind()).fetchall())
    found = job(target, job_id)
    if not settled:
        raise StaleOutcome(_stale_message(found, outcome.attempt))
    return found


def _stale_message(found: JobHistory, attempt: int) -> str:
    where = f"job {found.id} is {found.status}"
    if found.status is JobStatus.RUNNING:
        if found.attempts != attempt:
            where += f" on attempt {found.attempts}, not {attempt}"
        else:
            where += f" on attempt {attempt}, but its lease ended at {found.lease_expires_at}"
    elif found.table != "queued_jobs":
        where += f" (in {found.table})"
    return f"{where}: the outcome reported for attempt {attempt} changes nothing"
