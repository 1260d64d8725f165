"""The database edge of pgjobs: where the database is (``dsn``, ``embedded``), connections and
pools (``connections``), driver errors turned into ``pgjobs.errors`` (``translate``), rows turned
into ``models`` (``rows``), the hot statements on libpq's own calls (``libpq``) and the reads
several parts share (``reads``). Nothing outside this package catches ``psycopg.Error``.

This module is the package's common face: ``from pgjobs import db; db.connect(dsn)``.
"""

from __future__ import annotations

from pgjobs.db.connections import (
    CONNECT_TIMEOUT,
    Target,
    cancel_quietly,
    checkout,
    checkout_async,
    connect,
    connect_async,
    ended_uncommitted,
    fetch_all,
    fetch_all_async,
    notifications,
    open_async_pool,
    open_pool,
    pooled,
    require_session,
    schema_revision,
    socket_ready,
    sqlalchemy_engine,
    target_connection,
)
from pgjobs.db.reads import live_workers, replica_status
from pgjobs.db.rows import (
    Damaged,
    archive_partition_from_row,
    damaged,
    dead_group_from_row,
    dead_job_from_row,
    fetch_row,
    fetch_rows,
    fetch_rows_async,
    job_from_row,
    job_history_from_row,
    orphaned_leases_from_row,
    queue_state_from_row,
    queue_stats_from_row,
    schedule_info_from_row,
    table_health_from_row,
    unloadable,
    unloadable_problem,
    worker_info_from_row,
)
from pgjobs.db.translate import MIGRATE_HINT, is_connection_failure, translate_errors, translated

__all__ = [
    "CONNECT_TIMEOUT",
    "MIGRATE_HINT",
    "Damaged",
    "Target",
    "archive_partition_from_row",
    "cancel_quietly",
    "checkout",
    "checkout_async",
    "connect",
    "connect_async",
    "damaged",
    "dead_group_from_row",
    "dead_job_from_row",
    "ended_uncommitted",
    "fetch_all",
    "fetch_all_async",
    "fetch_row",
    "fetch_rows",
    "fetch_rows_async",
    "is_connection_failure",
    "job_from_row",
    "job_history_from_row",
    "live_workers",
    "notifications",
    "open_async_pool",
    "open_pool",
    "orphaned_leases_from_row",
    "pooled",
    "queue_state_from_row",
    "queue_stats_from_row",
    "replica_status",
    "require_session",
    "schedule_info_from_row",
    "schema_revision",
    "socket_ready",
    "sqlalchemy_engine",
    "table_health_from_row",
    "target_connection",
    "translate_errors",
    "translated",
    "unloadable",
    "unloadable_problem",
    "worker_info_from_row",
]
