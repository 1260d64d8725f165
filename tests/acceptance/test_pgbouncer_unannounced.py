"""pgjobs behind a transaction-mode PgBouncer it was not told about (no ``PGJOBS_POOLER``): the
server sessions mix up the prepared statements of the clients that share them, and every such
refusal is a ``PoolerMismatch`` that names the pooler and ``PGJOBS_POOLER=transaction`` and
wrote nothing; never ``DatabaseUnavailable`` ("cannot reach the database", which leaves the
commit unknown). A worker there logs the same and buries no job for it.

Debian 12's PgBouncer 1.18 (``tests/support/pgbouncer.py``), which passes prepared statements
through to whichever server session runs the transaction. Without pgbouncer installed these
tests skip, unless $CI is set: then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec
from pgjobs.db.dsn import Dsn
from pgjobs.errors import DatabaseUnavailable, PoolerMismatch
from tests.support import pgbouncer
from tests.support.helpers import Proc, assert_one_home, count, stop, wait_until

pytestmark = pytest.mark.slow


def _require_pgbouncer() -> None:
    if pgbouncer.binary() is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI runs the PgBouncer tests")
        pytest.skip(reason)


def _mismatch(caught: pytest.ExceptionInfo[PoolerMismatch], said: str) -> None:
    assert not isinstance(caught.value, DatabaseUnavailable)
    text = str(caught.value)
    for words in (said, "pooler in transaction mode", "PGJOBS_POOLER=transaction", "wrote nothing"):
        assert words in text, text


def test_each_mixup_of_prepared_statements_is_a_pooler_mismatch(
    server_url: str, dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    """One server session behind PgBouncer, shared by two apps and a client of its own: each
    kind of mixup comes in its turn, in the order a busy pooler produces them at random."""
    _require_pgbouncer()
    with pgbouncer.pgbouncer(server_url, pool_size=1) as bouncer:
        url = bouncer.url(dsn.url)
        first = App(url, pooler="session", check_task_names=False)
        second = App(url, pooler="session", check_task_names=False)
        other = psycopg.connect(url, autocommit=True)
        try:
            ids = first.enqueue_many([JobSpec("t", {}), JobSpec("t", {})])  # psycopg's _pg3_0
            ids.append(first.enqueue("t", {}))  # the libpq path's pgjobs_insert_ready
            # The second app's connection lands on the session the first prepared on.
            with pytest.raises(PoolerMismatch) as caught:
                second.enqueue("t", {})
            _mismatch(caught, 'prepared statement "pgjobs_insert_ready" already exists')
            # Another client drops the session's statements (as psycopg does after any rollback
            # of its own) and prepares its own _pg3_0, with one parameter.
            other.execute("DEALLOCATE ALL")
            other.execute("SELECT %s::int", [1], prepare=True)
            with pytest.raises(PoolerMismatch) as caught:
                first.enqueue_many([JobSpec("t", {}), JobSpec("t", {})])
            _mismatch(caught, 'but prepared statement "_pg3_0" requires 1')
            # The fast path prepares again what the session lost, and goes on.
            ids.append(first.enqueue("t", {}))
            assert count(conn, "queued_jobs") == len(ids) == 4
            assert_one_home(conn, ids)
        finally:
            other.close()
            first.close()
            second.close()


def test_a_worker_there_says_what_to_set_and_buries_nothing_for_it(
    server_url: str,
    dsn: Dsn,
    conn: psycopg.Connection[Any],
    start_worker: Callable[..., Proc],
    subprocess_env: dict[str, str],
    runs: Any,
) -> None:
    _require_pgbouncer()
    with App(dsn.url, check_task_names=False) as app:
        ids = app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(300))
    with pgbouncer.pgbouncer(server_url) as bouncer:
        env = {**subprocess_env, "PGJOBS_DATABASE_URL": bouncer.url(dsn.url)}
        env.pop("PGJOBS_POOLER", None)
        worker = start_worker("-c", "8", env=env)
        wait_until(
            lambda: "PGJOBS_POOLER=transaction" in worker.err(),
            timeout=60,
            what="the worker naming PGJOBS_POOLER=transaction",
            procs=[worker],
        )
        stop([worker], timeout=30)
    err = worker.err()
    assert "cannot reach the database" not in err and "connection lost" not in err, err
    assert "could not be stored" not in err, err
    assert count(conn, "dead_letter") == 0
    assert_one_home(conn, ids)
