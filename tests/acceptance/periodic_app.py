"""The app of the periodic acceptance test: `pgjobs work --app tests.acceptance.periodic_app:app`.

One schedule every second (six-field cron); each run records its job id, scheduled instant and
worker pid in the side table ``ticks`` (created by the test with ``TICKS_DDL``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

import pgjobs

TICKS_DDL = """
DROP TABLE IF EXISTS ticks;
CREATE TABLE ticks (
    job_id bigint NOT NULL,
    run_at timestamptz NOT NULL,
    worker_pid int NOT NULL,
    source text NOT NULL
)
"""

app = pgjobs.App()  # DSN from --dsn, $PGJOBS_DATABASE_URL or the embedded server

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # Through a transaction-mode pooler (PGJOBS_POOLER=transaction) a handler's own
        # connection prepares nothing either.
        unprepared = {"prepare_threshold": None} if app.dsn.transaction_pooled else {}
        conn = psycopg.connect(
            app.dsn.url, autocommit=True, application_name="pgjobs-ticks", **unprepared
        )
        _local.conn = conn
    return conn


@app.periodic("* * * * * *", name="accept.every-second", payload={"source": "cron"})
@app.task(name="accept.tick")
def tick(source: str) -> None:
    job = pgjobs.current_job().job
    _conn().execute(
        "INSERT INTO ticks (job_id, run_at, worker_pid, source) VALUES (%s, %s, %s, %s)",
        [job.id, job.run_at, os.getpid(), source],
    )
