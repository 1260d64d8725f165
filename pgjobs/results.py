"""Waiting for a job's end: ``app.wait`` and ``app.wait_async``.

An App holds one ``Waiters``: a thread with ONE connection that LISTENs on
``queries.ENDED_CHANNEL`` for every waiter of the process, sync or async, and a dict of job id ->
the waiters to wake. A waiter

1. registers itself (the thread is LISTENing by then, or has tried to),
2. marks its job watched (``queries.RESULT_WATCH``: the trigger ``pgjobs_job_ended`` then
   NOTIFYs its end),
3. looks the job up (``queries.RESULT_LOOKUP``): ended already, it returns at once,
4. else sleeps until the thread wakes it, and looks it up again.

A notification lost while the listening connection was down is covered twice: after every
reconnect the thread re-checks all pending jobs in one query (``queries.RESULT_ENDED``), and it
runs that same query every ``RECHECK`` seconds while anyone waits. Where LISTEN is impossible
(the app's DSN goes through a transaction-mode pooler and no ``listen_dsn`` is given), that
query, every ``POLL`` seconds, is how waiters learn of an end: one query for all of them, never
one per waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import (
    ConfigurationError,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    PgjobsError,
    WaitTimeout,
)
from pgjobs.models import ArchivedStatus
from pgjobs.pools import Pools

log = logging.getLogger("pgjobs.results")

#: Seconds between the re-checks of every pending job while LISTENing (a lost notification).
RECHECK = 5.0
#: Seconds between those re-checks when no LISTEN is possible: how late a waiter may learn.
POLL = 1.0
#: Seconds the listening thread waits for a notification before it looks at its clock again.
TICK = 0.25
#: Seconds between two attempts to connect the listening connection again.
RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
#: The longest wait: a year, in seconds.
MAX_WAIT = 366 * 86_400.0

#: How a lookup row (``queries.RESULT_LOOKUP``) reads.
Row = tuple[Any, ...]


def check_wait(job_id: object, timeout: object) -> tuple[int, float]:
    """``(job_id, timeout)`` checked: an id >= 1, seconds from 0 to a year
    (``ConfigurationError``).

    Example: ``check_wait(42, 30) == (42, 30.0)``
    """
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise ConfigurationError(f"job_id must be a whole number >= 1, got {job_id!r}")
    try:
        seconds = float(timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(timeout, bool) or not 0 <= seconds <= MAX_WAIT:
        raise ConfigurationError(
            f"timeout must be seconds from 0 to {MAX_WAIT:.0f}, got {timeout!r}", field="timeout"
        )
    return job_id, seconds


def outcome(job_id: int, row: Row | None) -> tuple[bool, Any]:
    """What a lookup row says: ``(True, result)`` for a succeeded job, ``(False, None)`` for
    one still queued; raises ``JobFailed``, ``JobCancelled`` / ``JobExpired`` or
    ``JobNotFound``."""
    if row is None:
        raise JobNotFound(
            f"no job {job_id} in any pgjobs table (purged, pruned, or never enqueued)"
        )
    table, status, result, reason, error_type, last_error = row
    if table == "queued_jobs":
        return False, None
    if table == "dead_letter":
        raise JobFailed(job_id, reason, error_type, last_error)
    if status == ArchivedStatus.SUCCEEDED:
        return True, result
    if status == ArchivedStatus.EXPIRED:
        raise JobExpired(job_id)
    raise JobCancelled(job_id, status)


def watch_and_look(conn: psycopg.Connection[Any], job_id: int, *, watch: bool) -> Row | None:
    """Mark job ``job_id`` watched (with ``watch``), then, in a statement of its own (a snapshot
    taken after the mark committed), look it up."""
    with db.translate_errors():
        if watch:
            conn.execute(queries.RESULT_WATCH, {"id": job_id})
        return conn.execute(queries.RESULT_LOOKUP, {"id": job_id}).fetchone()


async def watch_and_look_async(
    conn: psycopg.AsyncConnection[Any], job_id: int, *, watch: bool
) -> Row | None:
    """``watch_and_look`` on an async connection."""
    with db.translate_errors():
        if watch:
            await conn.execute(queries.RESULT_WATCH, {"id": job_id})
        cursor = await conn.execute(queries.RESULT_LOOKUP, {"id": job_id})
        return await cursor.fetchone()


def _look(conn: psycopg.Connection[Any], _dsn: Dsn, *, job_id: int, watch: bool) -> Row | None:
    return watch_and_look(conn, job_id, watch=watch)


async def _look_async(
    conn: psycopg.AsyncConnection[Any], _dsn: Dsn, *, job_id: int, watch: bool
) -> Row | None:
    return await watch_and_look_async(conn, job_id, watch=watch)


class Waiters:
    """The waiters of one App and the thread that wakes them (started by the first wait).

    Example: ``Waiters(pools).wait(42, 30)`` is what ``app.wait(42, timeout=30)`` does.
    """

    def __init__(self, pools: Pools) -> None:
        self._pools = pools
        self._lock = threading.Lock()
        #: job id -> the wake-ups of its waiters (each called from the thread).
        self._waiting: dict[int, list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        #: Whether the thread's connection LISTENs now (False: it is down, or there is none).
        self.listening = False

    @property
    def pending(self) -> int:
        """How many jobs have waiters now."""
        with self._lock:
            return len(self._waiting)

    def start(self) -> None:
        """Start the thread (once) and return when its first LISTEN was done or failed."""
        with self._lock:
            if self._closed:
                raise PgjobsError("the app was closed: open it again to wait for a job")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgjobs-results", daemon=True
                )
                self._thread.start()
        self._ready.wait(db.CONNECT_TIMEOUT * 2)

    def close(self) -> None:
        """Stop the thread and close its connection; waiters still waiting raise."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            wakes = [wake for woken in self._waiting.values() for wake in woken]
        self._stop.set()
        for wake in wakes:
            wake()
        if thread is not None:
            thread.join(TICK * 8)

    def reopen(self) -> None:
        """Accept waiters again after ``close`` (the app's pools open again on use)."""
        with self._lock:
            if self._closed and self._thread is None:
                self._closed = False
                self._stop = threading.Event()
                self._ready = threading.Event()

    def _add(self, job_id: int, wake: Callable[[], None]) -> None:
        with self._lock:
            self._waiting.setdefault(job_id, []).append(wake)

    def _remove(self, job_id: int, wake: Callable[[], None]) -> None:
        with self._lock:
            woken = self._waiting.get(job_id)
            if woken is not None:
                with contextlib.suppress(ValueError):
                    woken.remove(wake)
                if not woken:
                    del self._waiting[job_id]

    def _wake(self, ids: Any) -> None:
        with self._lock:
            wakes = [wake for job_id in ids for wake in self._waiting.get(job_id, ())]
        for wake in wakes:
            wake()

    def _closed_while_waiting(self, job_id: int) -> PgjobsError:
        return PgjobsError(f"the app was closed while waiting for job {job_id}")

    # -- the waiters -----------------------------------------------------------------------------

    def wait(self, job_id: int, timeout: float) -> Any:
        """Block until job ``job_id`` ended, at most ``timeout`` seconds (see ``App.wait``)."""
        deadline = time.monotonic() + timeout
        self.reopen()
        self.start()
        woken = threading.Event()
        self._add(job_id, woken.set)
        try:
            watch = True
            while True:
                row = self._pools.run(functools.partial(_look, job_id=job_id, watch=watch))
                ended, result = outcome(job_id, row)
                if ended:
                    return result
                watch = False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(job_id, timeout)
                woken.wait(left)
                if self._stop.is_set():
                    raise self._closed_while_waiting(job_id)
                woken.clear()  # before the lookup: a wake-up from now on is not lost
        finally:
            self._remove(job_id, woken.set)

    async def wait_async(self, job_id: int, timeout: float) -> Any:
        """``wait`` for asyncio: the same thread wakes it (through its event loop)."""
        deadline = time.monotonic() + timeout
        self.reopen()
        if self._thread is None or not self._ready.is_set():
            await asyncio.to_thread(self.start)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(woken.set)

        self._add(job_id, wake)
        try:
            watch = True
            while True:
                row = await self._pools.run_async(
                    functools.partial(_look_async, job_id=job_id, watch=watch)
                )
                ended, result = outcome(job_id, row)
                if ended:
                    return result
                watch = False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(job_id, timeout)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), left)
                if self._stop.is_set():
                    raise self._closed_while_waiting(job_id)
                woken.clear()
        finally:
            self._remove(job_id, wake)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        stop = self._stop
        try:
            dsn = self._pools.listen_dsn
        except PgjobsError as exc:
            log.warning("waiting for jobs without LISTEN: %s", exc)
            dsn = None
        if dsn is None:
            # Through a transaction-mode pooler without a listen DSN: the batched re-check only.
            self._ready.set()
            while not stop.wait(POLL):
                self._recheck()
            return
        attempt = 0
        while not stop.is_set():
            try:
                self._listen(dsn)
                attempt = 0
            except PgjobsError as exc:
                log.warning("the LISTEN connection for waiters is down (%s); reconnecting", exc)
                attempt += 1
            finally:
                self.listening = False
                self._ready.set()
            if not stop.is_set():
                self._recheck()  # what ended while nobody listened
                stop.wait(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])

    def _listen(self, dsn: Dsn) -> None:
        """LISTEN on a connection of its own and wake waiters until ``close`` or a failure."""
        conn = db.connect(dsn)
        try:
            with db.translate_errors(dsn):
                conn.execute(queries.RESULT_LISTEN)
            self.listening = True
            self._ready.set()
            self._recheck()  # what ended before this connection listened
            due = time.monotonic() + RECHECK
            while not self._stop.is_set():
                with db.translate_errors(dsn):
                    for notify in conn.notifies(timeout=TICK):
                        if notify.payload.isdigit():
                            self._wake((int(notify.payload),))
                if time.monotonic() >= due:
                    self._recheck()
                    due = time.monotonic() + RECHECK
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _recheck(self) -> None:
        """Wake the waiters of every pending job that ended, found by one query."""
        with self._lock:
            ids = list(self._waiting)
        if not ids:
            return
        try:
            rows = self._pools.run(
                lambda conn, _dsn: db.fetch_all(conn, queries.RESULT_ENDED, {"ids": ids})
            )
        except PgjobsError as exc:
            log.debug("re-check of %d waited job(s) failed: %s", len(ids), exc)
            return
        self._wake(row[0] for row in rows)
