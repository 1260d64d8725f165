"""Pausing and resuming a queue: the claim skips a paused queue's jobs, which stay ready; a resume
wakes idle workers; `pgjobs queue ...` and `pgjobs stats` show it. The last test runs two
`pgjobs work` processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import JobSpec, queues
from pgjobs import stats as read_model
from pgjobs.completer.outcomes import Outcomes
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from tests.acceptance.workload import RUNS_DDL
from tests.support.factories import claim, settle
from tests.support.helpers import (
    assert_one_line_error,
    count,
    pgjobs_process,
    run,
    scalar,
    stop,
    wait_archived,
)

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    """Every test starts and ends with no queue paused: a pause left behind would stop the
    claims of the tests that follow."""

    def clear() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgjobs_queues")

    clear()
    yield
    clear()


def ready(conn: psycopg.Connection[Any], queue: str) -> int:
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM queued_jobs WHERE queue = %s AND lease_expires_at IS NULL "
            "AND run_at <= now()",
            [queue],
        )
    )


def test_claim_skips_a_paused_queue_and_takes_it_again_after_resume(make_app, conn, dsn):
    app = make_app()
    app.enqueue_many(JobSpec("t", {"n": n}, queue=q) for n in range(3) for q in ("a", "b"))

    change = queues.pause(dsn, "a", reason="incident 42")
    assert change.changed and change.queue.paused and change.queue.has_jobs
    assert change.queue.pause_reason == "incident 42"
    assert change.queue.paused_by  # the database role when the caller names nobody

    # The claim serves the other queue only; the paused one's jobs stay ready, unleased.
    claimed = claim(conn, queues=["a", "b"], limit=10)
    assert sorted(job.queue for job in claimed) == ["b", "b", "b"]
    assert claim(conn, queues=["a"], limit=10) == []
    assert ready(conn, "a") == 3

    change = queues.resume(dsn, "a")
    assert change.changed and not change.queue.paused
    assert sorted(job.queue for job in claim(conn, queues=["a", "b"], limit=10)) == ["a"] * 3


def test_pause_of_a_queue_without_jobs_is_allowed_and_says_so(dsn):
    change = queues.pause(dsn, "nothing-here-yet")
    assert change.changed and change.queue.paused and not change.queue.has_jobs
    listed = {q.name: q for q in queues.list_queues(dsn)}
    assert listed["nothing-here-yet"].paused


def test_pausing_twice_keeps_the_first_pause_and_a_new_reason(dsn):
    first = queues.pause(dsn, "q", reason="one", by="alice@host")
    again = queues.pause(dsn, "q", by="bob@host")
    assert not again.changed
    assert again.queue.paused_at == first.queue.paused_at
    assert again.queue.paused_by == "alice@host"
    assert again.queue.pause_reason == "one"  # no new reason: the old one stays
    third = queues.pause(dsn, "q", reason="two")
    assert third.queue.pause_reason == "two"
    assert not queues.resume(dsn, "never-paused").changed


def test_bad_names_are_refused_and_change_nothing(dsn):
    for bad in ("", " ", "a\x00b", "x" * 201):
        with pytest.raises(ConfigurationError) as raised:
            queues.pause(dsn, bad)
        assert raised.value.field == "queue"
    with pytest.raises(ConfigurationError):
        queues.pause(dsn, "q", reason="r" * 1001)
    assert queues.list_queues(dsn) == []


def test_resume_wakes_listeners_and_pause_does_not(dsn, make_app):
    make_app().enqueue("t", {}, queue="mail")
    with psycopg.connect(dsn.url, autocommit=True) as listener:
        listener.execute('LISTEN "pgjobs"')
        queues.pause(dsn, "mail")
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        queues.resume(dsn, "mail")
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in got] == ["mail"]


def test_list_shows_queues_with_jobs_running_ones_and_settings(make_app, conn, dsn):
    app = make_app()
    app.enqueue("t", {}, queue="ready-q")
    app.enqueue("t", {}, queue="scheduled-q", run_in=3600)
    app.enqueue("t", {}, queue="running-q")
    assert len(claim(conn, queues=["running-q"])) == 1
    queues.pause(dsn, "paused-empty")
    listed = [(q.name, q.paused, q.has_jobs) for q in queues.list_queues(dsn)]
    assert listed == [
        ("paused-empty", True, False),
        ("ready-q", False, True),
        ("running-q", False, True),
        ("scheduled-q", False, True),
    ]


def test_stats_show_paused_queues_even_without_jobs(make_app, conn, dsn):
    make_app().enqueue("t", {}, queue="busy")
    queues.pause(dsn, "busy", reason="deploy")
    queues.pause(dsn, "idle")
    by_name = {q.queue: q for q in read_model.snapshot(conn).queues}
    assert by_name["busy"].paused and by_name["busy"].ready == 1
    assert by_name["busy"].pause_reason == "deploy"
    assert by_name["idle"].paused and by_name["idle"].ready == 0
    queues.resume(dsn, "idle")
    assert "idle" not in {q.queue for q in read_model.snapshot(conn).queues}


def test_cli_pause_list_resume_and_stats(capsys, dsn, make_app):
    make_app().enqueue("t", {}, queue="emails")
    code, out, err = run(
        capsys, "queue", "pause", "emails", "--reason", "SMTP down", "--dsn", dsn.url
    )
    assert (code, err) == (0, "")
    assert "queue emails paused" in out

    code, out, _ = run(capsys, "queue", "pause", "nowhere", "--dsn", dsn.url)
    assert code == 0 and "paused (it holds no job now)" in out

    code, out, _ = run(capsys, "queue", "list", "--json", "--dsn", dsn.url)
    listed = {q["name"]: q for q in json.loads(out)}
    assert listed["emails"]["paused"] and listed["emails"]["pause_reason"] == "SMTP down"
    assert "@" in listed["emails"]["paused_by"]  # user@host of whoever ran the command
    assert listed["nowhere"]["has_jobs"] is False

    code, out, _ = run(capsys, "queue", "list", "--dsn", dsn.url)
    assert code == 0 and "paused" in out and "SMTP down" in out

    code, out, _ = run(capsys, "stats", "--json", "--dsn", dsn.url)
    stats = {q["queue"]: q for q in json.loads(out)}
    assert stats["emails"]["paused"] is True and stats["emails"]["ready"] == 1
    code, out, _ = run(capsys, "stats", "--dsn", dsn.url)
    assert "emails (paused)" in out

    code, out, _ = run(capsys, "queue", "resume", "emails", "--dsn", dsn.url)
    assert code == 0 and "queue emails resumed" in out
    code, out, _ = run(capsys, "queue", "resume", "emails", "--dsn", dsn.url)
    assert code == 0 and "was not paused" in out


def test_cli_bad_input_is_one_line_and_exit_2(capsys, dsn):
    code, _, err = run(capsys, "queue", "pause", "a\tb", "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, "queue name")
    code, _, err = run(capsys, "queue", "resume", "", "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, "queue name")
    assert queues.list_queues(dsn) == []


def test_two_worker_processes_honour_a_pause_and_run_everything_after_resume(
    make_app, conn, dsn, subprocess_env
):
    conn.execute(RUNS_DDL)
    app = make_app()
    app.enqueue("accept.record", {"key": 0})
    workers_args = ("work", "--app", "tests.acceptance.workload:app", "--poll-interval", "0.2")
    with (
        pgjobs_process(subprocess_env, *workers_args) as one,
        pgjobs_process(subprocess_env, *workers_args) as two,
    ):
        workers = [one, two]
        wait_archived(conn, 1, timeout=60, procs=workers)  # both started and claim

        queues.pause(dsn, "default")
        app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(1, 21))
        # Nothing is claimed while the queue is paused: the jobs stay ready. (Sampled for two
        # seconds; a worker would claim within its poll interval of 0.2 s.)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert ready(conn, "default") == 20
            assert count(conn, "archived_jobs") == 1
            time.sleep(0.1)

        queues.resume(dsn, "default")
        wait_archived(conn, 21, timeout=60, procs=workers)
        done = scalar(conn, "SELECT count(DISTINCT key) FROM runs WHERE phase = 'done'")
        assert done == 21
        assert stop(workers, timeout=30) == [0, 0]


def test_a_running_job_finishes_while_its_queue_is_paused(make_app, conn, dsn):
    job_id = make_app().enqueue("t", {})
    (job,) = claim(conn, owner="w1")
    queues.pause(dsn, "default")
    # The pause stops claims only: the lease holder still settles its job.
    outcomes = Outcomes("w1")
    outcomes.succeed(job, None)
    assert settle(conn, outcomes) == {job_id}
    assert count(conn, "archived_jobs") == 1
