"""Outcomes of leased jobs: succeed, retry, snooze or bury a batch in one statement; lease
extensions; progress.
"""

from __future__ import annotations

from pgjobs.models import ArchivedStatus
from pgjobs.queries.columns import _INTO_DEAD, _MOVED_COLUMNS

# Successes: take each job whose lease (attempt and owner) the worker still holds out of
# queued_jobs (_ARCHIVE_SUCCEEDED moves them into archived_jobs, after _ENDS_LOCKED).
_SUCCEED_MANY_DELETE = """\
succeeded AS (
    DELETE FROM queued_jobs q
    USING unnest(%(ok_ids)s::bigint[], %(ok_attempts)s::int[], %(ok_results)s::text[]::jsonb[])
        AS o(id, attempts, result)
    WHERE q.id = o.id AND q.attempts = o.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, o.result
)"""

_ARCHIVE_SUCCEEDED = f"""\
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, result, last_error, worker)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.SUCCEEDED}', result, last_error, lease_owner FROM succeeded
    WHERE (SELECT n FROM ends_locked) >= 0
    RETURNING id
)"""

# Burials: take each job whose lease (attempt and owner) the worker still holds out of
# queued_jobs (_BURY_FAILED moves them into dead_letter, after _ENDS_LOCKED).
_BURY_MANY_DELETE = """\
failed AS (
    DELETE FROM queued_jobs q
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[], %(dead_reasons)s::text[],
                 %(dead_types)s::text[], %(dead_errors)s::text[], %(dead_tracebacks)s::text[])
        AS d(id, attempts, reason, error_type, error, traceback)
    WHERE q.id = d.id AND q.attempts = d.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, d.reason, d.error_type, d.error, d.traceback
)"""

_BURY_FAILED_UNLOCKED = f"""\
buried AS (
    INSERT INTO dead_letter ({_MOVED_COLUMNS}, reason, error_type, last_error, traceback, worker)
    SELECT {_INTO_DEAD}, reason, error_type, error, traceback, lease_owner FROM failed
    RETURNING id
)"""
_BURY_FAILED = _BURY_FAILED_UNLOCKED.replace(
    "FROM failed\n", "FROM failed\n    WHERE (SELECT n FROM ends_locked) >= 0\n"
)


def _ends_locked(ended: str) -> str:
    """The CTE ``ends_locked`` over the jobs the statement takes out of queued_jobs (``ended``:
    a query of their id, watched, batch_id and redrive_count): it locks, before the rows enter
    archived_jobs or dead_letter, the rows their ends will change there (trigger
    ``pgjobs_job_ended``, queries/triggers.py): first the waiting rows of their dependents in
    job order, then their batches' rows in batch order. Every settle locks them in that one
    order, so workers ending siblings of the same fan-ins at once wait for each other instead
    of deadlocking (the trigger, row after row, would lock them in the order the rows come).
    Jobs nothing waits for and no batch counts add two empty index probes to the statement."""
    return f"""\
ended AS ({ended}),
ends_locked AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM (
            SELECT w.job_id FROM pgjobs_waiting w
            WHERE w.job_id = ANY(ARRAY(
                SELECT d.job_id FROM pgjobs_dependencies d
                WHERE d.depends_on = ANY(ARRAY(SELECT id FROM ended WHERE watched))))
            ORDER BY w.job_id
            FOR UPDATE
        ) dependents
        UNION ALL
        SELECT 1 FROM (
            SELECT b.id FROM pgjobs_batches b
            WHERE b.id = ANY(ARRAY(
                SELECT batch_id FROM ended
                WHERE batch_id IS NOT NULL AND redrive_count = 0))
            ORDER BY b.id
            FOR UPDATE
        ) batches
    ) locked
)"""


_SUCCEEDED_ENDED = "SELECT id, watched, batch_id, redrive_count FROM succeeded"
_FAILED_ENDED = "SELECT id, watched, batch_id, redrive_count FROM failed"

#: The successes of a trip, as the worker's settle-and-claim statements carry them
#: (queries/claim.py): out of queued_jobs, the shared rows locked, into archived_jobs.
_SUCCEED_MANY = ",\n".join(
    [_SUCCEED_MANY_DELETE, _ends_locked(_SUCCEEDED_ENDED), _ARCHIVE_SUCCEEDED]
)

#: Apply a batch of outcomes, each fenced by (id, attempt, lease owner) so that a worker whose
#: lease was lost changes nothing: successes move to archived_jobs, failures to retry are
#: rescheduled, failures for good move to dead_letter, and jobs given back are released (with
#: their attempt refunded when they never started, and held back ``release_holds`` seconds when
#: that is > 0). Returns the ids that were applied.
JOB_SETTLE_MANY = f"""
WITH {_SUCCEED_MANY_DELETE},
retried AS (
    UPDATE queued_jobs q
    SET run_at = now() + r.delay * interval '1 second',
        last_error = r.error,
        lease_owner = NULL,
        lease_expires_at = NULL
    FROM unnest(%(retry_ids)s::bigint[], %(retry_attempts)s::int[], %(retry_delays)s::float8[],
                %(retry_errors)s::text[]) AS r(id, attempts, delay, error)
    WHERE q.id = r.id AND q.attempts = r.attempts AND q.lease_owner = %(owner)s
    RETURNING q.id
),
{_BURY_MANY_DELETE},
{_ends_locked(f"{_SUCCEEDED_ENDED} UNION ALL {_FAILED_ENDED}")},
{_ARCHIVE_SUCCEEDED},
{_BURY_FAILED},
released AS (
    UPDATE queued_jobs q
    SET attempts = q.attempts - CASE WHEN g.refund THEN 1 ELSE 0 END,
        run_at = CASE WHEN g.hold > 0 THEN now() + g.hold * interval '1 second' ELSE q.run_at END,
        snoozes = q.snoozes + CASE WHEN g.snooze THEN 1 ELSE 0 END,
        lease_owner = NULL,
        lease_expires_at = NULL
    FROM unnest(%(release_ids)s::bigint[], %(release_attempts)s::int[], %(release_refunds)s::bool[],
                %(release_holds)s::float8[], %(release_snoozes)s::bool[])
        AS g(id, attempts, refund, hold, snooze)
    WHERE q.id = g.id AND q.attempts = g.attempts AND q.lease_owner = %(owner)s
    RETURNING q.id
)
SELECT id FROM archived
UNION ALL SELECT id FROM retried
UNION ALL SELECT id FROM buried
UNION ALL SELECT id FROM released
"""

#: JOB_SETTLE_MANY's move to dead_letter alone (the dead_* parameters and ``owner``), for an
#: outcome the database refused: it touches no other table (nor locks the rows of _ends_locked:
#: it moves one job), so a privilege missing on one of them does not stop it. Returns the ids
#: moved.
JOB_BURY_MANY = f"""
WITH {_BURY_MANY_DELETE},
{_BURY_FAILED_UNLOCKED}
SELECT id FROM buried
"""

#: Push the leases of running jobs ``seconds`` into the future, for those the caller still holds;
#: likewise the lease of a force-cancelled attempt's place in its group (pgjobs_group_holds),
#: which the worker ends (``seconds`` 0) once the handler has ended. Returns the ids extended.
JOB_EXTEND_LEASES = """
WITH extensions AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(seconds)s::float8[])
        AS e(id, attempts, seconds)
),
held AS (
    UPDATE pgjobs_group_holds h
    SET lease_expires_at = least(h.lease_expires_at, now() + e.seconds * interval '1 second')
    FROM extensions e
    WHERE h.job_id = e.id AND h.attempts = e.attempts AND h.lease_owner = %(owner)s
    RETURNING h.job_id
),
extended AS (
    UPDATE queued_jobs q
    SET lease_expires_at = now() + e.seconds * interval '1 second'
    FROM extensions e
    WHERE q.id = e.id AND q.attempts = e.attempts AND q.lease_owner = %(owner)s
    RETURNING q.id
)
SELECT id FROM extended
UNION ALL
SELECT job_id FROM held
"""

#: Store the handlers' latest progress of the running jobs ``ids`` (jsonb texts), each only
#: while this worker holds its lease (a job that lost it is left alone). Sent in the worker's
#: trip before the outcomes, so that a job ending in the same trip takes it into its table.
JOB_SET_PROGRESS = """
UPDATE queued_jobs q
SET progress = p.progress::jsonb
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(progress)s::text[])
    AS p(id, attempts, progress)
WHERE q.id = p.id AND q.attempts = p.attempts AND q.lease_owner = %(owner)s
"""
