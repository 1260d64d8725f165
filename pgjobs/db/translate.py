"""The edge where driver errors become ``pgjobs.errors``: by SQLSTATE, a lost or refused
connection is ``DatabaseUnavailable``, a prepared statement missing, already there or another
one (a transaction-mode pooler pgjobs was not told about) ``PoolerMismatch``, anything else the
server refused a ``QueryFailed`` that names what happened. Nothing outside ``pgjobs.db`` catches
``psycopg.Error``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import psycopg

from pgjobs.db.dsn import Dsn, scrub
from pgjobs.errors import (
    DatabaseUnavailable,
    LockTimeout,
    PgjobsError,
    PoolerMismatch,
    QueryFailed,
    SchemaMissing,
)

MIGRATE_HINT = "run `pgjobs migrate`"


@contextlib.contextmanager
def translate_errors(dsn: Dsn | None = None, *, connecting: bool = False) -> Iterator[None]:
    """Turn psycopg errors raised inside the block into ``pgjobs.errors``, by SQLSTATE: only a
    lost or refused connection is ``DatabaseUnavailable`` (the statement may be sent again
    later); anything else the server refused is a ``QueryFailed`` that names what happened.
    ``connecting``: the block opens a connection, so any refusal means it cannot be used."""
    try:
        yield
    except Exception as exc:
        original = _driver_error(exc) or exc
        if isinstance(original, psycopg.Error):
            raise translated(original, dsn, connecting=connecting) from exc
        raise


def translated(
    exc: psycopg.Error, dsn: Dsn | None = None, *, connecting: bool = False
) -> PgjobsError:
    """The ``pgjobs.errors`` counterpart of the driver error ``exc``."""
    state = exc.sqlstate or ""
    reason = scrub(_reason(exc), dsn.url if dsn else None)
    if state == "42P01":
        return SchemaMissing(f"the pgjobs tables are missing: {MIGRATE_HINT}")
    if state == "42703":
        return SchemaMissing(f"the pgjobs schema is out of date: {MIGRATE_HINT}")
    if state == "55P03":
        return LockTimeout(f"gave up waiting for a lock (lock_timeout): {reason}")
    if _prepared_mixup(exc):
        return PoolerMismatch(_mixup_message(state, reason, dsn))
    if connecting or is_connection_failure(exc):
        if state in _SERVER_CLOSED or _closed_by_server(exc):
            return DatabaseUnavailable(f"the connection was closed by the server: {reason}")
        if isinstance(exc, psycopg.InterfaceError):  # e.g. the connection was closed under us
            return DatabaseUnavailable(f"database connection unusable: {reason}")
        where = f" {dsn.redacted} ({dsn.source})" if dsn else ""
        return DatabaseUnavailable(
            f"cannot reach the database{where}: {reason}; check the DSN and that PostgreSQL is up"
        )
    what = _REFUSALS.get(state) or _REFUSALS.get(state[:2], "PostgreSQL refused a statement")
    return QueryFailed(f"{what} (SQLSTATE {state or 'unknown'}): {reason}")


#: SQLSTATEs of a server that ended the session: admin shutdown, crash shutdown, starting up.
_SERVER_CLOSED = frozenset({"57P01", "57P02", "57P03"})

#: What a refusal that is not about the connection means, by SQLSTATE or its two-letter class.
_REFUSALS = {
    "22": "PostgreSQL refused a value (data exception)",
    "23": "PostgreSQL refused a row (integrity constraint violation)",
    "54": "a value is too large for PostgreSQL (program limit exceeded)",
    "42501": "permission denied: the database role lacks a privilege",
    "42": "PostgreSQL refused the statement (syntax error or access rule violation)",
    "40001": "serialization failure: the transaction conflicted with a concurrent one; try again",
    "40P01": "deadlock detected: the transaction was cancelled; try again",
    "40": "the transaction was rolled back",
    "57014": "the statement was cancelled (statement_timeout or a cancel request)",
    "25": "the statement is not allowed in this transaction state",
    "08P01": "PostgreSQL refused a message of the protocol",
}

#: SQLSTATEs of a prepared statement the server session does not have (26000,
#: invalid_sql_statement_name) or has already (42P05, duplicate_prepared_statement).
_PREPARED_STATES = frozenset({"26000", "42P05"})


def _prepared_mixup(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says a prepared statement is missing, already there, or another one
    (``bind message supplies 9 parameters, but prepared statement "_pg3_0" requires 3``, a
    protocol violation the server refuses without ending the session). Statements are prepared
    once per connection (the libpq path's, psycopg's), so this happens when consecutive
    statements of one connection run on different server sessions."""
    state = exc.sqlstate
    if state in _PREPARED_STATES:
        return True
    return state == "08P01" and _refused_only(exc) and "prepared statement" in str(exc)


def _mixup_message(state: str, reason: str, dsn: Dsn | None) -> str:
    if dsn is not None and dsn.transaction_pooled:  # pgjobs prepares nothing in this mode
        fix = (
            "PGJOBS_POOLER=transaction is set, so the statement came prepared on a connection "
            "of yours: connect it with prepare_threshold=None"
        )
    else:
        fix = (
            'set PGJOBS_POOLER=transaction (or App(pooler="transaction"), --pooler '
            "transaction; `pgjobs doctor` checks)"
        )
    return (
        "the connection's server session changed between two statements, as behind a pooler "
        f"in transaction mode (PgBouncer's pool_mode = transaction): {fix}; the statement was "
        f"refused before it ran and wrote nothing (SQLSTATE {state}: {reason})"
    )


def _refused_only(exc: psycopg.Error) -> bool:
    """Whether the server reported ``exc`` at severity ERROR: it refused one statement or
    message and the session goes on (a FATAL one ends the session)."""
    severity = exc.diag.severity_nonlocalized or exc.diag.severity
    return severity == "ERROR"


def is_connection_failure(exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the connection is gone or could not be made (SQLSTATE class 08,
    57P01-57P03, or a libpq failure without SQLSTATE), or the server is out of resources
    (class 53: disk, memory, connections), which passes: the statement may be sent again. Not
    a protocol violation the server refused at severity ERROR (08P01: ``bind message supplies
    2 parameters, but prepared statement "x" requires 3``): the session goes on, and the
    statement did not run."""
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    if state == "08P01" and _refused_only(exc):
        return False
    return state.startswith(("08", "53")) or state in _SERVER_CLOSED


def _closed_by_server(exc: psycopg.Error) -> bool:
    """libpq's words for a session the server ended (pg_terminate_backend, a restart)."""
    text = str(exc)
    return "server closed the connection unexpectedly" in text or "terminating connection" in text


def _reason(exc: psycopg.Error) -> str:
    """The driver's message as one line, to be shown."""
    return _one_line(str(exc))


def _driver_error(exc: Exception) -> psycopg.Error | None:
    """The psycopg error SQLAlchemy wrapped in ``exc``, to be judged as the original. SQLAlchemy
    is imported only where it is used (migrations): when it is not loaded, it raised nothing."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_exc is None or not isinstance(exc, sqlalchemy_exc.DBAPIError):
        return None
    return exc.orig if isinstance(exc.orig, psycopg.Error) else None


def _one_line(message: str) -> str:
    return " ".join(message.split())
