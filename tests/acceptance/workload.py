"""The app the acceptance tests run with `pgjobs work --app tests.acceptance.workload:app`.

Handlers record every run in the side table ``runs`` (created by the tests with ``RUNS_DDL``):
one ``start`` row when a handler begins and one ``done`` row when it returns, each with the
payload's ``key`` and the worker's pid. A job that ran to completion twice therefore shows two
``done`` rows; a run cut short by kill -9 shows a ``start`` without a ``done``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

import pgjobs

#: The side table; tests drop and recreate it so that every test starts empty.
RUNS_DDL = """
DROP TABLE IF EXISTS runs;
CREATE TABLE runs (
    key bigint NOT NULL,
    phase text NOT NULL CHECK (phase IN ('start', 'done')),
    worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: The most jobs of ``accept.limited`` running at once, across every worker.
LIMITED_CONCURRENCY = 3
#: The rate of ``accept.rated``: a bucket of RATED_JOBS tokens, refilled RATED_JOBS a second.
RATED_JOBS = 20

#: Seconds a job of ``accept.slow_short_lease`` is leased: short, so that the kill -9 test sees
#: the lease run out quickly; longer than the handler's default sleep.
SHORT_LEASE = 4.0

app = pgjobs.App()  # DSN from --dsn, $PGJOBS_DATABASE_URL or the embedded server

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    """The calling handler thread's own connection to the app's database."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # Through a transaction-mode pooler (PGJOBS_POOLER=transaction) a handler's own
        # connection prepares nothing either.
        unprepared = {"prepare_threshold": None} if app.dsn.transaction_pooled else {}
        conn = psycopg.connect(
            app.dsn.url, autocommit=True, application_name="pgjobs-runs", **unprepared
        )
        _local.conn = conn
    return conn


def _record(key: int, phase: str) -> None:
    _conn().execute(
        "INSERT INTO runs (key, phase, worker_pid) VALUES (%s, %s, %s)", [key, phase, os.getpid()]
    )


def _run(key: int, seconds: float = 0.0) -> int:
    """Records the start of one run, takes `seconds`, records its end and returns its key."""
    _record(key, "start")
    if seconds:
        time.sleep(seconds)
    _record(key, "done")
    return key


@app.task(name="accept.record")
def record(key: int) -> int:
    """Quick: records one run and returns its key."""
    return _run(key)


@app.task(name="accept.slow")
def slow(key: int, seconds: float = 2.0) -> int:
    """Slow, with the default (long) lease: for the SIGTERM tests."""
    return _run(key, seconds)


@app.task(name="accept.slow_short_lease", lease=SHORT_LEASE)
def slow_short_lease(key: int, seconds: float = 1.5) -> int:
    """Slow, with a short lease: for the kill -9 test."""
    return _run(key, seconds)


@app.task(name="accept.echo")
def echo(key: int) -> int:
    """Touches no table of its own (the embedded test has no side table)."""
    return key


@app.task(name="accept.limited", concurrency=LIMITED_CONCURRENCY)
def limited(key: int, seconds: float = 0.05) -> int:
    """Slow-ish, at most LIMITED_CONCURRENCY at once across every worker."""
    return _run(key, seconds)


@app.task(name="accept.narrow", queue="narrow")
def narrow(key: int, seconds: float = 0.05) -> int:
    """Slow-ish, in the queue "narrow" (the tests give that queue its limits)."""
    return _run(key, seconds)


@app.task(name="accept.rated", rate=f"{RATED_JOBS}/s")
def rated(key: int) -> int:
    """Quick, at most RATED_JOBS starts a second (after a first bucketful) across every worker."""
    return _run(key)


#: The most jobs of ``accept.grouped`` with the same group running at once, across every worker.
GROUP_CONCURRENCY = 2


@app.task(name="accept.grouped", group_concurrency=GROUP_CONCURRENCY)
def grouped(key: int, seconds: float = 0.05) -> int:
    """Slow-ish, at most GROUP_CONCURRENCY of one group at once across every worker."""
    return _run(key, seconds)


#: The group rate of ``accept.group_rated``: at most GROUP_RATE_JOBS starts of one group in any
#: second, across every worker.
GROUP_RATE_JOBS = 3


@app.task(name="accept.group_rated", group_rate=f"{GROUP_RATE_JOBS}/s")
def group_rated(key: int) -> int:
    """Quick, at most GROUP_RATE_JOBS starts of one group a second across every worker."""
    return _run(key)


@app.task(name="accept.in_order", ordered=True)
def in_order(key: int, seconds: float = 0.02) -> int:
    """One job of a group at a time, in enqueue order."""
    return _run(key, seconds)


@app.task(name="accept.grouped_short_lease", group_concurrency=2, lease=SHORT_LEASE)
def grouped_short_lease(key: int, seconds: float = 1.0) -> int:
    """Slow, with a short lease, two of a group at once: for the kill -9 test of groups."""
    return _run(key, seconds)
