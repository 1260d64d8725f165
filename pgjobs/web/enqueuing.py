"""The one-job enqueue of ``POST /api/v1/jobs`` as fast as ``app.enqueue``: plain jobs that
requests send at the same moment go in as one statement and one commit (the group commit of
``pgjobs.enqueue.coalescing``), and each request is answered from the row its job was inserted
as, not read again.

Why: every enqueue NOTIFYs its queue's workers, and commits that NOTIFY take turns on one lock
until each is flushed to disk (see ``pgjobs.enqueue.coalescing``); requests that each committed
their own job, then read it back in two more statements, served 500 requests a second whatever the
number of clients. Here a flight of jobs is one ``JOB_INSERT_SHOWN``, run on the server's pool in
one thread of the pool FastAPI runs plain routes in, whatever the number of requests it serves.

A job with an idempotency key, a group, a unique key or dependencies (``enqueue.fits``)
takes the route's usual path: whether its answer is 201 or 200 is read in its own transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
from starlette.concurrency import run_in_threadpool

from pgjobs import db, enqueue
from pgjobs.enqueue import PreparedJob
from pgjobs.models import JobHistory

#: A pooled autocommit connection whose errors become ``pgjobs.errors`` (``Backend.connection``).
Connect = Callable[[], contextlib.AbstractContextManager[psycopg.Connection[Any]]]


class Enqueuer:
    """Inserts jobs (``enqueue.fits``) for the requests of one server, several at once.

    Example: ``history = await Enqueuer(backend.connection).insert(app.prepare(spec))``
    """

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        # It belongs to the event loop that made it: a new one for a new loop (tests run several).
        self._coalescer: enqueue.AsyncCoalescer[JobHistory] | None = None

    async def insert(self, row: PreparedJob) -> JobHistory:
        """Insert ``row`` with the other requests' jobs arriving meanwhile; the job as inserted.
        A failing job fails its own request only (the others are sent again alone)."""
        coalescer = self._coalescer
        if coalescer is None or coalescer.loop is not asyncio.get_running_loop():
            coalescer = self._coalescer = enqueue.AsyncCoalescer(self._send)
        return await coalescer.insert(row)

    async def _send(self, rows: list[PreparedJob]) -> list[JobHistory]:
        return await run_in_threadpool(self._write, rows)

    def _write(self, rows: list[PreparedJob]) -> list[JobHistory]:
        with self._connect() as conn:
            return insert(conn, rows)


def insert(conn: psycopg.Connection[Any], rows: list[PreparedJob]) -> list[JobHistory]:
    """Insert ``rows`` (each ``enqueue.fits``) in one statement, on an autocommit ``conn``
    one commit; the jobs as inserted, in order."""
    sql, params = enqueue.shown(rows)
    found = conn.execute(sql, params, prepare=True).fetchall()
    return [db.job_history_from_row(row) for row in found]
