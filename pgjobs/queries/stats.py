"""Counts for pgjobs stats, the dashboard and /metrics: per queue, per task, per minute, and table
health.
"""

from __future__ import annotations

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

#: The jobs of ``queues`` there is work for now, what an autoscaler asks for (KEDA's
#: ``postgresql`` scaler: deploy/kubernetes/keda/scaledobject-postgresql.yaml holds this text
#: with the values written in, a test keeps them equal): the running ones, and the ready ones
#: (due, not leased, in a queue that is not paused) a claim could take, as JOB_CLAIM_LIMITED
#: takes them: a group's ready jobs count only up to what its limits leave (a task's
#: ``group_tasks`` with their ``group_limits``, across every queue; a queue's
#: group_concurrency, in that queue; a queue's group rate, in that queue, and a task's
#: ``group_rate_tasks`` with ``group_rate_jobs`` per ``group_rate_seconds``, across every queue:
#: what their starts of the group in the last period leave), an ordered task's
#: (``ordered_tasks``) only when it is its (task, group)'s oldest job in every queue, a
#: ``hold_tasks``'s only while no dead job of its (task, group) is in dead_letter; the place of
#: a force-cancelled job whose handler may still run (pgjobs_group_holds) counts as a running
#: job there, not as work. One scan of queued_jobs;
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
  AND (p.group_rate_jobs IS NULL OR r.queue_nth <= p.group_rate_jobs - coalesce(
          (SELECT sum(x.jobs) FROM pgjobs_group_starts x
           WHERE x.group_key = r.group_key AND x.kind = 'queue' AND x.name = r.queue
             AND x.started_at > now() - p.group_rate_seconds * interval '1 second'), 0))
  AND NOT EXISTS (
          SELECT 1 FROM unnest(%(group_rate_tasks)s::text[], %(group_rate_jobs)s::int[],
                               %(group_rate_seconds)s::float8[]) AS g(task, jobs, seconds)
          WHERE g.task = r.task AND r.task_nth > g.jobs - coalesce(
              (SELECT sum(x.jobs) FROM pgjobs_group_starts x
               WHERE x.group_key = r.group_key AND x.kind = 'task' AND x.name = r.task
                 AND x.started_at > now() - g.seconds * interval '1 second'), 0))
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
