-- The SQL cookbook: plain SQL over pgjobs' three tables, to run from psql.
-- docs/reference/sql-cookbook.md shows it; tests/integration/operations/test_admin_cookbook.py
-- runs every statement (statements end with ';' at the end of a line).

-- Top failing tasks today: jobs that died today, and jobs waiting to retry after an error
SELECT task,
       count(*) FILTER (WHERE dead) AS dead_today,
       count(*) FILTER (WHERE NOT dead) AS retrying
FROM (
    SELECT task, true AS dead FROM dead_letter WHERE failed_at >= date_trunc('day', now())
    UNION ALL
    SELECT task, false FROM queued_jobs WHERE attempts > 0 AND last_error IS NOT NULL
) failing
GROUP BY task
ORDER BY dead_today DESC, retrying DESC
LIMIT 10;

-- Failures by error fingerprint, exactly as `pgjobs dead group` counts them
SELECT task, fingerprint, count(*) AS jobs,
       min(failed_at) AS first_seen, max(failed_at) AS last_seen
FROM dead_letter d, LATERAL (SELECT left(
    CASE WHEN d.error_type IS NULL THEN d.reason || ': ' ELSE '' END
    || regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        split_part(left(coalesce(d.last_error, ''), 1000), E'\n', 1),
        $q$(^|[^[:alnum:]_])('[^']*'|"[^"]*")$q$, '\1<str>', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '0x[0-9a-f]+|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}', '<n>', 'gi'),
        '[0-9]+(\.[0-9]+)*', '<n>', 'g'),
        '\s+', ' ', 'g'),
    300) AS fingerprint) f
GROUP BY task, fingerprint
ORDER BY jobs DESC
LIMIT 20;

-- Jobs stuck the longest: ready but unclaimed (claim lag) ...
SELECT queue, id, task, attempts, now() - run_at AS waiting
FROM queued_jobs
WHERE lease_expires_at IS NULL AND run_at <= now()
ORDER BY run_at
LIMIT 20;

-- ... and running, by lease expiry, with the worker that holds each
SELECT queue, id, task, lease_owner, attempts, lease_expires_at
FROM queued_jobs
WHERE lease_expires_at IS NOT NULL
ORDER BY lease_expires_at
LIMIT 20;

-- Retry rate by queue, last 24 hours: finished jobs that needed more than one attempt, and died
SELECT queue,
       count(*) AS finished,
       round(100.0 * count(*) FILTER (WHERE attempts > 1) / count(*), 1) AS retried_pct,
       round(100.0 * count(*) FILTER (WHERE dead) / count(*), 1) AS dead_pct
FROM (
    SELECT queue, attempts, false AS dead FROM archived_jobs
    WHERE finished_at > now() - interval '24 hours' AND status = 'succeeded'
    UNION ALL
    SELECT queue, attempts, true FROM dead_letter WHERE failed_at > now() - interval '24 hours'
) finished
GROUP BY queue
ORDER BY retried_pct DESC;

-- Why jobs died
SELECT reason, count(*) FROM dead_letter GROUP BY reason ORDER BY count(*) DESC;

-- Run time and pickup latency per task, last hour (p50 and p99, in seconds): started_at is when
-- a job's last attempt started, so run time is finished_at - started_at and pickup latency
-- (ready until picked up) started_at - run_at. Only the finished_at index range is read.
SELECT task,
       count(*) AS jobs,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))::numeric, 3) AS run_p50,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))::numeric, 3) AS run_p99,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at))::numeric, 3) AS pickup_p99
FROM archived_jobs
WHERE finished_at > now() - interval '1 hour' AND status = 'succeeded' AND started_at IS NOT NULL
GROUP BY task
ORDER BY run_p99 DESC;

-- Redriven jobs, and how they ended
SELECT 'archived: ' || status AS outcome, count(*), max(redrive_count) AS most_redrives
FROM archived_jobs WHERE redrive_count > 0 GROUP BY status
UNION ALL
SELECT 'dead again', count(*), max(redrive_count) FROM dead_letter WHERE redrive_count > 0
UNION ALL
SELECT 'queued', count(*), max(redrive_count) FROM queued_jobs WHERE redrive_count > 0;

-- The replays of job 123, wherever they are
SELECT 'queued_jobs' AS place, id FROM queued_jobs WHERE replay_of = 123
UNION ALL SELECT 'archived_jobs', id FROM archived_jobs WHERE replay_of = 123
UNION ALL SELECT 'dead_letter', id FROM dead_letter WHERE replay_of = 123;

-- --8<-- [start:timeouts]
-- Jobs that went to dead_letter for a timeout, newest first
SELECT id, task, attempts, last_error, failed_at - started_at AS ran
FROM dead_letter WHERE reason = 'timeout' ORDER BY failed_at DESC LIMIT 20;
-- --8<-- [end:timeouts]
