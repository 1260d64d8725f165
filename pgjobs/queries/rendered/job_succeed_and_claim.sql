WITH succeeded AS (
    DELETE FROM queued_jobs q
    USING unnest(%(ok_ids)s::bigint[], %(ok_attempts)s::int[], %(ok_results)s::text[]::jsonb[])
        AS o(id, attempts, result)
    WHERE q.id = o.id AND q.attempts = o.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, o.result
),
ended AS (SELECT id, watched, batch_id, redrive_count FROM succeeded),
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
),
archived AS (
    INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, status, result, last_error, worker)
    SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, 'succeeded', result, last_error, lease_owner FROM succeeded
    WHERE (SELECT n FROM ends_locked) >= 0
    RETURNING id
),
claimed AS (
UPDATE queued_jobs
SET attempts = attempts + 1,
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
    started_at = now()
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
            FROM queued_jobs
        WHERE queue = w.queue
          AND lease_expires_at IS NULL
          AND run_at <= now()
          AND (expires_at IS NULL OR expires_at > now())
              AND limit_key IS NULL AND group_key IS NULL
              AND NOT EXISTS (
                  SELECT 1 FROM pgjobs_queues p WHERE p.name = w.queue AND (p.paused_at IS NOT NULL OR p.concurrency IS NOT NULL OR p.rate_jobs IS NOT NULL)
              )
            ORDER BY priority DESC, run_at, id
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
RETURNING id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, trace_context, group_key, unique_key, snoozes
)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, trace_context, group_key, unique_key, snoozes FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, jsonb_build_object(
    'archived', coalesce((SELECT jsonb_agg(id) FROM archived), '[]'::jsonb),
    'status', CASE WHEN (EXISTS (
    SELECT 1 FROM pgjobs_queues
    WHERE name = ANY(%(queues)s::text[]) AND (concurrency IS NOT NULL OR rate_jobs IS NOT NULL)
) OR EXISTS (
    SELECT 1 FROM pgjobs_group_states WHERE queue = ANY(%(queues)s::text[])
)) THEN '{"queue_limits": true}'::jsonb END), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
