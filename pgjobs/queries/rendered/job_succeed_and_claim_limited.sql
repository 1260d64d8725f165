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
scopes AS MATERIALIZED (
    SELECT 'task' AS kind, t.name, t.concurrency, t.rate_jobs, t.rate_seconds, false AS paused
    FROM unnest(%(limit_tasks)s::text[], %(limit_concurrency)s::int[],
                %(limit_rate_jobs)s::int[], %(limit_rate_seconds)s::float8[])
        AS t(name, concurrency, rate_jobs, rate_seconds)
    UNION ALL
    SELECT 'queue', p.name, p.concurrency, p.rate_jobs, p.rate_seconds, p.paused_at IS NOT NULL
    FROM pgjobs_queues p
    WHERE p.name = ANY(%(queues)s::text[]) AND (p.paused_at IS NOT NULL OR p.concurrency IS NOT NULL OR p.rate_jobs IS NOT NULL)
),
running AS MATERIALIZED (
    SELECT s.kind, s.name,
           CASE WHEN s.kind = 'task' THEN (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.limit_key = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL(%(ok_ids)s::bigint[])
                   LIMIT s.concurrency) r)
           ELSE (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.queue = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL(%(ok_ids)s::bigint[])
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
          AND q.id <> ALL(%(ok_ids)s::bigint[])
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
           row_number() OVER (PARTITION BY c.queue, c.group_key ORDER BY priority DESC, run_at, id) AS turn,
           row_number() OVER (PARTITION BY c.group_key, c.task ORDER BY priority DESC, run_at, id) AS task_turn
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
),
candidates AS (
    SELECT c.*, false AS was_held
    FROM queue_caps w
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        FROM queued_jobs
        WHERE queue = w.queue
          AND lease_expires_at IS NULL
          AND run_at <= now()
          AND (expires_at IS NULL OR expires_at > now())
          AND limit_key IS NULL AND group_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT w.cap
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.*, true
    FROM queue_caps w
    JOIN task_caps t ON w.cap > 0 AND t.capacity > 0
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        FROM queued_jobs
        WHERE queue = w.queue
          AND lease_expires_at IS NULL
          AND run_at <= now()
          AND (expires_at IS NULL OR expires_at > now())
          AND limit_key = t.task AND group_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT least(w.cap, t.capacity)
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.id, c.queue, c.task, c.priority, c.run_at, c.turn, true
    FROM group_jobs c
),
ranked AS (
    SELECT c.*, t.capacity AS task_cap,
           row_number() OVER (PARTITION BY c.task ORDER BY priority DESC, turn, run_at, id) AS nth
    FROM candidates c
    LEFT JOIN task_caps t ON t.task = c.task
),
allowed AS (
    SELECT r.id, r.queue, r.priority, r.run_at, r.turn,
           row_number() OVER (PARTITION BY r.queue ORDER BY priority DESC, turn, run_at, id) AS nth
    FROM ranked r
    WHERE r.task_cap IS NULL OR r.nth <= r.task_cap
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
    started_at = now(),
    limit_key = CASE WHEN task = ANY(%(limit_tasks)s::text[]) THEN task END
    WHERE id = ANY(ARRAY(
        SELECT a.id
        FROM allowed a
        JOIN queue_caps w ON w.queue = a.queue
        WHERE a.nth <= w.cap
        ORDER BY a.priority DESC, a.turn, a.run_at, a.id
        LIMIT %(limit)s
    ))
    RETURNING id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, trace_context, group_key, unique_key, snoozes
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
)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, trace_context, group_key, unique_key, snoozes FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, jsonb_build_object(
    'archived', coalesce((SELECT jsonb_agg(id) FROM archived), '[]'::jsonb),
    'status', jsonb_build_object(
    -- Jobs held back, and groups whose whole share was claimed (they may hold more): claim
    -- again at once.
    'held', (SELECT count(*) FROM held) + (
        SELECT count(*) FROM group_takes k
        WHERE k.take > 0 AND k.take <= (SELECT count(*) FROM claimed c
                                       WHERE c.queue = k.queue AND c.group_key = k.group_key)),
    'locked_out', (SELECT coalesce(bool_or(locked_out), false) FROM limits),
    'retry_in', (SELECT min(retry_in) FROM limits),
    'queue_limits', (SELECT coalesce(bool_or(limited), false) FROM limits WHERE kind = 'queue')
                    OR EXISTS (
    SELECT 1 FROM pgjobs_group_states WHERE queue = ANY(%(queues)s::text[])
))), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
