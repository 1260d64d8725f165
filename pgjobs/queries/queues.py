"""Queues: the settings row (pause, limits), which queues have jobs, waking them."""

from __future__ import annotations

from pgjobs.models import ArchivedStatus
from pgjobs.queries.channels import NOTIFY_CHANNEL
from pgjobs.queries.columns import _MOVED_COLUMNS


# Every queue that holds a job, read from the indexes alone: the ready and scheduled jobs' queues
# by skip scans of the claim index, the limited claim's and the groups' (one index probe per
# queue, however many jobs), the running jobs' queues from the lease index (running jobs are few:
# at most the workers' slots).
def _queues_in(name: str, condition: str) -> str:
    """A recursive CTE ``name(queue)``: the queues of the queued_jobs rows that meet
    ``condition`` (on ``j``), one index probe per queue (a skip scan), NULL last."""
    return f"""{name}(queue) AS (
    (SELECT j.queue FROM queued_jobs j WHERE {condition} ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM queued_jobs j
            WHERE {condition} AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM {name} p
    WHERE p.queue IS NOT NULL
)"""


_QUEUES_WITH_JOBS = f"""
RECURSIVE {_queues_in("waiting", "j.lease_expires_at IS NULL AND j.limit_key IS NULL AND j.group_key IS NULL")},
{_queues_in("grouped", "j.lease_expires_at IS NULL AND j.group_key IS NOT NULL")},
{_queues_in("held", "j.lease_expires_at IS NULL AND j.limit_key IS NOT NULL")},
with_jobs AS (
    SELECT queue FROM waiting WHERE queue IS NOT NULL
    UNION
    SELECT queue FROM held WHERE queue IS NOT NULL
    UNION
    SELECT queue FROM grouped WHERE queue IS NOT NULL
    UNION
    SELECT queue FROM queued_jobs WHERE lease_expires_at IS NOT NULL
)
"""

# Whether queue %(name)s holds a job (ready, scheduled or running), through the same indexes.
_QUEUE_HAS_JOBS = """
(EXISTS (SELECT 1 FROM queued_jobs
         WHERE queue = %(name)s AND lease_expires_at IS NULL AND limit_key IS NULL
           AND group_key IS NULL)
 OR EXISTS (SELECT 1 FROM queued_jobs
            WHERE queue = %(name)s AND lease_expires_at IS NULL AND group_key IS NOT NULL)
 OR EXISTS (SELECT 1 FROM queued_jobs
            WHERE queue = %(name)s AND lease_expires_at IS NULL AND limit_key IS NOT NULL)
 OR EXISTS (SELECT 1 FROM queued_jobs WHERE queue = %(name)s AND lease_expires_at IS NOT NULL))
"""

# Columns of a queue's limits (pgjobs_queues p), in the order of models.QueueState.
_QUEUE_LIMIT_COLUMNS = (
    "p.concurrency, p.rate_jobs, p.rate_seconds, p.group_concurrency, "
    "p.group_rate_jobs, p.group_rate_seconds"
)

#: Every known queue (one that holds a job, or has settings) with its settings, by name.
#: Rows: (name, paused_at, paused_by, pause_reason, holds jobs, concurrency, rate_jobs,
#: rate_seconds, group_concurrency, group_rate_jobs, group_rate_seconds).
QUEUE_LIST = f"""
WITH {_QUEUES_WITH_JOBS}
SELECT coalesce(j.queue, p.name), p.paused_at, p.paused_by, p.pause_reason, j.queue IS NOT NULL,
       {_QUEUE_LIMIT_COLUMNS}
FROM with_jobs j
FULL JOIN pgjobs_queues p ON p.name = j.queue
ORDER BY 1
"""

#: One queue's settings, known or not. Rows: one, as QUEUE_LIST's.
QUEUE_GET = f"""
SELECT %(name)s::text, p.paused_at, p.paused_by, p.pause_reason, {_QUEUE_HAS_JOBS},
       {_QUEUE_LIMIT_COLUMNS}
FROM (SELECT 1) one
LEFT JOIN pgjobs_queues p ON p.name = %(name)s
"""

#: Set queue ``name``'s concurrency limit (when ``set_concurrency``), rate (when ``set_rate``)
#: group concurrency (when ``set_group_concurrency``) and group rate (when ``set_group_rate``) to
#: the values given, NULL removing one;
#: the other settings stay as they were. A
#: new or changed rate starts the queue's token bucket full (pgjobs_limit_states).
#: Wakes the idle workers of the queue (a limit raised lets them claim more). Rows: (whether a
#: setting changed).
QUEUE_LIMIT = f"""
WITH before AS (
    SELECT concurrency, rate_jobs, rate_seconds, group_concurrency, group_rate_jobs,
           group_rate_seconds
    FROM pgjobs_queues WHERE name = %(name)s
),
limited AS (
    INSERT INTO pgjobs_queues AS q (
        name, concurrency, rate_jobs, rate_seconds, group_concurrency, group_rate_jobs,
        group_rate_seconds, updated_at
    )
    VALUES (%(name)s, %(concurrency)s::int, %(rate_jobs)s::int, %(rate_seconds)s::float8,
            %(group_concurrency)s::int, %(group_rate_jobs)s::int,
            %(group_rate_seconds)s::float8, now())
    ON CONFLICT (name) DO UPDATE
    SET concurrency = CASE WHEN %(set_concurrency)s THEN excluded.concurrency
                           ELSE q.concurrency END,
        rate_jobs = CASE WHEN %(set_rate)s THEN excluded.rate_jobs ELSE q.rate_jobs END,
        rate_seconds = CASE WHEN %(set_rate)s THEN excluded.rate_seconds ELSE q.rate_seconds END,
        group_concurrency = CASE WHEN %(set_group_concurrency)s THEN excluded.group_concurrency
                                 ELSE q.group_concurrency END,
        group_rate_jobs = CASE WHEN %(set_group_rate)s THEN excluded.group_rate_jobs
                               ELSE q.group_rate_jobs END,
        group_rate_seconds = CASE WHEN %(set_group_rate)s THEN excluded.group_rate_seconds
                                  ELSE q.group_rate_seconds END,
        updated_at = now()
    RETURNING concurrency, rate_jobs, rate_seconds, group_concurrency, group_rate_jobs,
              group_rate_seconds
),
state AS (
    INSERT INTO pgjobs_limit_states (kind, name, tokens, refilled_at)
    SELECT 'queue', %(name)s, l.rate_jobs, CASE WHEN l.rate_jobs IS NOT NULL THEN clock_timestamp() END
    FROM limited l
    LEFT JOIN before b ON true
    WHERE (l.rate_jobs, l.rate_seconds) IS DISTINCT FROM (b.rate_jobs, b.rate_seconds)
    ON CONFLICT (kind, name) DO UPDATE
    SET tokens = excluded.tokens, refilled_at = excluded.refilled_at
)
SELECT (l.concurrency, l.rate_jobs, l.rate_seconds, l.group_concurrency, l.group_rate_jobs,
        l.group_rate_seconds)
       IS DISTINCT FROM (b.concurrency, b.rate_jobs, b.rate_seconds, b.group_concurrency,
                         b.group_rate_jobs, b.group_rate_seconds)
FROM limited l
LEFT JOIN before b ON true
CROSS JOIN pg_notify('{NOTIFY_CHANNEL}', %(name)s)
"""

#: Pause queue ``name`` (known or not): from the next claim on, no worker claims its jobs. A
#: paused queue stays paused as it was (since, by whom); a new ``reason`` replaces the old one.
#: ``by`` NULL records the database role. Rows: (whether it was paused by this statement).
QUEUE_PAUSE = """
WITH before AS (SELECT paused_at FROM pgjobs_queues WHERE name = %(name)s)
INSERT INTO pgjobs_queues AS q (name, paused_at, paused_by, pause_reason, updated_at)
VALUES (%(name)s, now(), coalesce(%(by)s, session_user), %(reason)s, now())
ON CONFLICT (name) DO UPDATE
SET paused_at = coalesce(q.paused_at, excluded.paused_at),
    paused_by = CASE WHEN q.paused_at IS NULL THEN excluded.paused_by ELSE q.paused_by END,
    pause_reason = CASE WHEN q.paused_at IS NULL OR excluded.pause_reason IS NOT NULL
                        THEN excluded.pause_reason ELSE q.pause_reason END,
    updated_at = now()
RETURNING NOT EXISTS (SELECT 1 FROM before WHERE paused_at IS NOT NULL)
"""

#: Resume queue ``name`` and wake the idle workers that serve it (they claim at once). Rows:
#: one when it was paused, none when it was not.
QUEUE_RESUME = f"""
WITH resumed AS (
    UPDATE pgjobs_queues
    SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, updated_at = now()
    WHERE name = %(name)s AND paused_at IS NOT NULL
    RETURNING name
)
SELECT name FROM resumed, pg_notify('{NOTIFY_CHANNEL}', resumed.name)
"""

#: What a burst worker with nothing to claim still waits for in ``queues``, after archiving (as
#: expired, up to ``limit``) the unleased jobs of those queues past their expires_at, so that it
#: never leaves them behind. Rows: one, (expired now, jobs left, scheduled for later in active
#: queues, the next one's run_at, ready or scheduled in paused queues, running, ready but
#: waiting for a limit: held back for their task's, or in a limited queue, waiting for their
#: dependencies in active queues).
QUEUES_LEFT_FOR_BURST = f"""
WITH expired AS (
    DELETE FROM queued_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM queued_jobs
        WHERE queue = ANY(%(queues)s::text[])
          AND expires_at <= now() AND lease_expires_at IS NULL
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING *
),
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, last_error)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.EXPIRED}', last_error FROM expired
    RETURNING id
),
waiting AS (
    SELECT q.run_at, q.lease_expires_at, coalesce(p.paused_at IS NOT NULL, false) AS paused,
           q.limit_key IS NOT NULL OR q.group_key IS NOT NULL
               OR coalesce(p.concurrency IS NOT NULL OR p.rate_jobs IS NOT NULL, false)
               AS limited
    FROM queued_jobs q
    LEFT JOIN pgjobs_queues p ON p.name = q.queue
    WHERE q.queue = ANY(%(queues)s::text[])
      AND (q.expires_at IS NULL OR q.expires_at > now() OR q.lease_expires_at IS NOT NULL)
)
SELECT (SELECT count(*) FROM archived),
       count(*),
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now() AND NOT paused
                          AND run_at <> 'infinity'),
       min(run_at) FILTER (WHERE lease_expires_at IS NULL AND run_at > now() AND NOT paused
                             AND run_at <> 'infinity'),
       count(*) FILTER (WHERE lease_expires_at IS NULL AND paused),
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL),
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now() AND NOT paused
                          AND limited),
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at = 'infinity' AND NOT paused)
FROM waiting
"""

#: NOTIFY each of ``queues`` as an enqueue does: a burst worker that found nothing left says so
#: on its way out, so that the burst workers waiting for the jobs it ran look again at once
#: rather than at their next poll. Rows: one, the count of queues notified.
QUEUES_WAKE = f"""
SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM unnest(%(queues)s::text[]) AS queue
"""
