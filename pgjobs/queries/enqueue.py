"""Jobs entering queued_jobs, in the few shapes a job needs (``pgjobs.enqueue.Shape``): one job
(ready now, or with any plain option), many through unnest (nullable arrays for what few jobs
carry), COPY, and the keyed insert (an idempotency key, a group or a unique key). Every column
these write exists at the schema's head; the forms kept for older schemas are gone.
"""

from __future__ import annotations

from pgjobs.queries.channels import NOTIFY_CHANNEL
from pgjobs.queries.columns import _NEXT_JOB_ID_SEQ
from pgjobs.queries.jobs import _QUEUED_AS_FOUND

# A row's tags as text[] from ``{row}.tags`` (jsonb, a JSON array): NULL stays NULL, never an
# empty array. Tags travel as one JSON array per row (``%(tags)s``, NULL for a row without, or
# NULL for the whole array when no row has any), an array of arrays being no unnest input.
_TAG_ARRAY = (
    "CASE WHEN {row}.tags IS NOT NULL THEN ARRAY(SELECT t FROM jsonb_array_elements_text({row}.tags)"
    " WITH ORDINALITY AS e(t, n) ORDER BY n) END"
)

#: Insert one job (Shape.ONE: no key, group or unique key) with its run time, expiry, payload
#: version, trace context and tags (each NULL when not given), and wake idle workers of its
#: queue. Rows: (id,); pg_notify sits in FROM so that its void result is not a column to send and
#: decode.
JOB_INSERT = f"""
WITH inserted AS (
    INSERT INTO queued_jobs (queue, task, payload, priority, run_at, max_attempts,
                             expires_at, payload_version, trace_context, tags)
    VALUES (
        %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now() + %(run_in)s * interval '1 second'),
        %(max_attempts)s,
        coalesce(%(expires_at)s::timestamptz, now() + %(expires_in)s::float8 * interval '1 second'),
        %(payload_version)s::int, %(trace_context)s::jsonb, %(tags)s::text[]
    )
    RETURNING id, queue
)
SELECT id FROM inserted, pg_notify('{NOTIFY_CHANNEL}', queue)
"""

#: JOB_INSERT for the usual job (Shape.READY): ready now, never expiring, nothing but its task's
#: columns; run_at takes its default, now(). The hottest statement (also sent by db/libpq.py).
JOB_INSERT_READY = f"""
WITH inserted AS (
    INSERT INTO queued_jobs (queue, task, payload, priority, max_attempts)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s)
    RETURNING id, queue
)
SELECT id FROM inserted, pg_notify('{NOTIFY_CHANNEL}', queue)
"""

# The job that holds each idempotency key of a batch (``input``) in any of the three tables.
_EXISTING_KEYS = """existing AS (
    SELECT i.position, (
        SELECT id FROM queued_jobs WHERE idempotency_key = i.idempotency_key
        UNION ALL
        SELECT id FROM archived_jobs WHERE idempotency_key = i.idempotency_key
        UNION ALL
        SELECT id FROM dead_letter WHERE idempotency_key = i.idempotency_key
        LIMIT 1
    ) AS id
    FROM input i
    WHERE i.idempotency_key IS NOT NULL
)"""

# The columns a keyed insert writes (JOB_INSERT_KEYED), from its ``fresh`` rows.
_KEYED_COLUMNS = (
    "id, queue, task, payload, priority, run_at, max_attempts, expires_at, idempotency_key, "
    "payload_version, trace_context, group_key, unique_key, tags, batch_id"
)


#: Insert jobs of which some have an idempotency key, a group or a unique key (Shape.KEYED,
#: pgjobs.uniqueness), from parallel arrays as JOB_INSERT_MANY plus each job's idempotency key,
#: group, unique key, on_conflict mode, debounce, its task's throttle (seconds), and the batch
#: ``batch_id`` they join (NULL: none). In one statement:
#: - a job whose idempotency key is already taken (in any of the three tables, or earlier in
#:   the same call) is not inserted and the holder's id returned;
#: - every (queue, group) of the batch upserts its pgjobs_group_states row, in (queue, group)
#:   order (concurrent batches lock them in one order), writing touched_at: a claim that counted
#:   the group's running jobs in an older snapshot sees the row changed;
#: - a throttled key's job runs no earlier than its window: the previous job of the key
#:   (pgjobs_throttles) started + throttle, or that job's own floor when it never started;
#: - "keep" rows insert ON CONFLICT DO NOTHING (any unique index) and return the holder;
#:   "replace" and "debounce" rows update the holder (a not-started job of the task with the key)
#:   with the new payload, priority, run time, payload version, max_attempts, and trace context
#:   expiry and tags when given; the first insert of a debounced job waits too;
#: - a throttled key's new job becomes the key's previous job.
#: A holder waiting for its dependencies (run_at 'infinity') that is replaced keeps waiting, its
#: new run time kept for its release (pgjobs_waiting).
#: The caller merges rows of one batch with the same (task, unique key). Rows: (position, id,
#: created), where id is the holder's for a key held; NULL when a concurrent enqueue holds a key
#: but has not committed yet (the caller sends those rows again: the next statement sees the
#: commit); created: this statement inserted the job (a dependent's edges go on it).
JOB_INSERT_KEYED = f"""
WITH input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[],
        %(keys)s::text[], %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[],
        %(groups)s::text[], %(unique_keys)s::text[], %(modes)s::text[], %(debounces)s::float8[],
        %(throttles)s::float8[], %(tags)s::text[]::jsonb[]
    ) WITH ORDINALITY AS r(queue, task, payload, priority, run_at, run_in, max_attempts,
                           expires_at, expires_in, idempotency_key, payload_version,
                           trace_context, group_key, unique_key, mode, debounce, throttle,
                           tags, position)
),
{_EXISTING_KEYS},
groups AS (
    INSERT INTO pgjobs_group_states AS g (queue, group_key)
    SELECT DISTINCT queue, group_key FROM input WHERE group_key IS NOT NULL
    ORDER BY queue, group_key
    ON CONFLICT (queue, group_key) DO UPDATE SET touched_at = clock_timestamp()
),
-- The throttle rows of the batch's throttled keys as this statement's snapshot sees them, and
-- locked (their latest version): a row changed since the snapshot names a job the snapshot may
-- not see; such rows are sent again (stale).
throttled AS (
    SELECT i.position, t.job_id, t.window_start_at
    FROM input i
    JOIN pgjobs_throttles t ON t.task = i.task AND t.unique_key = i.unique_key
    WHERE i.throttle IS NOT NULL
),
latest AS (
    SELECT t.task, t.unique_key, t.job_id
    FROM pgjobs_throttles t
    WHERE (t.task, t.unique_key) IN (
        SELECT task, unique_key FROM input WHERE throttle IS NOT NULL
    )
    ORDER BY t.task, t.unique_key
    FOR UPDATE
),
stale AS (
    SELECT i.position
    FROM input i
    LEFT JOIN throttled th ON th.position = i.position
    LEFT JOIN latest l ON l.task = i.task AND l.unique_key = i.unique_key
    WHERE i.throttle IS NOT NULL AND (th.job_id IS NULL OR l.job_id IS DISTINCT FROM th.job_id)
),
-- The previous job of each throttled key while in queued_jobs, locked: its latest start (NULL:
-- not started, so it holds the key, and no claim starts it before this statement commits).
running AS (
    SELECT q.id, q.started_at
    FROM queued_jobs q
    WHERE q.id IN (SELECT job_id FROM latest)
    FOR UPDATE OF q
),
-- A throttled job's earliest start: the previous job's start + the throttle; its own floor if it
-- never started (cancelled, expired); now + the throttle if it left queued_jobs since the
-- snapshot (it started no later than now).
windows AS (
    SELECT i.position,
           greatest(
               th.window_start_at,
               CASE WHEN r.id IS NOT NULL THEN r.started_at
                    WHEN EXISTS (SELECT 1 FROM queued_jobs WHERE id = th.job_id)
                        THEN clock_timestamp()
                    ELSE coalesce(
                        (SELECT started_at FROM archived_jobs WHERE id = th.job_id),
                        (SELECT started_at FROM dead_letter WHERE id = th.job_id)
                    )
               END + i.throttle * interval '1 second'
           ) AS floor
    FROM input i
    JOIN throttled th ON th.position = i.position
    LEFT JOIN running r ON r.id = th.job_id
    WHERE i.position NOT IN (SELECT position FROM stale)
),
fresh AS (
    SELECT i.id, i.queue, i.task, i.payload, i.priority,
           greatest(
               coalesce(i.run_at, now() + i.run_in * interval '1 second'),
               now() + i.debounce * interval '1 second',
               w.floor
           ) AS run_at,
           i.max_attempts,
           coalesce(i.expires_at, now() + i.expires_in * interval '1 second') AS expires_at,
           i.idempotency_key, i.payload_version, i.trace_context, i.group_key, i.unique_key,
           i.mode, i.throttle, i.position, w.floor,
           {_TAG_ARRAY.format(row="i")} AS tags,
           %(batch_id)s::bigint AS batch_id
    FROM input i
    LEFT JOIN existing e ON e.position = i.position
    LEFT JOIN windows w ON w.position = i.position
    WHERE e.id IS NULL AND i.position NOT IN (SELECT position FROM stale)
),
kept AS (
    INSERT INTO queued_jobs ({_KEYED_COLUMNS})
    SELECT {_KEYED_COLUMNS} FROM fresh
    WHERE mode IS NULL OR mode = 'keep'
    ORDER BY position
    ON CONFLICT DO NOTHING
    RETURNING id, queue, task, unique_key, idempotency_key, true AS inserted
),
replaced AS (
    INSERT INTO queued_jobs AS q ({_KEYED_COLUMNS})
    SELECT {_KEYED_COLUMNS} FROM fresh
    WHERE mode IN ('replace', 'debounce')
    ORDER BY position
    ON CONFLICT (task, unique_key) WHERE unique_key IS NOT NULL AND started_at IS NULL
    DO UPDATE SET payload = excluded.payload,
                  priority = excluded.priority,
                  run_at = CASE WHEN q.run_at = 'infinity' THEN q.run_at
                                ELSE excluded.run_at END,
                  max_attempts = excluded.max_attempts,
                  payload_version = excluded.payload_version,
                  trace_context = coalesce(excluded.trace_context, q.trace_context),
                  expires_at = coalesce(excluded.expires_at, q.expires_at),
                  tags = coalesce(excluded.tags, q.tags)
    RETURNING id, queue, task, unique_key, idempotency_key, xmax = 0 AS inserted
),
-- A holder waiting for its dependencies (run_at 'infinity') keeps waiting: the new run time is
-- the one it takes when the last of them succeeds.
rewaited AS (
    UPDATE pgjobs_waiting wt SET run_at = f.run_at
    FROM replaced r JOIN fresh f ON f.task = r.task AND f.unique_key = r.unique_key
    WHERE wt.job_id = r.id AND NOT r.inserted
),
written AS (
    SELECT * FROM kept UNION ALL SELECT * FROM replaced
),
windowed AS (
    INSERT INTO pgjobs_throttles AS t (task, unique_key, job_id, window_start_at)
    SELECT f.task, f.unique_key, f.id, coalesce(f.floor, '-infinity')
    FROM fresh f JOIN written w ON w.id = f.id
    WHERE f.throttle IS NOT NULL AND w.inserted
    ORDER BY f.task, f.unique_key
    ON CONFLICT (task, unique_key) DO UPDATE
    SET job_id = excluded.job_id, window_start_at = excluded.window_start_at,
        updated_at = clock_timestamp()
    WHERE t.job_id < excluded.job_id
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM written) q
)
SELECT i.position, coalesce(
    e.id, w.id, twin.id,
    (SELECT q.id FROM queued_jobs q
     WHERE q.task = i.task AND q.unique_key = i.unique_key AND q.started_at IS NULL
       AND i.position NOT IN (SELECT position FROM stale))
), w.id IS NOT NULL AND w.id = i.id AS created
FROM input i
LEFT JOIN existing e ON e.position = i.position
LEFT JOIN written w ON w.id = i.id OR (w.task = i.task AND w.unique_key = i.unique_key)
LEFT JOIN written twin ON twin.idempotency_key = i.idempotency_key
CROSS JOIN notified
ORDER BY i.position
"""


#: The isolation level of the caller's transaction that a keyed insert would join (JOB_INSERT_MANY
#: can keep its promise only where each statement sees every commit: READ COMMITTED).
#: Rows: ('read committed' | 'repeatable read' | 'serializable' | 'read uncommitted').
JOB_INSERT_ISOLATION = "SELECT current_setting('transaction_isolation')"

#: Reserve ``count`` job ids, ascending, for a bulk enqueue by COPY, with the transaction's
#: ``now()`` (the base of ``run_in`` delays, as in JOB_INSERT_MANY), and wake idle workers of each
#: of ``queues`` once (COPY cannot NOTIFY by itself; a NOTIFY is delivered at commit).
#: Rows: (now, ids array, number of queues notified).
JOB_RESERVE_IDS = f"""
SELECT now(),
       ARRAY(
           SELECT nextval(seq)
           FROM CAST(pg_get_serial_sequence('queued_jobs', 'id') AS regclass) AS seq,
                generate_series(1, %(count)s)
       ),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM unnest(%(queues)s::text[]) AS queue)
"""


# The steps of JOB_INSERT_MANY and JOB_INSERT_SHOWN: ``input``, each job's row from the parallel
# arrays with its new id and position, and ``inserted``, those rows written (RETURNING
# ``{returning}``), their queues woken.
_MANY_STEPS = f"""
input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[],
        %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[], %(tags)s::text[]::jsonb[]
    ) WITH ORDINALITY AS r(queue, task, payload, priority, run_at, run_in, max_attempts,
                           expires_at, expires_in, payload_version, trace_context, tags, position)
),
inserted AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                             expires_at, payload_version, trace_context, tags, batch_id)
    SELECT i.id, i.queue, i.task, i.payload, i.priority,
           coalesce(i.run_at, now() + i.run_in * interval '1 second'),
           i.max_attempts,
           coalesce(i.expires_at, now() + i.expires_in * interval '1 second'),
           i.payload_version, i.trace_context, {_TAG_ARRAY.format(row="i")},
           %(batch_id)s::bigint
    FROM input i
    ORDER BY i.position
    RETURNING {{returning}}
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) q
)"""

#: Insert many jobs without a key, group or unique key (Shape.ONE or READY), from parallel arrays
#: (``payload_versions``, ``trace_contexts`` and ``tags`` may be NULL as a whole when no job has
#: one: unnest pads a NULL array with NULLs), as members of batch ``batch_id`` (NULL: none), and
#: wake their queues' idle workers. Rows: (position, id). No lookup of keys, no join on them, and
#: no ON CONFLICT, whose speculative insertion costs every row a lock taken and released.
JOB_INSERT_MANY = f"""
WITH {_MANY_STEPS.format(returning="queue")}
SELECT i.position, i.id FROM input i CROSS JOIN notified ORDER BY i.position
"""

#: JOB_INSERT_MANY for jobs that are all Shape.READY, outside a batch (the usual bulk enqueue):
#: only their task's columns travel, run_at takes its default, now(). Rows: (position, id).
JOB_INSERT_MANY_READY = f"""
WITH input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(max_attempts)s::int[]
    ) WITH ORDINALITY AS r(queue, task, payload, priority, max_attempts, position)
),
inserted AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, max_attempts)
    SELECT i.id, i.queue, i.task, i.payload, i.priority, i.max_attempts
    FROM input i
    ORDER BY i.position
    RETURNING queue
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) q
)
SELECT i.position, i.id FROM input i CROSS JOIN notified ORDER BY i.position
"""

#: JOB_INSERT_MANY answering each new job as JOB_LOOKUP finds it, in the order given (the HTTP
#: API's one-job enqueues, coalesced: each answer is built from the inserted row, not read again).
JOB_INSERT_SHOWN = f"""
WITH {_MANY_STEPS.format(returning="*")}
SELECT {_QUEUED_AS_FOUND}, '{{}}'::bigint[] AS replays
FROM (SELECT ins.*, i.position FROM inserted ins JOIN input i ON i.id = ins.id) AS queued_jobs
CROSS JOIN notified
ORDER BY position
"""

#: Bulk-insert jobs without a key, group or unique key, with ids from JOB_RESERVE_IDS (COPY text
#: format), every column a job may carry (NULL where it has none), the batch's id on members.
JOB_COPY_MANY = """
COPY queued_jobs (id, queue, task, payload, priority, run_at, max_attempts, expires_at,
                  payload_version, trace_context, tags, batch_id) FROM STDIN
"""

#: JOB_COPY_MANY for jobs that are all Shape.READY, outside a batch: run_at takes its default,
#: now(), and no column but their task's travels.
JOB_COPY_MANY_READY = """
COPY queued_jobs (id, queue, task, payload, priority, max_attempts) FROM STDIN
"""
