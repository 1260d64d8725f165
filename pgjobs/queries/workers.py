"""The worker registry: heartbeats, who is live, leases without a live worker, replicas."""

from __future__ import annotations

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
