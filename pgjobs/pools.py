"""An App's database and its connection pools: one sync pool, and one async pool per event loop,
each opened on first use."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from pgjobs import db
from pgjobs.db.dsn import Dsn, app_dsn, resolve_dsn
from pgjobs.db.pooler import Pooler
from pgjobs.errors import DatabaseUnavailable

if TYPE_CHECKING:
    import psycopg_pool  # imported by pgjobs.db when a pool opens

T = TypeVar("T")

#: The environment variable naming a direct DSN to LISTEN on when the app's DSN goes through a
#: transaction-mode pooler (``--listen-dsn``, ``App(listen_dsn=...)``).
LISTEN_DSN_ENV = "PGJOBS_LISTEN_DSN"


class Pools:
    """The database an App uses (resolved on first use when not given) and its pools.

    ``pool`` and ``known_dsn`` are read without the lock once set: the enqueue path reads them on
    every call, and only ``sync()`` / ``bind()`` / ``close()`` change them.

    ``pooler``, when given, is the pooler mode of every DSN the pools use, whatever
    ``$PGJOBS_POOLER`` says; ``listen``, a DSN to LISTEN on instead of the database's own.

    Example: ``Pools(None, 10).sync()`` resolves the database and opens the pool.
    """

    def __init__(
        self, dsn: Dsn | None, size: int, pooler: Pooler | None = None, listen: Dsn | None = None
    ) -> None:
        self.pooler = pooler
        #: The database, once resolved (None: not looked up yet).
        self.known_dsn = None if dsn is None else self._moded(dsn)
        self._listen = listen
        self.size = size
        #: The sync pool, once opened.
        self.pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._lock = threading.Lock()
        # The async pool and the event loop it belongs to, and the lock that opens it (per loop).
        self._async_pool: tuple[psycopg_pool.AsyncConnectionPool[Any], Any] | None = None
        self._async_lock: tuple[asyncio.Lock, Any] | None = None

    @property
    def dsn(self) -> Dsn:
        """The database, resolved on first use ($PGJOBS_DATABASE_URL, $DATABASE_URL, or the
        embedded server)."""
        with self._lock:
            if self.known_dsn is None:
                self.known_dsn = self._moded(app_dsn())
            return self.known_dsn

    def _moded(self, dsn: Dsn) -> Dsn:
        return dsn if self.pooler is None else replace(dsn, pooler=self.pooler)

    def bind(self, dsn: Dsn, *, pooler: Pooler | None = None, listen: Dsn | None = None) -> None:
        """Use ``dsn`` from now on (in ``pooler`` mode, and LISTENing on ``listen``, when given);
        closes a sync pool opened on another one."""
        self.close()
        with self._lock:
            self.pooler = pooler or self.pooler
            self._listen = listen or self._listen
            self.known_dsn = self._moded(dsn)

    @property
    def listen_dsn(self) -> Dsn | None:
        """Where workers LISTEN for new jobs: the DSN given for it (``$PGJOBS_LISTEN_DSN``
        unless given in code or on the command line), else the database's own unless that goes
        through a transaction-mode pooler (None: workers poll)."""
        if self._listen is None and os.environ.get(LISTEN_DSN_ENV, "").strip():
            self._listen = resolve_dsn(os.environ[LISTEN_DSN_ENV], source=f"${LISTEN_DSN_ENV}")
        if self._listen is not None:
            return replace(self._listen, pooler=Pooler.SESSION)
        dsn = self.dsn
        return None if dsn.transaction_pooled else dsn

    def sync(self) -> psycopg_pool.ConnectionPool[Any]:
        """The sync pool, opened on first use (``DatabaseUnavailable`` when it cannot be)."""
        dsn = self.dsn
        with self._lock:
            if self.pool is None:
                self.pool = db.open_pool(dsn, self.size)
            return self.pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the sync pool, errors translated (``db.pooled``)."""
        with db.pooled(self.sync(), self.dsn) as conn:
            yield conn

    def run(self, work: Callable[[psycopg.Connection[Any], Dsn], T]) -> T:
        """``work(conn, dsn)`` on a connection of the sync pool, given back after. Sent again, on
        another connection, when the server ended the session as it was sent (an
        administrator's ``pg_terminate_backend`` or a shutdown, which commit nothing:
        ``db.ended_uncommitted``): a session ended while idle may say so only after the
        statement left. Then the pool's idle connections are checked (``pool.check()``: the
        others were likely ended too). ``work`` must be one autocommit statement, or
        statements that may run again (reads, inserts by idempotency key).

        Example: ``pools.run(lambda conn, dsn: enqueue.insert(conn, rows, dsn, pooled=True))``
        """
        pool, dsn = self.pool, self.known_dsn  # read without the lock once the pool is open
        if pool is None or dsn is None:
            pool, dsn = self.sync(), self.dsn
        tries = pool.max_size + 1  # every idle session may have been ended at once
        for attempt in range(1, tries + 1):
            conn = db.checkout(pool, dsn)
            try:
                return work(conn, dsn)
            except DatabaseUnavailable as exc:
                if attempt == tries or not db.ended_uncommitted(exc):
                    raise
            finally:
                pool.putconn(conn)
            if attempt == 1:
                pool.check()  # a round trip on each idle one: the ended ones are replaced
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_async(
        self, work: Callable[[psycopg.AsyncConnection[Any], Dsn], Awaitable[T]]
    ) -> T:
        """``run`` on the running loop's async pool."""
        pool, dsn = await self.running_loop()
        tries = pool.max_size + 1
        for attempt in range(1, tries + 1):
            conn = await db.checkout_async(pool, dsn)
            try:
                return await work(conn, dsn)
            except DatabaseUnavailable as exc:
                if attempt == tries or not db.ended_uncommitted(exc):
                    raise
            finally:
                await pool.putconn(conn)
            if attempt == 1:
                await pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    async def running_loop(self) -> tuple[psycopg_pool.AsyncConnectionPool[Any], Dsn]:
        """The async pool of the running event loop, opened on first use. A pool opened by an
        earlier loop that has ended is dropped (its connections went with that loop)."""
        loop = asyncio.get_running_loop()
        if self._async_pool is not None and self._async_pool[1] is loop and self.known_dsn:
            return self._async_pool[0], self.known_dsn
        dsn = (
            self.known_dsn
            if self.known_dsn is not None
            else await asyncio.to_thread(lambda: self.dsn)
        )
        async with self._opening(loop):
            if self._async_pool is None or self._async_pool[1] is not loop:
                self._async_pool = (await db.open_async_pool(dsn, self.size), loop)
            return self._async_pool[0], dsn

    @property
    def async_pool(self) -> psycopg_pool.AsyncConnectionPool[Any] | None:
        """The async pool last opened (by whichever event loop), or None."""
        return None if self._async_pool is None else self._async_pool[0]

    def _opening(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._lock:
            if self._async_lock is None or self._async_lock[1] is not loop:
                self._async_lock = (asyncio.Lock(), loop)
            return self._async_lock[0]

    def close(self) -> None:
        """Close the sync pool (a later use opens a new one)."""
        with self._lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        """Close the running loop's async pool, then the sync pool."""
        held, self._async_pool = self._async_pool, None
        if held is not None and held[1] is asyncio.get_running_loop():
            await held[0].close()
        await asyncio.to_thread(self.close)
