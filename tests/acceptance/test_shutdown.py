"""SIGTERM while every slot is busy: running handlers finish within the grace period and the
worker exits 0; past the grace period, unfinished jobs go back to the queue at once."""

from __future__ import annotations

import signal
import time

import pytest

from pgjobs import JobSpec
from tests.acceptance.conftest import wait_busy
from tests.support.helpers import count, scalar

CONCURRENCY = 4


@pytest.mark.slow
def test_sigterm_lets_running_jobs_finish(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    jobs = 2 * CONCURRENCY
    ids = app.enqueue_many(JobSpec("accept.slow", {"key": n, "seconds": 2.0}) for n in range(jobs))
    worker = start_worker("--concurrency", str(CONCURRENCY))

    wait_busy(conn, worker, [worker.pid], CONCURRENCY)
    in_flight = {
        row[0] for row in conn.execute("SELECT id FROM queued_jobs WHERE lease_owner IS NOT NULL")
    }
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(20) == 0, worker.describe()

    # The in-flight jobs finished and were archived, each after exactly one run.
    archived = conn.execute("SELECT id, status, attempts FROM archived_jobs").fetchall()
    assert {row[0] for row in archived} == in_flight
    assert {(row[1], row[2]) for row in archived} == {("succeeded", 1)}
    done = conn.execute(
        "SELECT key, count(*) FROM runs WHERE phase = 'done' GROUP BY key"
    ).fetchall()
    assert len(done) == CONCURRENCY and {n for _, n in done} == {1}, done

    # Nothing left leased; the jobs never claimed are ready, with no attempt used.
    rest = conn.execute(
        "SELECT id, lease_owner, lease_expires_at, attempts FROM queued_jobs"
    ).fetchall()
    assert {row[0] for row in rest} == set(ids) - in_flight
    assert {row[1:] for row in rest} == {(None, None, 0)}
    assert count(conn, "dead_letter") == 0


@pytest.mark.slow
def test_sigterm_past_grace_gives_jobs_back_at_once(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    handler_seconds = 8.0  # far longer than the grace period
    ids = app.enqueue_many(
        JobSpec("accept.slow", {"key": n, "seconds": handler_seconds}) for n in range(CONCURRENCY)
    )
    worker = start_worker("--concurrency", str(CONCURRENCY), "--grace", "0.5")

    wait_busy(conn, worker, [worker.pid], CONCURRENCY)
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    # Bounded well below the handlers' run time: the worker must not wait for them.
    assert worker.wait_exit(handler_seconds - 2) == 0, worker.describe()
    assert time.monotonic() - signalled < handler_seconds

    # Given back at once, not left to the lease (the task's lease is the default 300 s): ready to
    # be claimed again, the attempt used up, and no handler finished.
    rows = conn.execute(
        "SELECT id, lease_owner, lease_expires_at, attempts, run_at <= now() FROM queued_jobs"
    ).fetchall()
    assert {row[0] for row in rows} == set(ids)
    assert {row[1:] for row in rows} == {(None, None, 1, True)}, rows
    assert scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done'") == 0
    assert count(conn, "archived_jobs") == 0
    assert count(conn, "dead_letter") == 0
    assert "gave back 4 running job(s)" in worker.err()
