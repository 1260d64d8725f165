"""The app of the fault suite (`pgjobs work --app tests.acceptance.faults_app:app`).

Every handler run inserts one row into ``fault_runs`` (key, attempt, worker pid) before it does
anything else, on a connection of its own (application_name ``fault-handler``, so that tests
terminating pgjobs' connections leave it alone). The suite's invariant over that table: no two
runs of one job share an attempt number, so a job never ran twice under one lease.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import psycopg

import pgjobs

RUNS_DDL = """
DROP TABLE IF EXISTS fault_runs;
CREATE TABLE fault_runs (
    key bigint NOT NULL,
    attempt int NOT NULL,
    worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: Seconds of lease for the tasks below; short so that lost leases are rescued quickly.
LEASE = float(os.environ.get("FAULT_LEASE", "3"))

app = pgjobs.App()
_local = threading.local()


def _record(key: int) -> None:
    job = pgjobs.current_job().job
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(app.dsn.url, autocommit=True, application_name="fault-handler")
        _local.conn = conn
    try:
        conn.execute(
            "INSERT INTO fault_runs (key, attempt, worker_pid) VALUES (%s, %s, %s)",
            [key, job.attempts, os.getpid()],
        )
    except psycopg.OperationalError:
        _local.conn = None
        raise


@app.task(name="fault.work", lease=LEASE, max_attempts=20, retry_base=0.05, retry_cap=0.5)
def work(key: int, sleep: float = 0.0, fail_rate: float = 0.0) -> int:
    """Records the run, sleeps, and fails at random with probability ``fail_rate``."""
    _record(key)
    if sleep:
        time.sleep(random.uniform(0, 2 * sleep))
    if fail_rate and random.random() < fail_rate:
        raise RuntimeError(f"random failure of job {key}")
    return key


@app.task(name="fault.flaky", lease=LEASE, max_attempts=3, retry_base=0.05, retry_cap=0.2)
def flaky(key: int, fail_rate: float = 0.1) -> int:
    """Fails with probability ``fail_rate`` on each attempt; three attempts at most."""
    _record(key)
    if random.random() < fail_rate:
        raise RuntimeError(f"random failure of job {key}")
    return key


@app.task(name="fault.slow", lease=2.0, max_attempts=5)
def slow(key: int, seconds: float, extend: bool) -> int:
    """Slower than its 2 s lease; with ``extend`` it keeps the lease alive while it works."""
    _record(key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if extend:
            pgjobs.current_job().extend_lease(2.0)
    return key


@app.task(name="fault.slow_async", lease=2.0, max_attempts=5)
async def slow_async(key: int, seconds: float) -> int:
    """The async variant of ``slow`` with extension."""
    await asyncio.to_thread(_record, key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        pgjobs.current_job().extend_lease(2.0)
    return key


@app.task(name="fault.once", lease=2.0, at_most_once=True, max_attempts=5)
def once(key: int, seconds: float) -> int:
    """At-most-once: must never run twice, even when its worker dies mid-run."""
    _record(key)
    time.sleep(seconds)
    return key


@app.task(name="fault.exit", lease=2.0, max_attempts=2)
def exit_process(key: int) -> None:
    """Poison: takes its whole worker process down, as a crashing C extension would."""
    _record(key)
    os._exit(3)


@app.task(name="fault.segfault", lease=2.0, max_attempts=2)
def segfault(key: int) -> None:
    """Poison: a real segmentation fault."""
    import ctypes

    _record(key)
    ctypes.string_at(0)


@app.task(name="fault.hang", lease=2.0, max_attempts=2)
def hang(key: int) -> None:
    """Poison: never returns (its thread stays busy until the process exits)."""
    _record(key)
    threading.Event().wait()
