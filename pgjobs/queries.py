"""Every SQL statement the pgjobs runtime sends, each with a one-line purpose.

Statements are plain SQL with psycopg's named placeholders (``%(name)s``); every value travels
as a bind parameter, never as text spliced into SQL. Batched statements take parallel arrays and
``unnest`` them, so one statement moves many rows. The hot path is ``JOB_CLAIM`` and
``JOB_SETTLE_MANY``; read them with ``EXPLAIN ANALYZE`` at realistic table sizes after a change.
"""

from __future__ import annotations

from pgjobs.models import ArchivedStatus, DeadReason, JobStatus

#: Channel that enqueue NOTIFYs (payload: the queue name) and idle workers LISTEN on.
NOTIFY_CHANNEL = "pgjobs"

#: Start of the NOTIFY_CHANNEL payload that ``JOB_CANCEL`` sends for a running job it cancels:
#: "cancel<TAB><job id><TAB><attempt>". A queue name cannot hold a tab (no control characters),
#: so a worker never mistakes one for the other.
CANCEL_NOTICE = "cancel\t"

#: Subscribe this session to NOTIFY_CHANNEL (an identifier, so spelled out rather than bound).
LISTEN_JOBS = f'LISTEN "{NOTIFY_CHANNEL}"'

# The sequence of queued_jobs' ids, looked up once per statement (an uncorrelated subquery runs
# once): nextval(pg_get_serial_sequence(...)) looked it up again for every row, about 6 us each.
_NEXT_JOB_ID_SEQ = "(SELECT CAST(pg_get_serial_sequence('queued_jobs', 'id') AS regclass))"

# Columns of queued_jobs in the order models.Job takes them.
JOB_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, "
    "lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, "
    "trace_context, group_key, unique_key, snoozes"
)

# Columns the three tables share, copied as-is when a row moves between them (the redrive record,
# the replay link, the start of the latest attempt, the payload version and the trace context
# travel with the job).
_MOVED_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, "
    "created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, "
    "payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, "
    "watched"
)

# _MOVED_COLUMNS as a row enters dead_letter: a task name too long for the (task, failed_at)
# index (btree entries hold ~2700 bytes; another producer or hand-written SQL may have stored one)
# is clipped to its first 200 characters and says so, so that one such job cannot make the move
# of a whole batch fail.
_INTO_DEAD = _MOVED_COLUMNS.replace(
    ", task, ",
    ", CASE WHEN octet_length(task) <= 2000 THEN task"
    " ELSE left(task, 200) || format('... (%%s characters clipped)', length(task) - 200) END, ",
)

# The columns a job enqueued for a versioned task, or under a traced span, adds to an insert
# (migration 0007). The other inserts leave them out, so that a producer that uses neither keeps
# working against a database not yet migrated that far.
_VERSIONED_COLUMNS = ", payload_version, trace_context"


def _job_insert(versioned: bool) -> str:
    extra = _VERSIONED_COLUMNS if versioned else ""
    values = ", %(payload_version)s::int, %(trace_context)s::jsonb" if versioned else ""
    return f"""
WITH inserted AS (
    INSERT INTO queued_jobs (queue, task, payload, priority, run_at, max_attempts,
                             expires_at{extra})
    VALUES (
        %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now() + %(run_in)s * interval '1 second'),
        %(max_attempts)s,
        coalesce(%(expires_at)s::timestamptz, now() + %(expires_in)s::float8 * interval '1 second')
        {values}
    )
    RETURNING id, queue
)
SELECT id FROM inserted, pg_notify('{NOTIFY_CHANNEL}', queue)
"""


#: Insert one job without an idempotency key and wake idle workers of its queue. Rows: (id,);
#: pg_notify sits in FROM so that its void result is not a column to send and decode.
JOB_INSERT = _job_insert(versioned=False)

#: JOB_INSERT with the job's payload version and trace context.
JOB_INSERT_VERSIONED = _job_insert(versioned=True)

#: JOB_INSERT for a job that is ready now and never expires: run_at takes its default, now().
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


def _job_insert_many(versioned: bool, batch: bool = False) -> str:
    extra = _VERSIONED_COLUMNS if versioned else ""
    # A batch's members carry its id (BATCH_INSERT_MEMBERS).
    member, member_id = (", batch_id", ", %(batch_id)s::bigint") if batch else ("", "")
    arrays = (
        ", %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[]" if versioned else ""
    )
    return f"""
WITH input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[],
        %(keys)s::text[]{arrays}
    ) WITH ORDINALITY AS r(queue, task, payload, priority, run_at, run_in, max_attempts,
                           expires_at, expires_in, idempotency_key{extra}, position)
),
{_EXISTING_KEYS},
inserted AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                             expires_at, idempotency_key{extra}{member})
    SELECT i.id, i.queue, i.task, i.payload, i.priority,
           coalesce(i.run_at, now() + i.run_in * interval '1 second'),
           i.max_attempts,
           coalesce(i.expires_at, now() + i.expires_in * interval '1 second'),
           i.idempotency_key{extra.replace(", ", ", i.")}{member_id}
    FROM input i
    LEFT JOIN existing e ON e.position = i.position
    WHERE e.id IS NULL
    ORDER BY i.position
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, idempotency_key
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) q
)
SELECT i.position, coalesce(e.id, ins.id, holder.id)
FROM input i
LEFT JOIN existing e ON e.position = i.position
LEFT JOIN inserted ins ON ins.id = i.id
LEFT JOIN inserted holder ON holder.idempotency_key = i.idempotency_key
CROSS JOIN notified
ORDER BY i.position
"""


#: Insert many jobs from parallel arrays; a job whose idempotency key is already taken (in any of
#: the three tables, or earlier in the same batch) is not inserted and the holder's id returned.
#: Rows: (position, id). A NULL id means a concurrent enqueue holds the key but has not committed
#: yet; the caller retries those rows.
JOB_INSERT_MANY = _job_insert_many(versioned=False)

#: JOB_INSERT_MANY with each job's payload version and trace context.
JOB_INSERT_MANY_VERSIONED = _job_insert_many(versioned=True)

# The columns a keyed insert writes (JOB_INSERT_KEYED), from its ``fresh`` rows.
_KEYED_COLUMNS = (
    "id, queue, task, payload, priority, run_at, max_attempts, expires_at, idempotency_key, "
    "payload_version, trace_context, group_key, unique_key"
)


#: Insert many jobs of which some have a group or a unique key (pgjobs.uniqueness), from parallel
#: arrays as JOB_INSERT_MANY (idempotency keys keep their meaning there), plus each job's group,
#: unique key, on_conflict mode, debounce and its task's throttle (seconds). In one statement:
#: - every (queue, group) of the batch upserts its pgjobs_group_states row, in (queue, group)
#:   order (concurrent batches lock them in one order), writing touched_at: a claim that counted
#:   the group's running jobs in an older snapshot sees the row changed;
#: - a throttled key's job runs no earlier than its window: the previous job of the key
#:   (pgjobs_throttles) started + throttle, or that job's own floor when it never started;
#: - "keep" rows insert ON CONFLICT DO NOTHING (any unique index) and return the holder;
#:   "replace" and "debounce" rows update the holder (a not-started job of the task with the key)
#:   with the new payload, priority, run time, payload version, max_attempts, and trace context
#:   and expiry when given; the first insert of a debounced job waits too;
#: - a throttled key's new job becomes the key's previous job.
#: A holder waiting for its dependencies (run_at 'infinity') that is replaced keeps waiting, its
#: new run time kept for its release (pgjobs_waiting).
#: The caller merges rows of one batch with the same (task, unique key). Rows: (position, id,
#: created), where id is the holder's for a key held; NULL when a concurrent enqueue holds a key
#: but has not committed yet (the caller sends those rows again: the next statement sees the
#: commit); created: this statement inserted the job (a dependent's edges go on it).
def _job_insert_keyed(batch: bool) -> str:
    # A batch's members carry its id (BATCH_INSERT_MEMBERS_KEYED).
    columns = _KEYED_COLUMNS + (", batch_id" if batch else "")
    values = _KEYED_COLUMNS + (", %(batch_id)s::bigint" if batch else "")
    return f"""
WITH input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[],
        %(keys)s::text[], %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[],
        %(groups)s::text[], %(unique_keys)s::text[], %(modes)s::text[], %(debounces)s::float8[],
        %(throttles)s::float8[]
    ) WITH ORDINALITY AS r(queue, task, payload, priority, run_at, run_in, max_attempts,
                           expires_at, expires_in, idempotency_key, payload_version,
                           trace_context, group_key, unique_key, mode, debounce, throttle,
                           position)
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
           i.mode, i.throttle, i.position, w.floor
    FROM input i
    LEFT JOIN existing e ON e.position = i.position
    LEFT JOIN windows w ON w.position = i.position
    WHERE e.id IS NULL AND i.position NOT IN (SELECT position FROM stale)
),
kept AS (
    INSERT INTO queued_jobs ({columns})
    SELECT {values} FROM fresh
    WHERE mode IS NULL OR mode = 'keep'
    ORDER BY position
    ON CONFLICT DO NOTHING
    RETURNING id, queue, task, unique_key, idempotency_key, true AS inserted
),
replaced AS (
    INSERT INTO queued_jobs AS q ({columns})
    SELECT {values} FROM fresh
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
                  expires_at = coalesce(excluded.expires_at, q.expires_at)
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


#: The keyed insert described above ``_job_insert_keyed``.
JOB_INSERT_KEYED = _job_insert_keyed(batch=False)

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

#: Bulk-insert jobs without idempotency keys, with ids from JOB_RESERVE_IDS (COPY text format).
JOB_COPY_MANY = """
COPY queued_jobs (id, queue, task, payload, priority, run_at, max_attempts, expires_at) FROM STDIN
"""

#: JOB_COPY_MANY with each job's payload version and trace context.
JOB_COPY_MANY_VERSIONED = """
COPY queued_jobs (id, queue, task, payload, priority, run_at, max_attempts, expires_at,
                  payload_version, trace_context) FROM STDIN
"""

#: JOB_COPY_MANY for jobs that are ready now and never expire: run_at takes its default, now().
JOB_COPY_MANY_READY = """
COPY queued_jobs (id, queue, task, payload, priority, max_attempts) FROM STDIN
"""

#: The settings of the worker's claim connections (see db.connect_async): each prepared statement
#: planned once for the session, not at every execution (the hot statements have one good plan
#: whatever their parameters); no JIT compilation (a generic plan cannot know its LIMIT, so its
#: estimate grows with the table: past ~1M ready jobs the claim's crosses jit_above_cost, and
#: at 5M each claim of 32 jobs spent ~0.7 s compiling); no sequential scans (a plan made while
#: queued_jobs was empty, as after a drain or a TRUNCATE, read the whole table at every trip for
#: the rest of the session: a queue fed 20 jobs at a time spent 2-7 ms a trip reading the dead
#: rows of the jobs before); timestamps read in UTC (psycopg builds a datetime in UTC in a third
#: of the time it takes for a zone it must look up, such as the server's 'Etc/UTC').
SESSION_HOT = """
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('jit', 'off', false),
       set_config('enable_seqscan', 'off', false),
       set_config('TimeZone', 'UTC', false)
"""

#: ``SESSION_HOT`` through a transaction-mode pooler: the time zone only, a setting PgBouncer
#: tracks per client and applies to every server session the client's transactions run on.
SESSION_HOT_POOLED = """
SELECT set_config('TimeZone', 'UTC', false)
"""

# Successes: archive each job whose lease (attempt and owner) the worker still holds.
_SUCCEED_MANY = f"""
succeeded AS (
    DELETE FROM queued_jobs q
    USING unnest(%(ok_ids)s::bigint[], %(ok_attempts)s::int[], %(ok_results)s::text[]::jsonb[])
        AS o(id, attempts, result)
    WHERE q.id = o.id AND q.attempts = o.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, o.result
),
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, result, last_error, worker)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.SUCCEEDED}', result, last_error, lease_owner FROM succeeded
    RETURNING id
)
"""

# What a claim sets on each job it takes: one attempt used, leased to ``owner`` for its task's
# lease (else ``lease`` seconds), marked at-most-once for those tasks, the attempt recorded as
# delivered to a downstream for external tasks (NULL otherwise), and the attempt's start.
_CLAIM_SET = """SET attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_expires_at = now() + CASE
        WHEN cardinality(%(lease_tasks)s::text[]) = 0 THEN %(lease)s
        ELSE coalesce(
            (SELECT t.lease FROM unnest(%(lease_tasks)s::text[], %(lease_seconds)s::float8[])
                 AS t(task, lease)
             WHERE t.task = queued_jobs.task),
            %(lease)s)
    END * interval '1 second',
    at_most_once = task = ANY(%(at_most_once_tasks)s::text[]),
    external_attempt = CASE WHEN task = ANY(%(external_tasks)s::text[]) THEN attempts + 1 END,
    started_at = now()"""

# The ready jobs of one queue of the claim (w.queue), in claim order.
_READY_IN_QUEUE = """FROM queued_jobs
        WHERE queue = w.queue
          AND lease_expires_at IS NULL
          AND run_at <= now()
          AND (expires_at IS NULL OR expires_at > now())"""

_CLAIM_ORDER = "ORDER BY priority DESC, run_at, id"

# The claim order between groups: a group's first job before the second of any (``turn``; an
# ungrouped job is a group of one), within priority.
_TURN_ORDER = "ORDER BY priority DESC, turn, run_at, id"

# JOB_CLAIM_LIMITED's steps for jobs of a group (see there, 2b), ending with ``group_jobs`` (the
# groups' candidates, with their turn) and ``group_caps`` (the groups looked at).
_CLAIM_GROUPS = f"""
group_window AS MATERIALIZED (
    SELECT g.queue, g.group_key
    FROM queue_caps w
    CROSS JOIN LATERAL (
        SELECT s.queue, s.group_key
        FROM pgjobs_group_states s
        JOIN pgjobs_groups a ON a.group_key = s.group_key
        WHERE s.queue = w.queue AND w.cap > 0
          -- The rows as this statement's snapshot sees them: checked again, by the lock, on a
          -- row as last written when another claim or an enqueue wrote it since, which leaves
          -- the group out of this claim. So a group in the window is one whose running jobs this
          -- snapshot counts right: every claim that starts its jobs writes its (queue, group)
          -- row, and with it (pgjobs_group_touched) the group's row of every queue (a).
          AND s.xmin = (SELECT v.xmin FROM pgjobs_group_states v
                        WHERE v.queue = s.queue AND v.group_key = s.group_key)
          AND a.xmin = (SELECT v.xmin FROM pgjobs_groups v WHERE v.group_key = a.group_key)
          -- One probe of the group's ready range per group (a scalar subquery with a LIMIT is
          -- never planned as a join: an EXISTS could be, reading every ready job of the queue).
          AND (SELECT true FROM queued_jobs j
               WHERE j.queue = s.queue AND j.group_key = s.group_key
                 AND j.lease_expires_at IS NULL AND j.run_at <= now()
               LIMIT 1)
        ORDER BY s.last_claim_at
        LIMIT %(limit)s
        FOR UPDATE OF s, a SKIP LOCKED
    ) g
),
-- The window's groups' running jobs in every queue (a task's group concurrency and order hold
-- per (task, group), a queue's per (queue, group)).
group_running AS MATERIALIZED (
    SELECT j.queue, j.group_key, j.task, count(*) AS jobs
    FROM (SELECT DISTINCT group_key FROM group_window) r
    CROSS JOIN LATERAL (
        SELECT q.queue, q.group_key, q.task FROM queued_jobs q
        WHERE q.group_key = r.group_key AND q.lease_expires_at > now()
          AND q.id <> ALL({{settled}})
        UNION ALL
        -- Force-cancelled jobs whose handler may still run (JOB_CANCEL) keep their place.
        SELECT h.queue, h.group_key, h.task FROM pgjobs_group_holds h
        WHERE h.group_key = r.group_key AND h.lease_expires_at > now()
    ) j
    GROUP BY j.queue, j.group_key, j.task
),
group_caps AS MATERIALIZED (
    SELECT r.queue, r.group_key,
           p.group_concurrency - coalesce(
               (SELECT sum(x.jobs) FROM group_running x
                WHERE x.queue = r.queue AND x.group_key = r.group_key), 0) AS room,
           -- Each group's share of the claim: the groups looked at take turns.
           ceil(%(limit)s::float8 / count(*) OVER ())::int AS share
    FROM group_window r
    LEFT JOIN pgjobs_queues p ON p.name = r.queue
),
group_takes AS MATERIALIZED (
    SELECT k.*,
           greatest(least(k.share, coalesce(k.room, k.share)), 0) AS take
    FROM group_caps k
),
group_picked AS (
    SELECT c.*, k.room,
           row_number() OVER (PARTITION BY c.queue, c.group_key {_CLAIM_ORDER}) AS turn,
           row_number() OVER (PARTITION BY c.group_key, c.task {_CLAIM_ORDER}) AS task_turn
    FROM group_takes k
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.task, j.priority, j.run_at, j.group_key
        FROM queued_jobs j
        WHERE j.queue = k.queue AND j.group_key = k.group_key
          AND j.lease_expires_at IS NULL
          AND j.run_at <= now()
          AND (j.expires_at IS NULL OR j.expires_at > now())
          -- An ordered task's job only when it is its (task, group)'s oldest in every queue.
          AND (j.task <> ALL(%(ordered_tasks)s::text[]) OR NOT EXISTS (
                  SELECT 1 FROM queued_jobs o
                  WHERE o.group_key = j.group_key AND o.task = j.task AND o.id < j.id)
                  AND NOT EXISTS (
                  SELECT 1 FROM pgjobs_group_holds h
                  WHERE h.group_key = j.group_key AND h.task = j.task
                    AND h.lease_expires_at > now()))
          AND (j.task <> ALL(%(hold_tasks)s::text[]) OR NOT EXISTS (
                  SELECT 1 FROM dead_letter d
                  WHERE d.group_key = j.group_key AND d.task = j.task))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT k.take
        FOR UPDATE OF j SKIP LOCKED
    ) c
),
group_jobs AS (
    SELECT p.id, p.queue, p.task, p.priority, p.run_at, p.turn
    FROM group_picked p
    LEFT JOIN unnest(%(group_tasks)s::text[], %(group_limits)s::int[]) AS t(task, cap)
        ON t.task = p.task
    WHERE t.task IS NULL
       OR p.task_turn <= t.cap - coalesce(
              (SELECT sum(x.jobs) FROM group_running x
               WHERE x.group_key = p.group_key AND x.task = p.task), 0)
)"""

# A queue with a setting a claim must obey: paused, or limited (JOB_CLAIM leaves such a queue to
# JOB_CLAIM_LIMITED, which reads its settings).
_QUEUE_RESTRICTED = (
    "(p.paused_at IS NOT NULL OR p.concurrency IS NOT NULL OR p.rate_jobs IS NOT NULL)"
)

# JOB_CLAIM's UPDATE (see there).
_CLAIM_PLAIN = f"""
UPDATE queued_jobs
{_CLAIM_SET}
WHERE id = ANY(ARRAY(
    SELECT c.id
    FROM (
        SELECT c.id, c.priority, c.run_at,
               row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS nth,
               c.attempts + 1 < c.max_attempts
                   AND c.task <> ALL(%(at_most_once_tasks)s::text[]) AS may_wait
        FROM unnest(%(queues)s::text[]) AS w(queue)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at, task, attempts, max_attempts
            {_READY_IN_QUEUE}
              AND limit_key IS NULL AND group_key IS NULL
              AND NOT EXISTS (
                  SELECT 1 FROM pgjobs_queues p WHERE p.name = w.queue AND {_QUEUE_RESTRICTED}
              )
            {_CLAIM_ORDER}
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) c
        -- Outside the scan, not in it: with a condition on task in the scan, the planner's
        -- estimate of a generic plan (a queue of one or two tasks) makes it sort the whole queue.
        WHERE c.task <> ALL(%(limit_tasks)s::text[])
    ) c
    WHERE c.nth <= %(slots)s OR c.may_wait
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
))
RETURNING {JOB_COLUMNS}
"""

# JOB_CLAIM_LIMITED's steps (see there), as common table expressions ending with ``claimed``
# (the jobs taken), ``held`` (ids held back) and ``spent`` (limits whose state was written).
# {settled}: the ids the same statement archives: they no longer count as running.
_CLAIM_LIMITED = f"""
scopes AS MATERIALIZED (
    SELECT 'task' AS kind, t.name, t.concurrency, t.rate_jobs, t.rate_seconds, false AS paused
    FROM unnest(%(limit_tasks)s::text[], %(limit_concurrency)s::int[],
                %(limit_rate_jobs)s::int[], %(limit_rate_seconds)s::float8[])
        AS t(name, concurrency, rate_jobs, rate_seconds)
    UNION ALL
    SELECT 'queue', p.name, p.concurrency, p.rate_jobs, p.rate_seconds, p.paused_at IS NOT NULL
    FROM pgjobs_queues p
    WHERE p.name = ANY(%(queues)s::text[]) AND {_QUEUE_RESTRICTED}
),
running AS MATERIALIZED (
    SELECT s.kind, s.name,
           CASE WHEN s.kind = 'task' THEN (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.limit_key = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL({{settled}})
                   LIMIT s.concurrency) r)
           ELSE (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.queue = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL({{settled}})
                   LIMIT s.concurrency) r)
           END AS jobs
    FROM scopes s
    WHERE s.concurrency IS NOT NULL AND NOT s.paused
),
seen AS MATERIALIZED (
    SELECT l.kind, l.name, l.xmin AS version
    FROM pgjobs_limit_states l
    JOIN scopes s ON s.kind = l.kind AND s.name = l.name
),
states AS MATERIALIZED (
    SELECT l.kind, l.name, l.xmin AS version, l.tokens, l.refilled_at,
           greatest(clock_timestamp(), l.refilled_at) AS clock
    FROM pgjobs_limit_states l
    JOIN scopes s ON s.kind = l.kind AND s.name = l.name
    LEFT JOIN running r ON r.kind = l.kind AND r.name = l.name
    WHERE NOT s.paused AND (s.rate_jobs IS NOT NULL OR r.jobs < s.concurrency)
    FOR UPDATE OF l SKIP LOCKED
),
new_states AS (
    INSERT INTO pgjobs_limit_states (kind, name)
    SELECT s.kind, s.name
    FROM scopes s
    WHERE NOT s.paused AND NOT EXISTS (
        SELECT 1 FROM seen WHERE seen.kind = s.kind AND seen.name = s.name
    )
    ON CONFLICT DO NOTHING
    RETURNING kind, name
),
measured AS (
    SELECT s.kind, s.name, s.concurrency, s.rate_jobs, s.rate_seconds, s.paused,
           r.jobs AS running, t.clock,
           -- A state created by this claim holds no tokens it could write back, but no claim
           -- under the limit can have committed before it: the count stands.
           t.kind IS NOT NULL OR (n.kind IS NOT NULL AND s.rate_jobs IS NULL) AS locked,
           coalesce(t.version = v.version, n.kind IS NOT NULL) AS fresh,
           CASE WHEN s.rate_jobs IS NOT NULL AND t.kind IS NOT NULL THEN
               least(s.rate_jobs::float8,
                     coalesce(t.tokens, s.rate_jobs) + s.rate_jobs / s.rate_seconds
                     * extract(epoch FROM t.clock - coalesce(t.refilled_at, t.clock)))
           END AS tokens
    FROM scopes s
    LEFT JOIN running r ON r.kind = s.kind AND r.name = s.name
    LEFT JOIN states t ON t.kind = s.kind AND t.name = s.name
    LEFT JOIN seen v ON v.kind = s.kind AND v.name = s.name
    LEFT JOIN new_states n ON n.kind = s.kind AND n.name = s.name
),
limits AS MATERIALIZED (
    SELECT m.kind, m.name, m.tokens, m.clock,
           m.concurrency IS NOT NULL OR m.rate_jobs IS NOT NULL AS limited,
           CASE WHEN m.paused THEN 0
                ELSE least(
                    %(limit)s,
                    CASE WHEN m.concurrency IS NULL THEN %(limit)s
                         WHEN m.running >= m.concurrency OR NOT (m.locked AND m.fresh) THEN 0
                         ELSE m.concurrency - m.running END,
                    CASE WHEN m.rate_jobs IS NULL THEN %(limit)s
                         WHEN NOT m.locked THEN 0
                         ELSE floor(m.tokens)::int END)
           END AS capacity,
           NOT m.paused
               AND (m.rate_jobs IS NOT NULL AND NOT m.locked
                    OR m.running < m.concurrency AND NOT (m.locked AND m.fresh))
               AS locked_out,
           CASE WHEN m.tokens < 1 THEN (1 - m.tokens) * m.rate_seconds / m.rate_jobs END
               AS retry_in
    FROM measured m
),
queue_caps AS (
    SELECT w.queue, coalesce(l.capacity, %(limit)s) AS cap
    FROM unnest(%(queues)s::text[]) AS w(queue)
    LEFT JOIN limits l ON l.kind = 'queue' AND l.name = w.queue
),
task_caps AS (
    SELECT l.name AS task, l.capacity FROM limits l WHERE l.kind = 'task'
),
{_CLAIM_GROUPS},
candidates AS (
    SELECT c.*, false AS was_held
    FROM queue_caps w
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        {_READY_IN_QUEUE}
          AND limit_key IS NULL AND group_key IS NULL
        {_CLAIM_ORDER}
        LIMIT w.cap
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.*, true
    FROM queue_caps w
    JOIN task_caps t ON w.cap > 0 AND t.capacity > 0
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        {_READY_IN_QUEUE}
          AND limit_key = t.task AND group_key IS NULL
        {_CLAIM_ORDER}
        LIMIT least(w.cap, t.capacity)
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.id, c.queue, c.task, c.priority, c.run_at, c.turn, true
    FROM group_jobs c
),
ranked AS (
    SELECT c.*, t.capacity AS task_cap,
           row_number() OVER (PARTITION BY c.task {_TURN_ORDER}) AS nth
    FROM candidates c
    LEFT JOIN task_caps t ON t.task = c.task
),
allowed AS (
    SELECT r.id, r.queue, r.priority, r.run_at, r.turn,
           row_number() OVER (PARTITION BY r.queue {_TURN_ORDER}) AS nth
    FROM ranked r
    WHERE r.task_cap IS NULL OR r.nth <= r.task_cap
),
claimed AS (
    UPDATE queued_jobs
    {_CLAIM_SET},
    limit_key = CASE WHEN task = ANY(%(limit_tasks)s::text[]) THEN task END
    WHERE id = ANY(ARRAY(
        SELECT a.id
        FROM allowed a
        JOIN queue_caps w ON w.queue = a.queue
        WHERE a.nth <= w.cap
        ORDER BY a.priority DESC, a.turn, a.run_at, a.id
        LIMIT %(limit)s
    ))
    RETURNING {JOB_COLUMNS}
),
held AS (
    UPDATE queued_jobs
    SET limit_key = task
    WHERE id = ANY(ARRAY(SELECT r.id FROM ranked r WHERE NOT r.was_held AND r.nth > r.task_cap))
    RETURNING id
),
spent AS (
    UPDATE pgjobs_limit_states l
    SET tokens = k.tokens - u.used,
        refilled_at = CASE WHEN k.tokens IS NOT NULL THEN k.clock END,
        last_claim_at = now()
    FROM limits k
    JOIN (
        SELECT 'task' AS kind, task AS name, count(*) AS used FROM claimed GROUP BY task
        UNION ALL
        SELECT 'queue', queue, count(*) FROM claimed GROUP BY queue
    ) u ON u.kind = k.kind AND u.name = k.name
    WHERE l.kind = k.kind AND l.name = k.name
    RETURNING l.name
),
turned AS (
    UPDATE pgjobs_group_states g
    SET last_claim_at = now()
    WHERE (g.queue, g.group_key) IN (
        SELECT c.queue, c.group_key FROM claimed c WHERE c.group_key IS NOT NULL
        UNION
        SELECT k.queue, k.group_key FROM group_caps k
        WHERE NOT EXISTS (
            SELECT 1 FROM group_picked p WHERE p.queue = k.queue AND p.group_key = k.group_key)
    )
    RETURNING g.group_key
)"""

# The claimed jobs in JOB_COLUMNS, then the claim's status row: id NULL, its JSON in the payload
# column. {status}: its JSON.
_STATUS_ROW = "SELECT NULL, NULL, NULL, {status}, " + ", ".join(
    ["NULL"] * (JOB_COLUMNS.count(",") - 3)
)
# Whether some of the worker's queues have jobs of a group (JOB_CLAIM leaves them to
# JOB_CLAIM_LIMITED, which takes turns between groups).
_QUEUE_GROUPS = """EXISTS (
    SELECT 1 FROM pgjobs_group_states WHERE queue = ANY(%(queues)s::text[])
)"""
# Whether some of the worker's queues are limited or have groups (a plain claim's only status).
_QUEUE_LIMITS = f"""(EXISTS (
    SELECT 1 FROM pgjobs_queues
    WHERE name = ANY(%(queues)s::text[]) AND (concurrency IS NOT NULL OR rate_jobs IS NOT NULL)
) OR {_QUEUE_GROUPS})"""


def _claim_statement(*, limited: bool, succeed: bool) -> str:
    ctes = [_SUCCEED_MANY.strip()] if succeed else []
    if limited:
        settled = "%(ok_ids)s::bigint[]" if succeed else "'{}'::bigint[]"
        ctes.append(_CLAIM_LIMITED.format(settled=settled).strip())
        status, when = (
            f"""jsonb_build_object(
    -- Jobs held back, and groups whose whole share was claimed (they may hold more): claim
    -- again at once.
    'held', (SELECT count(*) FROM held) + (
        SELECT count(*) FROM group_takes k
        WHERE k.take > 0 AND k.take <= (SELECT count(*) FROM claimed c
                                       WHERE c.queue = k.queue AND c.group_key = k.group_key)),
    'locked_out', (SELECT coalesce(bool_or(locked_out), false) FROM limits),
    'retry_in', (SELECT min(retry_in) FROM limits),
    'queue_limits', (SELECT coalesce(bool_or(limited), false) FROM limits WHERE kind = 'queue')
                    OR {_QUEUE_GROUPS})""",
            None,
        )
    else:
        ctes.append(f"claimed AS ({_CLAIM_PLAIN})")
        # Only when there is something to say.
        status, when = """'{"queue_limits": true}'::jsonb""", _QUEUE_LIMITS
    if succeed:
        # One row for the whole trip, not one per job archived: their ids in a JSON array.
        if when is not None:
            status = f"CASE WHEN {when} THEN {status} END"
        status, when = (
            f"""jsonb_build_object(
    'archived', coalesce((SELECT jsonb_agg(id) FROM archived), '[]'::jsonb),
    'status', {status})""",
            None,
        )
    row = _STATUS_ROW.format(status=status) + ("" if when is None else f"\nWHERE {when}")
    joined = ",\n".join(ctes)
    return f"WITH {joined}\nSELECT {JOB_COLUMNS} FROM claimed\nUNION ALL\n{row}\n"


#: Claim up to ``limit`` ready jobs of the given queues (priority, then run_at order across
#: them), lease them to ``owner`` (for their task's lease, else ``lease`` seconds), mark the
#: at-most-once ones, use up one attempt each and record when the attempt started. One index
#: range per queue (LATERAL), so the claim stays flat however large the backlog. A queue that is
#: paused or limited (pgjobs_queues) is left out before any of its rows is read or locked: one
#: primary-key probe per queue, in the same statement, so a pause holds from the next claim on.
#: Of ``limit`` jobs, those beyond the first ``slots`` are claimed ahead of the worker's free
#: slots (its read-ahead): a job on its last attempt, or of an at-most-once task, is never one of
#: them, so that a worker that dies with jobs claimed ahead never sends a job that has not run to
#: dead_letter (it is claimed for a free slot, later).
#: Jobs held back for a task's limit (limit_key set) are not in these ranges, and the jobs of
#: ``limit_tasks`` (the tasks the worker limits) are left where they are: only JOB_CLAIM_LIMITED
#: takes them (a claim that comes back short because of them is followed by one under limits,
#: which holds them back out of the way).
#: Returns the claimed jobs (JOB_COLUMNS), then, only when some of the queues are limited, a
#: status row (id NULL, payload ``{"queue_limits": true}``): the worker claims with
#: JOB_CLAIM_LIMITED from then on.
JOB_CLAIM = _claim_statement(limited=False, succeed=False)

#: Whether any of ``queues`` holds a ready job (not leased, its run_at passed), whatever its
#: limit, group or expiry: what an idle worker asks at each poll before it claims, since the
#: claim statements cost the server several times more (~0.37 ms against ~0.12 ms, mostly their
#: executor's start on the tables they would write). False means no claim could take a job;
#: true only means one might. Per queue, one probe of each of the three partial indexes that
#: hold the ready rows (ix_queued_jobs_claim, _group_ready, _limit_ready), each a scalar subquery
#: with a LIMIT (an EXISTS is planned as a hashed subplan that reads every ready row). Rows:
#: (bool,).
JOB_READY_IN_QUEUES = """
SELECT EXISTS (
    SELECT 1 FROM unnest(%(queues)s::text[]) AS w(queue)
    WHERE coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND limit_key IS NULL AND group_key IS NULL AND run_at <= now()
                    LIMIT 1), false)
       OR coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND group_key IS NOT NULL AND run_at <= now()
                    LIMIT 1), false)
       OR coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND limit_key IS NOT NULL AND run_at <= now()
                    LIMIT 1), false)
)
"""

#: JOB_CLAIM for a worker that limits some of its tasks (``limit_tasks`` with their
#: ``limit_concurrency``, ``limit_rate_jobs`` and ``limit_rate_seconds``; NULL where a task has
#: no such limit) or serves limited queues. In one statement:
#:   1. each limit (the tasks' from the worker, the queues' from pgjobs_queues) says how many jobs
#:      it allows (``limits``): a concurrency limit counts its running jobs in this statement's
#:      snapshot (``running``) and trusts the count only when the limit's row in
#:      pgjobs_limit_states, locked FOR UPDATE SKIP LOCKED (``states``), is the version the
#:      snapshot saw (``seen``): every claim that starts jobs under a limit writes its row, so a
#:      claim committed after this snapshot is never missed; a rate refills its bucket (the same
#:      row, read as last committed through the lock). A row locked by another claim, or not
#:      there yet (``new_states`` creates it), allows nothing this time (``locked_out``);
#:   2. each queue's range gives at most its capacity, and each limited task's held-back range in
#:      that queue at most the task's capacity (FOR UPDATE SKIP LOCKED);
#:   2b. jobs of a group (``_CLAIM_GROUPS``): the queues' groups with ready jobs are looked at in
#:      turn order (pgjobs_group_states.last_claim_at, oldest first; ``limit`` groups at most),
#:      each group's row locked FOR UPDATE SKIP LOCKED and kept only when it is the version the
#:      snapshot saw (a group another claim started jobs of since is left to the next claim), so
#:      its running jobs, counted in the snapshot (``group_running``), are right; each group gives
#:      its share of the claim from its own range, at most what the queue's group_concurrency
#:      leaves, then at most what each task's ``group_limits`` leaves (``group_jobs``); an
#:      ordered task's job only when no older job of its task and group is in queued_jobs (and,
#:      for ``hold_tasks``, none is in dead_letter); the groups that gave jobs, or had nothing to
#:      give, go to the back of the turn order (``turned``). A task's limit and order hold per
#:      (task, group) in every queue, a queue's group_concurrency per (queue, group): each group
#:      is taken only when its row of every queue (pgjobs_groups, written with each of its
#:      (queue, group) rows) is locked too and the version the snapshot saw, and its running
#:      jobs are counted in every queue;
#:   3. of those, at most each task's and each queue's capacity are taken, ``limit`` in all, in
#:      claim order, a group's first job before the second of any (``turn``); the jobs taken of
#:      limited tasks keep their limit_key (it counts them);
#:   4. jobs of a limited task met in a queue's range beyond its capacity are held back: their
#:      limit_key is set, which moves them out of the queue's range into the task's own, so the
#:      queue's other jobs are reached past them from the next claim on;
#:   5. every limit that gave jobs has its row written (``spent``): tokens less one per job taken,
#:      and last_claim_at.
#: Returns the claimed jobs, then one status row (id NULL, payload a JSON object): ``held`` (jobs
#: held back now, and groups that gave their whole share: claim again at once), ``locked_out``
#: (another worker claims under one of the limits right now: try again soon), ``retry_in``
#: (seconds until an empty bucket has a token), ``queue_limits`` (some of the queues are limited
#: or hold groups). (``spent`` runs whether read or not, as every data-modifying part of a
#: statement does.)
JOB_CLAIM_LIMITED = _claim_statement(limited=True, succeed=False)

#: The worker's usual round trip in one statement, so one commit and no pipeline: archive the
#: successes of the last batch (fenced as in JOB_SETTLE_MANY) and claim the next batch (as
#: JOB_CLAIM; ``limit`` 0 claims nothing). The two parts touch different rows: a job being
#: archived is leased, a claimable one is not. ``ok_results`` may be NULL (no handler returned
#: a value). Returns the claimed jobs (JOB_COLUMNS), then the trip's row (id NULL, payload
#: ``{"archived": [ids], "status": JOB_CLAIM's status or null}``).
JOB_SUCCEED_AND_CLAIM = _claim_statement(limited=False, succeed=True)

#: JOB_SUCCEED_AND_CLAIM with JOB_CLAIM_LIMITED's claim (its status in the trip's row). The jobs
#: it archives no longer count against their limits.
JOB_SUCCEED_AND_CLAIM_LIMITED = _claim_statement(limited=True, succeed=True)

# Burials: move each job whose lease (attempt and owner) the worker still holds to dead_letter.
_BURY_MANY = f"""
failed AS (
    DELETE FROM queued_jobs q
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[], %(dead_reasons)s::text[],
                 %(dead_types)s::text[], %(dead_errors)s::text[], %(dead_tracebacks)s::text[])
        AS d(id, attempts, reason, error_type, error, traceback)
    WHERE q.id = d.id AND q.attempts = d.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, d.reason, d.error_type, d.error, d.traceback
),
buried AS (
    INSERT INTO dead_letter ({_MOVED_COLUMNS}, reason, error_type, last_error, traceback, worker)
    SELECT {_INTO_DEAD}, reason, error_type, error, traceback, lease_owner FROM failed
    RETURNING id
)
"""

#: Apply a batch of outcomes, each fenced by (id, attempt, lease owner) so that a worker whose
#: lease was lost changes nothing: successes move to archived_jobs, failures to retry are
#: rescheduled, failures for good move to dead_letter, and jobs given back are released (with
#: their attempt refunded when they never started, and held back ``release_holds`` seconds when
#: that is > 0). Returns the ids that were applied.
JOB_SETTLE_MANY = f"""
WITH {_SUCCEED_MANY},
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
{_BURY_MANY},
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
#: outcome the database refused: it touches no other table, so a privilege missing on one of them
#: does not stop it. Returns the ids moved.
JOB_BURY_MANY = f"""
WITH {_BURY_MANY}
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

#: Rescue up to ``limit`` jobs whose lease expired: back to ready, or to dead_letter when that
#: was their last attempt or their task is at-most-once. Returns (requeued, dead).
JOB_RESCUE_EXPIRED_LEASES = f"""
WITH lost AS (
    SELECT id FROM queued_jobs
    WHERE lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
exhausted AS (
    DELETE FROM queued_jobs q USING lost
    WHERE q.id = lost.id AND (q.attempts >= q.max_attempts OR q.at_most_once)
    RETURNING q.*
),
buried AS (
    INSERT INTO dead_letter ({_MOVED_COLUMNS}, reason, last_error, worker)
    SELECT {_INTO_DEAD}, '{DeadReason.LEASE_EXPIRED}',
           format('lease of worker %%s expired on attempt %%s of %%s%%s',
                  lease_owner, attempts, max_attempts,
                  CASE WHEN at_most_once THEN ' (at-most-once task: not run again)' ELSE '' END),
           lease_owner
    FROM exhausted
    RETURNING id
),
requeued AS (
    UPDATE queued_jobs q
    SET lease_owner = NULL,
        lease_expires_at = NULL,
        last_error = format('lease of worker %%s expired on attempt %%s of %%s',
                            q.lease_owner, q.attempts, q.max_attempts)
    FROM lost
    WHERE q.id = lost.id AND q.attempts < q.max_attempts AND NOT q.at_most_once
    RETURNING q.id
)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM buried)
"""

#: Give back to their queue's claim range up to ``limit`` ready jobs of ``queues`` held back for
#: the limit of one of ``tasks`` (tasks the calling worker runs without a limit). Returns their
#: ids.
JOB_RELEASE_LAPSED_LIMITS = """
UPDATE queued_jobs
SET limit_key = NULL
WHERE id = ANY(ARRAY(
    SELECT id FROM queued_jobs
    WHERE queue = ANY(%(queues)s::text[]) AND limit_key = ANY(%(tasks)s::text[])
      AND lease_expires_at IS NULL
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
))
RETURNING id
"""

#: Tidy the group rows of ``queues`` (maintenance.groups): remove up to ``limit`` rows of groups
#: that hold no job and have seen no enqueue nor claim for ``idle`` seconds (the condition is
#: checked again on the row as last written: an enqueue that wrote it meanwhile keeps it), and
#: write the missing row of each group with ready jobs; remove the pgjobs_groups row of a group
#: whose last (queue, group) row it removed, and write the missing one of a group with rows.
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

#: Archive up to ``limit`` unleased jobs whose expires_at has passed, as expired, unrun.
JOB_EXPIRE_MANY = f"""
WITH gone AS (
    DELETE FROM queued_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM queued_jobs
        WHERE expires_at <= now() AND lease_expires_at IS NULL
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING *
),
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, last_error)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.EXPIRED}', last_error FROM gone
    RETURNING id
)
SELECT count(*) FROM archived
"""

#: Per-queue counts for `pgjobs stats`; ages in seconds. The last-minute columns give throughput
#: (archived per second) and retry rate (of the jobs that ran and finished, archived or dead, the
#: share that needed more than one attempt). A paused or limited queue is listed even without
#: jobs, with when, by whom and why it was paused, and its limits; ``held`` counts the ready jobs
#: held back for their task's limit.
QUEUE_STATS = """
WITH hot AS (
    SELECT queue,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()
                              AND run_at <> 'infinity') AS scheduled,
           count(*) FILTER (WHERE lease_expires_at IS NOT NULL) AS running,
           -- Waiting for their dependencies (pgjobs.dependencies).
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at = 'infinity') AS waiting,
           -- An infinite time (a row pgjobs did not write) has no age: PostgreSQL refuses it.
           extract(epoch FROM now() - min(run_at)
                   FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()
                                 AND isfinite(run_at)))::float8
               AS oldest_ready_age,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()
                              AND limit_key IS NOT NULL) AS held
    FROM queued_jobs
    GROUP BY queue
),
dead AS (
    SELECT queue,
           count(*) AS dead,
           count(*) FILTER (WHERE failed_at > now() - interval '1 hour') AS failed_last_hour,
           count(*) FILTER (WHERE failed_at > now() - interval '1 minute') AS failed_last_minute,
           count(*) FILTER (WHERE failed_at > now() - interval '1 minute' AND attempts > 1)
               AS retried_last_minute,
           count(*) FILTER (WHERE failed_at > now() - interval '1 minute' AND attempts >= 1)
               AS ran_last_minute
    FROM dead_letter
    GROUP BY queue
),
finished AS (
    SELECT queue, count(*) AS finished_last_hour,
           count(*) FILTER (WHERE finished_at > now() - interval '1 minute')
               AS finished_last_minute,
           count(*) FILTER (WHERE finished_at > now() - interval '1 minute' AND attempts > 1)
               AS retried_last_minute,
           count(*) FILTER (WHERE finished_at > now() - interval '1 minute' AND attempts >= 1)
               AS ran_last_minute
    FROM archived_jobs
    WHERE finished_at > now() - interval '1 hour'
    GROUP BY queue
)
SELECT q.queue,
       coalesce(hot.ready, 0), coalesce(hot.scheduled, 0), coalesce(hot.running, 0),
       coalesce(dead.dead, 0), coalesce(finished.finished_last_hour, 0),
       coalesce(dead.failed_last_hour, 0), hot.oldest_ready_age,
       coalesce(finished.finished_last_minute, 0), coalesce(dead.failed_last_minute, 0),
       coalesce(finished.retried_last_minute, 0) + coalesce(dead.retried_last_minute, 0),
       coalesce(finished.ran_last_minute, 0) + coalesce(dead.ran_last_minute, 0),
       p.paused_at IS NOT NULL, p.paused_at, p.paused_by, p.pause_reason,
       coalesce(hot.held, 0), p.concurrency, p.rate_jobs, p.rate_seconds,
       coalesce(hot.waiting, 0)
FROM (SELECT queue FROM hot UNION SELECT queue FROM dead UNION SELECT queue FROM finished
      UNION SELECT name FROM pgjobs_queues
            WHERE paused_at IS NOT NULL OR concurrency IS NOT NULL OR rate_jobs IS NOT NULL) q
LEFT JOIN hot USING (queue)
LEFT JOIN dead USING (queue)
LEFT JOIN finished USING (queue)
LEFT JOIN pgjobs_queues p ON p.name = q.queue
ORDER BY q.queue
"""

#: The revision of pgjobs' schema in this database (fails with UndefinedTable when never migrated).
SCHEMA_REVISION = "SELECT version_num FROM pgjobs_alembic_version"


# -- Queues and schedules (pgjobs.queues, pgjobs.maintenance.scheduler) -------------------------


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
_QUEUE_LIMIT_COLUMNS = "p.concurrency, p.rate_jobs, p.rate_seconds, p.group_concurrency"

#: Every known queue (one that holds a job, or has settings) with its settings, by name.
#: Rows: (name, paused_at, paused_by, pause_reason, holds jobs, concurrency, rate_jobs,
#: rate_seconds, group_concurrency).
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
#: and group concurrency (when ``set_group_concurrency``) to the values given, NULL removing one;
#: the other settings stay as they were. A
#: new or changed rate starts the queue's token bucket full (pgjobs_limit_states).
#: Wakes the idle workers of the queue (a limit raised lets them claim more). Rows: (whether a
#: setting changed).
QUEUE_LIMIT = f"""
WITH before AS (
    SELECT concurrency, rate_jobs, rate_seconds, group_concurrency
    FROM pgjobs_queues WHERE name = %(name)s
),
limited AS (
    INSERT INTO pgjobs_queues AS q (
        name, concurrency, rate_jobs, rate_seconds, group_concurrency, updated_at
    )
    VALUES (%(name)s, %(concurrency)s::int, %(rate_jobs)s::int, %(rate_seconds)s::float8,
            %(group_concurrency)s::int, now())
    ON CONFLICT (name) DO UPDATE
    SET concurrency = CASE WHEN %(set_concurrency)s THEN excluded.concurrency
                           ELSE q.concurrency END,
        rate_jobs = CASE WHEN %(set_rate)s THEN excluded.rate_jobs ELSE q.rate_jobs END,
        rate_seconds = CASE WHEN %(set_rate)s THEN excluded.rate_seconds ELSE q.rate_seconds END,
        group_concurrency = CASE WHEN %(set_group_concurrency)s THEN excluded.group_concurrency
                                 ELSE q.group_concurrency END,
        updated_at = now()
    RETURNING concurrency, rate_jobs, rate_seconds, group_concurrency
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
SELECT (l.concurrency, l.rate_jobs, l.rate_seconds, l.group_concurrency)
       IS DISTINCT FROM (b.concurrency, b.rate_jobs, b.rate_seconds, b.group_concurrency)
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

# Columns of pgjobs_schedules in the order of models.ScheduleInfo, and whether a worker declared
# the schedule within ``stale_after`` seconds.
_SCHEDULE_COLUMNS = """
name, task, queue, schedule, timezone, catch_up, next_run_at, last_run_at, last_enqueued_at,
last_job_id, declared_at, declared_at > now() - %(stale_after)s * interval '1 second',
paused_at, paused_by
"""

#: The database's clock, from which every scheduler computes the occurrences (workers' clocks
#: may disagree).
SCHEDULE_NOW = "SELECT now()"

#: Record the schedules a worker declares (parallel arrays, one element per schedule): new ones
#: start at ``next_run_ats`` (their first occurrence after now); a schedule whose expression or
#: timezone changed starts again there; the others keep their place. Rows are locked in name
#: order, so two workers declaring at once wait for each other instead of deadlocking. Rows:
#: (name, whether this statement added it) per schedule.
SCHEDULE_DECLARE = """
INSERT INTO pgjobs_schedules AS s
    (name, task, queue, schedule, timezone, catch_up, next_run_at, declared_at)
SELECT d.name, d.task, d.queue, d.schedule, d.timezone, d.catch_up, d.next_run_at, now()
FROM unnest(%(names)s::text[], %(tasks)s::text[], %(queues)s::text[], %(schedules)s::text[],
            %(timezones)s::text[], %(catch_ups)s::text[], %(next_run_ats)s::timestamptz[])
    AS d(name, task, queue, schedule, timezone, catch_up, next_run_at)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE
SET task = excluded.task,
    queue = excluded.queue,
    catch_up = excluded.catch_up,
    next_run_at = CASE WHEN (s.schedule, s.timezone) IS DISTINCT FROM
                            (excluded.schedule, excluded.timezone)
                       THEN excluded.next_run_at ELSE s.next_run_at END,
    schedule = excluded.schedule,
    timezone = excluded.timezone,
    declared_at = now()
RETURNING name, xmax = 0 AS added
"""

#: Whether any of the schedules among ``names`` is due and not paused: what a scheduler round
#: asks first, in one autocommitted statement, and it opens the transaction of SCHEDULE_LOCK_DUE
#: (three round trips: BEGIN, the lock, COMMIT) only when one is. Most rounds, a second apart in
#: every worker that declares schedules, find none due. Rows: (bool,).
SCHEDULE_ANY_DUE = """
SELECT EXISTS (
    SELECT 1 FROM pgjobs_schedules
    WHERE name = ANY(%(names)s::text[]) AND next_run_at <= now() AND paused_at IS NULL
)
"""

#: Lock the schedules among ``names`` that are due, not paused (`pgjobs schedule pause`), and
#: that no other worker holds (SKIP LOCKED: another worker enqueueing them now is left alone).
#: Held until the transaction ends, in which the occurrences are enqueued and SCHEDULE_ADVANCE
#: moves next_run_at. Rows: (name, next_run_at, the transaction's now()).
SCHEDULE_LOCK_DUE = """
SELECT name, next_run_at, now()
FROM pgjobs_schedules
WHERE name = ANY(%(names)s::text[]) AND next_run_at <= now() AND paused_at IS NULL
ORDER BY name
FOR UPDATE SKIP LOCKED
"""

#: Move locked schedules on (parallel arrays): their next occurrence, and the last one enqueued
#: with its job when this round enqueued one (NULL: keep the previous).
SCHEDULE_ADVANCE = """
UPDATE pgjobs_schedules s
SET next_run_at = a.next_run_at,
    last_run_at = coalesce(a.last_run_at, s.last_run_at),
    last_enqueued_at = CASE WHEN a.last_run_at IS NULL THEN s.last_enqueued_at ELSE now() END,
    last_job_id = coalesce(a.last_job_id, s.last_job_id)
FROM unnest(%(names)s::text[], %(next_run_ats)s::timestamptz[], %(last_run_ats)s::timestamptz[],
            %(last_job_ids)s::bigint[]) AS a(name, next_run_at, last_run_at, last_job_id)
WHERE s.name = a.name
RETURNING s.name
"""

#: Every schedule in the database, by name (models.ScheduleInfo).
SCHEDULE_LIST = f"SELECT {_SCHEDULE_COLUMNS} FROM pgjobs_schedules ORDER BY name"

#: Forget schedule ``name`` (a worker that still declares it records it again, from its next
#: occurrence). Rows: one when it existed.
SCHEDULE_DELETE = "DELETE FROM pgjobs_schedules WHERE name = %(name)s RETURNING name"

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


# -- Operations: triage, lookup and control (pgjobs.admin) --------------------------------------

# The error fingerprint of a dead_letter row ``d``: its first error line with quoted strings,
# UUIDs, hex ids and numbers replaced by placeholders (hex before numbers, so an id such as
# 3f9a2b1c becomes one <n>, like a decimal id), prefixed by the reason when no exception was
# recorded (lease_expired, unknown_task, ...). 40,000 failures of one outage share one
# fingerprint. Computed, never stored: the rows keep the raw error.
_FINGERPRINT = r"""
left(
    CASE WHEN d.error_type IS NULL THEN d.reason || ': ' ELSE '' END
    || regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        split_part(left(coalesce(d.last_error, ''), 1000), E'\n', 1),
        $q$(^|[^[:alnum:]_])('[^']*'|"[^"]*")$q$, '\1<str>', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '0x[0-9a-f]+|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}', '<n>', 'gi'),
        '[0-9]+(\.[0-9]+)*', '<n>', 'g'),
        '\s+', ' ', 'g'),
    300)
"""

# dead_letter rows ``d`` with their fingerprint ``f.fingerprint`` and its short id.
_DEAD_FROM = f"""
dead_letter d
CROSS JOIN LATERAL (SELECT {_FINGERPRINT} AS fingerprint) f0
CROSS JOIN LATERAL (SELECT f0.fingerprint, left(md5(f0.fingerprint), 8) AS id) f
"""

# The filters of `pgjobs dead list/group/redrive/purge`; a NULL parameter does not filter.
# ``error`` is a case-insensitive substring of last_error; ``fingerprint`` is a fingerprint or its
# short id; ``until`` is exclusive. _DEAD_WHERE_BUT_FINGERPRINT needs no _DEAD_FROM (a count
# without a fingerprint filter need not compute each row's fingerprint).
_DEAD_WHERE_BUT_FINGERPRINT = """
(%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
AND (%(task)s::text IS NULL OR d.task = %(task)s::text)
AND (%(tags)s::text[] IS NULL OR d.tags @> %(tags)s::text[])
AND (%(since)s::timestamptz IS NULL OR d.failed_at >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR d.failed_at < %(until)s::timestamptz)
AND (%(error)s::text IS NULL
     OR strpos(lower(coalesce(d.last_error, '')), lower(%(error)s::text)) > 0)
"""
_DEAD_WHERE = (
    _DEAD_WHERE_BUT_FINGERPRINT
    + "AND (%(fingerprint)s::text IS NULL OR %(fingerprint)s::text IN (f.fingerprint, f.id))\n"
)

# Columns of dead_letter ``d`` in the order models.DeadJob takes them; {traceback} is
# ``d.traceback`` or NULL (listings leave it out).
_DEAD_JOB_COLUMNS = """
d.id, d.queue, d.task, d.payload, d.priority, d.run_at, d.attempts, d.max_attempts, d.reason,
d.error_type, d.last_error, {traceback}, d.worker, d.created_at, d.failed_at, d.expires_at,
d.idempotency_key, d.redrive_count, d.redriven_at, d.replay_of, d.started_at, f.fingerprint,
f.id, d.tags
"""


def _dead_list(traceback: str) -> str:
    """Dead jobs matching the filters, newest first, at most ``limit``; ``traceback`` is the
    traceback column's expression."""
    return f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback=traceback)}
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""


#: Dead jobs matching the filters, newest first, at most ``limit``, without their tracebacks.
DEAD_LIST = _dead_list("NULL::text")

#: DEAD_LIST with each job's traceback (`pgjobs dead list --json`).
DEAD_LIST_WITH_TRACEBACK = _dead_list("d.traceback")

#: One dead job, with its traceback.
DEAD_GET = f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback="d.traceback")}
FROM {_DEAD_FROM}
WHERE d.id = %(id)s
"""

#: Dead jobs matching the filters, counted by task and error fingerprint, largest group first.
#: Rows: (task, fingerprint, fingerprint id, count, first failed_at, last failed_at, queues,
#: newest id).
DEAD_GROUP = f"""
SELECT d.task, f.fingerprint, f.id, count(*), min(d.failed_at), max(d.failed_at),
       array_agg(DISTINCT d.queue ORDER BY d.queue), max(d.id)
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
GROUP BY d.task, f.fingerprint, f.id
ORDER BY count(*) DESC, d.task, f.fingerprint
"""

#: The ids of the dead jobs matching the filters, ascending, and the transaction's now(): what a
#: redrive or purge will move, batch by batch by id (the filters are evaluated once here, not on
#: the whole table per batch), and only jobs that failed before it started.
DEAD_SELECT_IDS = f"""
SELECT coalesce(array_agg(d.id ORDER BY d.id), '{{}}'), now()
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
"""

#: Which of these ids are in dead_letter.
DEAD_FIND_IDS = """
SELECT id FROM dead_letter WHERE id = ANY(%(ids)s::bigint[])
"""

# Up to ``limit`` dead jobs matching the filters (``ids``: one batch of DEAD_SELECT_IDS), in id
# order, locked (SKIP LOCKED: two concurrent redrives or purges never take the same row).
_DEAD_PICK = f"""
SELECT d.id
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
ORDER BY d.id
LIMIT %(limit)s
FOR UPDATE OF d SKIP LOCKED
"""

# Upsert the pgjobs_group_states rows of the groups of jobs moved back into queued_jobs (``{rows}``:
# a CTE with queue and group_key), as an enqueue does, in (queue, group) order.
_GROUPS_TOUCHED = """
    INSERT INTO pgjobs_group_states (queue, group_key)
    SELECT DISTINCT queue, group_key FROM {rows} WHERE group_key IS NOT NULL
    ORDER BY queue, group_key
    ON CONFLICT (queue, group_key) DO UPDATE SET touched_at = clock_timestamp()
"""

# A job moved back into queued_jobs (``{rows}``: a CTE of them, with task, unique_key and id)
# keeps its unique key only when no job of its task not started yet holds the key (the first by
# id, when several moved together share one): otherwise its key becomes NULL. A concurrent
# enqueue that takes the key meanwhile is met by ON CONFLICT DO NOTHING, and the job goes in
# again without its key (see DEAD_REDRIVE_BATCH).
_KEY_IF_FREE = """CASE WHEN unique_key IS NOT NULL
         AND row_number() OVER (PARTITION BY task, unique_key ORDER BY id) = 1
         AND NOT EXISTS (
             SELECT 1 FROM queued_jobs h
             WHERE h.task = {rows}.task AND h.unique_key = {rows}.unique_key
               AND h.started_at IS NULL
         ) THEN unique_key END"""

_BY_ID = "\n    ORDER BY id"


def _requeue(columns: str, source: str, order: str = "") -> str:
    """Two CTEs, ``keyed`` and ``unkeyed``, that insert ``source``'s rows (``columns``) into
    queued_jobs: each with its unique key (as _KEY_IF_FREE left it), or without it when an
    enqueue took the key meanwhile. Both return (id, queue); ``order`` sorts the inserts."""
    return f"""keyed AS (
    INSERT INTO queued_jobs ({columns})
    SELECT {columns} FROM {source}{order}
    ON CONFLICT DO NOTHING
    RETURNING id, queue
),
unkeyed AS (
    INSERT INTO queued_jobs ({columns})
    SELECT {columns.replace("unique_key", "NULL")} FROM {source}
    WHERE id NOT IN (SELECT id FROM keyed){order}
    RETURNING id, queue
)"""


_REDRIVEN_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at, "
    "expires_at, idempotency_key, redrive_count, redriven_at, replay_of, payload_version, "
    "trace_context, group_key, unique_key, batch_id, tags"
)

#: Move one batch of up to ``limit`` dead jobs matching the filters back to queued_jobs, ready now
#: with fresh attempts (last_error, payload version, trace context and group kept; the unique key
#: kept when free, see _KEY_IF_FREE), their redrive record updated, their groups' rows touched,
#: and wake idle workers of their queues. Returns the ids moved.
DEAD_REDRIVE_BATCH = f"""
WITH picked AS ({_DEAD_PICK}),
gone AS (
    DELETE FROM dead_letter d USING picked WHERE d.id = picked.id
    RETURNING d.*
),
moving AS (
    SELECT id, queue, task, payload, priority, now() AS run_at, 0 AS attempts, max_attempts,
           last_error, created_at, expires_at, idempotency_key,
           redrive_count + 1 AS redrive_count, now() AS redriven_at, replay_of, payload_version,
           trace_context, group_key, {_KEY_IF_FREE.format(rows="gone")} AS unique_key, batch_id, tags
    FROM gone
),
{_requeue(_REDRIVEN_COLUMNS, "moving", _BY_ID)},
requeued AS (
    SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed
),
grouped AS ({_GROUPS_TOUCHED.format(rows="gone")}),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM requeued) q
)
SELECT r.id FROM requeued r CROSS JOIN notified ORDER BY r.id
"""

#: Delete one batch of up to ``limit`` dead jobs matching the filters, for good. Returns the ids.
DEAD_PURGE_BATCH = f"""
WITH picked AS ({_DEAD_PICK})
DELETE FROM dead_letter d USING picked WHERE d.id = picked.id
RETURNING d.id
"""

# A row of queued_jobs as JOB_LOOKUP finds it, up to its replays: the columns of
# models.JobHistory, with the job's status now.
_QUEUED_AS_FOUND = f"""id, 'queued_jobs' AS home,
           CASE WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                ELSE '{JobStatus.READY}' END AS status,
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, lease_owner, lease_expires_at,
           NULL::jsonb AS result, NULL::text AS worker, NULL::timestamptz AS finished_at,
           NULL::text AS reason, NULL::text AS error_type, NULL::text AS traceback,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags"""


#: A job wherever it lives, in the order of models.JobHistory (status as text, replays as an
#: array); no row when the id is in none of the three tables.
JOB_LOOKUP = f"""
WITH found AS (
    SELECT {_QUEUED_AS_FOUND}
    FROM queued_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, 'archived_jobs', status,
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, NULL, NULL,
           result, worker, finished_at,
           NULL, NULL, NULL,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags
    FROM archived_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, 'dead_letter', '{JobStatus.DEAD}',
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, NULL, NULL,
           NULL, worker, failed_at,
           reason, error_type, traceback,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags
    FROM dead_letter WHERE id = %(id)s
)
SELECT found.*, ARRAY(
    SELECT id FROM queued_jobs WHERE replay_of = %(id)s
    UNION ALL SELECT id FROM archived_jobs WHERE replay_of = %(id)s
    UNION ALL SELECT id FROM dead_letter WHERE replay_of = %(id)s
    ORDER BY 1
)
FROM found
"""


# The two steps of an insert of jobs without idempotency keys (JOB_INSERT_PLAIN,
# JOB_INSERT_SHOWN): ``input``, each job's row from the parallel arrays with its new id and
# position, and ``inserted``, those rows written (RETURNING ``returning``), their queues woken.
def _plain_steps(versioned: bool, returning: str) -> str:
    extra = _VERSIONED_COLUMNS if versioned else ""
    arrays = (
        ", %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[]" if versioned else ""
    )
    return f"""
input AS (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS id, r.*
    FROM unnest(
        %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[]{arrays}
    ) WITH ORDINALITY AS r(queue, task, payload, priority, run_at, run_in, max_attempts,
                           expires_at, expires_in{extra}, position)
),
inserted AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                             expires_at{extra})
    SELECT i.id, i.queue, i.task, i.payload, i.priority,
           coalesce(i.run_at, now() + i.run_in * interval '1 second'),
           i.max_attempts,
           coalesce(i.expires_at, now() + i.expires_in * interval '1 second')
           {extra.replace(", ", ", i.")}
    FROM input i
    ORDER BY i.position
    RETURNING {returning}
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) q
)"""


#: Insert jobs none of which has an idempotency key, from the parallel arrays of JOB_INSERT_MANY
#: but ``keys``, and wake their queues' idle workers. Rows: (position, id). What JOB_INSERT_MANY
#: does for such jobs without its steps for keys: no lookup of existing keys, no join on them,
#: and no ON CONFLICT, whose speculative insertion costs every row a lock taken and released.
JOB_INSERT_PLAIN = f"""
WITH {_plain_steps(versioned=False, returning="queue")}
SELECT i.position, i.id FROM input i CROSS JOIN notified ORDER BY i.position
"""

#: JOB_INSERT_PLAIN with each job's payload version and trace context.
JOB_INSERT_PLAIN_VERSIONED = f"""
WITH {_plain_steps(versioned=True, returning="queue")}
SELECT i.position, i.id FROM input i CROSS JOIN notified ORDER BY i.position
"""


def _job_insert_shown(versioned: bool) -> str:
    return f"""
WITH {_plain_steps(versioned, returning="*")}
SELECT {_QUEUED_AS_FOUND}, '{{}}'::bigint[] AS replays
FROM (SELECT ins.*, i.position FROM inserted ins JOIN input i ON i.id = ins.id) AS queued_jobs
CROSS JOIN notified
ORDER BY position
"""


#: Insert jobs without an idempotency key, group, unique key, tags or dependencies (the HTTP
#: API's one-job enqueues, coalescing.fits) from parallel arrays, and wake their queues' idle
#: workers. Rows: each new job as JOB_LOOKUP finds it, in the order given, so that the answer is
#: built from the inserted row without reading it again.
JOB_INSERT_SHOWN = _job_insert_shown(versioned=False)

#: JOB_INSERT_SHOWN with each job's payload version and trace context.
JOB_INSERT_SHOWN_VERSIONED = _job_insert_shown(versioned=True)

#: Archive a queued job as cancelled, unrun; a running (leased) one only when ``force``: its
#: worker is told (``CANCEL_NOTICE``) to stop the handler, whose outcome the fence discards
#: anyway, and a running job of a group keeps its place in the group (pgjobs_group_holds) until
#: the handler has ended or the lease runs out. Returns (id, lease owner) when cancelled.
JOB_CANCEL = f"""
WITH target AS (
    SELECT id FROM queued_jobs
    WHERE id = %(id)s AND (lease_expires_at IS NULL OR %(force)s::boolean)
    FOR UPDATE
),
gone AS (
    DELETE FROM queued_jobs q USING target WHERE q.id = target.id
    RETURNING q.*
),
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, last_error, worker)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.CANCELLED}', last_error, lease_owner FROM gone
    RETURNING id, worker, attempts
),
-- A running job of a group keeps its place there while its handler may still run: until its
-- worker ends the attempt's lease (JOB_EXTEND_LEASES) or the lease runs out.
held AS (
    INSERT INTO pgjobs_group_holds
        (job_id, queue, task, group_key, attempts, lease_owner, lease_expires_at)
    SELECT id, queue, task, group_key, attempts, lease_owner, lease_expires_at FROM gone
    WHERE group_key IS NOT NULL AND lease_expires_at > now()
    ON CONFLICT (job_id) DO NOTHING
),
-- A running job's worker learns at commit that the attempt it runs was cancelled.
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', '{CANCEL_NOTICE}' || id || chr(9) || attempts))
    FROM archived WHERE worker IS NOT NULL
)
SELECT id, worker FROM archived, notified
"""

#: The lease of a job, locked until the transaction ends, for an outcome reported from outside
#: a worker (external tasks): (attempts, max_attempts, lease owner, whether the lease is live,
#: task, the attempt claimed for delivery to a downstream). No row when the job is not in
#: queued_jobs.
JOB_LEASE_HOLDER = """
SELECT attempts, max_attempts, lease_owner, lease_expires_at > now(), task, external_attempt
FROM queued_jobs
WHERE id = %(id)s
FOR UPDATE
"""

_REPLAYED_COLUMNS = (
    "id, queue, task, payload, priority, max_attempts, expires_at, replay_of, payload_version, "
    "group_key, unique_key, tags"
)

#: Enqueue a finished (archived) or dead job again as a new job linked by replay_of: same queue,
#: task, payload (and its version), priority, max_attempts and group; no idempotency key; its
#: unique key when no job of the task not started yet holds it (_KEY_IF_FREE); ready now.
#: Its expiry is the one given (``expires_at``, else ``expires_in`` seconds from now); with none,
#: the copy of an expired job keeps the original's expiry, long passed, and any other copy never
#: expires. A copy whose expiry has passed is archived at once as expired, unrun (never queued);
#: any other wakes idle workers of its queue and touches its group's row. Rows: (new id, whether
#: it was archived as expired); none when the id is neither archived nor dead.
JOB_REPLAY = f"""
WITH original AS (
    SELECT id, queue, task, payload, priority, max_attempts, payload_version, group_key,
           unique_key, tags,
           CASE WHEN status = '{ArchivedStatus.EXPIRED}' THEN coalesce(expires_at, now()) END
               AS lapsed_at
    FROM archived_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, queue, task, payload, priority, max_attempts, payload_version, group_key,
           unique_key, tags, NULL
    FROM dead_letter WHERE id = %(id)s
),
made AS MATERIALIZED (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS new_id, o.*,
           coalesce(%(expires_at)s::timestamptz,
                    now() + %(expires_in)s::float8 * interval '1 second',
                    o.lapsed_at) AS expiry
    FROM original o
),
copy AS (
    SELECT new_id AS id, queue, task, payload, priority, max_attempts, expiry AS expires_at,
           id AS replay_of, payload_version, group_key,
           {_KEY_IF_FREE.format(rows="made")} AS unique_key, tags
    FROM made WHERE expiry IS NULL OR expiry > now()
),
{_requeue(_REPLAYED_COLUMNS, "copy")},
queued AS (
    SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed
),
grouped AS ({_GROUPS_TOUCHED.format(rows="copy")}),
expired AS (
    INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                               status, created_at, expires_at, replay_of, payload_version,
                               group_key, unique_key, tags)
    SELECT new_id, queue, task, payload, priority, now(), 0, max_attempts,
           '{ArchivedStatus.EXPIRED}', now(), expiry, id, payload_version, group_key, unique_key,
           tags
    FROM made WHERE expiry <= now()
    RETURNING id
)
SELECT id, false FROM queued, pg_notify('{NOTIFY_CHANNEL}', queue)
UNION ALL
SELECT id, true FROM expired
"""


# -- Retention, worker registry and table health -----------------------------------------------

#: Key of the transaction-level advisory lock held around DDL on archived_jobs' partitions
#: (creating, detaching, dropping), so that workers and `pgjobs prune` take turns.
ARCHIVE_DDL_LOCK_KEY = 7_106_873_430_001
#: Key of the session-level advisory lock of `pgjobs prune`: one prune at a time per database.
ARCHIVE_PRUNE_LOCK_KEY = 7_106_873_430_002

#: Key of the session-level advisory lock of `pgjobs migrate`: one migration at a time, so a
#: second one waits, then finds the schema already at head.
MIGRATION_LOCK_KEY = 7_106_873_430_003

#: Take the turn to migrate if no other session holds it. Rows: (taken). Released by
#: MIGRATION_UNLOCK or disconnecting. Polled, never waited for in a statement: a waiting statement
#: holds a snapshot, which CREATE INDEX CONCURRENTLY in the running migration would wait for.
MIGRATION_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: Give the turn to migrate back.
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: Bound lock waits for the rest of the transaction (value: a PostgreSQL duration, e.g. '5s').
LOCK_TIMEOUT_LOCAL = "SELECT set_config('lock_timeout', %(timeout)s, true)"

#: Bound lock waits for the rest of the session.
LOCK_TIMEOUT_SESSION = "SELECT set_config('lock_timeout', %(timeout)s, false)"

#: Wait (within lock_timeout) for the turn to change archived_jobs' partitions.
ARCHIVE_DDL_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"

#: Take the prune lock if no other session holds it. Rows: (taken).
ARCHIVE_PRUNE_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: Give the prune lock back.
ARCHIVE_PRUNE_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: Key of the session-level advisory lock of the retention service: one round at a time across
#: all the workers of a database.
RETENTION_LOCK_KEY = 7_106_873_430_004

#: Take the retention service's turn if no other session holds it. Rows: (taken).
RETENTION_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: Give the retention service's turn back.
RETENTION_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: Delete at most ``limit`` rows of {table} (archived_jobs, its DEFAULT partition or
#: dead_letter) whose {at} (finished_at or failed_at) is before ``cutoff``, of the queues in
#: ``queues`` (NULL: any queue) and none in ``kept`` (the queues with periods of their own),
#: oldest first; rows another session holds are left for the next batch. RETURNING every column,
#: so that wrapped in ``COPY (...) TO STDOUT`` the rows are exported as they go. Compose {table}
#: and {at} with psycopg.sql.
RETENTION_DELETE_OLDER = """
DELETE FROM {table}
WHERE (id, {at}) IN (
    SELECT id, {at} FROM {table}
    WHERE {at} < %(cutoff)s
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue <> ALL(%(kept)s::text[])
    ORDER BY {at}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING *
"""

#: RETENTION_DELETE_OLDER as {delete}, counted. Rows: (deleted).
RETENTION_DELETE_COUNT = "WITH gone AS ({delete}) SELECT count(*) FROM gone"

#: RETENTION_DELETE_OLDER as {delete}, its rows copied out ({options}: the COPY options).
RETENTION_DELETE_COPY_OUT = "COPY ({delete}) TO STDOUT ({options})"

#: When the oldest archived job finished (NULL when the archive is empty), and now(): how much
#: history the archive holds (`pgjobs doctor`). Each partition's ix_archived_jobs_finished_at
#: answers its min() with one index probe.
ARCHIVE_OLDEST = "SELECT min(finished_at), now() FROM archived_jobs"

#: Today as a UTC date, whether archived_jobs is partitioned (False before migration 0004), and
#: the database's now().
ARCHIVE_STATE = """
SELECT (now() AT TIME ZONE 'UTC')::date,
       EXISTS (SELECT 1 FROM pg_partitioned_table
               WHERE partrelid = to_regclass('archived_jobs')),
       now()
"""

#: The partitions of archived_jobs, oldest first, the DEFAULT partition last. Rows: (name,
#: lower bound or NULL for MINVALUE, upper bound or NULL for DEFAULT, is default, detach pending,
#: estimated rows or NULL when never analysed, total bytes with indexes and TOAST).
ARCHIVE_PARTITIONS = """
SELECT c.relname::text,
       CASE WHEN m.bounds[1] = 'MINVALUE' THEN NULL
            ELSE trim(BOTH '''' FROM m.bounds[1])::timestamptz END,
       trim(BOTH '''' FROM m.bounds[2])::timestamptz,
       b.expr = 'DEFAULT',
       i.inhdetachpending,
       CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END,
       pg_total_relation_size(c.oid)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
LEFT JOIN LATERAL (
    SELECT regexp_match(b.expr, 'FROM \\((.+)\\) TO \\((.+)\\)') AS bounds
) m ON true
WHERE i.inhparent = to_regclass('archived_jobs')
ORDER BY b.expr = 'DEFAULT', 3 NULLS FIRST
"""

#: Create one partition of archived_jobs for [lower, upper); compose {partition}, {lower} and
#: {upper} with psycopg.sql. Takes an ACCESS EXCLUSIVE lock on archived_jobs for a moment.
ARCHIVE_PARTITION_CREATE = """
CREATE TABLE IF NOT EXISTS {partition} PARTITION OF archived_jobs
    FOR VALUES FROM ({lower}) TO ({upper})
"""

#: The UTC days of the rows in the DEFAULT partition {default}, oldest first, at most ``limit``.
ARCHIVE_DEFAULT_DAYS = """
SELECT DISTINCT (finished_at AT TIME ZONE 'UTC')::date AS day
FROM {default}
ORDER BY day
LIMIT %(limit)s
"""

#: Keep writers out of the DEFAULT partition {default} until the end of the transaction.
ARCHIVE_DEFAULT_LOCK = "LOCK TABLE {default} IN SHARE ROW EXCLUSIVE MODE"

#: Take the rows of [lower, upper) out of the DEFAULT partition {default} into a temporary table
#: (dropped at commit), so that a partition for that range can be created.
ARCHIVE_DEFAULT_STAGE = """
CREATE TEMP TABLE pgjobs_moving ON COMMIT DROP AS
WITH moved AS (
    DELETE FROM {default} WHERE finished_at >= {lower} AND finished_at < {upper}
    RETURNING *
)
SELECT * FROM moved
"""

#: Put the rows staged by ARCHIVE_DEFAULT_STAGE back, into the partition just created.
ARCHIVE_DEFAULT_UNSTAGE = "INSERT INTO archived_jobs SELECT * FROM pgjobs_moving"

#: Rows of the DEFAULT partition {default} that finished before ``cutoff``.
ARCHIVE_DEFAULT_COUNT_OLDER = "SELECT count(*) FROM {default} WHERE finished_at < %(cutoff)s"

#: Exact number of rows in one partition {partition}.
ARCHIVE_PARTITION_COUNT = "SELECT count(*) FROM ONLY {partition}"

#: Copy one partition {partition} out, as CSV with a header line ({options}: the COPY options).
ARCHIVE_PARTITION_COPY_OUT = "COPY {partition} TO STDOUT ({options})"

#: Detach one partition {partition} (ACCESS EXCLUSIVE on archived_jobs for a moment; the only
#: way while a DEFAULT partition exists).
ARCHIVE_PARTITION_DETACH = "ALTER TABLE archived_jobs DETACH PARTITION {partition}"

#: Detach one partition {partition} without blocking readers and writers of archived_jobs
#: (PostgreSQL 14+, outside a transaction, impossible while a DEFAULT partition exists).
ARCHIVE_PARTITION_DETACH_CONCURRENTLY = (
    "ALTER TABLE archived_jobs DETACH PARTITION {partition} CONCURRENTLY"
)

#: Complete a concurrent detach of {partition} that was interrupted.
ARCHIVE_PARTITION_DETACH_FINALIZE = (
    "ALTER TABLE archived_jobs DETACH PARTITION {partition} FINALIZE"
)

#: Drop a detached partition {partition}.
ARCHIVE_PARTITION_DROP = "DROP TABLE IF EXISTS {partition}"

#: Register a worker, or refresh its heartbeat, and remove the rows of workers not seen for
#: ``stale_after`` seconds (they crashed or lost the database). Rows: (stale rows removed).
WORKER_HEARTBEAT = """
WITH me AS (
    INSERT INTO pgjobs_workers AS w (id, host, pid, queues, concurrency, started_at)
    VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(started_at)s)
    ON CONFLICT (id) DO UPDATE SET last_seen_at = now()
    RETURNING w.id
),
stale AS (
    DELETE FROM pgjobs_workers
    WHERE last_seen_at < now() - %(stale_after)s * interval '1 second' AND id <> %(id)s
    RETURNING id
)
SELECT count(*) FROM stale
"""

#: Remove a worker's row at its clean exit.
WORKER_UNREGISTER = "DELETE FROM pgjobs_workers WHERE id = %(id)s"

#: Where a read DSN (``pgjobs serve --read-dsn``) leads and how far behind it is. Rows: (whether
#: it is a standby; its WAL receiver's status, NULL when none runs or the role may not see it;
#: bytes received but not replayed yet; seconds since the last transaction it replayed was
#: committed on the primary; whether replay is paused). On a primary: (false, NULL, 0, 0, false).
REPLICA_STATUS = """
SELECT pg_is_in_recovery(),
       (SELECT status FROM pg_stat_wal_receiver LIMIT 1),
       CASE WHEN pg_is_in_recovery()
            THEN coalesce(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0)
            ELSE 0 END::float8,
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp())
            ELSE 0 END::float8,
       CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END
"""

#: A worker's /stats (pgjobs.worker.depths): the jobs of each of ``queues`` that are ready,
#: scheduled and running, in all (any worker's). Rows: (queue, ready, scheduled, running); a queue
#: without jobs gives no row. A scan of queued_jobs, read at most once a second by each worker
#: that is asked (HashAggregate <- Seq Scan: 3.8 ms for 10,000 queued jobs, 4,000 of them in the
#: queues asked, PostgreSQL 15), and less often when it is slow (2.4 s, Parallel Seq Scan, for
#: 5M ready jobs: see pgjobs.worker.depths.SLOW_READS).
WORKER_QUEUE_DEPTHS = """
SELECT queue,
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()),
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()
                          AND run_at <> 'infinity'),
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL)
FROM queued_jobs
WHERE queue = ANY(%(queues)s::text[])
GROUP BY queue
"""

#: Live workers (seen in the last ``stale_after`` seconds) with their running jobs, by host and
#: start. Rows: (id, host, pid, queues, concurrency, started_at, last_seen_at, running,
#: seconds since start, seconds since last seen).
WORKERS_LIVE = """
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen_at,
       coalesce(r.running, 0),
       extract(epoch FROM now() - w.started_at)::float8,
       extract(epoch FROM now() - w.last_seen_at)::float8
FROM pgjobs_workers w
LEFT JOIN (
    SELECT lease_owner, count(*) AS running
    FROM queued_jobs
    WHERE lease_expires_at IS NOT NULL
    GROUP BY lease_owner
) r ON r.lease_owner = w.id
WHERE w.last_seen_at >= now() - %(stale_after)s * interval '1 second'
ORDER BY w.host, w.started_at, w.id
"""

#: Running jobs leased to workers that are not live (crashed, or cut off from the database):
#: their leases free them when they expire. Rows: (jobs, owners, seconds until the first
#: lease expires, seconds until the last one does).
LEASES_WITHOUT_LIVE_WORKER = """
SELECT count(*), count(DISTINCT lease_owner),
       -- An infinite lease (a row pgjobs did not write) has no expiry to count down to.
       extract(epoch FROM min(lease_expires_at) FILTER (WHERE isfinite(lease_expires_at))
                          - now())::float8,
       extract(epoch FROM max(lease_expires_at) FILTER (WHERE isfinite(lease_expires_at))
                          - now())::float8
FROM queued_jobs q
WHERE lease_expires_at IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM pgjobs_workers w
      WHERE w.id = q.lease_owner
        AND w.last_seen_at >= now() - %(stale_after)s * interval '1 second'
  )
"""

#: First statement of the transaction `pgjobs stats` reads in: one snapshot for all its queries.
STATS_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

#: Health of pgjobs' tables for `pgjobs stats --verbose` (a partitioned table sums over its
#: partitions). Rows: (table, live rows, dead rows, last autovacuum, last vacuum, last
#: autoanalyze, autovacuum runs, total bytes, partitions, storage options).
TABLE_HEALTH = """
SELECT t.name,
       sum(s.n_live_tup)::bigint, sum(s.n_dead_tup)::bigint,
       max(s.last_autovacuum), max(s.last_vacuum), max(s.last_autoanalyze),
       sum(s.autovacuum_count)::bigint,
       sum(pg_total_relation_size(p.relid))::bigint,
       count(*) FILTER (WHERE p.relid <> to_regclass(t.name)),
       (SELECT c.reloptions FROM pg_class c WHERE c.oid = to_regclass(t.name))
FROM unnest(ARRAY['queued_jobs', 'archived_jobs', 'dead_letter', 'pgjobs_workers']) AS t(name)
CROSS JOIN LATERAL (
    SELECT relid FROM pg_partition_tree(to_regclass(t.name)) WHERE isleaf
    UNION ALL
    SELECT to_regclass(t.name)
    WHERE NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(t.name))
) p
LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid
WHERE to_regclass(t.name) IS NOT NULL
GROUP BY t.name
ORDER BY array_position(
    ARRAY['queued_jobs', 'archived_jobs', 'dead_letter', 'pgjobs_workers'], t.name)
"""


# -- Doctor (pgjobs.doctor) ----------------------------------------------------------------------

#: Who and where this session is, and the server settings the doctor judges. Rows: (server
#: version, database, user, server address or NULL over a socket, the port the session reached
#: (over a socket, the one the server listens on: the number in its socket's name), backend
#: pid, autovacuum, track_counts).
DOCTOR_SERVER = """
SELECT current_setting('server_version'), current_database()::text, current_user::text,
       host(inet_server_addr()), coalesce(inet_server_port(), current_setting('port')::int),
       pg_backend_pid(),
       current_setting('autovacuum'), current_setting('track_counts')
"""

#: The connection budget: max_connections, the slots reserved for superusers and (PostgreSQL 16+)
#: for pg_use_reserved_connections, client sessions open now on the whole server, and those of
#: them opened by pgjobs (its connections say application_name 'pgjobs').
DOCTOR_CONNECTIONS = """
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       coalesce(current_setting('reserved_connections', true), '0')::int,
       count(*) FILTER (WHERE backend_type = 'client backend'),
       count(*) FILTER (WHERE backend_type = 'client backend' AND application_name = 'pgjobs')
FROM pg_stat_activity
"""

#: What holds back vacuum's horizon in this database the most: a session's snapshot or
#: transaction id, a prepared transaction, or a replication slot; this session excepted. Rows, at
#: most one: (kind, pid, state, application, user or slot name, age of its xmin in transactions,
#: seconds its transaction has been open or NULL, query or slot type, backend type).
DOCTOR_OLDEST_XMIN = """
SELECT kind, pid, state, application, who, xmin_age, seconds, what, backend_type
FROM (
    SELECT 'session' AS kind, a.pid, a.state, a.application_name AS application,
           a.usename::text AS who,
           greatest(age(a.backend_xmin), age(a.backend_xid))::bigint AS xmin_age,
           extract(epoch FROM now() - coalesce(a.xact_start, a.query_start))::float8 AS seconds,
           left(a.query, 200) AS what, a.backend_type
    FROM pg_stat_activity a
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.pid <> pg_backend_pid()
      AND (a.datname = current_database() OR a.datname IS NULL)
    UNION ALL
    SELECT 'prepared transaction', NULL, 'prepared', NULL, p.owner::text,
           age(p.transaction)::bigint, extract(epoch FROM now() - p.prepared)::float8,
           p.gid, NULL
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'replication slot', s.active_pid, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           NULL, s.slot_name::text, greatest(age(s.xmin), age(s.catalog_xmin))::bigint, NULL,
           s.slot_type, NULL
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
) holders
ORDER BY xmin_age DESC NULLS LAST, seconds DESC NULLS LAST
LIMIT 1
"""

#: Share of the server's NOTIFY queue (8 GB) taken by notifications not yet read by every
#: listener, from 0 to 1. When it is full, every transaction that NOTIFYs (every enqueue) fails.
DOCTOR_NOTIFY_USAGE = "SELECT pg_notification_queue_usage()"

#: Channel of the doctor's LISTEN/NOTIFY round trip (not NOTIFY_CHANNEL: workers never see it).
DOCTOR_CHANNEL = "pgjobs_doctor"

#: Subscribe this session to DOCTOR_CHANNEL.
DOCTOR_LISTEN = f'LISTEN "{DOCTOR_CHANNEL}"'

#: Send ``token`` on DOCTOR_CHANNEL.
DOCTOR_NOTIFY = f"SELECT pg_notify('{DOCTOR_CHANNEL}', %(token)s)"

#: The server session behind this connection, to see whether consecutive statements share one.
#: Rows: (backend pid).
DOCTOR_BACKEND_PID = "SELECT pg_backend_pid()"

#: Registered workers whose heartbeat stopped ``stale_after`` seconds ago or more, oldest first,
#: at most ``limit``. Rows: (id, host, pid, last seen, seconds since, how many there are).
DOCTOR_STALE_WORKERS = """
SELECT id, host, pid, last_seen_at, extract(epoch FROM now() - last_seen_at)::float8,
       count(*) OVER ()
FROM pgjobs_workers
WHERE last_seen_at < now() - %(stale_after)s * interval '1 second'
ORDER BY last_seen_at
LIMIT %(limit)s
"""


# -- Queue metrics for pgjobs serve (pgjobs.web.metrics) -----------------------------------------
#
# Read every few seconds by `pgjobs serve`'s /metrics, so each one is cheap at any size:
# queued_jobs is small and scanned; dead_letter is grouped whole (it holds what humans have yet
# to triage); archived_jobs, which may hold millions of rows, is only ever read by an index range
# on finished_at over what finished since the last reading (ix_archived_jobs_finished_at, on
# every partition; partitions of other days are pruned by the range).
#
# Plans (EXPLAIN ANALYZE) with 1,000,000 archived rows over 30 daily partitions, 2,000 queued
# jobs and 5,000 dead ones, PostgreSQL 15:
#   METRICS_QUEUED, METRICS_DEAD_LETTER
#       HashAggregate <- Seq Scan: 0.9 ms for 2,000 queued rows, 1.6 ms for 5,000 dead ones.
#   METRICS_ARCHIVED_NEXT
#       Limit <- Incremental Sort (finished_at presorted, then id) <- Merge Append of an Index
#       Scan of finished_at on each partition the range reaches (the others removed at executor
#       start, "Subplans Removed"): 0.08 ms when nothing finished, 7.8 ms for a page of 10,000.
#   METRICS_ARCHIVED_WINDOW_COUNT
#       Aggregate <- Append of index scans (finished_at, or index-only on the primary key) over
#       the window's partitions: 0.08 ms for a window of a few rows, 20 ms for 33,000 (the
#       count alone took 9 ms; the sum of times in microseconds costs the rest).
#   METRICS_ARCHIVED_WINDOW (only when that count shows a late row)
#       as METRICS_ARCHIVED_NEXT over the window: 24 ms for 33,000 rows.
#   METRICS_DEAD_NEXT, _WINDOW_COUNT, _WINDOW
#       the same shapes on ix_dead_letter_failed_at: 0.08 ms for 60 rows.

#: The database's clock, where the metrics' readings of the archive and dead letters start.
METRICS_NOW = "SELECT now()"

#: Jobs of queued_jobs by queue and task. Rows: (queue, task, ready, scheduled, running,
#: seconds since the oldest ready job's run_at or NULL when none is ready).
METRICS_QUEUED = """
SELECT queue, task,
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()),
       -- Jobs waiting for their dependencies (run_at 'infinity') are not scheduled ones.
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()
                          AND run_at <> 'infinity'),
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL),
       extract(epoch FROM now() - min(run_at)
               FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()))::float8
FROM queued_jobs
GROUP BY queue, task
"""

#: Jobs in dead_letter by queue and task. Rows: (queue, task, jobs).
METRICS_DEAD_LETTER = """
SELECT queue, task, count(*) FROM dead_letter GROUP BY queue, task
"""


def _metrics_reading(table: str, at: str, columns: str) -> tuple[str, str, str]:
    """The three statements that read what entered ``table`` since the last reading, in
    (``at``, id) order: the next page after a cursor, the number of rows in the window behind
    the cursor with the sums of their ids and of their times in microseconds (a row that
    committed late and another deleted since leave the count alone, not the sums too), and that
    window's rows (to find rows that committed after the cursor passed)."""
    select = f"SELECT id, {at}, {columns} FROM {table}"
    following = f"""
{select}
WHERE {at} >= %(after)s AND ({at}, id) > (%(after)s, %(after_id)s)
  AND {at} < now() - %(hold)s * interval '1 second'
ORDER BY {at}, id
LIMIT %(limit)s
"""
    window = f"{at} > %(lower)s AND {at} <= %(upper)s AND ({at}, id) <= (%(upper)s, %(upper_id)s)"
    count = f"""
SELECT count(*), coalesce(sum(id), 0),
       coalesce(sum((extract(epoch FROM {at}) * 1000000)::bigint), 0)
FROM {table}
WHERE {window}
"""
    rows = f"""
{select}
WHERE {window}
ORDER BY {at}, id
LIMIT %(limit)s
"""
    return following, count, rows


_ARCHIVED_METRIC_COLUMNS = (
    "queue, task, status, "
    "extract(epoch FROM finished_at - started_at)::float8, "
    "extract(epoch FROM started_at - run_at)::float8"
)
_DEAD_METRIC_COLUMNS = f"queue, task, '{JobStatus.DEAD}', NULL::float8, NULL::float8"

#: METRICS_ARCHIVED_NEXT: up to ``limit`` archived jobs after the cursor (``after``,
#: ``after_id``) in (finished_at, id) order that finished at least ``hold`` seconds ago.
#: METRICS_ARCHIVED_WINDOW_COUNT: the number of archived jobs in the window (``lower``, cursor
#: ``upper``, ``upper_id``], the sum of their ids and the sum of their finished_at as Unix
#: microseconds. METRICS_ARCHIVED_WINDOW: those jobs, at most ``limit``.
#: Rows of both readers: (id, finished_at, queue, task, status, seconds from start to finish,
#: seconds from run_at to start; NULL when the job never started).
METRICS_ARCHIVED_NEXT, METRICS_ARCHIVED_WINDOW_COUNT, METRICS_ARCHIVED_WINDOW = _metrics_reading(
    "archived_jobs", "finished_at", _ARCHIVED_METRIC_COLUMNS
)

#: The METRICS_ARCHIVED_* statements for dead_letter, by failed_at; status is 'dead' and the
#: two durations NULL.
METRICS_DEAD_NEXT, METRICS_DEAD_WINDOW_COUNT, METRICS_DEAD_WINDOW = _metrics_reading(
    "dead_letter", "failed_at", _DEAD_METRIC_COLUMNS
)


# -- Browsing jobs (pgjobs.browse) --------------------------------------------------------------

# A job of each table in the columns of models.JobHistory (by name; ``replays`` aside), plus
# ``at``, the moment it entered its table as far as the table records it: created_at (or
# redriven_at, for a redriven job) in queued_jobs, finished_at in archived_jobs, failed_at in
# dead_letter. Listings page by (at, id), newest first.
_BROWSE_QUEUED = f"""
SELECT id, 'queued_jobs' AS "table",
       CASE WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
            WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
            WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
            ELSE '{JobStatus.READY}' END AS status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, lease_owner, lease_expires_at, NULL::jsonb AS result,
       NULL::text AS worker, NULL::timestamptz AS finished_at, NULL::text AS reason,
       NULL::text AS error_type, {{traceback}} AS traceback, redrive_count, redriven_at,
       replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       coalesce(redriven_at, created_at) AS at
FROM queued_jobs
"""

_BROWSE_ARCHIVED = """
SELECT id, 'archived_jobs' AS "table", status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, NULL::text AS lease_owner,
       NULL::timestamptz AS lease_expires_at, {result} AS result, worker, finished_at,
       NULL::text AS reason, NULL::text AS error_type, {traceback} AS traceback, redrive_count,
       redriven_at, replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       finished_at AS at
FROM archived_jobs
"""

_BROWSE_DEAD = f"""
SELECT id, 'dead_letter' AS "table", '{JobStatus.DEAD}' AS status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, NULL::text AS lease_owner,
       NULL::timestamptz AS lease_expires_at, NULL::jsonb AS result, worker,
       failed_at AS finished_at, reason, error_type, {{traceback}} AS traceback, redrive_count,
       redriven_at, replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       failed_at AS at
FROM dead_letter
"""

# The filters of a listing, on one table whose entry moment is {at}; a NULL parameter does not
# filter. (%(before_at)s, %(before_id)s) is the cursor: the last row of the previous page.
_BROWSE_WHERE = """
(%(queue)s::text IS NULL OR queue = %(queue)s::text)
AND (%(task)s::text IS NULL OR task = %(task)s::text)
AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
AND (%(since)s::timestamptz IS NULL OR {at} >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR {at} < %(until)s::timestamptz)
AND (%(before_at)s::timestamptz IS NULL
     OR ({at}, id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
"""

#: Jobs of the states ``states`` (JobStatus values) matching the filters, across the three
#: tables, newest first by (at, id), at most ``limit``; without results and tracebacks. Each
#: table gives its own newest ``limit`` rows by its time index (archived_jobs by finished_at,
#: pruned to the partitions of the time window; dead_letter by failed_at, or (task, failed_at));
#: queued_jobs is the small hot table. A table no state asks for is not read.
BROWSE_JOBS = f"""
SELECT * FROM (
    (SELECT * FROM ({_BROWSE_QUEUED.format(traceback="NULL::text")}) q
     WHERE %(states)s::text[] && ARRAY['{JobStatus.READY}', '{JobStatus.SCHEDULED}',
                                       '{JobStatus.WAITING}', '{JobStatus.RUNNING}']
       AND status = ANY(%(states)s::text[])
       AND {_BROWSE_WHERE.format(at="at")}
     ORDER BY at DESC, id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM ({_BROWSE_ARCHIVED.format(result="NULL::jsonb", traceback="NULL::text")}
                    WHERE status = ANY(%(states)s::text[])
                      AND {_BROWSE_WHERE.format(at="finished_at")}
                    ORDER BY finished_at DESC, id DESC
                    LIMIT %(limit)s) a
     WHERE %(states)s::text[] && ARRAY['{JobStatus.SUCCEEDED}', '{JobStatus.CANCELLED}',
                                       '{JobStatus.EXPIRED}'])
    UNION ALL
    (SELECT * FROM ({_BROWSE_DEAD.format(traceback="NULL::text")}
                    WHERE {_BROWSE_WHERE.format(at="failed_at")}
                    ORDER BY failed_at DESC, id DESC
                    LIMIT %(limit)s) d
     WHERE '{JobStatus.DEAD}' = ANY(%(states)s::text[]))
) jobs
ORDER BY at DESC, id DESC
LIMIT %(limit)s
"""

#: The jobs with these ids wherever they are, in the columns of models.JobHistory (``replays``
#: included), in no particular order; an id in no table gives no row. The replays come from one
#: grouped read of the three replay_of indexes (a subquery per job would be costed so high that
#: PostgreSQL compiles the statement with JIT, which takes longer than running it).
BROWSE_JOBS_BY_ID = f"""
SELECT found.*, coalesce(r.replays, '{{}}') AS replays
FROM (
    {_BROWSE_QUEUED.format(traceback="NULL::text")} WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    {_BROWSE_ARCHIVED.format(result="result", traceback="NULL::text")}
    WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    {_BROWSE_DEAD.format(traceback="traceback")} WHERE id = ANY(%(ids)s::bigint[])
) found
LEFT JOIN (
    SELECT replay_of, array_agg(id ORDER BY id) AS replays
    FROM (
        SELECT id, replay_of FROM queued_jobs WHERE replay_of = ANY(%(ids)s::bigint[])
        UNION ALL
        SELECT id, replay_of FROM archived_jobs WHERE replay_of = ANY(%(ids)s::bigint[])
        UNION ALL
        SELECT id, replay_of FROM dead_letter WHERE replay_of = ANY(%(ids)s::bigint[])
    ) replay
    GROUP BY replay_of
) r ON r.replay_of = found.id
"""

#: Whether the queued job ``id`` was inserted by the current transaction (an idempotent enqueue
#: that created the job, rather than finding the one holding its key).
BROWSE_JOB_IS_NEW = """
SELECT EXISTS (
    SELECT 1 FROM queued_jobs WHERE id = %(id)s AND xmin = pg_current_xact_id()::xid
)
"""


# -- Test helpers (pgjobs.testing) ---------------------------------------------------------------

#: Create an empty throwaway database {database} (compose with psycopg.sql).
TESTING_CREATE_DATABASE = "CREATE DATABASE {database}"

#: Drop the throwaway database {database}, ending the sessions still connected to it.
TESTING_DROP_DATABASE = "DROP DATABASE IF EXISTS {database} WITH (FORCE)"

#: Empty pgjobs' {tables} between two tests (compose with psycopg.sql; pgjobs.testing names
#: every table of pgjobs.schema): no job, worker, queue setting (a pause or a limit left by one
#: test would hold the next one's jobs back), limit state or schedule is left over.
TESTING_EMPTY_TABLES = "TRUNCATE {tables} RESTART IDENTITY"

#: Every job in queued_jobs (ready, scheduled or running), oldest first, as models.Job.
TESTING_QUEUED_JOBS = f"SELECT {JOB_COLUMNS} FROM queued_jobs ORDER BY id"

#: Advance the clock of the scheduled jobs of ``queues`` to the next moment one is due (not past
#: ``until``, when given): the jobs due then become ready now, as if now were their run_at; their
#: expires_at moves back by as much. Jobs being run are not touched, nor jobs waiting for their
#: dependencies (run_at 'infinity': only the trigger releases them). Returns the ids moved (none
#: when no job is due by ``until``).
TESTING_ADVANCE_CLOCK = """
WITH next AS (
    SELECT min(run_at) AS run_at FROM queued_jobs
    WHERE queue = ANY(%(queues)s::text[]) AND lease_expires_at IS NULL AND run_at > now()
      AND run_at <> 'infinity'
),
due AS (
    SELECT q.id FROM queued_jobs q, next
    WHERE q.queue = ANY(%(queues)s::text[]) AND q.lease_expires_at IS NULL
      AND q.run_at > now() AND q.run_at <> 'infinity'
      AND q.run_at <= next.run_at
      AND (%(until)s::timestamptz IS NULL OR q.run_at <= %(until)s::timestamptz)
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE queued_jobs q
SET expires_at = q.expires_at - (q.run_at - now()),
    run_at = now()
FROM due
WHERE q.id = due.id
RETURNING q.id
"""


# -- The dashboard's pages (pgjobs.web.dashboard) -----------------------------------------------

# Each is index-backed and LIMITed, or reads the small hot table, or reads the planner's
# statistics instead of counting a big table. Plans at 1M archived and 100k dead rows
# (``benchmarks/dashboard.py`` fills such a database):
#   JOBS_FINISHED_PER_MINUTE  Index Only Scan of ix_archived_jobs_finished_at (today's
#                             partition) and of ix_dead_letter_failed_at over the last hour
#   TABLE_ROW_ESTIMATES       pg_class.reltuples of each table and archive partition: no table read
#   TABLE_ROWS_CAPPED         a scan of each table stopped at ``cap`` rows
#   DEAD_LIST_PAGE            Index Scan Backward of ix_dead_letter_failed_at, stopped at the LIMIT
#   DEAD_NEWEST_IDS           the same, ids only
#   DEAD_COUNT_CAPPED         a scan of dead_letter (no fingerprint) stopped at ``cap`` rows
#   JOB_IDS_BY_KEY            the three idempotency-key indexes
#   QUEUE_STATS_BY_TASK       queued_jobs (small), dead_letter of one queue, the last hour of the
#                             archive

# The dead-letter filters plus the reason (the dashboard filters on it; the CLI and the API
# do not).
_DEAD_WHERE_AND_REASON = (
    _DEAD_WHERE + "AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)\n"
)

#: The database's clock (the dashboard shows ages against it, not the web server's).
DATABASE_NOW = "SELECT now()"

#: Jobs archived and dead-lettered in each of the last 60 minutes (the current one included),
#: oldest first. Rows: (minute, archived, of which succeeded, dead-lettered). Dead-lettered counts
#: the jobs in dead_letter now by the minute they failed: a redrive or purge takes them out.
JOBS_FINISHED_PER_MINUTE = """
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS minute
),
finished AS (
    SELECT date_trunc('minute', finished_at) AS minute, count(*) AS finished,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded
    FROM archived_jobs
    -- A bound the planner sees (now() is stable): it prunes to today's partitions and reads
    -- them by index. (Joined from a CTE, it would scan every partition.)
    WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
),
failed AS (
    SELECT date_trunc('minute', failed_at) AS minute, count(*) AS failed
    FROM dead_letter
    WHERE failed_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute, coalesce(finished.finished, 0), coalesce(finished.succeeded, 0),
       coalesce(failed.failed, 0)
FROM minutes m
LEFT JOIN finished USING (minute)
LEFT JOIN failed USING (minute)
ORDER BY m.minute
"""

#: The planner's row estimate of each pgjobs table (archived_jobs summed over its partitions),
#: from the statistics ANALYZE left: NULL for a table never analysed. Rows: (table, rows).
TABLE_ROW_ESTIMATES = """
SELECT t.name,
       (SELECT sum(c.reltuples)::bigint
        FROM pg_class c
        WHERE c.relkind = 'r' AND c.reltuples >= 0
          AND (c.oid = t.name::regclass
               OR c.oid IN (SELECT relid FROM pg_partition_tree(t.name::regclass)
                            WHERE isleaf)))
FROM unnest(ARRAY['queued_jobs', 'archived_jobs', 'dead_letter']) AS t(name)
"""

#: Each pgjobs table's rows counted exactly, but at most ``cap`` of them: a scan stopped at the
#: LIMIT, cheap whatever the table's size. The dashboard's sizes where the planner's estimate is
#: missing or cannot be trusted (no ANALYZE since: autovacuum off). Rows: (table, rows).
TABLE_ROWS_CAPPED = """
SELECT 'queued_jobs', count(*) FROM (SELECT 1 FROM queued_jobs LIMIT %(cap)s) t
UNION ALL
SELECT 'archived_jobs', count(*) FROM (SELECT 1 FROM archived_jobs LIMIT %(cap)s) t
UNION ALL
SELECT 'dead_letter', count(*) FROM (SELECT 1 FROM dead_letter LIMIT %(cap)s) t
"""

#: DEAD_LIST narrowed by ``reason`` too, one page after the cursor (``before_at``,
#: ``before_id``: the last job of the previous page; NULL for the first page).
DEAD_LIST_PAGE = f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback="NULL::text")}
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE_AND_REASON}
  AND (%(before_at)s::timestamptz IS NULL
       OR (d.failed_at, d.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: The ids of the newest ``limit`` dead jobs matching the filters and ``reason`` (all of them
#: when ``limit`` is NULL), newest first.
DEAD_NEWEST_IDS = f"""
SELECT d.id
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE_AND_REASON}
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: How many dead jobs match the filters but the fingerprint, and ``reason``, counting no further
#: than ``cap``.
DEAD_COUNT_CAPPED = f"""
SELECT count(*) FROM (
    SELECT 1 FROM dead_letter d
    WHERE {_DEAD_WHERE_BUT_FINGERPRINT}
      AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)
    LIMIT %(cap)s
) matching
"""

#: The jobs holding the idempotency key ``key`` in any table, newest first, at most ``limit``:
#: (id). A key is unique among queued jobs only; the archive and dead letters may hold several.
JOB_IDS_BY_KEY = """
SELECT id FROM (
    SELECT id, created_at FROM queued_jobs WHERE idempotency_key = %(key)s
    UNION ALL
    SELECT id, created_at FROM archived_jobs WHERE idempotency_key = %(key)s
    UNION ALL
    SELECT id, created_at FROM dead_letter WHERE idempotency_key = %(key)s
) found
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
"""

# The dashboard's search (pgjobs.web.dashboard.search): each kind reads the three tables through
# one index each, every table LIMITed on its own, newest (highest id) first. Rows: (id,).
#   by id               the primary keys (the archive's (id, finished_at), partition by partition)
#   by idempotency key  JOB_IDS_BY_KEY above: uq_queued_jobs_idempotency_key,
#                       ix_archived_jobs_idempotency_key, ix_dead_letter_idempotency_key
#   by unique key       ix_queued_jobs_unique_key, ix_archived_jobs_unique_key,
#                       ix_dead_letter_unique_key (migration 0015)
#   by tag              the GIN indexes ix_queued_jobs_tags, ix_archived_jobs_tags,
#                       ix_dead_letter_tags (a Bitmap Index Scan; the matches are then sorted)
#   by group            ix_queued_jobs_group_sequence (group_key first), ix_archived_jobs_group_key
#                       (migration 0015), ix_dead_letter_group_key_task
# tests/integration/schema/test_search_plans.py checks each plan with sequential scans off.
_SEARCH_TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def _search(where: str) -> str:
    parts = "\n    UNION ALL\n".join(
        f"    (SELECT id FROM {table} WHERE {where} ORDER BY id DESC LIMIT %(limit)s)"
        for table in _SEARCH_TABLES
    )
    return f"SELECT id FROM (\n{parts}\n) found\nORDER BY id DESC\nLIMIT %(limit)s\n"


#: Job ``id`` wherever it is (one row), or no row.
SEARCH_BY_ID = """
SELECT id FROM queued_jobs WHERE id = %(id)s::bigint
UNION ALL
SELECT id FROM archived_jobs WHERE id = %(id)s::bigint
UNION ALL
SELECT id FROM dead_letter WHERE id = %(id)s::bigint
"""
#: The newest ``limit`` jobs enqueued with unique key ``value``, in any table.
SEARCH_BY_UNIQUE_KEY = _search("unique_key = %(value)s::text")
#: The newest ``limit`` jobs tagged ``value``, in any table (``tags IS NOT NULL`` matches the GIN
#: indexes' predicate).
SEARCH_BY_TAG = _search("tags IS NOT NULL AND tags @> ARRAY[%(value)s::text]")
#: The newest ``limit`` jobs of group ``value``, in any table.
SEARCH_BY_GROUP = _search("group_key = %(value)s::text")

#: One page of batches, newest first, before batch ``before`` (NULL: from the newest): a keyset
#: on the primary key (Index Scan Backward of pgjobs_batches_pkey, stopped at the LIMIT). Rows:
#: batches.BatchStatus's columns but its members' counts.
BATCHES_PAGE = """
SELECT id, total, pending, succeeded, dead, cancelled, created_at, completed_at,
       callback_task, callback_queue, callback_job_id
FROM pgjobs_batches
WHERE id < coalesce(%(before)s::bigint, 9223372036854775807)
ORDER BY id DESC
LIMIT %(limit)s
"""

#: The workflow around job ``id``: the jobs its dependency edges reach in either direction,
#: breadth first (nearest first), at most ``cap`` of them, and the edges between those. Through
#: pgjobs_dependencies' primary key (job_id first) and ix_pgjobs_dependencies_depends_on. Rows:
#: (job, NULL) for each job reached, the job itself first; (job_id, depends_on) for each edge.
DEPENDENCY_GRAPH = """
WITH RECURSIVE reach(id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT n.id FROM reach r, LATERAL (
        SELECT d.depends_on AS id FROM pgjobs_dependencies d WHERE d.job_id = r.id
        UNION ALL
        SELECT d.job_id FROM pgjobs_dependencies d WHERE d.depends_on = r.id
    ) n
),
nodes AS MATERIALIZED (SELECT id, row_number() OVER () AS n FROM (SELECT id FROM reach LIMIT %(cap)s) r)
SELECT id, NULL::bigint FROM (SELECT id, n FROM nodes ORDER BY n) ordered
UNION ALL
SELECT d.job_id, d.depends_on FROM pgjobs_dependencies d
WHERE d.job_id IN (SELECT id FROM nodes) AND d.depends_on IN (SELECT id FROM nodes)
"""

#: The status and task of each of the jobs ``ids``, wherever they are (by the three primary
#: keys). Rows: (id, JobStatus value, task); a job in no table has no row.
DEPENDENCY_GRAPH_JOBS = f"""
SELECT q.id, CASE WHEN q.lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                  WHEN q.run_at = 'infinity' THEN '{JobStatus.WAITING}'
                  WHEN q.run_at > now() THEN '{JobStatus.SCHEDULED}'
                  ELSE '{JobStatus.READY}' END, q.task
FROM queued_jobs q WHERE q.id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT a.id, a.status, a.task FROM archived_jobs a WHERE a.id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT d.id, '{JobStatus.DEAD}', d.task FROM dead_letter d WHERE d.id = ANY(%(ids)s::bigint[])
"""

#: One queue's jobs by task: ready, scheduled, running, dead, archived in the last hour and
#: dead-lettered in the last hour; ages in seconds. Rows: (task, ready, scheduled, running, dead,
#: finished last hour, failed last hour, oldest ready age), by task.
QUEUE_STATS_BY_TASK = """
WITH hot AS (
    SELECT task,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()) AS ready,
           -- Jobs waiting for their dependencies (run_at 'infinity') are not scheduled ones.
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()
                              AND run_at <> 'infinity') AS scheduled,
           count(*) FILTER (WHERE lease_expires_at IS NOT NULL) AS running,
           extract(epoch FROM now() - min(run_at)
                   FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()))::float8
               AS oldest_ready_age
    FROM queued_jobs
    WHERE queue = %(queue)s
    GROUP BY task
),
dead AS (
    SELECT task, count(*) AS dead,
           count(*) FILTER (WHERE failed_at > now() - interval '1 hour') AS failed_last_hour
    FROM dead_letter
    WHERE queue = %(queue)s
    GROUP BY task
),
finished AS (
    SELECT task, count(*) AS finished_last_hour
    FROM archived_jobs
    WHERE queue = %(queue)s AND finished_at > now() - interval '1 hour'
    GROUP BY task
)
SELECT t.task,
       coalesce(hot.ready, 0), coalesce(hot.scheduled, 0), coalesce(hot.running, 0),
       coalesce(dead.dead, 0), coalesce(finished.finished_last_hour, 0),
       coalesce(dead.failed_last_hour, 0), hot.oldest_ready_age
FROM (SELECT task FROM hot UNION SELECT task FROM dead UNION SELECT task FROM finished) t
LEFT JOIN hot USING (task)
LEFT JOIN dead USING (task)
LEFT JOIN finished USING (task)
ORDER BY t.task
"""


# -- Groups: stats, dashboard, metrics ------------------------------------------------------------

#: The groups of every queue that holds grouped jobs (of queue ``queue`` only, unless NULL)
#: (``pgjobs.groups.load``): per queue, its
#: ``top`` groups by ready jobs (ready, running, at its limit), how many groups it has and how
#: many are at their limit, and what holds each top group with ready jobs back. Rows: (queue,
#: group_concurrency, groups, groups_capped, at_limit, group_key, ready, running, group at its
#: limit, hold reason, hold task, holding job ids, holding jobs, hold until), one per top group and
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
#: ix_dead_letter_group_key_task).
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
       h.reason, h.task, h.job_ids, h.jobs, h.until
FROM ranked r
LEFT JOIN LATERAL (
    -- At its limit: the running jobs that hold it (every one of the queue at the queue's limit;
    -- those of the tasks at their own limit otherwise, in any queue, an ordered task's shown
    -- below as its oldest job).
    SELECT 1 AS nth, 'limit' AS reason, NULL::text AS task,
           (array_agg(j.id ORDER BY j.id))[1:%(holders)s] AS job_ids, count(*)::int AS jobs,
           NULL::timestamptz AS until
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
    SELECT v.nth, v.reason, t.task, ARRAY[v.id], 1, v.until
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
) h ON true
WHERE r.rank <= greatest(%(top)s, 1)
ORDER BY r.queue, r.rank, h.nth, h.task
"""


#: The jobs of ``queues`` there is work for now, what an autoscaler asks for (KEDA's
#: ``postgresql`` scaler: deploy/kubernetes/keda/scaledobject-postgresql.yaml holds this text
#: with the values written in, a test keeps them equal): the running ones, and the ready ones
#: (due, not leased, in a queue that is not paused) a claim could take, as JOB_CLAIM_LIMITED
#: takes them: a group's ready jobs count only up to what its limits leave (a task's
#: ``group_tasks`` with their ``group_limits``, across every queue; a queue's
#: group_concurrency, in that queue), an ordered task's (``ordered_tasks``) only when it is its
#: (task, group)'s oldest job in every queue, a ``hold_tasks``'s only while no dead job of its
#: (task, group) is in dead_letter; the place of a force-cancelled job whose handler may still
#: run (pgjobs_group_holds) counts as a running job there, not as work. One scan of queued_jobs;
#: the ready jobs of a group are ranked per (task, group) and per (queue, group) in claim order.
#: Rows: (count,).
JOB_DEMAND = """
WITH ready AS (
    SELECT q.id, q.queue, q.task, q.group_key,
           row_number() OVER (PARTITION BY q.group_key, q.task
                              ORDER BY q.priority DESC, q.run_at, q.id) AS task_nth,
           row_number() OVER (PARTITION BY q.queue, q.group_key
                              ORDER BY q.priority DESC, q.run_at, q.id) AS queue_nth
    FROM queued_jobs q
    WHERE q.queue = ANY(%(queues)s::text[])
      AND q.lease_expires_at IS NULL AND q.run_at <= now() AND q.group_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pgjobs_queues p
                      WHERE p.name = q.queue AND p.paused_at IS NOT NULL)
),
running AS (
    SELECT q.queue, q.task, q.group_key, count(*) AS jobs
    FROM (SELECT queue, task, group_key FROM queued_jobs
          WHERE lease_expires_at > now() AND group_key IS NOT NULL
          UNION ALL
          SELECT queue, task, group_key FROM pgjobs_group_holds
          WHERE lease_expires_at > now()) q
    GROUP BY q.queue, q.task, q.group_key
)
SELECT (
    SELECT count(*) FROM queued_jobs q
    WHERE q.queue = ANY(%(queues)s::text[])
      AND (q.lease_expires_at IS NOT NULL
           OR q.group_key IS NULL AND q.run_at <= now()
              AND NOT EXISTS (SELECT 1 FROM pgjobs_queues p
                              WHERE p.name = q.queue AND p.paused_at IS NOT NULL))
) + (
SELECT count(*) FROM ready r
LEFT JOIN unnest(%(group_tasks)s::text[], %(group_limits)s::int[]) AS l(task, cap)
    ON l.task = r.task
LEFT JOIN pgjobs_queues p ON p.name = r.queue
WHERE (l.task IS NULL OR r.task_nth <= l.cap - coalesce(
          (SELECT sum(x.jobs) FROM running x
           WHERE x.group_key = r.group_key AND x.task = r.task), 0))
  AND (p.group_concurrency IS NULL OR r.queue_nth <= p.group_concurrency - coalesce(
          (SELECT sum(x.jobs) FROM running x
           WHERE x.group_key = r.group_key AND x.queue = r.queue), 0))
  AND (r.task <> ALL(%(ordered_tasks)s::text[]) OR NOT EXISTS (
          SELECT 1 FROM queued_jobs o
          WHERE o.group_key = r.group_key AND o.task = r.task AND o.id < r.id)
          AND NOT EXISTS (
          SELECT 1 FROM pgjobs_group_holds h
          WHERE h.group_key = r.group_key AND h.task = r.task AND h.lease_expires_at > now()))
  AND (r.task <> ALL(%(hold_tasks)s::text[]) OR NOT EXISTS (
          SELECT 1 FROM dead_letter d WHERE d.group_key = r.group_key AND d.task = r.task))
)
"""


# -- Results: waiting for a job's end, and its progress (pgjobs.results, JobContext.progress) ----

#: Channel the trigger ``pgjobs_job_ended`` NOTIFYs (payload: the job id) when a watched job
#: enters archived_jobs or dead_letter.
ENDED_CHANNEL = "pgjobs_ended"

#: Subscribe this session to ENDED_CHANNEL.
RESULT_LISTEN = f'LISTEN "{ENDED_CHANNEL}"'

#: Ask for a notification when queued job ``id`` ends (a row already watched is not written).
RESULT_WATCH = "UPDATE queued_jobs SET watched = true WHERE id = %(id)s AND NOT watched"

#: Where job ``id`` is and how it ended: (table, status, result, reason, error_type,
#: last_error); no row when the id is in no table. One snapshot: a job moving meanwhile is
#: found in exactly one of them.
RESULT_LOOKUP = f"""
SELECT 'archived_jobs', status, result, NULL::text, NULL::text, NULL::text
FROM archived_jobs WHERE id = %(id)s
UNION ALL
SELECT 'dead_letter', '{JobStatus.DEAD}', NULL::jsonb, reason, error_type, last_error
FROM dead_letter WHERE id = %(id)s
UNION ALL
SELECT 'queued_jobs', NULL::text, NULL::jsonb, NULL::text, NULL::text, NULL::text
FROM queued_jobs WHERE id = %(id)s
"""

#: Which of the jobs ``ids`` have ended (are in archived_jobs or dead_letter): the one batched
#: re-check of every pending waiter.
RESULT_ENDED = """
SELECT id FROM archived_jobs WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id FROM dead_letter WHERE id = ANY(%(ids)s::bigint[])
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


# -- Batches (pgjobs.batches) --------------------------------------------------------------------
# A batch is written in one transaction: its row (BATCH_INSERT), its members (the insert paths
# above with the batch's id, BATCH_INSERT_MEMBERS*), then BATCH_SEAL. The trigger
# pgjobs_job_ended counts each member's first end and enqueues the callback once (migration 0013).

#: The batch's counts and its callback as a JSON object: the "batch" key of the callback's payload.
_BATCH_COUNTS = """jsonb_build_object(
    'id', b.id, 'total', b.total, 'succeeded', b.succeeded, 'dead', b.dead,
    'cancelled', b.cancelled)"""

#: Create a batch, members not counted yet (BATCH_SEAL counts them), with its callback (NULL task:
#: none). Rows: (id,).
BATCH_INSERT = """
INSERT INTO pgjobs_batches (total, pending, callback_task, callback_queue, callback_payload,
                            callback_priority, callback_max_attempts, callback_payload_version)
VALUES (0, 0, %(task)s, %(queue)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s,
        %(payload_version)s)
RETURNING id
"""

#: JOB_INSERT_MANY_VERSIONED for the members of batch ``batch_id``.
BATCH_INSERT_MEMBERS = _job_insert_many(versioned=True, batch=True)

#: JOB_INSERT_KEYED for the members of batch ``batch_id``: a member whose key is held is the
#: holder, which stays out of the batch.
BATCH_INSERT_MEMBERS_KEYED = _job_insert_keyed(batch=True)

#: JOB_COPY_MANY_VERSIONED for the members of a batch (its id on every row).
BATCH_COPY_MEMBERS = """
COPY queued_jobs (id, queue, task, payload, priority, run_at, max_attempts, expires_at,
                  payload_version, trace_context, batch_id) FROM STDIN
"""

#: Count batch ``id``'s members (the jobs its inserts wrote, not the holders of keys they met) as
#: its total and pending; a batch with none is complete at once, its callback enqueued now with
#: counts of 0 (as the trigger would: its id reserved first, to be named by the batch's row).
#: Rows: (total, callback job id).
BATCH_SEAL = f"""
WITH members AS (
    SELECT count(*)::int AS n FROM queued_jobs WHERE batch_id = %(id)s
),
sealed AS (
    UPDATE pgjobs_batches b
    SET total = m.n, pending = m.n,
        completed_at = CASE WHEN m.n = 0 THEN now() END,
        callback_job_id = CASE WHEN m.n = 0 AND b.callback_task IS NOT NULL
                               THEN nextval(pg_get_serial_sequence('queued_jobs', 'id')) END
    FROM members m
    WHERE b.id = %(id)s
    RETURNING b.*
),
callback AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, max_attempts, payload_version)
    SELECT b.callback_job_id, b.callback_queue, b.callback_task,
           b.callback_payload || jsonb_build_object('batch', {_BATCH_COUNTS}),
           b.callback_priority, b.callback_max_attempts, b.callback_payload_version
    FROM sealed b
    WHERE b.callback_job_id IS NOT NULL
    RETURNING id, queue
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n FROM callback
)
SELECT s.total, (SELECT id FROM callback)
FROM sealed s CROSS JOIN notified
"""

#: Batch ``id`` in the order of batches.BatchStatus, then its members' count per status as a JSON
#: object, read from the three tables through their batch_id indexes. No row: no such batch.
BATCH_STATUS = f"""
SELECT b.id, b.total, b.pending, b.succeeded, b.dead, b.cancelled, b.created_at, b.completed_at,
       b.callback_task, b.callback_queue, b.callback_job_id,
       (SELECT coalesce(jsonb_object_agg(m.status, m.n), '{{}}') FROM (
            SELECT status, count(*) AS n FROM (
                SELECT CASE WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                            WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                            WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                            ELSE '{JobStatus.READY}' END AS status
                FROM queued_jobs WHERE batch_id = b.id
                UNION ALL
                SELECT status FROM archived_jobs WHERE batch_id = b.id
                UNION ALL
                SELECT '{JobStatus.DEAD}' FROM dead_letter WHERE batch_id = b.id
            ) s GROUP BY status
        ) m)
FROM pgjobs_batches b
WHERE b.id = %(id)s
"""

#: Up to ``limit`` member ids of batch ``id`` per status, lowest first, as a JSON object of
#: arrays (the batch page's links).
BATCH_MEMBERS = f"""
SELECT coalesce(jsonb_object_agg(status, ids), '{{}}') FROM (
    SELECT status, (array_agg(id ORDER BY id))[1:%(limit)s] AS ids FROM (
        SELECT id, CASE WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                        WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                        WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                        ELSE '{JobStatus.READY}' END AS status
        FROM queued_jobs WHERE batch_id = %(id)s
        UNION ALL
        SELECT id, status FROM archived_jobs WHERE batch_id = %(id)s
        UNION ALL
        SELECT id, '{JobStatus.DEAD}' FROM dead_letter WHERE batch_id = %(id)s
    ) s GROUP BY status
) m
"""

#: The batch job ``id`` is a member of, wherever the job is. Rows: (batch_id,) or none.
BATCH_OF_JOB = """
SELECT batch_id FROM queued_jobs WHERE id = %(id)s AND batch_id IS NOT NULL
UNION ALL
SELECT batch_id FROM archived_jobs WHERE id = %(id)s AND batch_id IS NOT NULL
UNION ALL
SELECT batch_id FROM dead_letter WHERE id = %(id)s AND batch_id IS NOT NULL
LIMIT 1
"""


# -- Tags (pgjobs.tags) -------------------------------------------------------------------------
# Jobs without tags keep the statements above; a call in which some job has tags takes these,
# derived from them (``_edited`` refuses an edit that no longer finds its text, so a change to a
# base statement cannot leave its tagged twin silently stale). Tags travel as one JSON array per
# row (``%(tags)s``, NULL for a row without), an array of arrays being no unnest input.

# A row's tags as text[] from ``{row}.tags`` (jsonb): NULL stays NULL, never an empty array.
_TAG_ARRAY = (
    "CASE WHEN {row}.tags IS NOT NULL THEN ARRAY(SELECT t FROM jsonb_array_elements_text({row}.tags)"
    " WITH ORDINALITY AS e(t, n) ORDER BY n) END"
)


def _edited(sql: str, *edits: tuple[str, str, int]) -> str:
    """``sql`` with each (old, new, count) edit made; ``old`` must occur exactly ``count`` times."""
    for old, new, count in edits:
        if sql.count(old) != count:
            raise AssertionError(f"a tagged statement's base changed: {old!r} is not found")
        sql = sql.replace(old, new)
    return sql


def _tagged_many(sql: str, *, batch: bool = False) -> str:
    """JOB_INSERT_MANY_VERSIONED (or, ``batch``, BATCH_INSERT_MEMBERS) with each job's tags
    (``tags``: JSON arrays or NULLs)."""
    member = ", batch_id" if batch else ""
    value = ", %(batch_id)s::bigint" if batch else ""
    return _edited(
        sql,
        (
            "%(trace_contexts)s::text[]::jsonb[]\n",
            "%(trace_contexts)s::text[]::jsonb[], %(tags)s::text[]::jsonb[]\n",
            1,
        ),
        (", trace_context, position)", ", trace_context, tags, position)", 1),
        (
            f"idempotency_key, payload_version, trace_context{member})",
            f"idempotency_key, payload_version, trace_context{member}, tags)",
            1,
        ),
        (
            f"i.trace_context{value}\n    FROM input i",
            f"i.trace_context{value}, {_TAG_ARRAY.format(row='i')}\n    FROM input i",
            1,
        ),
    )


def _tagged_keyed(sql: str) -> str:
    """JOB_INSERT_KEYED (or BATCH_INSERT_MEMBERS_KEYED) with each job's tags. A replace or
    debounce gives the holder the new job's tags when it has some (a new job without tags leaves
    the holder's, as its trace context)."""
    return _edited(
        sql,
        ("%(throttles)s::float8[]\n", "%(throttles)s::float8[], %(tags)s::text[]::jsonb[]\n", 1),
        ("throttle,\n                           position)", "throttle, tags, position)", 1),
        (
            "i.mode, i.throttle, i.position, w.floor\n",
            f"i.mode, i.throttle, i.position, w.floor, {_TAG_ARRAY.format(row='i')} AS tags\n",
            1,
        ),
        (_KEYED_COLUMNS, _KEYED_COLUMNS + ", tags", 4),
        (
            "expires_at = coalesce(excluded.expires_at, q.expires_at)\n",
            "expires_at = coalesce(excluded.expires_at, q.expires_at),\n"
            "                  tags = coalesce(excluded.tags, q.tags)\n",
            1,
        ),
    )


def _tagged_copy(sql: str) -> str:
    """A COPY of jobs with each job's tags as its last column."""
    return _edited(sql, (") FROM STDIN", ", tags) FROM STDIN", 1))


#: JOB_INSERT_MANY_VERSIONED with each job's tags.
JOB_INSERT_MANY_TAGGED = _tagged_many(JOB_INSERT_MANY_VERSIONED)
#: JOB_INSERT_KEYED with each job's tags.
JOB_INSERT_KEYED_TAGGED = _tagged_keyed(JOB_INSERT_KEYED)
#: JOB_COPY_MANY_VERSIONED with each job's tags.
JOB_COPY_MANY_TAGGED = _tagged_copy(JOB_COPY_MANY_VERSIONED)
#: The same three for the members of a batch.
BATCH_INSERT_MEMBERS_TAGGED = _tagged_many(BATCH_INSERT_MEMBERS, batch=True)
BATCH_INSERT_MEMBERS_KEYED_TAGGED = _tagged_keyed(BATCH_INSERT_MEMBERS_KEYED)
BATCH_COPY_MEMBERS_TAGGED = _tagged_copy(BATCH_COPY_MEMBERS)


# -- Pausing periodic schedules (pgjobs.schedules) ---------------------------------------------

#: Schedule ``name`` (models.ScheduleInfo); no row when the database has none of that name.
SCHEDULE_GET = f"SELECT {_SCHEDULE_COLUMNS} FROM pgjobs_schedules WHERE name = %(name)s"

#: Pause schedule ``name``: from the scheduler's next round on, none of its occurrences is
#: enqueued (SCHEDULE_LOCK_DUE skips it). A paused schedule stays paused as it was (since, by
#: whom). ``by`` NULL records the database role; ``reason`` follows it after ": ". Rows:
#: (whether this statement paused it); none when there is no such schedule.
SCHEDULE_PAUSE = """
WITH before AS (SELECT paused_at FROM pgjobs_schedules WHERE name = %(name)s FOR UPDATE)
UPDATE pgjobs_schedules s
SET paused_at = coalesce(s.paused_at, now()),
    paused_by = CASE WHEN s.paused_at IS NULL
                     THEN coalesce(%(by)s::text, session_user) || coalesce(': ' || %(reason)s::text, '')
                     ELSE s.paused_by END
FROM before
WHERE s.name = %(name)s
RETURNING before.paused_at IS NULL
"""

#: Resume schedule ``name``: its occurrences missed while paused are due at once, and its
#: catch_up rule decides how many run (as for occurrences missed while no worker ran). Rows:
#: (whether it was paused); none when there is no such schedule.
SCHEDULE_RESUME = """
WITH before AS (SELECT paused_at FROM pgjobs_schedules WHERE name = %(name)s FOR UPDATE)
UPDATE pgjobs_schedules s
SET paused_at = NULL, paused_by = NULL
FROM before
WHERE s.name = %(name)s
RETURNING before.paused_at IS NOT NULL
"""


# -- Dependencies: jobs enqueued ``after`` others (pgjobs.dependencies) -------------------------

# The status of a queued job ``q`` as pgjobs shows it: a job waiting for its dependencies sits at
# run_at 'infinity', which no claim takes.
_QUEUED_STATUS = f"""CASE WHEN q.lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                WHEN q.run_at = 'infinity' THEN '{JobStatus.WAITING}'
                WHEN q.run_at > now() THEN '{JobStatus.SCHEDULED}'
                ELSE '{JobStatus.READY}' END"""

#: Reserve ``count`` job ids, ascending, for the jobs of an enqueue with dependencies (a job may
#: name another of the same call before either is inserted). Rows: one, (ids array).
DEPENDENCY_RESERVE_IDS = """
SELECT ARRAY(
    SELECT nextval(seq)
    FROM CAST(pg_get_serial_sequence('queued_jobs', 'id') AS regclass) AS seq,
         generate_series(1, %(count)s)
)
"""

#: Mark the dependencies still in queued_jobs (``ids``) as watched, in id order. The row lock
#: is the point: a worker that moves one of them out of queued_jobs concurrently waits for this
#: transaction, so the move carries watched = true and its trigger sees the new job's edges (or
#: the move went first, and the next statement finds the dependency where it went). Rows: (id,)
#: per dependency still queued.
DEPENDENCY_LOCK = """
UPDATE queued_jobs q SET watched = true
FROM (SELECT id FROM queued_jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE) l
WHERE q.id = l.id
RETURNING q.id
"""

#: Where the dependencies that left queued_jobs (``ids``) ended. Rows: (id, archived status or
#: 'dead'); an id in neither table gives no row.
DEPENDENCY_ENDED = f"""
SELECT id, status FROM archived_jobs WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, '{JobStatus.DEAD}' FROM dead_letter WHERE id = ANY(%(ids)s::bigint[])
"""

#: Insert jobs with dependencies, from parallel arrays with their reserved ``ids``: a job with
#: ``waiting_on`` > 0 dependencies not succeeded yet goes in at run_at 'infinity' with its
#: pgjobs_waiting row (the run_at it asked for, for the trigger that releases it); the others
#: as usual, waking idle workers of their queues. ``watched``: the job waits, or a later job of
#: the call waits for it. Every edge (``edge_jobs``, ``edge_targets``) goes into
#: pgjobs_dependencies, met ones too (the job's page lists them). Rows: one, (jobs inserted).
DEPENDENCY_INSERT = f"""
WITH input AS (
    SELECT r.*, coalesce(r.run_at, now() + r.run_in * interval '1 second') AS due
    FROM unnest(
        %(ids)s::bigint[], %(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[]::jsonb[],
        %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(run_ins)s::float8[],
        %(max_attempts)s::int[], %(expires_ats)s::timestamptz[], %(expires_ins)s::float8[],
        %(payload_versions)s::int[], %(trace_contexts)s::text[]::jsonb[],
        %(waiting_on)s::int[], %(watched)s::boolean[], %(tags)s::text[]::jsonb[]
    ) AS r(id, queue, task, payload, priority, run_at, run_in, max_attempts, expires_at,
           expires_in, payload_version, trace_context, waiting_on, watched, tags)
),
inserted AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                             expires_at, payload_version, trace_context, watched, tags)
    SELECT id, queue, task, payload, priority,
           CASE WHEN waiting_on > 0 THEN 'infinity' ELSE due END,
           max_attempts, coalesce(expires_at, now() + expires_in * interval '1 second'),
           payload_version, trace_context, watched, {_TAG_ARRAY.format(row="input")}
    FROM input
    ORDER BY id
    RETURNING id
),
edges AS (
    INSERT INTO pgjobs_dependencies (job_id, depends_on)
    SELECT * FROM unnest(%(edge_jobs)s::bigint[], %(edge_targets)s::bigint[])
),
waiting AS (
    INSERT INTO pgjobs_waiting (job_id, waiting_on, run_at)
    SELECT id, waiting_on, due FROM input WHERE waiting_on > 0
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM input WHERE waiting_on = 0) q
)
SELECT (SELECT count(*) FROM inserted) FROM notified
"""

#: Make jobs just inserted by JOB_INSERT_KEYED (with an idempotency key, a group or a unique key)
#: dependents: their edges, ``watched`` where given, and for each with ``waiting_on`` > 0
#: dependencies not met yet, run_at 'infinity' and a pgjobs_waiting row that keeps the run time
#: the insert gave it (its release time). Rows: (jobs updated,).
DEPENDENCY_ATTACH = """
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(waiting_on)s::int[], %(watched)s::boolean[])
        AS r(id, waiting_on, watched)
),
edges AS (
    INSERT INTO pgjobs_dependencies (job_id, depends_on)
    SELECT * FROM unnest(%(edge_jobs)s::bigint[], %(edge_targets)s::bigint[])
),
waiting AS (
    INSERT INTO pgjobs_waiting (job_id, waiting_on, run_at)
    SELECT q.id, i.waiting_on, q.run_at
    FROM input i JOIN queued_jobs q ON q.id = i.id
    WHERE i.waiting_on > 0
),
held AS (
    UPDATE queued_jobs q
    SET run_at = CASE WHEN i.waiting_on > 0 THEN 'infinity' ELSE q.run_at END,
        watched = q.watched OR i.watched
    FROM input i
    WHERE q.id = i.id
    RETURNING q.id
)
SELECT count(*) FROM held
"""

#: The jobs job ``id`` depends on and the jobs that depend on it, with their status wherever
#: they are (NULL: purged or pruned), and the dependencies it still waits for. Rows: ('after' |
#: 'dependent', id, status) by side and id, then ('waiting', count, NULL) while it waits.
DEPENDENCY_SHOW = f"""
WITH edges AS (
    SELECT 'after' AS side, depends_on AS id FROM pgjobs_dependencies WHERE job_id = %(id)s
    UNION ALL
    SELECT 'dependent', job_id FROM pgjobs_dependencies WHERE depends_on = %(id)s
)
SELECT e.side, e.id, coalesce(
    (SELECT {_QUEUED_STATUS} FROM queued_jobs q WHERE q.id = e.id),
    (SELECT a.status FROM archived_jobs a WHERE a.id = e.id),
    (SELECT '{JobStatus.DEAD}' FROM dead_letter d WHERE d.id = e.id)
)
FROM edges e
UNION ALL
SELECT 'waiting', waiting_on, NULL FROM pgjobs_waiting WHERE job_id = %(id)s
ORDER BY 1, 2
"""
