"""The app of the batch acceptance tests (`pgjobs work --app tests.acceptance.batch_app:app`):
quick members, some of which fail for good, members with a short lease for the kill -9 test, and
a callback that records each of its runs in the side table ``callback_runs`` (``CALLBACK_DDL``)."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

import pgjobs
from tests.acceptance.workload import SHORT_LEASE

CALLBACK_DDL = """
DROP TABLE IF EXISTS callback_runs;
CREATE TABLE callback_runs (
    batch_id bigint NOT NULL,
    total int NOT NULL,
    succeeded int NOT NULL,
    dead int NOT NULL,
    cancelled int NOT NULL,
    worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: Every FAIL_EVERY-th member (by key) fails for good: it ends in dead_letter.
FAIL_EVERY = 10

app = pgjobs.App()  # DSN from --dsn or $PGJOBS_DATABASE_URL


@app.task(name="batch.member")
def member(key: int) -> int:
    """Quick; fails for good when ``key`` is a multiple of FAIL_EVERY."""
    if key % FAIL_EVERY == 0:
        raise pgjobs.NonRetryableError(f"member {key} fails for good")
    return key


@app.task(name="batch.slow_member", lease=SHORT_LEASE)
def slow_member(key: int, seconds: float = 0.5) -> int:
    """Slow, with a short lease: a killed worker's members run again once it runs out."""
    time.sleep(seconds)
    return int(member(key))


@app.task(name="batch.summarise", queue="summaries")
def summarise(batch: dict[str, Any]) -> None:
    """Records this run of the callback and the counts it was given."""
    with psycopg.connect(app.dsn.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO callback_runs (batch_id, total, succeeded, dead, cancelled, worker_pid) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [
                batch["id"],
                batch["total"],
                batch["succeeded"],
                batch["dead"],
                batch["cancelled"],
                os.getpid(),
            ],
        )
