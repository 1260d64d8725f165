"""The errors a transaction-mode pooler pgjobs was not told about makes the server answer (a
prepared statement missing, already there, or another one with other parameters) become
``PoolerMismatch``: a refusal that names the pooler and ``PGJOBS_POOLER=transaction`` and says
nothing was written, never ``DatabaseUnavailable`` ("cannot reach the database", which leaves
the commit unknown)."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from psycopg import pq

from pgjobs.db.dsn import Dsn
from pgjobs.db.pooler import Pooler
from pgjobs.db.translate import is_connection_failure, translated
from pgjobs.errors import DatabaseUnavailable, PoolerMismatch, QueryFailed

URL = "postgresql://app@pgbouncer:6432/app"


def _server_error(state: str, message: str, severity: str = "ERROR") -> psycopg.Error:
    """The error psycopg raises for the server's answer ``message`` (SQLSTATE ``state``)."""
    field = pq.DiagnosticField
    info: dict[int, bytes | None] = {
        field.SQLSTATE: state.encode(),
        field.SEVERITY: severity.encode(),
        field.SEVERITY_NONLOCALIZED: severity.encode(),
        field.MESSAGE_PRIMARY: message.encode(),
    }
    error: psycopg.Error = psycopg.errors.lookup(state)(message, info=info)
    return error


MIXUPS = {
    "missing": ("26000", 'prepared statement "pgjobs_insert_ready" does not exist'),
    "already there": ("42P05", 'prepared statement "_pg3_0" already exists'),
    "another one": (
        "08P01",
        'bind message supplies 9 parameters, but prepared statement "_pg3_0" requires 3',
    ),
}


@pytest.mark.parametrize("kind", list(MIXUPS))
def test_a_prepared_statement_mixup_names_the_pooler_and_says_nothing_was_written(
    kind: str,
) -> None:
    state, message = MIXUPS[kind]
    dsn = Dsn(URL, "--dsn", pooler=Pooler.SESSION)
    error = translated(_server_error(state, message), dsn)
    assert isinstance(error, PoolerMismatch) and isinstance(error, QueryFailed)
    assert not isinstance(error, DatabaseUnavailable)
    text = str(error)
    assert "\n" not in text
    for words in ("pooler in transaction mode", "set PGJOBS_POOLER=transaction", "wrote nothing"):
        assert words in text
    assert message in text and f"SQLSTATE {state}" in text
    assert "cannot reach" not in text and "check the DSN" not in text


def test_in_transaction_mode_the_fix_is_the_callers_own_connection() -> None:
    """pgjobs prepares nothing with PGJOBS_POOLER=transaction: a statement that came prepared
    is one of the caller's, on a connection of its own (``connection=``)."""
    dsn = Dsn(URL, "--dsn", pooler=Pooler.TRANSACTION)
    error = translated(_server_error(*MIXUPS["missing"]), dsn)
    assert isinstance(error, PoolerMismatch)
    assert "prepare_threshold=None" in str(error) and "set PGJOBS_POOLER" not in str(error)


def test_a_protocol_violation_that_ends_the_session_is_still_a_lost_connection() -> None:
    fatal = _server_error("08P01", "invalid frontend message type 0", severity="FATAL")
    assert is_connection_failure(fatal)
    assert isinstance(translated(fatal), DatabaseUnavailable)


def test_a_refused_message_is_not_a_lost_connection() -> None:
    refused = _server_error("08P01", "bind message has 2 parameter formats but 1 parameters")
    assert not is_connection_failure(refused)
    error = translated(refused)
    assert type(error) is QueryFailed and "protocol" in str(error)
