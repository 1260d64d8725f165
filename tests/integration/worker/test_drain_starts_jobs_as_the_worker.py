"""``drain`` and a worker start a claimed job the same way (``pgjobs.runs``): what only that shared
start does, the task's timeout (an async handler cancelled, a sync one told through
``current_job().cancelled``) and the handler's progress written with the outcome, ends
identically in both. Before they shared it, drain let a handler run past its timeout (the job
succeeded) and never wrote a progress."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import pgjobs
from pgjobs import App
from pgjobs.testing import drain
from pgjobs.worker import Worker
from tests.support.helpers import assert_one_home, scalar, wait_until
from tests.support.stopping import run_worker

#: Seconds a handler would run past its 1 s timeout if nothing stopped it: long enough that a
#: run not stopped shows as a success, cut short once the test is over.
OVERRUN = 30.0


def declare(app: App, over: threading.Event) -> None:
    """Tasks whose end only the shared start decides: two that outlive their timeout, two that
    report progress and return."""

    @app.task(name="slow.async", timeout=1, lease=30, max_attempts=1)
    async def slow_async() -> str:
        end = time.monotonic() + OVERRUN
        while not over.is_set() and time.monotonic() < end:
            await asyncio.sleep(0.02)
        return "ran past its timeout"

    @app.task(name="slow.sync", timeout=1, lease=30, max_attempts=1)
    def slow_sync() -> str:
        end = time.monotonic() + OVERRUN
        while not (pgjobs.current_job().cancelled or over.is_set()) and time.monotonic() < end:
            time.sleep(0.02)
        return "ran past its timeout"

    @app.task(name="steps.async")
    async def steps_async(n: int) -> int:
        for i in range(n):
            pgjobs.current_job().progress(i + 1, n, f"step {i + 1}")
        await asyncio.sleep(0)
        return n

    @app.task(name="steps.sync")
    def steps_sync(n: int) -> int:
        for i in range(n):
            pgjobs.current_job().progress(i + 1, n, f"step {i + 1}")
        return n


def enqueue(app: App) -> dict[int, str]:
    tasks = ("slow.async", "slow.sync", "steps.async", "steps.sync")
    return {app.enqueue(task, {} if task.startswith("slow") else {"n": 3}): task for task in tasks}


def ends(conn: psycopg.Connection[Any], jobs: dict[int, str]) -> dict[str, Any]:
    """How each job ended, by task: its table, and its dead letter's reason, error and error
    type or its archived result and progress (without the time it was reported)."""
    found: dict[str, Any] = {}
    for job_id, task in jobs.items():
        dead = conn.execute(
            "SELECT reason, last_error, error_type FROM dead_letter WHERE id = %s", [job_id]
        ).fetchone()
        if dead is not None:
            found[task] = ("dead_letter", *dead)
            continue
        result, progress = conn.execute(
            "SELECT result, progress FROM archived_jobs WHERE id = %s", [job_id]
        ).fetchone() or (None, None)
        if progress is not None:
            progress = {k: v for k, v in progress.items() if k != "at"}
        found[task] = ("archived_jobs", result, progress)
    return found


def finished(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    return not scalar(conn, "SELECT count(*) FROM queued_jobs WHERE id = ANY(%s)", [ids])


def test_timeouts_and_progress_end_the_same_in_drain_and_in_a_worker(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    over = threading.Event()
    app = make_app()
    declare(app, over)
    try:
        drained = enqueue(app)
        result = drain(app)
        worked = enqueue(app)

        def scenario(_: Worker) -> None:
            wait_until(lambda: finished(conn, list(worked)), timeout=60, what="every job finished")

        run_worker(app, scenario)
    finally:
        over.set()

    timed_out = ("dead_letter", "timeout", "timeout: the handler ran longer than its 1s timeout")
    progress = {"done": 3, "total": 3, "message": "step 3"}
    expected = {
        "slow.async": (*timed_out, "pgjobs.timeout"),
        "slow.sync": (*timed_out, "pgjobs.timeout"),
        "steps.async": ("archived_jobs", 3, progress),
        "steps.sync": ("archived_jobs", 3, progress),
    }
    assert ends(conn, drained) == expected
    assert ends(conn, worked) == ends(conn, drained)
    by_task = {task: job_id for job_id, task in drained.items()}
    assert sorted(result.succeeded) == sorted([by_task["steps.async"], by_task["steps.sync"]])
    assert [d.reason for d in result.dead] == ["timeout", "timeout"]
    assert result.results == {by_task["steps.async"]: 3, by_task["steps.sync"]: 3}
    assert set(assert_one_home(conn, [*drained, *worked]).values()) <= {
        "dead_letter",
        "archived_jobs",
    }
