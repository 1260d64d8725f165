"""Browsing jobs across the three tables: listings by state, queue, task and time window, paged
with an opaque keyset cursor, and many jobs by id at once.

A listing is newest first by the moment each job entered its table (``at``: created, or
redriven, for a queued job; finished for an archived one; failed for a dead one), then by id.
Each page is one statement: every table asked for gives at most ``limit`` rows through its time
index (the archive only from the partitions of the time window), and the page is the newest
``limit`` of those. A job that moves to another table while a client pages may show twice or
not at all; every job that stays where it is shows exactly once.

Like ``pgjobs.admin``, every function takes a ``Dsn`` (a connection is opened and closed) or a
psycopg connection of the caller.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError
from pgjobs.models import DeadReason, JobHistory, JobStatus, Unloadable
from pgjobs.submission import check_name
from pgjobs.tags import check_filter

#: Jobs per page unless told otherwise, and at most.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
#: Ids one ``jobs_by_id`` call may name (a batch enqueue's answer).
MAX_IDS = 10_000

Target = db.Target

_FIELDS = tuple(field.name for field in dataclasses.fields(JobHistory))


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing: its jobs, and the cursor of the next page (None on the last)."""

    jobs: list[JobHistory]
    next_cursor: str | None


def jobs(
    target: Target,
    *,
    states: Collection[JobStatus | str] | None = None,
    queue: str | None = None,
    task: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    tags: Sequence[str] | None = None,
) -> Page:
    """A page of jobs in ``states`` (all states when None) matching the filters, newest first.
    ``since``/``until`` bound the moment each job entered its table (``until`` exclusive);
    ``cursor`` is the ``next_cursor`` of the previous page, with the same filters; ``tags``:
    jobs carrying every one of them.

    Example::

        page = browse.jobs(dsn, states=["dead", "succeeded"], queue="emails", limit=100)
        while page.next_cursor:
            page = browse.jobs(dsn, states=["dead", "succeeded"], queue="emails",
                               limit=100, cursor=page.next_cursor)
    """
    wanted = _states(states)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ConfigurationError(
            f"limit must be in 1..{MAX_PAGE_SIZE}, got {limit!r}", field="limit"
        )
    names: dict[str, str] = {}  # in NFC, as stored
    for name, value in (("queue", queue), ("task", task)):
        if value is not None:
            try:
                names[name] = check_name(name, value)
            except ConfigurationError as exc:
                raise ConfigurationError(str(exc), field=name) from None
    for name, moment in (("since", since), ("until", until)):
        if moment is not None and (moment.tzinfo is None or moment.utcoffset() is None):
            raise ConfigurationError(f"{name} must be timezone-aware, got {moment}", field=name)
    if since is not None and until is not None and since >= until:
        raise ConfigurationError(
            f"since ({since.isoformat()}) is not before until ({until.isoformat()})", field="since"
        )
    before_at, before_id = (None, None) if cursor is None else decode_cursor(cursor)
    params = {
        "states": wanted,
        "queue": names.get("queue"),
        "task": names.get("task"),
        "tags": check_filter(tags),
        "since": since,
        "until": until,
        "before_at": before_at,
        "before_id": before_id,
        # One more than a page: whether it exists says whether there is a next page.
        "limit": limit + 1,
    }
    with db.target_connection(target) as conn, conn.cursor(row_factory=dict_row) as cur:
        # Never a generic plan: each call's NULL filters and time window change the best one
        # (which indexes, which archive partitions).
        rows = db.fetch_rows(cur.execute(queries.BROWSE_JOBS, params, prepare=False))
    found = [_history(row) for row in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = encode_cursor(last["at"], last["id"])
    return Page(found, next_cursor)


def jobs_by_id(target: Target, ids: Sequence[int]) -> list[JobHistory]:
    """The jobs with these ids wherever they are, in the order of ``ids``, each with its whole
    record as ``admin.job`` gives it (tracebacks aside); an id in no table is left out.

    Example: ``[job.status for job in browse.jobs_by_id(dsn, [41, 42])]``
    """
    if len(ids) > MAX_IDS:
        raise ConfigurationError(f"at most {MAX_IDS:,} ids at once, got {len(ids):,}", field="ids")
    if not ids:
        return []
    with db.target_connection(target) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = db.fetch_rows(cur.execute(queries.BROWSE_JOBS_BY_ID, {"ids": list(ids)}))
    by_id = {row["id"]: _history(row) for row in rows}
    return [by_id[job_id] for job_id in ids if job_id in by_id]


def job_is_new(conn: psycopg.Connection[Any], job_id: int) -> bool:
    """Whether the queued job ``job_id`` was inserted by the transaction open on ``conn`` (an
    idempotent enqueue created it, rather than finding the job that holds its key).

    Example::

        with conn.transaction():
            new = browse.job_is_new(conn, app.enqueue(..., connection=conn))
    """
    with db.translate_errors():
        row = conn.execute(queries.BROWSE_JOB_IS_NEW, {"id": job_id}).fetchone()
    return bool(row and row[0])


def _states(states: Collection[JobStatus | str] | None) -> list[str]:
    if states is None:
        return [status.value for status in JobStatus]
    wanted = []
    for state in states:
        try:
            wanted.append(JobStatus(state).value)
        except ValueError:
            known = ", ".join(status.value for status in JobStatus)
            raise ConfigurationError(
                f"unknown state {state!r}: use {known}", field="state"
            ) from None
    if not wanted:
        raise ConfigurationError(
            "states is empty: name at least one, or None for all", field="state"
        )
    return wanted


def _history(row: dict[str, Any]) -> JobHistory:
    """A row of ``BROWSE_JOBS`` or ``BROWSE_JOBS_BY_ID`` as a ``JobHistory`` (columns by name)."""
    values: dict[str, Any] = {name: row.get(name) for name in _FIELDS}
    values["status"] = JobStatus(values["status"])
    if values["reason"] is not None:
        values["reason"] = DeadReason(values["reason"])
    values["replays"] = tuple(values["replays"] or ())
    values["tags"] = tuple(values["tags"] or ())
    return JobHistory(**values)


# -- cursors ------------------------------------------------------------------------------------


#: A cursor's time: a datetime, or the text of one Python cannot hold (a row pgjobs did not
#: write), which PostgreSQL reads as it wrote it.
CursorTime = datetime | str

# The times PostgreSQL writes that Python cannot hold: infinite, or of a year after 9999 (UTC,
# as every pgjobs session and the libpq path read them).
_BEYOND_PYTHON = re.compile(r"-?infinity|\d{5,}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?\+00")


def encode_cursor(at: datetime | Unloadable, job_id: int) -> str:
    """The opaque cursor of the page that follows the job (``at``, ``job_id``)."""
    raw = f"{at.isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[CursorTime, int]:
    """The (at, id) a cursor of ``encode_cursor`` holds; ``ConfigurationError`` for anything
    else."""
    refusal = ConfigurationError(
        "cursor is not one this server gave: pass next_cursor of the previous page as is",
        field="cursor",
    )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at_text, _, id_text = raw.rpartition("|")
        job_id = int(id_text)
        if _BEYOND_PYTHON.fullmatch(at_text):
            if not 0 < job_id < 2**63:
                raise refusal
            return at_text, job_id
        at = datetime.fromisoformat(at_text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise refusal from None
    if at.tzinfo is None or not 0 < job_id < 2**63:
        raise refusal
    return at, job_id
