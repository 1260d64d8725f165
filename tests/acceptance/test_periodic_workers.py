"""Three `pgjobs work` processes run the scheduler of a schedule that fires every second: each
occurrence is enqueued exactly once (one job per scheduled instant, its key naming the instant)
and runs exactly once."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import psycopg
import pytest

from tests.acceptance.periodic_app import TICKS_DDL
from tests.support.helpers import Proc, scalar, stop, wait_until

APP = "tests.acceptance.periodic_app:app"
WORKERS = 3
OCCURRENCES = 6


@pytest.fixture(autouse=True)
def no_schedules(conn: psycopg.Connection[Any]) -> Any:
    conn.execute("TRUNCATE pgjobs_schedules")
    yield
    conn.execute("TRUNCATE pgjobs_schedules")


def test_three_workers_enqueue_and_run_each_occurrence_once(
    conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    conn.execute(TICKS_DDL)
    workers = [spawn("work", "--app", APP, "--poll-interval", "0.2") for _ in range(WORKERS)]

    def ran() -> int:
        return int(scalar(conn, "SELECT count(*) FROM ticks"))

    wait_until(
        lambda: ran() >= OCCURRENCES,
        timeout=60,
        what=lambda: f"{OCCURRENCES} occurrences run (now {ran()})",
        procs=workers,
    )
    assert stop(workers, timeout=30) == [0] * WORKERS, [w.describe() for w in workers]

    # Every job the schedule enqueued, wherever it is now.
    jobs = conn.execute(
        """
        SELECT id, run_at, idempotency_key FROM queued_jobs WHERE task = 'accept.tick'
        UNION ALL SELECT id, run_at, idempotency_key FROM archived_jobs WHERE task = 'accept.tick'
        UNION ALL SELECT id, run_at, idempotency_key FROM dead_letter WHERE task = 'accept.tick'
        ORDER BY run_at
        """
    ).fetchall()
    instants = [run_at for _, run_at, _ in jobs]
    assert len(instants) >= OCCURRENCES
    assert len(set(instants)) == len(instants), "an occurrence was enqueued twice"
    assert all(t.microsecond == 0 for t in instants)
    assert [key for _, _, key in jobs] == [
        f"periodic:accept.every-second:{t.astimezone(UTC).isoformat()}" for t in instants
    ]
    # None lost while the workers ran: one per second from the first to the last.
    gaps = [b - a for a, b in itertools.pairwise(instants)]
    assert gaps == [timedelta(seconds=1)] * len(gaps)

    # Each run once: the side table has one row per job that ran, none twice.
    ticks = conn.execute("SELECT job_id, run_at, source FROM ticks ORDER BY run_at").fetchall()
    assert len({job_id for job_id, _, _ in ticks}) == len(ticks)
    by_id = {job_id: run_at for job_id, run_at, _ in jobs}
    assert all(by_id[job_id] == run_at for job_id, run_at, _ in ticks)
    assert {source for _, _, source in ticks} == {"cron"}
    archived = scalar(conn, "SELECT count(*) FROM archived_jobs WHERE task = 'accept.tick'")
    assert archived == len(ticks)

    row = conn.execute(
        "SELECT last_run_at, next_run_at FROM pgjobs_schedules WHERE name = 'accept.every-second'"
    ).fetchone()
    assert row is not None and row[0] == instants[-1] and row[1] > row[0]
