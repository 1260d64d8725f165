"""Whatever a handler raises or returns becomes that job's recorded outcome; the worker survives
it and loses no other job's outcome. A real `pgjobs work` runs a queue mixing ordinary jobs with
every hostile handler of ``zoo_app``."""

from __future__ import annotations

from signal import SIGTERM
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs.db.dsn import Dsn
from pgjobs.text import MAX_ERROR_LENGTH, MAX_TRACEBACK_LENGTH
from tests.acceptance.zoo_app import RUNS_DDL
from tests.acceptance.zoo_app import app as zoo
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


#: The good jobs of each trip test, beside its one hostile job: sync and async handlers.
BESIDE = ["zoo.beside", "zoo.beside_async", "zoo.beside", "zoo.beside_async", "zoo.beside"]

_PROGRESS = "ConfigurationError: progress"
_SNOOZE = "ValueError: Snooze takes seconds from 0 to 31622400 (a year)"

#: One hostile value a handler hands pgjobs (task of ``zoo_app``) -> where its job ends, with
#: which dead-letter reason (None: archived as succeeded) and the words its last_error (or
#: archived result) holds.
TRIP_CASES = {
    # progress(): refused in the handler, whose job fails with that one line.
    "zoo.progress_surrogate": ("exhausted", [_PROGRESS, "lone surrogate"]),
    "zoo.progress_surrogate_async": ("exhausted", [_PROGRESS, "lone surrogate"]),
    "zoo.progress_nul": ("exhausted", [_PROGRESS, "NUL"]),
    "zoo.progress_sly": ("exhausted", [_PROGRESS, "NUL"]),
    "zoo.progress_huge": ("exhausted", ["ConfigurationError: progress done must be a number"]),
    "zoo.extend_infinite": ("exhausted", ["ConfigurationError: extend_lease takes seconds"]),
    # retry_after that is not seconds from 0 to a day: ignored, the backoff retries the job.
    "zoo.retry_after_huge": ("exhausted", ["Exception: later, after int"]),
    "zoo.retry_after_huge_async": ("exhausted", ["Exception: later, after int"]),
    "zoo.retry_after_infinite": ("exhausted", ["Exception: later, after float"]),
    "zoo.retry_after_nan": ("exhausted", ["Exception: later, after float"]),
    "zoo.retry_after_negative": ("exhausted", ["Exception: later, after int"]),
    "zoo.retry_after_raises": ("exhausted", ["RetryAfterRaises: asked when"]),
    "zoo.retry_after_exits": ("exhausted", ["RetryAfterExits: asked when"]),
    # Snooze seconds that are not 0 to a year: the attempt fails, naming them.
    "zoo.snooze_infinite": ("exhausted", [_SNOOZE, "got inf"]),
    "zoo.snooze_huge": ("exhausted", [_SNOOZE, "got 1000000000"]),
    "zoo.snooze_altered": ("exhausted", [_SNOOZE, "got nan"]),
    "zoo.snooze_altered_async": ("exhausted", [_SNOOZE, "got 1000000000"]),
    "zoo.snooze_without_seconds": ("exhausted", [_SNOOZE, "AttributeError"]),
    # Error text: one storable line, whatever the message is.
    "zoo.error_str_raises": ("exhausted", ["Unprintable", "message cannot be shown"]),
    "zoo.error_str_exits": ("exhausted", ["ExitingStr", "raised SystemExit"]),
    "zoo.error_surrogate": ("exhausted", ["SurrogateStr: \\ud800 alone"]),
    "zoo.error_nul": ("exhausted", ["NulStr: a\\x00b"]),
    "zoo.error_huge": ("exhausted", ["ValueError: xxxx", "…"]),
    "zoo.error_huge_async": ("exhausted", ["ValueError: \u00e9\u00e9\u00e9", "…"]),
    "zoo.error_module": ("exhausted", ["Unnamed: who am I"]),
    # Results: stored, or a note saying why not; the job succeeded either way.
    "zoo.result_surrogate": (None, ["half \ufffd a pair"]),
    "zoo.result_nul": (None, ["a\ufffd", "b\ufffd"]),
    "zoo.result_huge": (None, ["result not stored: its JSON is 10,000,002 bytes"]),
    "zoo.result_huge_int": (None, ["result not stored", "ValueError"]),
    "zoo.result_nan": (None, ["nan"]),
    "zoo.result_unshowable": (None, ["result not stored", "no str either"]),
    "zoo.result_exits": (None, ["result not stored", "SystemExit"]),
    "zoo.result_exits_async": (None, ["result not stored", "SystemExit"]),
    # Tags a handler enqueues with: the door refuses them in the handler.
    "zoo.enqueue_bad_tag": ("exhausted", ["ConfigurationError: tags[0]", "surrogate"]),
}

#: What a worker's log shows when an outcome broke its trip, or the path that records it.
BROKEN = ["Traceback", "could not be recorded", "could not be stored", "apart", "refused"]


@pytest.mark.parametrize("task", TRIP_CASES)
def test_a_hostile_value_costs_only_its_own_job_in_a_trip_of_good_ones(
    conn: psycopg.Connection[Any], dsn: Dsn, spawn: Any, subprocess_env: dict[str, str], task: str
) -> None:
    reason, words = TRIP_CASES[task]
    with pgjobs.App(dsn.url, check_task_names=False) as app:
        good = {app.enqueue(name, {"key": key}): key for key, name in enumerate(BESIDE)}
        hostile = app.enqueue(task, {}, max_attempts=zoo.tasks[task].max_attempts)
    # Every job waits for the others before it ends: their outcomes share one round trip.
    trip = str(len(good) + 1)
    worker: Proc = spawn(
        "work", "--app", APP, "--concurrency", trip, "--poll-interval", "0.2",
        env={**subprocess_env, "ZOO_TRIP": trip},
    )  # fmt: skip
    wait_until(
        lambda: count(conn, "queued_jobs") == 0,
        timeout=60,
        what=lambda: f"{count(conn, 'queued_jobs')} job(s) still queued",
        procs=[worker],
    )

    assert worker.alive(), worker.describe()
    where = assert_one_home(conn, [*good, hostile])
    results = dict(
        conn.execute(
            "SELECT id, result FROM archived_jobs WHERE id = ANY(%s) AND status = 'succeeded'",
            [list(good)],
        ).fetchall()
    )
    assert results == good, "every good job succeeded with its result"
    if reason is None:
        assert where[hostile] == "archived_jobs", worker.describe()
        (status, said) = conn.execute(
            "SELECT status, result #>> '{}' FROM archived_jobs WHERE id = %s", [hostile]
        ).fetchone() or (None, None)
        assert status == "succeeded"
    else:
        assert where[hostile] == "dead_letter", worker.describe()
        (found, said, trace) = conn.execute(
            "SELECT reason, last_error, traceback FROM dead_letter WHERE id = %s", [hostile]
        ).fetchone() or (None, None, None)
        assert found == reason, said
        assert len(said or "") <= MAX_ERROR_LENGTH
        assert trace is None or len(trace) <= MAX_TRACEBACK_LENGTH
    assert isinstance(said, str), worker.describe()
    for word in words:
        assert word in said, (word, said[:300])
    log = worker.err()
    assert not [line for line in log.splitlines() if any(bad in line for bad in BROKEN)], log
    assert worker.stop(SIGTERM, timeout=30) == 0, worker.describe()
