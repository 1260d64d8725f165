"""Durable workflows under real worker processes: killed with SIGKILL at every step boundary,
and with their sessions ended by pg_terminate_backend, every workflow completes; a recorded
step never runs again, a transactional step's writes happen exactly once, a plain step's write
repeats only when its run died between the write and the record."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgjobs import JobSpec
from tests.acceptance.workflow_app import LEASE, POINTS, WORKFLOW_DDL
from tests.support.helpers import Proc, assert_one_home, count, wait_until

APP = "tests.acceptance.workflow_app:app"
STEPS = ("charge", "reserve", "email")


def counted(conn: psycopg.Connection[Any], table: str) -> Counter[tuple[int, str]]:
    rows = conn.execute(f"SELECT key, step FROM {table}").fetchall()
    return Counter((int(key), step) for key, step in rows)


def check_results(conn: psycopg.Connection[Any], ids: list[int], keys: list[int]) -> None:
    assert assert_one_home(conn, ids) == dict.fromkeys(ids, "archived_jobs")
    results = conn.execute(
        "SELECT status, result FROM archived_jobs WHERE id = ANY(%s)", [ids]
    ).fetchall()
    assert sorted(r[1]["key"] for r in results) == keys
    assert all(
        s == "succeeded" and r["cents"] == 100 + r["key"] and r["reserved"] == "reserved"
        for s, r in results
    )
    entries = conn.execute(
        "SELECT job_id, array_agg(name ORDER BY seq), bool_and(status = 'done') "
        "FROM pgjobs_workflow_history WHERE job_id = ANY(%s) GROUP BY job_id",
        [ids],
    ).fetchall()
    assert len(entries) == len(ids)
    assert all(
        names == ["charge", "reserve", "sleep", "email"] and done for _, names, done in entries
    )


@pytest.mark.slow
def test_kill9_at_every_step_boundary(make_app, conn, spawn):
    conn.execute(WORKFLOW_DDL)
    app = make_app()
    keys = list(range(len(POINTS)))
    ids = app.enqueue_many(
        JobSpec("accept.checkout", {"key": key, "die_at": point})
        for key, point in zip(keys, POINTS, strict=True)
    )

    def start() -> Proc:
        started: Proc = spawn(
            "work", "--app", APP, "--concurrency", "1", "--poll-interval", "0.2",
            "--rescue-interval", "0.5",
        )  # fmt: skip
        return started

    workers = [start()]
    deaths = 0

    def all_done() -> bool:
        nonlocal deaths
        if not workers[-1].alive():
            assert workers[-1].wait_exit(5) == -signal.SIGKILL, workers[-1].err
            deaths += 1
            assert deaths <= len(POINTS), "a boundary killed its worker twice"
            workers.append(start())
        return count(conn, "archived_jobs") == len(ids)

    wait_until(
        all_done,
        timeout=len(POINTS) * (LEASE + 15) + 30,
        what=lambda: f"every workflow to end ({deaths} kills so far)",
        interval=0.1,
    )
    workers[-1].signal(signal.SIGTERM)
    assert workers[-1].wait_exit(30) == 0
    assert deaths == len(POINTS)
    check_results(conn, ids, keys)

    runs, effects = counted(conn, "wf_runs"), counted(conn, "wf_effects")
    for key, point in zip(keys, POINTS, strict=True):
        died_in = point.split(":")[0]
        for step in STEPS:
            # The step the run died in ran twice; every step recorded before it, once.
            assert runs[key, step] == (2 if step == died_in else 1), (point, step, runs)
        # Transactional writes once, whatever the kill; the plain write of `reserve` twice only
        # when the run died between that write and its record.
        assert effects[key, "charge"] == 1, point
        assert effects[key, "email"] == 1, point
        assert effects[key, "reserve"] == (2 if point == "reserve:end" else 1), point


@pytest.mark.slow
def test_sessions_ended_under_running_workflows(make_app, conn, spawn):
    conn.execute(WORKFLOW_DDL)
    app = make_app()
    keys = list(range(40))
    ids = app.enqueue_many(JobSpec("accept.checkout", {"key": key}) for key in keys)
    worker = spawn("work", "--app", APP, "--concurrency", "4", "--poll-interval", "0.2")
    stop = threading.Event()
    ended: list[int] = []

    def terminate() -> None:
        with psycopg.connect(conn.info.dsn, autocommit=True) as killer:
            while not stop.wait(0.15):
                rows = killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'pgjobs' "
                    "AND pid <> pg_backend_pid()"
                ).fetchall()
                ended.append(len(rows))

    killer = threading.Thread(target=terminate)
    killer.start()
    try:
        wait_until(
            lambda: count(conn, "archived_jobs") == len(ids),
            timeout=240,
            what=lambda: f"every workflow to end; dead: {count(conn, 'dead_letter')}",
            procs=[worker],
            interval=0.2,
        )
    finally:
        stop.set()
        killer.join()
    assert sum(ended) > 0, "no session was ended"
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(30) == 0
    check_results(conn, ids, keys)
    effects = counted(conn, "wf_effects")
    for key in keys:
        assert effects[key, "charge"] == 1
        assert effects[key, "email"] == 1
        assert effects[key, "reserve"] >= 1
