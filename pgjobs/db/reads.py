"""Reads that several parts of pgjobs share (stats, doctor, the web): one function per question,
so the question is asked the same way everywhere."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import queries
from pgjobs.db.connections import fetch_all
from pgjobs.db.rows import worker_info_from_row
from pgjobs.models import WorkerInfo


def live_workers(conn: psycopg.Connection[Any], stale_after: float) -> list[WorkerInfo]:
    """The workers that sent a heartbeat in the last ``stale_after`` seconds, with the jobs each
    one runs (``queries.WORKERS_LIVE``); errors translated.

    Example: ``[w.id for w in live_workers(conn, STALE_AFTER)]``
    """
    rows = fetch_all(conn, queries.WORKERS_LIVE, {"stale_after": stale_after})
    return [worker_info_from_row(row) for row in rows]
