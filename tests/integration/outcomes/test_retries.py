"""Failing handlers: retries with backoff, then dead_letter; non-retryable errors go at once."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import psycopg

from pgjobs import App, NonRetryableError
from tests.support.factories import db_now, row, work
from tests.support.helpers import assert_one_home


def _own_row(dsn, job_id: int) -> dict[str, Any]:
    """The job's queued row, read by the handler while it runs (its own connection)."""
    with psycopg.connect(dsn.url, autocommit=True) as own:
        found = own.execute(
            "SELECT attempts, last_error, run_at, lease_owner FROM queued_jobs WHERE id = %s",
            [job_id],
        ).fetchone()
    assert found is not None
    return dict(zip(["attempts", "last_error", "run_at", "lease_owner"], found, strict=True))


def test_failure_schedules_a_retry_with_backoff_and_records_the_error(make_app, dsn, conn):
    app: App = make_app()
    calls = []

    # A delay of 1000s for the first retry: the job is still scheduled when the worker stops.
    @app.task(name="t.flaky", max_attempts=3, retry_base=1000, retry_cap=5000)
    def flaky() -> None:
        calls.append(1)
        # Stop the worker like `kill -TERM` would; it flushes this attempt's outcome first.
        os.kill(os.getpid(), signal.SIGTERM)
        raise ValueError("db timeout")

    job_id = app.enqueue("t.flaky", {})
    assert work(app, burst=False) == 0

    assert calls == [1]
    retried = row(conn, "queued_jobs", job_id)
    assert retried is not None
    assert retried["attempts"] == 1
    assert retried["last_error"] == "ValueError: db timeout"
    assert retried["lease_owner"] is None and retried["lease_expires_at"] is None
    # Equal jitter: the first retry waits between base/2 and base (500..1000s).
    wait = retried["run_at"] - db_now(conn)
    assert timedelta(seconds=400) < wait <= timedelta(seconds=1000)
    assert_one_home(conn, [job_id])


def test_retries_then_dead_letter_when_attempts_are_exhausted(make_app, dsn, conn):
    app: App = make_app()
    seen: list[dict[str, Any]] = []
    job_ids: list[int] = []

    @app.task(name="t.broken", max_attempts=3, retry_base=0.05, retry_cap=0.08)
    def broken(order: int) -> None:
        state = _own_row(dsn, job_ids[0])
        seen.append(state)
        raise ValueError(f"boom {state['attempts']}")

    job_ids.append(app.enqueue("t.broken", {"order": 7}))
    assert work(app, concurrency=2) == 0

    assert [s["attempts"] for s in seen] == [1, 2, 3]
    assert [s["last_error"] for s in seen] == [None, "ValueError: boom 1", "ValueError: boom 2"]
    assert all(s["lease_owner"] for s in seen)
    # Each retry was pushed at least half its nominal delay past the previous run_at.
    assert seen[1]["run_at"] - seen[0]["run_at"] >= timedelta(seconds=0.025)
    assert seen[2]["run_at"] - seen[1]["run_at"] >= timedelta(seconds=0.04)

    assert assert_one_home(conn, job_ids) == {job_ids[0]: "dead_letter"}
    dead = row(conn, "dead_letter", job_ids[0])
    assert dead is not None
    assert dead["reason"] == "exhausted"
    assert dead["attempts"] == dead["max_attempts"] == 3
    assert dead["error_type"] == "builtins.ValueError"
    assert dead["last_error"] == "ValueError: boom 3"
    assert dead["traceback"].startswith("Traceback (most recent call last)")
    assert "in broken" in dead["traceback"]
    assert dead["traceback"].rstrip().endswith("ValueError: boom 3")
    assert dead["payload"] == {"order": 7}
    assert dead["worker"]
    assert dead["failed_at"] >= dead["created_at"]


def test_non_retryable_error_goes_straight_to_dead_letter(make_app, conn):
    app: App = make_app()
    calls = []

    @app.task(name="t.charge", max_attempts=5, retry_base=0.01)
    def charge(order_id: int) -> None:
        calls.append(order_id)
        raise NonRetryableError(f"order {order_id} does not exist")

    job_id = app.enqueue("t.charge", {"order_id": 42})
    assert work(app) == 0

    assert calls == [42]
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "non_retryable"
    assert dead["attempts"] == 1 and dead["max_attempts"] == 5
    assert dead["error_type"] == "pgjobs.errors.NonRetryableError"
    assert dead["last_error"] == "NonRetryableError: order 42 does not exist"
    assert "order 42 does not exist" in dead["traceback"]


def test_async_handler_failure_is_retried_then_succeeds(make_app, conn):
    app: App = make_app()
    calls = []

    @app.task(name="t.async_flaky", max_attempts=3, retry_base=0.01, retry_cap=0.02)
    async def async_flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("upstream reset")
        return "ok"

    job_id = app.enqueue("t.async_flaky", {})
    assert work(app) == 0

    assert len(calls) == 2
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["status"], archived["attempts"], archived["result"]) == ("succeeded", 2, "ok")
    assert archived["last_error"] == "ConnectionError: upstream reset"
    assert_one_home(conn, [job_id])


def test_many_sync_handlers_finishing_together_each_get_their_own_outcome(make_app, conn):
    """Sync handlers report from the pool threads in batches; none may be lost or mixed up,
    including a handler that raises a BaseException (SystemExit) rather than an Exception."""
    app: App = make_app()

    @app.task(name="t.sync_mix", max_attempts=1)
    def sync_mix(n: int) -> int:
        if n % 10 == 3:
            raise SystemExit(n)
        if n % 10 == 7:
            raise ValueError(f"bad {n}")
        return n * 2

    ids = [app.enqueue("t.sync_mix", {"n": n}) for n in range(200)]
    assert work(app, concurrency=16) == 0

    where = assert_one_home(conn, ids)
    for n, job_id in enumerate(ids):
        if n % 10 in (3, 7):
            assert where[job_id] == "dead_letter"
            dead = row(conn, "dead_letter", job_id)
            assert dead is not None
            expected = f"SystemExit: {n}" if n % 10 == 3 else f"ValueError: bad {n}"
            assert dead["last_error"] == expected
        else:
            assert where[job_id] == "archived_jobs"
            assert row(conn, "archived_jobs", job_id)["result"] == n * 2  # type: ignore[index]
