"""A worker inside a process it does not own: ``await Worker.run_async()`` in the caller's event
loop (a FastAPI lifespan, a loop in another thread), and ``Worker.run()`` from a thread other
than the main one. The caller owns the signals: no handler is installed; ``stop()`` stops it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pgjobs import App, JobSpec, Worker, WorkerConfig
from tests.support.helpers import assert_one_home, count, wait_archived, wait_until

CONFIG: dict[str, Any] = {"poll_interval": 0.05, "maintenance": False, "grace": 10}


def _app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="t.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="t.add_sync")
    def add_sync(a: int, b: int) -> int:
        return a + b

    return app


def test_run_async_works_in_the_callers_loop_and_installs_no_signal_handler(make_app, conn):
    app = _app(make_app)

    async def main() -> tuple[int, list[int], object, object]:
        # asyncio.run installs its own SIGINT handler: compare with the loop's, before the run.
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        worker = Worker(app, WorkerConfig(**CONFIG))
        task = asyncio.create_task(worker.run_async())
        ids = await app.enqueue_many_async(
            [JobSpec("t.add", {"a": n, "b": 1}) for n in range(20)]
            + [JobSpec("t.add_sync", {"a": n, "b": 2}) for n in range(20)]
        )
        while count(conn, "archived_jobs") < len(ids):
            await asyncio.sleep(0.05)
        during = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        worker.stop()
        code = await asyncio.wait_for(task, 60)
        await app.aclose()
        return code, ids, before, during

    code, ids, before, during = asyncio.run(main())
    assert code == 0
    assert during == before, "run_async installed a signal handler"
    assert_one_home(conn, ids)
    statuses = conn.execute("SELECT DISTINCT status FROM archived_jobs").fetchall()
    assert statuses == [("succeeded",)]
    assert count(conn, "pgjobs_workers") == 0, "the worker unregistered"


def test_run_from_a_thread_that_is_not_the_main_one_stops_on_stop(make_app, conn):
    app = _app(make_app)
    ids = app.enqueue_many(JobSpec("t.add", {"a": n, "b": 1}) for n in range(10))
    worker = Worker(app, WorkerConfig(**CONFIG))
    result: list[int | BaseException] = []

    def work() -> None:
        try:
            result.append(worker.run())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=work, name="pgjobs-worker")
    thread.start()
    try:
        wait_archived(conn, len(ids), timeout=30)
    finally:
        worker.stop()
        thread.join(60)
    assert result == [0]
    assert_one_home(conn, ids)


def test_a_stop_before_the_run_begins_is_not_lost(make_app, conn):
    app = _app(make_app)
    app.enqueue("t.add", {"a": 1, "b": 1})
    worker = Worker(app, WorkerConfig(**CONFIG))
    worker.stop()  # e.g. a lifespan that shuts down before the worker's task ever ran

    async def main() -> int:
        return await asyncio.wait_for(worker.run_async(), 60)

    assert asyncio.run(main()) == 0
    assert count(conn, "queued_jobs") == 1, "a worker stopped before it began claims nothing"


def test_burst_run_async_returns_once_the_queue_is_empty(make_app, conn):
    app = _app(make_app)
    ids = app.enqueue_many(JobSpec("t.add_sync", {"a": n, "b": 1}) for n in range(10))

    async def main() -> int:
        return await asyncio.wait_for(
            Worker(app, WorkerConfig(**CONFIG, burst=True)).run_async(), 60
        )

    assert asyncio.run(main()) == 0
    assert count(conn, "archived_jobs") == len(ids)


def test_a_worker_runs_once(make_app):
    app = _app(make_app)
    worker = Worker(app, WorkerConfig(**CONFIG, burst=True))
    assert worker.run() == 0
    with pytest.raises(Exception, match="runs once"):
        worker.run()


def test_a_fastapi_lifespan_runs_a_worker_beside_the_api(make_app, conn):
    pytest.importorskip("fastapi")
    from fastapi import FastAPI

    with warnings.catch_warnings():
        # Starlette asks for its httpx fork (httpx2) when it finds httpx; the client works the same.
        warnings.simplefilter("ignore", UserWarning)
        from starlette.testclient import TestClient

    app = _app(make_app)

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        await app.open_async()
        worker = Worker(app, WorkerConfig(concurrency=4, **CONFIG))
        task = asyncio.create_task(worker.run_async())
        yield
        worker.stop()
        await task
        await app.aclose()

    api = FastAPI(lifespan=lifespan)

    @api.post("/sum")
    async def enqueue_sum(a: int, b: int) -> dict[str, int]:
        return {"job": await app.enqueue_async("t.add", {"a": a, "b": b})}

    # TestClient runs the application, lifespan included, on an event loop in another thread.
    with TestClient(api) as client:
        ids = [client.post("/sum", params={"a": n, "b": 1}).json()["job"] for n in range(5)]
        wait_archived(conn, len(ids), timeout=30)
        wait_until(lambda: count(conn, "pgjobs_workers") == 1, timeout=30, what="registered")
    assert count(conn, "pgjobs_workers") == 0, "the lifespan's shutdown stopped the worker"
    results = conn.execute("SELECT result FROM archived_jobs ORDER BY id").fetchall()
    assert [row[0] for row in results] == [n + 1 for n in range(5)]
