WITH failed AS (
    DELETE FROM queued_jobs q
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[], %(dead_reasons)s::text[],
                 %(dead_types)s::text[], %(dead_errors)s::text[], %(dead_tracebacks)s::text[])
        AS d(id, attempts, reason, error_type, error, traceback)
    WHERE q.id = d.id AND q.attempts = d.attempts AND q.lease_owner = %(owner)s
    RETURNING q.*, d.reason, d.error_type, d.error, d.traceback
),
buried AS (
    INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, reason, error_type, last_error, traceback, worker)
    SELECT id, queue, CASE WHEN octet_length(task) <= 2000 THEN task ELSE left(task, 200) || format('... (%%s characters clipped)', length(task) - 200) END, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched, reason, error_type, error, traceback, lease_owner FROM failed
    RETURNING id
)
SELECT id FROM buried
