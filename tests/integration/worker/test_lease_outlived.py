"""A handler that outlives its lease: its job, rescued and claimed again by the same worker, never
runs beside itself there, and a task's concurrency limit still holds in that worker."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec
from pgjobs.worker import Worker
from tests.support.external import run_worker_while
from tests.support.helpers import assert_one_home, count, scalar, wait_until


class Runs:
    """The handlers running at once, overall and per job, and the most there ever were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: Counter[int] = Counter()
        self.most = 0
        self.most_of_one = 0
        self.started: Counter[int] = Counter()

    def enter(self, n: int) -> None:
        with self.lock:
            self.now[n] += 1
            self.started[n] += 1
            self.most = max(self.most, sum(self.now.values()))
            self.most_of_one = max(self.most_of_one, self.now[n])

    def leave(self, n: int) -> None:
        with self.lock:
            self.now[n] -= 1


def test_a_job_whose_handler_outlives_its_lease_never_runs_beside_itself(
    make_app: Any, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app: App = make_app()
    runs = Runs()
    release = threading.Event()

    @app.task(name="t.long", concurrency=2, lease=1, max_attempts=20)
    def long(n: int) -> None:
        runs.enter(n)
        try:
            release.wait(30)
        finally:
            runs.leave(n)

    ids = app.enqueue_many([JobSpec("t.long", {"n": n}) for n in range(4)])

    def scenario(worker: Worker) -> None:
        # The first two outlive their leases, are rescued and claimed again by this worker.
        wait_until(
            lambda: (
                scalar(
                    conn,
                    "SELECT count(*) FROM queued_jobs WHERE attempts >= 2 "
                    "AND lease_owner IS NOT NULL",
                )
                == 2
            ),
            timeout=30,
            what="both jobs claimed again",
        )
        wait_until(
            lambda: worker.slots.held == 2 or runs.most_of_one > 1,
            timeout=10,
            what="the worker to take the new attempts",
        )
        release.set()
        wait_until(lambda: count(conn, "queued_jobs") == 0, timeout=60, what="all jobs done")

    with caplog.at_level(logging.WARNING, logger="pgjobs.worker"):
        _, code = run_worker_while(
            app, scenario, concurrency=8, maintenance=True, rescue_interval=0.2
        )
    assert code == 0
    assert runs.most_of_one == 1, "a job ran beside itself"
    assert runs.most == 2, "the task's limit held in the worker"
    assert_one_home(conn, ids)
    assert any("outlived its lease" in r.getMessage() for r in caplog.records)
