"""Limits in a running worker: a task's concurrency limit holds however many slots the worker
has, the queue's other tasks run past its held-back jobs, a limited job that ends lets the next
one start at once (not at the next poll), a rate paces starts, and a queue limit set while the
worker runs is obeyed from its next claim on. (Several worker processes: tests/acceptance/
test_limits_workers.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, queues
from pgjobs.db.dsn import Dsn
from tests.support.external import run_worker_while
from tests.support.factories import claim_limited, work
from tests.support.helpers import assert_one_home, count, scalar, wait_until


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    yield
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgjobs_queues, pgjobs_limit_states")


class Overlap:
    """Counts the handlers running at once, and the most there ever were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.order: list[str] = []

    def enter(self, what: str) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(what)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def test_a_task_limit_holds_in_a_worker_with_more_slots_and_other_tasks_run_past_it(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    slow_runs = Overlap()
    fast_done: list[float] = []
    slow_done: list[float] = []

    @app.task(name="t.slow", concurrency=2)
    async def slow(n: int) -> None:
        slow_runs.enter("slow")
        try:
            await asyncio.sleep(0.05)
        finally:
            slow_runs.leave()
        slow_done.append(time.monotonic())

    @app.task(name="t.fast")
    def fast(n: int) -> None:
        fast_done.append(time.monotonic())

    ids = app.enqueue_many([JobSpec("t.slow", {"n": n}) for n in range(20)])
    ids += app.enqueue_many([JobSpec("t.fast", {"n": n}) for n in range(30)])

    assert work(app, concurrency=8) == 0

    assert slow_runs.most == 2, "never more than the limit, and the limit was reached"
    assert len(slow_done) == 20 and len(fast_done) == 30
    # The fast jobs, enqueued after all the slow ones, did not wait for them: 20 slow jobs two
    # at a time take ten rounds of 50 ms, and every fast job was done before half of them.
    assert max(fast_done) < sorted(slow_done)[10]
    assert_one_home(conn, ids)
    assert scalar(conn, "SELECT count(*) FROM archived_jobs WHERE status = 'succeeded'") == 50


def test_an_external_tasks_limit_counts_the_jobs_its_downstream_holds(make_app, conn) -> None:
    app: App = make_app()
    app.external_task("t.remote", url="http://127.0.0.1:9/never", concurrency=3)
    app.enqueue_many([JobSpec("t.remote", {"n": n}) for n in range(5)])
    # A job delivered stays running until its report: the claim counts it like a running one.
    jobs, _ = claim_limited(conn, list(app.tasks.values()), limit=10)
    assert len(jobs) == 3
    assert claim_limited(conn, list(app.tasks.values()), limit=10)[0] == []


def test_a_queue_limit_set_while_the_worker_runs_is_obeyed_from_its_next_claim(
    make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    runs = Overlap()
    release = threading.Event()

    @app.task(name="t.wait")
    def wait_for_release(n: int) -> None:
        runs.enter("wait")
        try:
            release.wait(30)
        finally:
            runs.leave()

    def scenario(_: Any) -> None:
        queues.limit(dsn, "default", concurrency=2)
        app.enqueue_many([JobSpec("t.wait", {"n": n}) for n in range(6)])
        wait_until(lambda: runs.now == 2, timeout=10, what="two jobs running")
        time.sleep(0.5)  # more polls: still two, the others ready
        assert runs.now == 2 and runs.most == 2
        assert count(conn, "queued_jobs") == 6
        # Raising the limit wakes the worker (the command NOTIFYs the queue).
        queues.limit(dsn, "default", concurrency=4)
        wait_until(lambda: runs.now == 4, timeout=10, what="four jobs running")
        release.set()
        wait_until(lambda: count(conn, "archived_jobs") == 6, timeout=10, what="all done")

    _, code = run_worker_while(app, scenario, concurrency=8, poll_interval=0.1)
    assert code == 0
    assert runs.most == 4


def test_a_rate_paces_the_starts_of_a_task_in_a_worker(make_app: Any, conn: Any) -> None:
    app: App = make_app()
    starts: list[float] = []

    @app.task(name="t.paced", rate="10/s")
    def paced(n: int) -> None:
        starts.append(time.monotonic())

    app.enqueue_many([JobSpec("t.paced", {"n": n}) for n in range(25)])
    assert work(app, concurrency=8) == 0
    assert len(starts) == 25
    # A bucket of 10 tokens refilling 10 a second: in any stretch of t seconds at most
    # 10 + 10 t starts (plus one for the clocks' rounding).
    starts.sort()
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 10 + 10 * (starts[j] - first) + 1, (i, j, starts)
    # 25 starts need at least 1.5 s (10 at once, then 15 at 10 a second).
    assert starts[-1] - starts[0] >= 1.4
