"""The worker registry: workers register at start, refresh a heartbeat, delete their row at a
clean exit; rows whose heartbeat stopped are removed by other workers and not listed as live."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, stats
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import ServiceConfig
from pgjobs.maintenance.registry import STALE_AFTER, Heartbeat, WorkerIdentity, WorkerRegistry
from tests.support.factories import claim, run_service, work
from tests.support.helpers import pgjobs_env, pgjobs_process, wait_until


def registered(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, host, pid, queues, concurrency FROM pgjobs_workers ORDER BY id"
    ).fetchall()


def identity(worker_id: str, **changes: Any) -> WorkerIdentity:
    values: dict[str, Any] = {
        "id": worker_id,
        "host": "box",
        "pid": 42,
        "queues": ["default"],
        "concurrency": 4,
        "started_at": datetime.now(UTC),
    }
    values.update(changes)
    return WorkerIdentity(**values)


def test_a_worker_is_listed_with_its_running_jobs_while_it_runs_then_leaves(make_app, dsn, conn):
    app: App = make_app()
    seen: dict[str, Any] = {}

    @app.task(name="registry.look")
    def look() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as c:
            wait_until(lambda: registered(c), timeout=10, what="the worker's registration")
            seen["rows"] = registered(c)
            seen["snapshot"] = stats.snapshot(c)

    app.enqueue("registry.look", {})
    assert work(app, concurrency=3) == 0

    [(worker_id, host, pid, queues, concurrency)] = seen["rows"]
    assert (host, pid, queues, concurrency) == (socket.gethostname(), os.getpid(), ["default"], 3)
    [live] = seen["snapshot"].workers
    assert (live.id, live.running, live.concurrency) == (worker_id, 1, 3)
    assert seen["snapshot"].orphaned.jobs == 0
    assert registered(conn) == [], "a clean exit deletes the worker's row"


def test_heartbeat_refreshes_last_seen_and_keeps_started_at(dsn, conn):
    me = identity("w-1", started_at=datetime.now(UTC) - timedelta(hours=1))
    assert run_service(dsn, WorkerRegistry(me)) == Heartbeat(stale_removed=0)
    conn.execute("UPDATE pgjobs_workers SET last_seen_at = now() - interval '30 seconds'")
    run_service(dsn, WorkerRegistry(me))
    started, seen_ago = conn.execute(
        "SELECT started_at, extract(epoch FROM now() - last_seen_at) FROM pgjobs_workers"
    ).fetchone()
    assert started == me.started_at
    assert seen_ago < 5


def test_stale_rows_are_removed_by_another_worker_and_never_listed_as_live(dsn, conn):
    run_service(dsn, WorkerRegistry(identity("gone")))
    [job_id] = [
        conn.execute("INSERT INTO queued_jobs (task) VALUES ('t') RETURNING id").fetchone()[0]
    ]
    [job] = claim(conn, owner="gone", lease=120)
    assert job.id == job_id
    conn.execute(
        "UPDATE pgjobs_workers SET last_seen_at = now() - %s * interval '1 second'",
        [STALE_AFTER + 5],
    )
    snap = stats.snapshot(conn)
    assert snap.workers == []
    assert (snap.orphaned.jobs, snap.orphaned.owners) == (1, 1)
    assert snap.orphaned.first_expiry is not None
    assert 100 < snap.orphaned.first_expiry <= 120

    assert run_service(dsn, WorkerRegistry(identity("alive"))) == Heartbeat(stale_removed=1)
    assert [row[0] for row in registered(conn)] == ["alive"]


def test_two_registries_at_once_each_keep_their_row(dsn, conn):
    async def both() -> None:
        conns = [await psycopg.AsyncConnection.connect(dsn.url, autocommit=True) for _ in "ab"]
        try:
            registries = [WorkerRegistry(identity(f"w-{n}")) for n in range(2)]
            for _ in range(3):
                await asyncio.gather(
                    *(r.run_once(c) for r, c in zip(registries, conns, strict=True))
                )
        finally:
            for c in conns:
                await c.close()

    asyncio.run(both())
    assert [row[0] for row in registered(conn)] == ["w-0", "w-1"]


def test_stale_after_must_exceed_the_heartbeat_interval():
    with pytest.raises(ConfigurationError, match="stale_after"):
        WorkerRegistry(identity("x"), ServiceConfig(interval=30), stale_after=30)


def test_a_worker_process_registers_and_its_sigterm_exit_unregisters(dsn, conn):
    with pgjobs_process(
        pgjobs_env(dsn.url), "work", "--app", "tests.integration.ops_app:app", "--concurrency", "2"
    ) as worker:
        wait_until(lambda: registered(conn) or not worker.alive(), timeout=20, what="registration")
        [(worker_id, host, pid, queues, concurrency)] = registered(conn)
        assert (host, pid, queues, concurrency) == (
            socket.gethostname(),
            worker.popen.pid,
            ["default", "slow"],
            2,
        )
        assert worker_id.startswith(f"{host}:{worker.popen.pid}:")
        assert worker.stop(signal.SIGTERM) == 0, worker.err()
    assert registered(conn) == []
