WITH succeeded AS (
    DELETE FROM queued_jobs q
    USING unnest(%(ok_ids)s::bigint[], %(ok_attempts)s::int[], %(ok_results)s::text[]::jsonb[])
        AS o(id, attempts, result)
    WHERE q.id = o.id AND q.attempts = o.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, o.result
),
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
failed AS (
    DELETE FROM queued_jobs q
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[], %(dead_reasons)s::text[],
                 %(dead_types)s::text[], %(dead_errors)s::text[], %(dead_tracebacks)s::text[])
        AS d(id, attempts, reason, error_type, error, traceback)
    WHERE q.id = d.id AND q.attempts = d.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, d.reason, d.error_type, d.error, d.traceback
),
ended AS (SELECT id, watched, batch_id, redrive_count FROM succeeded UNION ALL SELECT id, watched, batch_id, redrive_count FROM failed),
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
buried AS (
    INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, reason, error_type, last_error, traceback, worker)
    SELECT id, queue, CASE WHEN octet_length(task) <= 2000 THEN task ELSE left(task, 200) || format('... (%%s characters clipped)', length(task) - 200) END, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, reason, error_type, error, traceback, lease_owner FROM failed
    WHERE (SELECT n FROM ends_locked) >= 0
    RETURNING id
),
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
