"""Helpers of the operations tests (``test_admin_*.py``): dead rows built in bulk, a worker
played by hand, and the CLI run in process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from pgjobs.completer.outcomes import Outcomes
from pgjobs.models import DeadReason, Job
from tests.support.factories import claim, settle
from tests.support.helpers import TABLES


def bury(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    task: str = "images.resize",
    queue: str = "default",
    error: Callable[[int], str] = lambda n: f"ValueError: image {n} is corrupt",
    error_type: str | None = "builtins.ValueError",
    reason: DeadReason = DeadReason.EXHAUSTED,
) -> list[int]:
    """Insert ``count`` dead_letter rows as the worker's bury path leaves them (ids from the
    queue's sequence, as if enqueued), in one statement; returns their ids in order. Much faster
    than working thousands of jobs to death, for tests about what happens to dead rows next."""
    errors = [error(n) for n in range(count)]
    rows = conn.execute(
        """
        INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts,
                                 max_attempts, reason, error_type, last_error, traceback,
                                 worker, created_at)
        SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id')), %(queue)s, %(task)s,
               jsonb_build_object('n', e.n - 1), 0, now(), 3, 3, %(reason)s, %(error_type)s,
               e.error, 'Traceback (most recent call last):' || E'\\n' || e.error,
               'host:1:abcd1234', now()
        FROM unnest(%(errors)s::text[]) WITH ORDINALITY AS e(error, n)
        ORDER BY e.n
        RETURNING id
        """,
        {
            "queue": queue,
            "task": task,
            "reason": reason,
            "error_type": error_type,
            "errors": errors,
        },
    ).fetchall()
    return sorted(r[0] for r in rows)


def claim_one(
    conn: psycopg.Connection[Any],
    job_id: int,
    *,
    owner: str = "w1",
    queue: str = "default",
    external_tasks: Sequence[str] = (),
) -> Job:
    """Lease ``job_id`` to ``owner`` like a worker's claim (it must be next in its queue); the
    jobs of ``external_tasks`` as a worker that delivers them to a downstream."""
    jobs = claim(conn, owner=owner, queues=[queue], limit=1, external_tasks=external_tasks)
    assert [job.id for job in jobs] == [job_id]
    return jobs[0]


def fail_for_good(
    conn: psycopg.Connection[Any], job: Job, error: str, *, owner: str = "w1"
) -> set[int]:
    """Bury a claimed job as the worker does on its last attempt; returns the ids applied."""
    outcomes = Outcomes(owner)
    outcomes.bury(job, DeadReason.EXHAUSTED, error, "builtins.ValueError", "Traceback ...")
    return settle(conn, outcomes)


def succeed(conn: psycopg.Connection[Any], job: Job, *, owner: str = "w1") -> set[int]:
    """Archive a claimed job as succeeded, as the worker does; returns the ids applied."""
    outcomes = Outcomes(owner)
    outcomes.succeed(job, '"ok"')
    return settle(conn, outcomes)


def ids_in(conn: psycopg.Connection[Any], table: str, ids: Sequence[int]) -> set[int]:
    assert table in TABLES
    found = conn.execute(f"SELECT id FROM {table} WHERE id = ANY(%s)", [list(ids)]).fetchall()
    return {r[0] for r in found}
