"""The app of the dependency acceptance tests (`pgjobs work --app
tests.acceptance.dependency_app:app`).

Each handler records its run in the side table ``dep_runs`` (``DEP_RUNS_DDL``): a ``start`` row
when it begins, with how many jobs it depends on (``pgjobs_dependencies``) and how many of those
had succeeded (in ``archived_jobs``) at that moment, and a ``done`` row when it returns.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

import pgjobs

DEP_RUNS_DDL = """
DROP TABLE IF EXISTS dep_runs;
CREATE TABLE dep_runs (
    job_id bigint NOT NULL,
    phase text NOT NULL CHECK (phase IN ('start', 'done')),
    deps int,
    met int,
    worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: Seconds a job of ``dep.part`` is leased: short, so that a killed worker's parts are run again
#: soon.
PART_LEASE = 4.0
#: A part ends at the next multiple of this many seconds of the wall clock: parts running on
#: different workers end at the same instant, and so do the dependencies of one join.
TICK = 0.05

app = pgjobs.App()

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(app.dsn.url, autocommit=True, application_name="pgjobs-dep-runs")
        _local.conn = conn
    return conn


def _record(phase: str) -> None:
    job_id = pgjobs.current_job().job.id
    _conn().execute(
        """
        INSERT INTO dep_runs (job_id, phase, deps, met, worker_pid)
        SELECT %(id)s, %(phase)s, count(*),
               count(*) FILTER (WHERE EXISTS (
                   SELECT 1 FROM archived_jobs a
                   WHERE a.id = d.depends_on AND a.status = 'succeeded')),
               %(pid)s
        FROM pgjobs_dependencies d WHERE d.job_id = %(id)s
        """,
        {"id": job_id, "phase": phase, "pid": os.getpid()},
    )


@app.task(name="dep.part", queue="dep_parts", lease=PART_LEASE)
def part() -> None:
    """A dependency: ends at the next tick of the wall clock (at least a tick from now)."""
    _record("start")
    time.sleep(TICK + TICK - time.time() % TICK)
    _record("done")


@app.task(name="dep.join", queue="dep_joins")
def join() -> None:
    """A dependent: quick."""
    _record("start")
    _record("done")
