"""Connections and pools: opening them (sync and async, the worker's "hot" ones), taking a live
one from a pool, running a statement with its errors translated (``pgjobs.db.translate``), the
LISTEN stream, and the SQLAlchemy engine of migrations."""

from __future__ import annotations

import contextlib
import json
import logging
import select
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors
import psycopg.types.json

from pgjobs import queries
from pgjobs.db.dsn import Dsn
from pgjobs.db.rows import fetch_rows, fetch_rows_async
from pgjobs.db.translate import translate_errors
from pgjobs.errors import ConfigurationError, DatabaseUnavailable

if TYPE_CHECKING:
    # psycopg_pool is imported where a pool is opened or used: a worker and a one-shot command
    # (`pgjobs enqueue`) use plain connections and never load it.
    import psycopg_pool
    import sqlalchemy

#: Seconds to wait for a TCP connection before calling the database unreachable.
CONNECT_TIMEOUT = 5


def _connect_kwargs(dsn: Dsn) -> dict[str, Any]:
    """psycopg's arguments for a connection to ``dsn``. Through a transaction-mode pooler no
    statement is prepared on the server (``prepare_threshold=None``, which also overrides
    ``execute(..., prepare=True)``): the next transaction may run on another server session,
    which never saw it. ``application_name`` is a startup parameter, which PgBouncer keeps per
    client."""
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": "pgjobs"}
    if dsn.transaction_pooled:
        kwargs["prepare_threshold"] = None
    if "connect_timeout" not in dsn.url:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def require_session(dsn: Dsn, command: str) -> None:
    """Refuse (``ConfigurationError``) to run ``command``, which holds a session-level advisory
    lock across transactions, through a transaction-mode pooler: the lock would stay behind on
    a server session the pooler hands to other clients, and guard nothing."""
    if dsn.transaction_pooled:
        raise ConfigurationError(
            f"{command} holds a lock across transactions, which a transaction-mode pooler does "
            "not keep: run it on a direct DSN, without $PGJOBS_POOLER (PGJOBS_POOLER=session "
            "pgjobs ... --dsn postgresql://... naming PostgreSQL itself)"
        )


def connect(dsn: Dsn) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection; connection failures become ``DatabaseUnavailable``."""
    with translate_errors(dsn, connecting=True):
        return psycopg.connect(dsn.url, **_connect_kwargs(dsn))


async def connect_async(dsn: Dsn, *, hot: bool = False) -> psycopg.AsyncConnection[Any]:
    """An autocommit async psycopg connection; failures become ``DatabaseUnavailable``.

    ``hot`` is for connections that run the same prepared statements many times a second (the
    worker's claim connections), set up by ``queries.SESSION_HOT``: generic plans (PostgreSQL
    would otherwise plan the claim anew at every execution, which costs more server CPU than
    running it, ~1 ms against ~0.3 ms for a batch of 32, for the same plan) that never scan a
    table whole (a plan made on an empty queue would, for the rest of the session), and
    timestamps in UTC, so the datetimes of the jobs a worker claims are in UTC whatever the
    server's TimeZone. Their json and jsonb values (every claimed job's payload) are decoded
    by ``_json_loads``.

    Through a transaction-mode pooler only the time zone is set (``queries.SESSION_HOT_POOLED``):
    PgBouncer keeps ``TimeZone`` per client and sets it again on whichever server session runs
    the client's next transaction, while ``plan_cache_mode`` would stay behind on one session
    (and there is no prepared statement for it to act on).
    """
    with translate_errors(dsn, connecting=True):
        conn = await psycopg.AsyncConnection.connect(dsn.url, **_connect_kwargs(dsn))
        if hot:
            pooled = dsn.transaction_pooled
            await conn.execute(queries.SESSION_HOT_POOLED if pooled else queries.SESSION_HOT)
            psycopg.types.json.set_json_loads(_json_loads, conn)
        return conn


_json_decode = json.JSONDecoder().decode


def _json_loads(data: str | bytes) -> Any:
    """``json.loads`` for the UTF-8 text PostgreSQL sends (psycopg passes bytes): the same
    values, in about half the time of ``json.loads(bytes)``, which sniffs the encoding first
    (~1 µs a payload saved on this kind of machine)."""
    return _json_decode(data if isinstance(data, str) else data.decode())


async def cancel_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    """Ask the server to cancel the statement ``conn`` runs (within ``CONNECT_TIMEOUT``
    seconds); best effort: when that fails too, the statement runs to its end."""
    with contextlib.suppress(psycopg.Error):
        if hasattr(conn, "cancel_safe"):  # psycopg >= 3.2
            await conn.cancel_safe(timeout=CONNECT_TIMEOUT)
        else:  # blocking, as psycopg 3.1 cancels itself
            conn.cancel()


#: Where an operation runs: a DSN (a connection is opened for it and closed) or a psycopg
#: connection of the caller (used as it is, in its transaction if one is open).
Target = Dsn | psycopg.Connection[Any]


@contextlib.contextmanager
def target_connection(target: Target) -> Iterator[psycopg.Connection[Any]]:
    """A connection to ``target``, errors translated: a new autocommit one for a ``Dsn``
    (closed afterwards), else the caller's own.

    Example: ``with db.target_connection(dsn) as conn: conn.execute(...)``
    """
    if isinstance(target, Dsn):
        conn = connect(target)
        try:
            with translate_errors(target):
                yield conn
        finally:
            conn.close()
    else:
        with translate_errors():
            yield target


def schema_revision(conn: psycopg.Connection[Any]) -> str | None:
    """The pgjobs schema revision of this database, or None when pgjobs was never migrated."""
    try:
        with conn.transaction():
            row = conn.execute(queries.SCHEMA_REVISION).fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return None if row is None else str(row[0])


class _PoolNoise(logging.Filter):
    """psycopg_pool warns of every closed connection given back to it ("discarding closed
    connection: <psycopg.Connection [BAD]>"): pgjobs gives back on purpose the connections whose
    session the server ended (``checkout``, a statement that lost its connection, ``pool.check``),
    and the pool replaces them. Those lines become DEBUG records (a default handler drops them:
    nothing reaches a bare stderr); the pool's other warnings (cannot connect...) pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.msg in _DISCARDED:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


#: What the pool says when it drops a closed connection given back, or one ``pool.check()``
#: found broken (after the server ended sessions; pgjobs' own messages say what matters).
_DISCARDED = frozenset({"discarding closed connection: %s", "discarding broken connection: %s"})
_POOL_NOISE = _PoolNoise()


def _quiet_pool_noise() -> None:
    """Install ``_PoolNoise`` on psycopg_pool's logger (once)."""
    pool_log = logging.getLogger("psycopg.pool")
    if _POOL_NOISE not in pool_log.filters:
        pool_log.addFilter(_POOL_NOISE)


def open_pool(dsn: Dsn, max_size: int) -> psycopg_pool.ConnectionPool[Any]:
    """A pool of autocommit connections; fails fast with ``DatabaseUnavailable`` when the
    database cannot be reached."""
    _quiet_pool_noise()
    # Probe first: an unreachable database fails at once with libpq's reason, instead of the
    # pool retrying until its timeout and logging every failed attempt on stderr.
    connect(dsn).close()
    import psycopg_pool

    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        dsn.url,
        kwargs=_connect_kwargs(dsn),
        min_size=1,
        max_size=max_size,
        timeout=CONNECT_TIMEOUT * 2,
        open=False,
        name="pgjobs",
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
    except psycopg_pool.PoolTimeout as exc:
        pool.close()
        raise DatabaseUnavailable(
            f"cannot reach the database {dsn.redacted} ({dsn.source}); "
            "check the DSN and that PostgreSQL is up"
        ) from exc
    return pool


@contextlib.contextmanager
def pooled(pool: psycopg_pool.ConnectionPool[Any], dsn: Dsn) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool``, errors translated; see ``checkout``."""
    conn = checkout(pool, dsn)
    try:
        with translate_errors(dsn):
            yield conn
    finally:
        pool.putconn(conn)


def checkout(pool: psycopg_pool.ConnectionPool[Any], dsn: Dsn) -> psycopg.Connection[Any]:
    """A connection from ``pool``, to give back with ``pool.putconn``; a pool exhausted or closed
    becomes ``DatabaseUnavailable``.

    A pooled connection whose session the server ended while it sat idle (a restart,
    ``pg_terminate_backend``) is closed and another taken, before any statement is sent on it:
    the caller's statement then runs once, on a live connection.

    Cheaper than ``pool.connection()``, which also commits on the way out: pgjobs' pooled
    connections are autocommit, and ``putconn`` rolls back one returned inside a transaction.
    """
    # Every idle connection may have been ended at once (a restart): try each, then a new one.
    for _ in range(pool.max_size + 1):
        conn = _getconn(pool, dsn)
        if not _ended_by_server(conn):
            return conn
        with contextlib.suppress(psycopg.Error):
            conn.close()
        pool.putconn(conn)  # the pool drops a closed connection and opens a new one
    raise DatabaseUnavailable(
        f"the connection was closed by the server: every pooled connection to {dsn.redacted} "
        "was ended by the server; check that PostgreSQL is up"
    )


def _getconn(pool: psycopg_pool.ConnectionPool[Any], dsn: Dsn) -> psycopg.Connection[Any]:
    import psycopg_pool  # loaded already: ``pool`` is one of its pools

    try:
        conn: psycopg.Connection[Any] = pool.getconn()
    except psycopg_pool.PoolTimeout as exc:
        raise DatabaseUnavailable(
            f"no database connection available from the pool for {dsn.redacted}: {exc}"
        ) from exc
    except psycopg_pool.PoolClosed as exc:
        raise DatabaseUnavailable(f"the connection pool for {dsn.redacted} is closed") from exc
    return conn


async def open_async_pool(dsn: Dsn, max_size: int) -> psycopg_pool.AsyncConnectionPool[Any]:
    """``open_pool`` for asyncio: a pool of autocommit async connections, bound to the running
    event loop; fails fast with ``DatabaseUnavailable`` when the database cannot be reached."""
    _quiet_pool_noise()
    await (await connect_async(dsn)).close()
    import psycopg_pool

    pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
        dsn.url,
        kwargs=_connect_kwargs(dsn),
        min_size=1,
        max_size=max_size,
        timeout=CONNECT_TIMEOUT * 2,
        open=False,
        name="pgjobs-async",
    )
    try:
        await pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
    except psycopg_pool.PoolTimeout as exc:
        await pool.close()
        raise DatabaseUnavailable(
            f"cannot reach the database {dsn.redacted} ({dsn.source}); "
            "check the DSN and that PostgreSQL is up"
        ) from exc
    return pool


async def checkout_async(
    pool: psycopg_pool.AsyncConnectionPool[Any], dsn: Dsn
) -> psycopg.AsyncConnection[Any]:
    """``checkout`` for an async pool: a live connection, to give back with ``pool.putconn``."""
    import psycopg_pool  # loaded already: ``pool`` is one of its pools

    for _ in range(pool.max_size + 1):
        try:
            conn: psycopg.AsyncConnection[Any] = await pool.getconn()
        except psycopg_pool.PoolTimeout as exc:
            raise DatabaseUnavailable(
                f"no database connection available from the pool for {dsn.redacted}: {exc}"
            ) from exc
        except psycopg_pool.PoolClosed as exc:
            raise DatabaseUnavailable(f"the connection pool for {dsn.redacted} is closed") from exc
        if not _ended_by_server(conn):
            return conn
        with contextlib.suppress(psycopg.Error):
            await conn.close()
        await pool.putconn(conn)
    raise DatabaseUnavailable(
        f"the connection was closed by the server: every pooled connection to {dsn.redacted} "
        "was ended by the server; check that PostgreSQL is up"
    )


def _ended_by_server(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server ended, or is ending, the session of this idle connection. A server
    that ends a session sends a last message (FATAL) and closes the socket; nothing else arrives
    unasked on an idle pooled connection (it LISTENs to nothing). So a socket with something to
    read means that, and costs one ``poll`` of no wait to see, not a round trip."""
    if conn.closed:
        return True
    try:
        return socket_ready(conn.pgconn.socket, timeout=0)
    except (OSError, ValueError, psycopg.Error):
        return True


#: PostgreSQL's farewell when an administrator ends a session (``pg_terminate_backend``, a
#: shutdown; SQLSTATE 57P01), as libpq words it when the session ends as a statement is sent.
_ADMIN_FAREWELL = "terminating connection due to administrator command"


def ended_uncommitted(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a statement on an autocommit connection, is the server ending
    the session by an administrator's command (SQLSTATE 57P01), so that the statement may be sent
    again on another connection: such a session commits nothing more (its transaction in
    progress is rolled back, and a statement that committed first got its answer before the
    farewell). Any other lost connection (a crash, the network) leaves the commit unknown.

    Example: ``ended_uncommitted(exc)`` after ``pg_terminate_backend`` of an idle pooled session
    """
    cause = exc.__cause__
    if not isinstance(exc, DatabaseUnavailable) or not isinstance(cause, psycopg.Error):
        return False
    return cause.sqlstate == "57P01" or _ADMIN_FAREWELL in str(cause)


def socket_ready(fd: int, *, write: bool = False, timeout: float | None = None) -> bool:
    """Whether the socket ``fd`` has something to read (or, with ``write``, takes more) within
    ``timeout`` seconds (None: as long as it takes). By ``poll`` where there is one: ``select``
    refuses descriptors above 1023, and a busy process (a web server with many clients) hands
    such numbers to its database connections.

    Example: ``socket_ready(conn.pgconn.socket, timeout=0)``
    """
    if not hasattr(select, "poll"):  # Windows
        ready = select.select([] if write else [fd], [fd] if write else [], [], timeout)
        return bool(ready[0] or ready[1])
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


def fetch_all(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """Run one statement on a pgjobs connection and return its rows, errors translated; a value
    Python cannot hold is an ``Unloadable`` (``rows.fetch_rows``)."""
    with translate_errors():
        return fetch_rows(conn.execute(sql, params))


async def fetch_all_async(
    conn: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """``fetch_all`` on an async connection (the worker's)."""
    with translate_errors():
        cur = await conn.execute(sql, params, prepare=True)
        return await fetch_rows_async(cur)


async def notifications(dsn: Dsn) -> AsyncIterator[str]:
    """Payloads NOTIFYed on ``queries.NOTIFY_CHANNEL`` (queue names), on a connection of their
    own, until the connection fails (``DatabaseUnavailable``) or the iteration is cancelled.
    ``dsn`` must reach one server session for the life of the connection: never a DSN through a
    transaction-mode pooler (``ConfigurationError``), where LISTEN would stay behind on a server
    session other clients then use and the notifications go to them."""
    if dsn.transaction_pooled:
        raise ConfigurationError(
            f"LISTEN through a transaction-mode pooler ({dsn.redacted}) does not work: "
            "give a direct DSN to listen on (--listen-dsn, App(listen_dsn=...)) or poll"
        )
    conn = await connect_async(dsn)
    try:
        with translate_errors(dsn):
            await conn.execute(queries.LISTEN_JOBS)
            async for notify in conn.notifies():
                yield notify.payload
    finally:
        with contextlib.suppress(psycopg.Error):
            await conn.close()


def sqlalchemy_engine(dsn: Dsn) -> sqlalchemy.Engine:
    """A SQLAlchemy engine (psycopg 3 dialect, no pooling) for migrations and one-off commands.

    Its connections are opened by psycopg from the DSN as libpq reads it: SQLAlchemy's own URL
    parser knows one host and one numeric port, and fails on libpq's multi-host URLs
    (``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``)."""
    import sqlalchemy

    kwargs = {**_connect_kwargs(dsn), "autocommit": False}
    return sqlalchemy.create_engine(
        "postgresql+psycopg://",
        poolclass=sqlalchemy.NullPool,
        creator=lambda: psycopg.connect(dsn.url, **kwargs),
    )
