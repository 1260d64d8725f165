"""Jobs enqueued after others: reserving ids, the waiting rows, what a job page shows."""

from __future__ import annotations

from pgjobs.models import JobStatus
from pgjobs.queries.channels import NOTIFY_CHANNEL
from pgjobs.queries.enqueue import _TAG_ARRAY

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
#: pgjobs_dependencies, met ones too (the job's page lists them), with the name the job gave it
#: (``edge_names``, NULL: by id only). The jobs are members of batch ``batch_id`` (NULL: none).
#: Rows: one, (jobs inserted).
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
                             expires_at, payload_version, trace_context, watched, tags,
                             batch_id)
    SELECT id, queue, task, payload, priority,
           CASE WHEN waiting_on > 0 THEN 'infinity' ELSE due END,
           max_attempts, coalesce(expires_at, now() + expires_in * interval '1 second'),
           payload_version, trace_context, watched, {_TAG_ARRAY.format(row="input")},
           %(batch_id)s::bigint
    FROM input
    ORDER BY id
    RETURNING id
),
edges AS (
    INSERT INTO pgjobs_dependencies (job_id, depends_on, name)
    SELECT * FROM unnest(%(edge_jobs)s::bigint[], %(edge_targets)s::bigint[],
                         %(edge_names)s::text[])
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
#: dependents: their edges (named by ``edge_names``), ``watched`` where given, and for each with
#: ``waiting_on`` > 0 dependencies not met yet, run_at 'infinity' and a pgjobs_waiting row that
#: keeps the run time the insert gave it (its release time). Rows: (jobs updated,).
DEPENDENCY_ATTACH = """
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(waiting_on)s::int[], %(watched)s::boolean[])
        AS r(id, waiting_on, watched)
),
edges AS (
    INSERT INTO pgjobs_dependencies (job_id, depends_on, name)
    SELECT * FROM unnest(%(edge_jobs)s::bigint[], %(edge_targets)s::bigint[],
                         %(edge_names)s::text[])
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
#: they are (NULL: purged or pruned) and the edge's name (NULL: by id only), and the dependencies
#: it still waits for. Rows: ('after' | 'dependent', id, status, name) by side and id, then
#: ('waiting', count, NULL, NULL) while it waits.
DEPENDENCY_SHOW = f"""
WITH edges AS (
    SELECT 'after' AS side, depends_on AS id, name FROM pgjobs_dependencies WHERE job_id = %(id)s
    UNION ALL
    SELECT 'dependent', job_id, name FROM pgjobs_dependencies WHERE depends_on = %(id)s
)
SELECT e.side, e.id, coalesce(
    (SELECT {_QUEUED_STATUS} FROM queued_jobs q WHERE q.id = e.id),
    (SELECT a.status FROM archived_jobs a WHERE a.id = e.id),
    (SELECT '{JobStatus.DEAD}' FROM dead_letter d WHERE d.id = e.id)
), e.name
FROM edges e
UNION ALL
SELECT 'waiting', waiting_on, NULL, NULL FROM pgjobs_waiting WHERE job_id = %(id)s
ORDER BY 1, 2
"""

#: What each job that job ``id`` depends on left, where it is now: (id, name, table, status,
#: result, reason, error_type, last_error) by id, as RESULT_LOOKUP reads one job (table NULL:
#: in no table, its archived row pruned or purged). Through pgjobs_dependencies' primary key and
#: each table's primary key; at most MAX_DEPENDENCIES rows, each result within the limit the
#: worker stored it under.
DEPENDENCY_RESULTS = f"""
SELECT d.depends_on, d.name, f.home, f.status, f.result, f.reason, f.error_type, f.last_error
FROM pgjobs_dependencies d
LEFT JOIN LATERAL (
    SELECT 'archived_jobs' AS home, a.status, a.result, NULL::text AS reason,
           NULL::text AS error_type, NULL::text AS last_error
    FROM archived_jobs a WHERE a.id = d.depends_on
    UNION ALL
    SELECT 'dead_letter', '{JobStatus.DEAD}', NULL::jsonb, x.reason, x.error_type, x.last_error
    FROM dead_letter x WHERE x.id = d.depends_on
    UNION ALL
    SELECT 'queued_jobs', NULL::text, NULL::jsonb, NULL::text, NULL::text, NULL::text
    FROM queued_jobs q WHERE q.id = d.depends_on
    LIMIT 1
) f ON true
WHERE d.job_id = %(id)s
ORDER BY d.depends_on
"""
