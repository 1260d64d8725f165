"""Whatever a handler raises or returns becomes that job's recorded outcome; the worker survives
it and loses no other job's outcome. A real `pgjobs work` runs a queue mixing ordinary jobs with
every hostile handler of ``zoo_app``."""

from __future__ import annotations

from signal import SIGTERM
from typing import Any

import psycopg

import pgjobs
from pgjobs.db.dsn import Dsn
from tests.acceptance.zoo_app import RUNS_DDL
from tests.support.helpers import Proc, assert_one_home, count, wait_until

APP = "tests.acceptance.zoo_app:app"

#: Hostile failures: task -> words its dead_letter row's last_error must hold.
FAILURES = {
    "zoo.str_raises": ["Unprintable", "message cannot be shown", "RuntimeError"],
    "zoo.surrogate_error": ["ValueError: bad \\ud800 text \\udcff"],
    "zoo.keyboard_interrupt_async": ["KeyboardInterrupt"],
    "zoo.system_exit_async": ["SystemExit: 3"],
    "zoo.base_exception_async": ["Exotic: exotic"],
    "zoo.cancelled_async": ["CancelledError: nobody asked"],
    "zoo.keyboard_interrupt_sync": ["KeyboardInterrupt"],
    "zoo.system_exit_sync": ["SystemExit: 3"],
}

#: Hostile results: task -> words its archived result must hold.
RESULTS = {
    "zoo.tuple_keys": ["result not stored", "TypeError"],
    "zoo.deep": ["result not stored", "RecursionError"],
    "zoo.surrogate_result": ["half \ufffd a pair"],
    "zoo.unshowable_result": ["result not stored", "no str either"],
}


def test_the_worker_survives_every_hostile_handler_and_loses_no_outcome(
    conn: psycopg.Connection[Any], dsn: Dsn, spawn: Any
) -> None:
    conn.execute(RUNS_DDL)
    hostile: dict[int, str] = {}
    normal: list[int] = []
    with pgjobs.App(dsn.url, check_task_names=False) as app:
        for round_ in range(3):
            for n in range(10):
                key = round_ * 100 + n
                task = "zoo.normal" if n % 2 else "zoo.normal_async"
                normal.append(app.enqueue(task, {"key": key}))
            for task in [*FAILURES, *RESULTS]:
                hostile[app.enqueue(task, {})] = task

    worker: Proc = spawn("work", "--app", APP, "--concurrency", "4", "--poll-interval", "0.2")
    every = [*normal, *hostile]
    wait_until(
        lambda: count(conn, "queued_jobs") == 0,
        timeout=60,
        what=lambda: f"{count(conn, 'queued_jobs')} job(s) still queued",
        procs=[worker],
    )

    assert worker.alive(), worker.describe()
    where = assert_one_home(conn, every)
    assert {where[i] for i in normal} == {"archived_jobs"}
    runs = conn.execute("SELECT key, count(*) FROM zoo_runs GROUP BY key").fetchall()
    assert len(runs) == len(normal) and {n for _, n in runs} == {1}  # each ran exactly once
    for job_id, task in hostile.items():
        if task in FAILURES:
            assert where[job_id] == "dead_letter", task
            found = conn.execute(
                "SELECT last_error, traceback FROM dead_letter WHERE id = %s", [job_id]
            ).fetchone()
            assert found is not None
            for words in FAILURES[task]:
                assert words in found[0], (task, found[0])
        else:
            assert where[job_id] == "archived_jobs", task
            found = conn.execute(
                "SELECT result #>> '{}' FROM archived_jobs WHERE id = %s", [job_id]
            ).fetchone()
            assert found is not None
            for words in RESULTS[task]:
                assert words in found[0], (task, found[0][:300])

    # Only the worker's own signal stops it, and then cleanly.
    assert worker.stop(SIGTERM, timeout=30) == 0, worker.describe()
