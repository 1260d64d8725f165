"""Queue settings: pause and resume a queue, limit how many of its jobs run at once and how
many start per period, and list every known queue with its settings. `pgjobs queue` and
``/api/v1/queues`` call these.

A paused queue's jobs stay in ``queued_jobs``, ready; no worker claims them. The claim reads the
setting in the same statement that takes the jobs (no cache), so a pause holds from each
worker's next claim, and jobs already running finish as usual. Pausing does not wake idle
workers (they have nothing to do with it); resuming NOTIFYs the queue, so idle workers claim its
jobs at once. Enqueueing into a paused queue works: the jobs wait for the resume. A queue's
limits are read by every claim too, in the claim's own statement (see ``queries.JOB_CLAIM``).

Every function takes a ``Dsn`` (it opens a connection and closes it) or a psycopg connection of
the caller (used as is, in its transaction if one is open).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError, QueueNotFound
from pgjobs.models import QueueState
from pgjobs.rates import Rate
from pgjobs.submission import check_limit, check_name, check_note

#: Where an operation runs: a DSN (pgjobs opens and closes a connection) or a psycopg connection.
Target = db.Target


@dataclass(frozen=True, slots=True)
class Change:
    """What a pause or resume did: the queue as it is now, and whether this call changed it
    (False: it was already paused, or not paused)."""

    queue: QueueState
    changed: bool


def pause(target: Target, name: str, *, reason: str | None = None, by: str | None = None) -> Change:
    """Pause queue ``name``: from each worker's next claim on, its jobs are not claimed; they stay
    ready. The queue need not exist yet (``Change.queue.has_jobs`` says whether it holds jobs).
    Pausing a paused queue keeps when and by whom it was paused; a ``reason`` given replaces the
    previous one. ``by`` defaults to the database role.

    Example: ``pause(dsn, "emails", reason="SMTP provider outage").changed``
    """
    name = check_name("queue", name)
    check_note("reason", reason)
    check_note("by", by)
    with db.target_connection(target) as conn, _transaction(conn):
        rows = db.fetch_all(conn, queries.QUEUE_PAUSE, {"name": name, "reason": reason, "by": by})
        return Change(_get(conn, name), bool(rows[0][0]))


def resume(target: Target, name: str) -> Change:
    """Resume queue ``name`` and wake the idle workers that serve it. Resuming a queue that is
    not paused changes nothing (``Change.changed`` is False).

    Example: ``resume(dsn, "emails")``
    """
    name = check_name("queue", name)
    with db.target_connection(target) as conn, _transaction(conn):
        rows = db.fetch_all(conn, queries.QUEUE_RESUME, {"name": name})
        return Change(_get(conn, name), bool(rows))


class _Keep:
    """``limit``'s default: leave that setting as it is."""

    def __repr__(self) -> str:
        return "KEEP"


#: ``limit(..., concurrency=KEEP)``: leave the setting as it is (None removes it).
KEEP: Any = _Keep()


def limit(
    target: Target,
    name: str,
    *,
    concurrency: int | None = KEEP,
    rate: Rate | str | None = KEEP,
    group_concurrency: int | None = KEEP,
) -> Change:
    """Set queue ``name``'s limits, obeyed by every worker from its next claim on (no restart):
    ``concurrency``, the most of its jobs running at once across every worker and host,
    ``rate`` ("100/s", "10/m", "5/10s"; a ``Rate``), the most that start per period, and
    ``group_concurrency``, the most jobs of one group (``enqueue(..., group=...)``) running at
    once. None removes a limit; a setting not given stays as it is. Jobs held back stay ready.
    The queue need not exist yet.

    Example: ``limit(dsn, "emails", concurrency=10, rate="100/s").changed``
    """
    name = check_name("queue", name)
    if concurrency is KEEP and rate is KEEP and group_concurrency is KEEP:
        raise ConfigurationError(
            "give a concurrency limit, a rate or a group concurrency to set (None removes one)",
            field="concurrency",
        )
    if concurrency is not KEEP and concurrency is not None:
        check_limit("concurrency", concurrency)
    if group_concurrency is not KEEP and group_concurrency is not None:
        check_limit("group_concurrency", group_concurrency)
    parsed = None if rate is KEEP or rate is None else Rate.parse(rate)
    params = {
        "name": name,
        "set_concurrency": concurrency is not KEEP,
        "concurrency": None if concurrency is KEEP else concurrency,
        "set_rate": rate is not KEEP,
        "rate_jobs": None if parsed is None else parsed.jobs,
        "rate_seconds": None if parsed is None else parsed.seconds,
        "set_group_concurrency": group_concurrency is not KEEP,
        "group_concurrency": None if group_concurrency is KEEP else group_concurrency,
    }
    with db.target_connection(target) as conn, _transaction(conn):
        rows = db.fetch_all(conn, queries.QUEUE_LIMIT, params)
        return Change(_get(conn, name), bool(rows[0][0]))


def queue(target: Target, name: str) -> QueueState:
    """Queue ``name`` and its settings, whether or not it is known.

    Example: ``queue(dsn, "emails").paused``
    """
    name = check_name("queue", name)
    with db.target_connection(target) as conn:
        return _get(conn, name)


def known_queue(target: Target, name: str, *, declared: Iterable[str] = ()) -> QueueState:
    """Queue ``name`` and its settings when it is known: it holds a job, has settings (or had:
    paused once), or is among ``declared`` (the queues of the app's tasks); else
    ``QueueNotFound``. What the HTTP API's ``GET /queues/{name}`` answers.

    Example: ``known_queue(dsn, "emails", declared={t.queue for t in app.tasks.values()})``
    """
    name = check_name("queue", name)
    with db.target_connection(target) as conn:
        state = _get(conn, name)
        if state.has_jobs or state.paused or state.limited or name in set(declared):
            return state
        if any(known.name == name for known in list_queues(conn)):
            return state
    raise QueueNotFound(
        f"no queue named {name!r}: none of its jobs is queued, it has no settings and no task "
        "declares it (`pgjobs queue list` lists the known queues)",
        field="name",
    )


def list_queues(target: Target) -> list[QueueState]:
    """Every known queue by name: those that hold a job (ready, scheduled or running) and those
    with settings (paused or once paused).

    Example: ``[q.name for q in list_queues(dsn) if q.paused]``
    """
    with db.target_connection(target) as conn:
        return [db.queue_state_from_row(row) for row in db.fetch_all(conn, queries.QUEUE_LIST)]


def _get(conn: psycopg.Connection[Any], name: str) -> QueueState:
    (row,) = db.fetch_all(conn, queries.QUEUE_GET, {"name": name})
    return db.queue_state_from_row(row)


@contextlib.contextmanager
def _transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The change and the reading of its result in one transaction (a savepoint in the
    caller's)."""
    with conn.transaction():
        yield
