"""Groups and unique keys: their side tables' upkeep and the groups' load for stats, the dashboard
and metrics.
"""

from __future__ import annotations

# JOB_CLAIM_LIMITED's steps for group rates (queries/claim.py), kept here beside the groups'
# other statements: ``group_task_rates`` (each task's group rate, for the groups looked at), as
# a common table expression followed by a comma.
_GROUP_TASK_RATES = """-- Each task's group rate, for each group looked at: what its starts of the group in the last
-- period, in every queue, leave.
group_task_rates AS MATERIALIZED (
    SELECT r.group_key, t.task, t.jobs, t.seconds,
           t.jobs - coalesce(
               (SELECT sum(x.jobs) FROM pgjobs_group_starts x
                WHERE x.group_key = r.group_key AND x.kind = 'task' AND x.name = t.task
                  AND x.started_at > now() - t.seconds * interval '1 second'), 0) AS room
    FROM (SELECT DISTINCT group_key FROM group_window) r
    CROSS JOIN unnest(%(group_rate_tasks)s::text[], %(group_rate_jobs)s::int[],
                      %(group_rate_seconds)s::float8[]) AS t(task, jobs, seconds)
),
"""

# JOB_CLAIM_LIMITED's last steps for group rates: ``rated`` (the starts it made, recorded) and
# ``rate_waits`` (when a group held by its rate may start again), after ``claimed``.
_GROUP_RATED = """-- The starts of each group under a group rate (the queue's, per (queue, group); a task's, per
-- (task, group)), at this claim's now(): the jobs' started_at.
rated AS (
    INSERT INTO pgjobs_group_starts AS s
        (group_key, kind, name, started_at, jobs, rate_jobs, rate_seconds)
    SELECT c.group_key, 'queue', c.queue, now(), count(*), k.group_rate_jobs,
           k.group_rate_seconds
    FROM group_caps k
    JOIN claimed c ON c.queue = k.queue AND c.group_key = k.group_key
    WHERE k.group_rate_jobs IS NOT NULL
    GROUP BY c.group_key, c.queue, k.group_rate_jobs, k.group_rate_seconds
    UNION ALL
    SELECT c.group_key, 'task', c.task, now(), count(*), r.jobs, r.seconds
    FROM group_task_rates r
    JOIN claimed c ON c.group_key = r.group_key AND c.task = r.task
    GROUP BY c.group_key, c.task, r.jobs, r.seconds
    ON CONFLICT (group_key, kind, name, started_at) DO UPDATE SET jobs = s.jobs + excluded.jobs
    RETURNING 1
),
-- Seconds until the oldest start in the window of a group held by its rate leaves it.
rate_waits AS (
    SELECT extract(epoch FROM (
               SELECT min(x.started_at) FROM pgjobs_group_starts x
               WHERE x.group_key = k.group_key AND x.kind = 'queue' AND x.name = k.queue
                 AND x.started_at > now() - k.group_rate_seconds * interval '1 second')
           + k.group_rate_seconds * interval '1 second' - now())::float8 AS wait
    FROM group_caps k
    WHERE k.group_rate_jobs IS NOT NULL AND k.room <= 0
    UNION ALL
    SELECT extract(epoch FROM (
               SELECT min(x.started_at) FROM pgjobs_group_starts x
               WHERE x.group_key = r.group_key AND x.kind = 'task' AND x.name = r.task
                 AND x.started_at > now() - r.seconds * interval '1 second')
           + r.seconds * interval '1 second' - now())::float8
    FROM group_task_rates r
    WHERE r.room <= 0
)"""

#: Make sure each throttled key (``tasks``, ``unique_keys``) has its pgjobs_throttles row before
#: JOB_INSERT_KEYED locks it (a row that does not exist cannot be locked): a new key's row names
#: no job (0) and no floor. Rows: (rows created,).
JOB_THROTTLE_ENSURE = """
WITH ensured AS (
    INSERT INTO pgjobs_throttles (task, unique_key, job_id, window_start_at)
    SELECT DISTINCT task, unique_key, 0, '-infinity'::timestamptz
    FROM unnest(%(tasks)s::text[], %(unique_keys)s::text[]) AS k(task, unique_key)
    ORDER BY task, unique_key
    ON CONFLICT (task, unique_key) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM ensured
"""

#: Tidy the group rows of ``queues`` (maintenance.groups): remove up to ``limit`` rows of groups
#: that hold no job and have seen no enqueue nor claim for ``idle`` seconds (the condition is
#: checked again on the row as last written: an enqueue that wrote it meanwhile keeps it), and
#: write the missing row of each group with ready jobs; remove the pgjobs_groups row of a group
#: whose last (queue, group) row it removed, and write the missing one of a group with rows;
#: remove up to ``limit`` rows of pgjobs_group_starts older than their rate's period.
#: Rows: one, (removed, written), rows of pgjobs_group_states.
GROUP_STATES_TIDY = """
WITH idle AS (
    DELETE FROM pgjobs_group_states g
    WHERE (g.queue, g.group_key) IN (
        SELECT s.queue, s.group_key FROM pgjobs_group_states s
        WHERE s.queue = ANY(%(queues)s::text[])
          AND s.touched_at < now() - %(idle)s * interval '1 second'
          AND s.last_claim_at < now() - %(idle)s * interval '1 second'
          AND NOT EXISTS (SELECT 1 FROM queued_jobs j
                          WHERE j.queue = s.queue AND j.group_key = s.group_key)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
      AND g.touched_at < now() - %(idle)s * interval '1 second'
      AND g.last_claim_at < now() - %(idle)s * interval '1 second'
    RETURNING g.queue, g.group_key
),
-- The row of every queue of a group whose last (queue, group) row was removed above (the
-- snapshot still sees those). An enqueue or a claim that wrote it meanwhile keeps it
-- (touched_at, checked again on the row as last written); one locked now is left for later.
unused AS (
    DELETE FROM pgjobs_groups a
    WHERE a.group_key IN (
        SELECT u.group_key FROM pgjobs_groups u
        WHERE u.group_key IN (SELECT group_key FROM idle)
          AND u.touched_at < now() - %(idle)s * interval '1 second'
          AND NOT EXISTS (SELECT 1 FROM pgjobs_group_states s
                          WHERE s.group_key = u.group_key
                            AND (s.queue, s.group_key) NOT IN (SELECT * FROM idle))
        FOR UPDATE SKIP LOCKED
    )
),
-- Starts under a group rate older than its period: no window holds them any more.
expired AS (
    DELETE FROM pgjobs_group_starts x
    WHERE (x.group_key, x.kind, x.name, x.started_at) IN (
        SELECT o.group_key, o.kind, o.name, o.started_at FROM pgjobs_group_starts o
        WHERE o.started_at <= now() - o.rate_seconds * interval '1 second'
        ORDER BY o.started_at
        LIMIT %(limit)s
    )
      AND x.started_at <= now() - x.rate_seconds * interval '1 second'
),
-- Places of force-cancelled jobs whose lease has ended: they count for nothing any more.
ended AS (
    DELETE FROM pgjobs_group_holds h
    WHERE h.job_id IN (SELECT job_id FROM pgjobs_group_holds
                       WHERE lease_expires_at <= now() LIMIT %(limit)s)
),
unlinked AS (
    INSERT INTO pgjobs_groups (group_key)
    SELECT DISTINCT s.group_key FROM pgjobs_group_states s
    WHERE s.queue = ANY(%(queues)s::text[])
      AND NOT EXISTS (SELECT 1 FROM pgjobs_groups a WHERE a.group_key = s.group_key)
    ORDER BY s.group_key
    ON CONFLICT DO NOTHING
),
missing AS (
    INSERT INTO pgjobs_group_states (queue, group_key)
    SELECT DISTINCT j.queue, j.group_key FROM queued_jobs j
    WHERE j.queue = ANY(%(queues)s::text[]) AND j.group_key IS NOT NULL
      AND j.lease_expires_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM pgjobs_group_states s
                      WHERE s.queue = j.queue AND s.group_key = j.group_key)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM idle), (SELECT count(*) FROM missing)
"""

#: Remove up to ``limit`` rows of pgjobs_throttles of ``tasks`` (throttled for ``seconds``, a
#: parallel array) that can hold no job back any more: the key's latest job has left queued_jobs
#: and started (if it ever did) more than a throttle ago; a row that names no job yet, written
#: more than a throttle ago. The row is locked SKIP LOCKED: an enqueue of the key holds it.
#: Rows: one, (removed,).
THROTTLES_TIDY = """
WITH gone AS (
    DELETE FROM pgjobs_throttles t
    WHERE (t.task, t.unique_key) IN (
        SELECT o.task, o.unique_key
        FROM pgjobs_throttles o
        JOIN unnest(%(tasks)s::text[], %(seconds)s::float8[]) AS k(task, seconds)
            ON k.task = o.task
        WHERE o.updated_at < now() - k.seconds * interval '1 second'
          AND NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = o.job_id)
          AND coalesce(
                  (SELECT max(a.started_at) FROM archived_jobs a WHERE a.id = o.job_id),
                  (SELECT max(d.started_at) FROM dead_letter d WHERE d.id = o.job_id),
                  '-infinity')
              < now() - k.seconds * interval '1 second'
        LIMIT %(limit)s
        FOR UPDATE OF o SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone
"""

#: The groups of every queue that holds grouped jobs (of queue ``queue`` only, unless NULL)
#: (``pgjobs.groups.load``): per queue, its
#: ``top`` groups by ready jobs (ready, running, at its limit), how many groups it has and how
#: many are at their limit, and what holds each top group with ready jobs back. Rows: (queue,
#: group_concurrency, groups, groups_capped, at_limit, group_key, ready, running, group at its
#: limit, hold reason, hold task, holding job ids, holding jobs, hold until, hold rate_jobs, hold
#: rate_seconds), one per top group and
#: hold (the hold columns NULL for a group held by nothing), or one with group_key NULL for a
#: queue with no group to show (``top`` 0: every queue's counts alone).
#:
#: Bounded whatever the queue holds: the queues, then each queue's groups with waiting jobs, are
#: found by skip scans of ix_queued_jobs_group_ready (one index probe per queue and group, at
#: most ``max_groups`` + 1 groups per queue: ``groups_capped``), and a group's ready jobs are
#: counted up to ``ready_cap`` + 1 rows of the same index (a group of 50,000 reads 1,001); with
#: ``top`` 0 no group's ready jobs are read. Running jobs are counted whole from
#: ix_queued_jobs_group_running: they are at most the workers' slots. A group is at its limit when
#: its running jobs reach the queue's group_concurrency, or those of one task reach that task's
#: (``tasks``/``limits``: the app's tasks that limit their groups, when the caller has the app).
#:
#: Holds (``models.HoldReason``), for the top groups with ready jobs only: at its limit, its
#: running jobs (the first ``holders`` ids and their count); for each ordered task
#: (``ordered_tasks``, ``hold_tasks`` those declared ``ordered="hold"``, as the claim takes them)
#: with a ready job in the group, its oldest job of the group in every queue when that job is not
#: ready (one probe of ix_queued_jobs_group_sequence; the ready job looked for among the task's
#: first ``ready_cap`` jobs of the group), and a dead job of a "hold" task (one probe of
#: ix_dead_letter_group_key_task); a group rate (the queue's, or a task's with a ready job of the
#: group here) whose window holds as many starts as it allows (pgjobs_group_starts, the group's
#: rows of the last period, with the rate the last claim obeyed): the starts counted, the rate,
#: and until when (the next start is allowed once enough of the oldest leave the window).
GROUPS_LOAD = """
WITH RECURSIVE queues AS (
    (SELECT queue FROM queued_jobs
     WHERE lease_expires_at IS NULL AND group_key IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM queued_jobs j
            WHERE j.lease_expires_at IS NULL AND j.group_key IS NOT NULL AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues q
    WHERE q.queue IS NOT NULL
),
waiting AS (
    SELECT q.queue, g.group_key, 1 AS n
    FROM queues q
    CROSS JOIN LATERAL (
        SELECT j.group_key FROM queued_jobs j
        WHERE j.queue = q.queue AND j.lease_expires_at IS NULL AND j.group_key IS NOT NULL
        ORDER BY j.group_key LIMIT 1
    ) g
    WHERE q.queue IS NOT NULL AND (%(queue)s::text IS NULL OR q.queue = %(queue)s::text)
    UNION ALL
    SELECT w.queue, g.group_key, w.n + 1
    FROM waiting w
    CROSS JOIN LATERAL (
        SELECT j.group_key FROM queued_jobs j
        WHERE j.queue = w.queue AND j.lease_expires_at IS NULL AND j.group_key IS NOT NULL
          AND j.group_key > w.group_key
        ORDER BY j.group_key LIMIT 1
    ) g
    WHERE w.n <= %(max_groups)s
),
common AS (
    SELECT q.queue, v.group_key
    FROM queues q
    CROSS JOIN (
        SELECT unnest(s.most_common_vals::text::text[]) AS group_key
        FROM pg_stats s
        JOIN pg_class c ON c.oid = 'queued_jobs'::regclass
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE s.schemaname = n.nspname AND s.tablename = 'queued_jobs'
          AND s.attname = 'group_key'
    ) v
    WHERE q.queue IS NOT NULL AND %(top)s > 0
      AND (%(queue)s::text IS NULL OR q.queue = %(queue)s::text)
),
candidates AS (
    SELECT queue, group_key FROM waiting WHERE n <= %(max_groups)s
    UNION
    SELECT queue, group_key FROM common
),
ready AS (
    SELECT c.queue, c.group_key, r.ready
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT count(*)::int AS ready FROM (
            SELECT 1 FROM queued_jobs j
            WHERE j.queue = c.queue AND j.group_key = c.group_key
              AND j.lease_expires_at IS NULL AND j.group_key IS NOT NULL AND j.run_at <= now()
            LIMIT %(ready_cap)s + 1
        ) counted
        WHERE %(top)s > 0
    ) r
),
shown AS (
    SELECT queue, group_key FROM waiting WHERE n <= %(max_groups)s
    UNION
    SELECT queue, group_key FROM ready WHERE ready > 0
),
limits AS (
    SELECT * FROM unnest(%(tasks)s::text[], %(limits)s::int[]) AS l(task, group_concurrency)
),
-- A task's limit holds per (task, group) in every queue, as the claim counts it: at its limit
-- by its running jobs of the group in all queues together.
running_tasks AS (
    SELECT r.queue, r.group_key, r.task, r.running,
           coalesce(r.everywhere >= l.group_concurrency, false) AS at_limit
    FROM (
        SELECT queue, group_key, task, count(*) AS running,
               sum(count(*)) OVER (PARTITION BY group_key, task) AS everywhere
        FROM queued_jobs
        WHERE lease_expires_at IS NOT NULL AND group_key IS NOT NULL
        GROUP BY queue, group_key, task
    ) r
    LEFT JOIN limits l ON l.task = r.task
),
running AS (
    SELECT queue, group_key, sum(running)::int AS running
    FROM running_tasks
    WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
    GROUP BY queue, group_key
),
loads AS (
    SELECT coalesce(w.queue, r.queue) AS queue, coalesce(w.group_key, r.group_key) AS group_key,
           coalesce(w.ready, 0) AS ready, coalesce(r.running, 0) AS running,
           EXISTS (SELECT 1 FROM running_tasks x
                   WHERE x.group_key = coalesce(w.group_key, r.group_key) AND x.at_limit)
           OR coalesce(r.running, 0) >= p.group_concurrency IS TRUE AS at_limit,
           p.group_concurrency
    FROM (SELECT queue, group_key, ready.ready FROM shown LEFT JOIN ready USING (queue, group_key)) w
    FULL JOIN running r ON r.queue = w.queue AND r.group_key = w.group_key
    LEFT JOIN pgjobs_queues p ON p.name = coalesce(w.queue, r.queue)
),
ranked AS (
    SELECT l.*,
           count(*) OVER per_queue AS groups,
           count(*) FILTER (WHERE at_limit) OVER per_queue AS groups_at_limit,
           row_number() OVER (per_queue ORDER BY ready DESC, running DESC, group_key) AS rank
    FROM loads l
    WINDOW per_queue AS (PARTITION BY queue)
)
SELECT r.queue, r.group_concurrency, r.groups,
       EXISTS (SELECT 1 FROM waiting w WHERE w.queue = r.queue AND w.n > %(max_groups)s),
       r.groups_at_limit,
       CASE WHEN %(top)s > 0 THEN r.group_key END, r.ready, r.running, r.at_limit,
       h.reason, h.task, h.job_ids, h.jobs, h.until, h.rate_jobs, h.rate_seconds
FROM ranked r
LEFT JOIN LATERAL (
    -- At its limit: the running jobs that hold it (every one of the queue at the queue's limit;
    -- those of the tasks at their own limit otherwise, in any queue, an ordered task's shown
    -- below as its oldest job).
    SELECT 1 AS nth, 'limit' AS reason, NULL::text AS task,
           (array_agg(j.id ORDER BY j.id))[1:%(holders)s] AS job_ids, count(*)::int AS jobs,
           NULL::timestamptz AS until, NULL::int AS rate_jobs, NULL::float8 AS rate_seconds
    FROM queued_jobs j
    WHERE %(top)s > 0 AND r.ready > 0 AND r.at_limit
      AND j.group_key = r.group_key
      AND j.lease_expires_at IS NOT NULL
      AND (j.queue = r.queue AND r.running >= r.group_concurrency OR EXISTS (
              SELECT 1 FROM running_tasks x
              WHERE x.queue = j.queue AND x.group_key = j.group_key AND x.task = j.task
                AND x.at_limit AND x.task <> ALL(%(ordered_tasks)s::text[])))
    HAVING count(*) > 0
    UNION ALL
    -- An ordered task: its oldest job of the group, when not ready, holds the task's ready jobs
    -- behind it; a dead job of a "hold" task holds them all.
    SELECT v.nth, v.reason, t.task, ARRAY[v.id], 1, v.until, NULL, NULL
    FROM unnest(%(ordered_tasks)s::text[]) AS t(task)
    -- The oldest job in every queue, as the claim takes an ordered group's head:
    -- ix_queued_jobs_group_sequence's first row of (group, task).
    CROSS JOIN LATERAL (
        SELECT j.id, j.lease_expires_at, j.run_at, j.attempts FROM queued_jobs j
        WHERE j.group_key = r.group_key AND j.task = t.task
        ORDER BY j.id LIMIT 1
    ) head
    -- A dead job of a "hold" task: ix_dead_letter_group_key_task, as the claim reads it.
    LEFT JOIN LATERAL (
        SELECT d.id FROM dead_letter d
        WHERE t.task = ANY(%(hold_tasks)s::text[])
          AND d.group_key = r.group_key AND d.task = t.task
        ORDER BY d.id LIMIT 1
    ) dead ON true
    CROSS JOIN LATERAL (VALUES
        (2, CASE WHEN head.lease_expires_at IS NOT NULL THEN 'running'
                 WHEN head.run_at <= now() THEN NULL
                 WHEN head.attempts > 0 THEN 'retry'
                 ELSE 'scheduled' END,
         head.id, CASE WHEN head.lease_expires_at IS NULL THEN head.run_at END),
        (3, CASE WHEN dead.id IS NOT NULL THEN 'dead' END, dead.id, NULL::timestamptz)
    ) v(nth, reason, id, until)
    WHERE %(top)s > 0 AND r.ready > 0 AND v.reason IS NOT NULL
      -- A ready job of the task in the group, looked for among its first ready_cap jobs.
      AND EXISTS (
          SELECT 1 FROM (
              SELECT n.lease_expires_at, n.run_at FROM queued_jobs n
              WHERE n.queue = r.queue AND n.group_key = r.group_key AND n.task = t.task
              ORDER BY n.id LIMIT %(ready_cap)s
          ) n
          WHERE n.lease_expires_at IS NULL AND n.run_at <= now())
    UNION ALL
    -- A group rate whose window is full: held until the oldest starts leave it.
    SELECT 4, 'rate', CASE WHEN w.kind = 'task' THEN w.name END, '{}'::bigint[],
           w.started::int, w.until, w.rate_jobs, w.rate_seconds
    FROM (
        SELECT y.kind, y.name, y.rate_jobs, y.rate_seconds, max(y.total) AS started,
               min(y.started_at + y.rate_seconds * interval '1 second')
                   FILTER (WHERE y.total - y.upto < y.rate_jobs) AS until
        FROM (
            SELECT x.kind, x.name, x.started_at, s.rate_jobs, s.rate_seconds,
                   sum(x.jobs) OVER (PARTITION BY x.kind, x.name) AS total,
                   sum(x.jobs) OVER (PARTITION BY x.kind, x.name ORDER BY x.started_at) AS upto
            FROM (
                -- Each rate of the group, as the last claim under it obeyed it.
                SELECT DISTINCT ON (z.kind, z.name) z.kind, z.name, z.rate_jobs, z.rate_seconds
                FROM pgjobs_group_starts z
                WHERE z.group_key = r.group_key
                  AND (z.kind = 'task' OR z.name = r.queue)
                ORDER BY z.kind, z.name, z.started_at DESC
            ) s
            JOIN pgjobs_group_starts x
                ON x.group_key = r.group_key AND x.kind = s.kind AND x.name = s.name
               AND x.started_at > now() - s.rate_seconds * interval '1 second'
        ) y
        GROUP BY y.kind, y.name, y.rate_jobs, y.rate_seconds
        HAVING max(y.total) >= y.rate_jobs
    ) w
    WHERE %(top)s > 0 AND r.ready > 0
      AND (w.kind = 'queue' OR EXISTS (
          SELECT 1 FROM (
              SELECT n.queue, n.lease_expires_at, n.run_at FROM queued_jobs n
              WHERE n.group_key = r.group_key AND n.task = w.name
              ORDER BY n.id LIMIT %(ready_cap)s
          ) n
          WHERE n.queue = r.queue AND n.lease_expires_at IS NULL AND n.run_at <= now()))
) h ON true
WHERE r.rank <= greatest(%(top)s, 1)
ORDER BY r.queue, r.rank, h.nth, h.task
"""
