"""The statements pgjobs runs most often, on libpq's own calls: the worker's round trip,
``queries.JOB_SUCCEED_AND_CLAIM`` (and its ``_LIMITED`` form), and the enqueue of one job ready
now, ``queries.JOB_INSERT_READY``, on a connection of the app's own pool.

psycopg's async cursor spends ~80 µs of client CPU per execution more than this path does
(at 32 jobs per trip, ~2.5 µs per job, ``python -m benchmarks.trips``: the cursor's machinery, a
reader added and removed and a timer armed at every wait); its sync cursor ~50 µs more for the
one-row insert (about 100 against 45 µs a call on this kind of machine). Here a statement is
prepared once per connection with untyped parameters, and again when the server dropped it (after
any rollback psycopg runs: see ``_prepared``), or, through a transaction-mode pooler, sent
unnamed with every execution; every execution sends them as text
(the statement casts each one) with ``PGconn.send_query_prepared``, then waits for the socket
(on the running event loop, or in ``poll`` for the sync insert). The claim's rows come in
binary, loaded with the connection's own loaders (so its json loader too): the server then
sends timestamps and integers as they are stored instead of writing them as text (~3 µs of
server CPU less per claimed job, measured on the statement alone: they are a claimed row's 16
columns, four of them timestamps).

The connection stays a psycopg connection, used by everything else as usual; this path takes
its lock for the statement. An I/O failure or an interruption in the middle of a statement
leaves the protocol state unknown: the connection is then closed (``conn.closed``; after a
cancellation of the worker's trip, once the server was asked to cancel the statement), and the
worker opens a new one (the pool drops it), as after any lost connection. Errors come out
as ``pgjobs.errors``, translated as everywhere else in ``pgjobs.db``.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Callable, Generator, Mapping
from typing import Any

import psycopg
import psycopg.adapt
import psycopg.errors
from psycopg import pq

from pgjobs import queries
from pgjobs.db.connections import cancel_quietly, socket_ready
from pgjobs.db.dsn import Dsn
from pgjobs.db.rows import loaded_rows
from pgjobs.db.translate import translate_errors

#: A parameter as this path sends it: as text, or NULL.
Param = str | int | float | None

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def positional(statement: str) -> tuple[bytes, tuple[str, ...]]:
    """``statement`` with its ``%(name)s`` placeholders as ``$n`` (a name used twice is one
    parameter), and the names in parameter order."""
    if "%%" in statement:
        raise ValueError("a literal % is not supported here")
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${order.setdefault(match.group(1), len(order) + 1)}"

    text = _PLACEHOLDER.sub(number, statement)
    return text.encode(), tuple(order)


class _Statement:
    """A statement of this path: its name on the server, its text with ``$n``, its parameters'
    names in order."""

    __slots__ = ("name", "order", "text")

    def __init__(self, name: bytes, statement: str) -> None:
        self.name = name
        self.text, self.order = positional(statement)


_PLAIN = _Statement(b"pgjobs_succeed_and_claim", queries.JOB_SUCCEED_AND_CLAIM)
_LIMITED = _Statement(b"pgjobs_succeed_and_claim_limited", queries.JOB_SUCCEED_AND_CLAIM_LIMITED)
_INSERT_READY = _Statement(b"pgjobs_insert_ready", queries.JOB_INSERT_READY)


class _Session:
    """What this path keeps per connection: the statements prepared on it, the loaders."""

    __slots__ = ("prepared", "transformer")

    def __init__(self, conn: Connection) -> None:
        self.prepared: set[bytes] = set()
        self.transformer = psycopg.adapt.Transformer(conn)


#: A connection this path runs statements on.
Connection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

_sessions: weakref.WeakKeyDictionary[Connection, _Session] = weakref.WeakKeyDictionary()


def _session(conn: Connection) -> _Session:
    session = _sessions.get(conn)
    if session is None:
        session = _sessions[conn] = _Session(conn)
    return session


async def succeed_and_claim(
    conn: psycopg.AsyncConnection[Any], params: Mapping[str, Param], *, limited: bool = False
) -> list[tuple[Any, ...]]:
    """Run ``JOB_SUCCEED_AND_CLAIM`` (``JOB_SUCCEED_AND_CLAIM_LIMITED`` with ``limited``) with
    ``params`` (by name) on ``conn``; its rows."""
    statement = _LIMITED if limited else _PLAIN
    values = [_text(params[name]) for name in statement.order]
    session = _session(conn)
    with translate_errors():
        async with conn.lock:
            pgconn = conn.pgconn
            if not _preparing(conn):
                result = await _exchange(conn, _send_unnamed, pgconn, statement.text, values)
            else:
                steps = _prepared(conn, session, statement, _send, pgconn, statement.name, values)
                send, args = next(steps)
                try:
                    while True:
                        send, args = steps.send(await _exchange(conn, send, *args))
                except StopIteration as done:
                    result = done.value
            result = _check(conn, result)
        transformer = session.transformer
        transformer.set_pgresult(result)
        # A value Python cannot hold (a row pgjobs did not write) spoils only its own row.
        return loaded_rows(transformer, result)


def insert_ready(
    conn: psycopg.Connection[Any], params: Mapping[str, Param], *, dsn: Dsn | None = None
) -> int:
    """Run ``JOB_INSERT_READY`` with ``params`` (by name) on ``conn``, an autocommit connection
    that runs nothing else meanwhile and is in no pipeline (the app's pooled connections; a
    caller's connection is not: psycopg would not have begun its transaction); the job's id.
    ``dsn``, where ``conn`` goes, is named in errors (its secrets scrubbed)."""
    statement = _INSERT_READY
    values = [_text(params[name]) for name in statement.order]
    session = _session(conn)
    with translate_errors(dsn):
        with conn.lock:
            pgconn = conn.pgconn
            if not _preparing(conn):
                result = _exchange_sync(pgconn.send_query_params, pgconn, statement.text, values)
            else:
                execute = pgconn.send_query_prepared
                steps = _prepared(conn, session, statement, execute, statement.name, values)
                send, args = next(steps)
                try:
                    while True:
                        send, args = steps.send(_exchange_sync(send, pgconn, *args))
                except StopIteration as done:
                    result = done.value
            result = _check(conn, result)
        job_id = result.get_value(0, 0) if result.ntuples == 1 else None
        if job_id is None:
            raise psycopg.InterfaceError("the insert returned no job id")
        return int(job_id)


#: What ``_prepared`` asks its caller to send: a libpq ``send_*`` call and its arguments.
_Send = tuple[Callable[..., None], tuple[Any, ...]]


def _prepared(
    conn: Connection, session: _Session, statement: _Statement, execute: Callable[..., None],
    *args: Any,
) -> Generator[_Send, pq.abc.PGresult, pq.abc.PGresult]:  # fmt: skip
    """Execute the prepared ``statement`` (``execute(*args)``), preparing it first when this
    connection has not yet; yields what to send, is sent each answer, and returns the
    execution's result (an error too). Sync and async callers drive the same steps.

    ``session.prepared`` is what this path prepared, not what the server still has: the server
    drops every prepared statement of the session, unknown to pgjobs, at a ``DEALLOCATE ALL``
    or ``DISCARD ALL``, and psycopg sends ``DEALLOCATE ALL`` itself after every rollback it
    runs (a refused call in a transaction, a pool rolling back a connection given back in one)
    and after DDL, once it prepared statements of its own on the connection. So when the server
    says the statement does not exist (SQLSTATE 26000), it is prepared again and executed once
    more: the server looks the statement up when it binds it, before anything of it runs, and
    an autocommit connection that the error left in no transaction has nothing of it to roll
    back, so the second execution is the only one that can have run. A statement prepared just
    now and already gone (a transaction-mode pooler moved the connection to another server
    session) is not tried again: the error says so (``translate``)."""
    known = statement.name in session.prepared
    while True:
        if statement.name not in session.prepared:
            _check(conn, (yield conn.pgconn.send_prepare, (statement.name, statement.text)))
            session.prepared.add(statement.name)
        result = yield execute, args
        if not _missing(result):
            return result
        session.prepared.discard(statement.name)  # the next execution prepares it, whatever
        if not known or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return result
        known = False


def _missing(result: pq.abc.PGresult) -> bool:
    """Whether ``result`` says the prepared statement it executed does not exist (SQLSTATE
    26000, invalid_sql_statement_name)."""
    return (
        result.status == pq.ExecStatus.FATAL_ERROR
        and result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
    )


def _preparing(conn: Connection) -> bool:
    """Whether statements may be prepared on ``conn``'s server session: not on a connection
    opened with ``prepare_threshold=None`` (through a transaction-mode pooler, where the next
    transaction may run on a server session that never saw the statement). Those run each
    statement unnamed, parsed again at every execution."""
    return conn.prepare_threshold is not None


def _exchange_sync(send: Callable[..., None], pgconn: pq.abc.PGconn, *args: Any) -> pq.abc.PGresult:
    """``send(*args)`` on ``pgconn``, then the answer, waiting in ``poll``. Failing or
    interrupted in between, the connection is closed."""
    try:
        send(*args)
        answer = _answer(pgconn)
        fd = pgconn.socket
        try:
            while True:
                _wait(fd, write=next(answer) == _WRITE)
        except StopIteration as done:
            result: pq.abc.PGresult = done.value
            return result
    except BaseException:
        pgconn.finish()
        raise


def _wait(fd: int, *, write: bool) -> None:
    """Block until the socket ``fd`` takes more (``write``) or has something to read."""
    socket_ready(fd, write=write)


def _send(pgconn: pq.abc.PGconn, name: bytes, values: list[bytes | None]) -> None:
    """Execute the prepared statement ``name``: parameters as text, rows in binary."""
    pgconn.send_query_prepared(name, values, result_format=pq.Format.BINARY)


def _send_unnamed(pgconn: pq.abc.PGconn, text: bytes, values: list[bytes | None]) -> None:
    """Parse and execute ``text`` as the unnamed statement: parameters as text, rows in
    binary."""
    pgconn.send_query_params(text, values, result_format=pq.Format.BINARY)


def _text(value: Param) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value).encode()
    raise TypeError(f"the libpq path sends text, int, float or None, got {type(value).__name__}")


def _check(conn: Connection, result: pq.abc.PGresult) -> pq.abc.PGresult:
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        raise psycopg.InterfaceError(
            f"unexpected result status: {pq.ExecStatus(result.status).name}"
        )
    return result


async def _exchange(conn: psycopg.AsyncConnection[Any], send: Any, *args: Any) -> pq.abc.PGresult:
    """``send(*args)`` on ``conn``'s libpq connection, then the answer. Failing in between, the
    connection is closed (what the server would still send is unknown); cancelled in between
    (the worker stops), the server is first asked to cancel the statement, as psycopg does."""
    pgconn = conn.pgconn
    try:
        send(*args)
        return await _result(pgconn)
    except BaseException as exc:
        try:
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                await cancel_quietly(conn)
        finally:
            pgconn.finish()
        raise


#: What ``_answer`` waits for: the socket to take more of the statement, or to have input.
_WRITE, _READ = "write", "read"


def _answer(pgconn: pq.abc.PGconn) -> Generator[str, None, pq.abc.PGresult]:
    """Send what libpq buffered, then read the answer; yields ``_WRITE`` or ``_READ`` when
    the socket must be waited for, and returns the last result (the first error, if any)."""
    while pgconn.flush():  # 1: more to send; the socket is full
        yield _WRITE
    error: pq.abc.PGresult | None = None
    last: pq.abc.PGresult | None = None
    while True:
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                if error is not None:
                    return error
                if last is None:
                    raise psycopg.InterfaceError("no result from the server")
                return last
            if result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = result
            last = result
        yield _READ


async def _result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult:
    """``_answer``, waiting for the socket on the running loop."""
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    answer = _answer(pgconn)
    try:
        while True:
            await _ready(loop, fd, write=next(answer) == _WRITE)
    except StopIteration as done:
        result: pq.abc.PGresult = done.value
        return result


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> None:
    waiter = loop.create_future()
    if write:
        loop.add_writer(fd, _wake, waiter)
    else:
        loop.add_reader(fd, _wake, waiter)
    try:
        await waiter
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
