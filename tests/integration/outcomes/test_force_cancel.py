"""`pgjobs cancel --force` on a running job reaches the worker that runs it (a NOTIFY on the
channel every worker listens to) and stops the handler: an async one is cancelled, a sync one
sees ``current_job().cancelled``. The cancel archives the job; the worker logs the cancel (not
a lost lease) and settles nothing for it. Bounds are generous: nothing here measures speed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import App, admin
from pgjobs.models import ArchivedStatus, JobStatus
from pgjobs.worker import Worker
from tests.support.factories import claim_limited, row
from tests.support.helpers import assert_one_home, run, scalar, wait_until
from tests.support.stopping import OVER, block_until, run_worker, sleep_until_over

CANCEL_LINE = "cancelled (by pgjobs cancel --force)"


def problems_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Lines that would tell an operator something went wrong."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
        or "lease was lost" in r.getMessage()
        or "not applied" in r.getMessage()
        or "lease extension refused" in r.getMessage()
    ]


def running_here(conn: psycopg.Connection[Any], job_id: int) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM queued_jobs WHERE id = %s AND lease_owner IS NOT NULL",
            [job_id],
        )
    )


def test_force_cancel_of_a_running_async_job_cancels_its_handler(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    started = threading.Event()
    cancelled_at: list[float] = []
    after_cancel: list[str] = []

    @app.task(name="long", lease=60)
    async def long() -> str:
        started.set()
        try:
            await sleep_until_over(120)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            after_cancel.append(f"cancelled={pgjobs.current_job().cancelled}")
            raise
        return "finished"  # never: the cancel stops it

    job_id = app.enqueue("long", {})
    asked: list[float] = []

    def scenario(worker: Worker) -> None:
        wait_until(started.is_set, timeout=30, what="the handler to start")
        wait_until(lambda: running_here(conn, job_id), timeout=10, what="the lease")
        asked.append(time.monotonic())
        assert app.cancel(job_id, force=True).status is JobStatus.CANCELLED
        wait_until(lambda: cancelled_at, timeout=10, what="the handler to be cancelled")
        wait_until(lambda: not worker.slots.busy, timeout=10, what="its slot to be free")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)

    assert cancelled_at[0] - asked[0] < 5  # a bound, not a measurement: no polling per job
    assert after_cancel == ["cancelled=True"]
    lines = [r.getMessage() for r in caplog.records if CANCEL_LINE in r.getMessage()]
    assert lines and lines[0].startswith(f"job {job_id} (long): {CANCEL_LINE}"), lines
    assert problems_logged(caplog) == []
    cancelled = row(conn, "archived_jobs", job_id)
    assert cancelled is not None and cancelled["status"] == ArchivedStatus.CANCELLED
    assert cancelled["result"] is None
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_force_cancel_of_a_running_sync_job_sets_its_cancelled_flag(
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    dsn: Any,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = make_app()
    started = threading.Event()
    noticed_after: list[float] = []

    @app.task(name="crunch", lease=60)
    def crunch() -> str:
        started.set()
        began = time.monotonic()
        while time.monotonic() - began < 120 and not OVER.is_set():
            if pgjobs.current_job().cancelled:
                noticed_after.append(time.monotonic())
                return "stopped early"  # discarded: the cancel archived the job
            time.sleep(0.02)
        return "finished"

    job_id = app.enqueue("crunch", {})
    asked: list[float] = []
    said: list[str] = []

    def scenario(worker: Worker) -> None:
        wait_until(started.is_set, timeout=30, what="the handler to start")
        wait_until(lambda: running_here(conn, job_id), timeout=10, what="the lease")
        asked.append(time.monotonic())
        code, out, err = run(capsys, "cancel", str(job_id), "--force", "--dsn", dsn.url)
        assert (code, err) == (0, "")
        said.append(out)
        wait_until(lambda: noticed_after, timeout=10, what="the handler to see the flag")
        wait_until(lambda: not worker.slots.busy, timeout=10, what="its slot to be free")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)

    assert noticed_after[0] - asked[0] < 5
    assert "its handler was asked to stop" in said[0]
    assert any(CANCEL_LINE in r.getMessage() for r in caplog.records)
    assert problems_logged(caplog) == []
    cancelled = row(conn, "archived_jobs", job_id)
    assert cancelled is not None
    assert (cancelled["status"], cancelled["result"]) == (ArchivedStatus.CANCELLED, None)
    assert admin.job(dsn, job_id).status is JobStatus.CANCELLED
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_a_force_cancelled_sync_handler_that_ignores_the_flag_is_given_up_at_its_timeout(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    started = threading.Event()
    release = threading.Event()

    @app.task(name="deaf", lease=60, timeout=2)
    def deaf() -> None:
        started.set()
        block_until(release, 60)

    job_id = app.enqueue("deaf", {})

    def scenario(worker: Worker) -> None:
        wait_until(started.is_set, timeout=30, what="the handler to start")
        wait_until(lambda: running_here(conn, job_id), timeout=10, what="the lease")
        app.cancel(job_id, force=True)
        wait_until(lambda: not worker.slots.busy, timeout=20, what="its slot to be given back")
        assert not release.is_set()  # given up while the thread still waits
        release.set()
        wait_until(lambda: worker.slots.stray_threads() == 0, timeout=20, what="its thread to end")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)

    # The cancel's record stands: the timeout records no failure for a cancelled job.
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    assert row(conn, "archived_jobs", job_id)["status"] == ArchivedStatus.CANCELLED  # type: ignore[index]
    assert not any("timed out" in r.getMessage() for r in caplog.records)
    assert problems_logged(caplog) == []


def test_a_cancel_notice_for_another_attempt_or_job_stops_nothing(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    started = threading.Event()
    release = threading.Event()
    seen: list[bool] = []

    @app.task(name="steady", lease=60)
    def steady() -> str:
        started.set()
        block_until(release, 60)
        seen.append(pgjobs.current_job().cancelled)
        return "done"

    job_id = app.enqueue("steady", {})

    def scenario(worker: Worker) -> None:
        wait_until(started.is_set, timeout=30, what="the handler to start")
        # A stale attempt, another job, a queue-like payload: none of them is this run.
        for notice in (f"cancel\t{job_id}\t7", f"cancel\t{job_id + 1}\t1", f"cancel:{job_id}:1"):
            conn.execute("SELECT pg_notify('pgjobs', %s)", [notice])
        time.sleep(1)  # a chance for a wrong notice to act; the assertions do not depend on it
        release.set()
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM archived_jobs WHERE id = %s", [job_id]),
            timeout=20,
            what="the job archived",
        )

    run_worker(app, scenario)
    assert seen == [False]
    assert row(conn, "archived_jobs", job_id)["status"] == ArchivedStatus.SUCCEEDED  # type: ignore[index]


@pytest.mark.parametrize("limit", [{"ordered": True}, {"group_concurrency": 1}], ids=str)
def test_a_force_cancelled_sync_handler_keeps_its_groups_place_until_it_ends(
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
    limit: dict[str, Any],
) -> None:
    app = make_app()
    saw_cancel = threading.Event()
    release = threading.Event()
    ran: list[int] = []

    @app.task(name="tenant.step", lease=60, **limit)
    def step(n: int) -> None:
        ran.append(n)
        if n == 0:
            # Told it was cancelled, and running on regardless (as a sync handler may).
            while not pgjobs.current_job().cancelled and not OVER.is_set():
                time.sleep(0.02)
            saw_cancel.set()
            block_until(release, 60)

    first, second = (app.enqueue("tenant.step", {"n": n}, group="tenant-1") for n in range(2))

    def scenario(worker: Worker) -> None:
        wait_until(lambda: running_here(conn, first), timeout=30, what="the first job to run")
        app.cancel(first, force=True)
        wait_until(saw_cancel.is_set, timeout=10, what="the handler to see the cancel")
        # While it runs on, the group's next job does not start, here or in any worker: a
        # claim now (as another worker's) takes nothing of the group.
        (task,) = [t for t in app.tasks.values() if t.name == "tenant.step"]
        assert claim_limited(conn, [task], owner="another-worker")[0] == []
        leased = "SELECT count(*) FROM queued_jobs WHERE lease_owner IS NOT NULL"
        assert scalar(conn, leased) == 0 and ran == [0]
        release.set()
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM archived_jobs WHERE id = %s", [second]),
            timeout=20,
            what="the group's next job to run once the handler ended",
        )

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)

    assert ran == [0, 1]
    assert row(conn, "archived_jobs", first)["status"] == ArchivedStatus.CANCELLED  # type: ignore[index]
    assert problems_logged(caplog) == []
