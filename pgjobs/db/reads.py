"""Reads that several parts of pgjobs share (stats, doctor, the web): one function per question,
so the question is asked the same way everywhere."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import queries
from pgjobs.db.connections import fetch_all
from pgjobs.db.rows import worker_info_from_row
from pgjobs.models import ReplicaStatus, WorkerInfo


def live_workers(conn: psycopg.Connection[Any], stale_after: float) -> list[WorkerInfo]:
    """The workers that sent a heartbeat in the last ``stale_after`` seconds, with the jobs each
    one runs (``queries.WORKERS_LIVE``); errors translated.

    Example: ``[w.id for w in live_workers(conn, STALE_AFTER)]``
    """
    rows = fetch_all(conn, queries.WORKERS_LIVE, {"stale_after": stale_after})
    return [worker_info_from_row(row) for row in rows]


def replica_status(conn: psycopg.Connection[Any]) -> ReplicaStatus:
    """Whether ``conn`` leads to a standby and how far behind the primary it is
    (``queries.REPLICA_STATUS``); errors translated.

    Example: ``replica_status(conn).lag_seconds`` is 0.0 on a primary.
    """
    standby, receiver, pending, since_replay, paused = fetch_all(conn, queries.REPLICA_STATUS)[0]
    if not standby:
        lag: float | None = 0.0
    elif receiver == "streaming" and not pending and not paused:
        lag = 0.0  # everything the primary sent is replayed
    else:
        lag = None if since_replay is None else max(0.0, float(since_replay))
    return ReplicaStatus(bool(standby), receiver, int(pending or 0), lag, bool(paused))
