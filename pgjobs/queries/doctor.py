"""What pgjobs doctor asks the server: settings, connections, the oldest xmin, NOTIFY's queue."""

from __future__ import annotations

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
