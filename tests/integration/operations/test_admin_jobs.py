"""Lookup and control of one job: `pgjobs job show`, `pgjobs replay`, `pgjobs cancel`, and the
same operations on the App (``app.job``, ``app.replay``, ``app.cancel``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobStatus, admin, queries
from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError, JobNotFound, JobStateConflict
from pgjobs.models import ArchivedStatus, DeadReason
from tests.support.admin_factories import (
    bury,
    claim_one,
    fail_for_good,
    succeed,
)
from tests.support.factories import counts, db_now, row, work
from tests.support.helpers import assert_one_home, assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture
def app(make_app):
    """An app that enqueues any task name (these tests never run a handler)."""
    return make_app(check_task_names=False)


def test_job_show_finds_a_job_in_each_of_its_places(app, conn, dsn, capsys):
    ready = app.enqueue("t.ready", {"a": 1}, priority=3, idempotency_key="k-1")
    scheduled = app.enqueue("t.later", {}, run_in=3600)
    running = app.enqueue("t.running", {}, queue="other")
    claim_one(conn, running, queue="other", owner="host:1:abcd")
    (dead,) = bury(conn, 1)

    assert app.job(ready).status is JobStatus.READY
    assert app.job(scheduled).status is JobStatus.SCHEDULED
    shown = app.job(running)
    assert (shown.status, shown.table, shown.lease_owner, shown.attempts) == (
        JobStatus.RUNNING,
        "queued_jobs",
        "host:1:abcd",
        1,
    )
    dead_job = admin.job(dsn, dead)
    assert (dead_job.status, dead_job.table, dead_job.reason) == (
        JobStatus.DEAD,
        "dead_letter",
        DeadReason.EXHAUSTED,
    )
    assert dead_job.reason is DeadReason.EXHAUSTED, "a reason, not a bare string"
    assert dead_job.traceback is not None and dead_job.finished_at is not None

    code, out, err = run(capsys, "job", "show", str(ready), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"job {ready}: ready (queued_jobs)"
    assert "t.ready" in out and '{"a": 1}' in out and "k-1" in out and "0 of 5" in out

    code, out, _ = run(capsys, "job", "show", str(running), "--dsn", dsn.url)
    assert code == 0 and "on worker host:1:abcd, lease until" in out

    code, out, _ = run(capsys, "job", "show", str(dead), "--dsn", dsn.url)
    assert code == 0
    assert out.splitlines()[0] == f"job {dead}: dead (exhausted)"
    assert "ValueError: image 0 is corrupt" in out and "Traceback" in out

    code, out, _ = run(capsys, "job", "show", str(scheduled), "--json", "--dsn", dsn.url)
    assert code == 0
    parsed = json.loads(out)
    assert (parsed["status"], parsed["table"], parsed["replays"]) == (
        "scheduled",
        "queued_jobs",
        [],
    )


def test_the_whole_story_of_a_redriven_then_replayed_job(make_app, conn, dsn, capsys):
    app: App = make_app()

    @app.task(name="t.flaky", max_attempts=1)
    def flaky(fail: bool) -> str:
        if fail:
            raise ValueError("downstream said no")
        return "done"

    original = app.enqueue("t.flaky", {"fail": True})
    assert work(app) == 0
    assert app.redrive(original) == 1
    assert work(app) == 0  # fails again: dead, redriven once
    replay = app.replay(original)
    assert work(app) == 0  # the replay fails too (same payload)

    story = app.job(original)
    assert (story.status, story.redrive_count, story.replays) == (JobStatus.DEAD, 1, (replay,))
    assert story.redriven_at is not None
    copy = app.job(replay)
    assert (copy.status, copy.replay_of, copy.redrive_count, copy.attempts) == (
        JobStatus.DEAD,
        original,
        0,
        1,
    )

    code, out, _ = run(capsys, "job", "show", str(original), "--dsn", dsn.url)
    assert code == 0
    assert "redriven     1 time(s)" in out and f"replays      {replay}" in out
    code, out, _ = run(capsys, "job", "show", str(replay), "--dsn", dsn.url)
    assert code == 0 and f"replay of    {original}" in out
    assert_one_home(conn, [original, replay])


def test_replay_enqueues_a_new_linked_job_and_leaves_the_original(app, conn, dsn, capsys):
    done = app.enqueue("t", {"x": 1}, priority=2, max_attempts=4, idempotency_key="once")
    job = claim_one(conn, done)
    assert succeed(conn, job) == {done}
    (dead,) = bury(conn, 1, task="t.dead")

    code, out, err = run(capsys, "replay", str(done), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    copy = int(out)
    new = row(conn, "queued_jobs", copy)
    assert new is not None
    assert (new["task"], new["payload"], new["priority"], new["max_attempts"]) == (
        "t",
        {"x": 1},
        2,
        4,
    )
    assert new["replay_of"] == done and new["attempts"] == 0
    assert new["idempotency_key"] is None, "a replay is not deduplicated against its original"

    second = admin.replay(dsn, dead)
    assert row(conn, "queued_jobs", second)["replay_of"] == dead  # type: ignore[index]
    where = assert_one_home(conn, [done, dead, copy, second])
    assert (where[done], where[dead]) == ("archived_jobs", "dead_letter")
    assert app.job(done).replays == (copy,)


def _expired(app: App, conn: psycopg.Connection[Any], task: str) -> int:
    """A job of ``task`` archived as expired, unrun, by the expirer's own statement."""
    job_id = app.enqueue(task, {"n": 1}, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert conn.execute(queries.JOB_EXPIRE_MANY, {"limit": 100}).fetchone() == (1,)
    assert app.job(job_id).status is JobStatus.EXPIRED
    return job_id


def test_replay_of_an_expired_job_expires_at_once_unless_given_a_new_expiry(
    make_app, conn, dsn, capsys
):
    app: App = make_app()
    ran: list[int] = []

    @app.task(name="t.late")
    def late(n: int) -> None:
        ran.append(n)

    original = _expired(app, conn, "t.late")
    code, out, err = run(capsys, "replay", str(original), "--dsn", dsn.url)
    assert code == 0 and err.startswith("pgjobs: warning: ") and "--expires-in" in err
    copy = int(out)
    archived = row(conn, "archived_jobs", copy)
    assert archived is not None, "archived at once, never queued"
    assert (archived["status"], archived["attempts"], archived["replay_of"]) == (
        ArchivedStatus.EXPIRED,
        0,
        original,
    )
    assert archived["expires_at"] == row(conn, "archived_jobs", original)["expires_at"]  # type: ignore[index]
    assert app.job(original).replays == (copy,)
    by_api = app.replay(original)  # the Python API: archived at once as expired, too
    assert app.job(by_api).status is JobStatus.EXPIRED
    assert work(app) == 0 and ran == []

    # A new expiry in the future: a copy that runs.
    runs = app.replay(original, expires_in=3600)
    queued = row(conn, "queued_jobs", runs)
    assert queued is not None and queued["expires_at"] > db_now(conn)
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    code, out, err = run(capsys, "replay", str(original), "--expires-at", future, "--dsn", dsn.url)
    assert (code, err) == (0, "")
    by_cli = int(out)
    assert row(conn, "queued_jobs", by_cli)["expires_at"] is not None  # type: ignore[index]
    assert work(app) == 0 and ran == [1, 1]
    # A given expiry already passed: archived at once as well.
    past = app.replay(original, expires_at=datetime.now(UTC) - timedelta(minutes=1))
    assert app.job(past).status is JobStatus.EXPIRED
    assert_one_home(conn, [original, copy, by_api, runs, by_cli, past])
    assert {app.job(i).status for i in (runs, by_cli)} == {JobStatus.SUCCEEDED}


def test_replay_refuses_a_bad_expiry_and_changes_nothing(app, conn, dsn, capsys):
    (dead,) = bury(conn, 1)
    before = counts(conn)
    for args, words in (
        (["--expires-in", "5", "--expires-at", "2030-01-01T00:00:00Z"], ["not both"]),
        (["--expires-at", "tomorrow"], ["--expires-at"]),
        (["--expires-in", "-1"], ["--expires-in"]),
    ):
        code, _, err = run(capsys, "replay", str(dead), *args, "--dsn", dsn.url)
        assert_one_line_error(code, err, *words)
        assert code == 2
    with pytest.raises(ConfigurationError, match="expires_at must be timezone-aware"):
        app.replay(dead, expires_at=datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError, match="not both"):
        app.replay(dead, expires_at=datetime.now(UTC), expires_in=5)
    assert counts(conn) == before


def test_replay_refuses_queued_and_unknown_jobs(app, conn, dsn, capsys):
    queued = app.enqueue("t", {})
    code, _, err = run(capsys, "replay", str(queued), "--dsn", dsn.url)
    assert_one_line_error(code, err, f"job {queued} is still queued (ready)", "cancel")
    assert code == 1
    code, _, err = run(capsys, "replay", "987654", "--dsn", dsn.url)
    assert_one_line_error(code, err, "no job 987654")
    with pytest.raises(JobNotFound):
        app.replay(987654)
    assert_one_home(conn, [queued])


def test_cancel_archives_a_queued_job_unrun(app, conn, dsn, capsys):
    ready = app.enqueue("t", {})
    scheduled = app.enqueue("t", {}, run_in=600)

    code, out, err = run(capsys, "cancel", str(ready), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert out.strip() == f"job {ready} cancelled"
    assert app.cancel(scheduled).status is JobStatus.CANCELLED

    where = assert_one_home(conn, [ready, scheduled])
    assert set(where.values()) == {"archived_jobs"}
    archived = row(conn, "archived_jobs", ready)
    assert archived is not None
    assert (archived["status"], archived["attempts"], archived["worker"]) == (
        ArchivedStatus.CANCELLED,
        0,
        None,
    )

    code, _, err = run(capsys, "cancel", str(ready), "--dsn", dsn.url)
    assert_one_line_error(code, err, "already finished", JobStatus.CANCELLED, "archived_jobs")
    (dead,) = bury(conn, 1)
    with pytest.raises(JobStateConflict, match="already finished: it is dead"):
        app.cancel(dead)
    code, _, err = run(capsys, "cancel", "31337", "--dsn", dsn.url)
    assert_one_line_error(code, err, "no job 31337")


def test_cancel_refuses_a_running_job_and_names_its_worker(app, conn, dsn, capsys):
    running = app.enqueue("t", {})
    job = claim_one(conn, running, owner="host:9:feedbeef")

    code, _, err = run(capsys, "cancel", str(running), "--dsn", dsn.url)
    assert_one_line_error(code, err, "is running on worker host:9:feedbeef", "--force")
    with pytest.raises(JobStateConflict):
        app.cancel(running)

    # Untouched: the worker finishes it normally.
    assert succeed(conn, job, owner="host:9:feedbeef") == {running}
    assert assert_one_home(conn, [running]) == {running: "archived_jobs"}
    assert row(conn, "archived_jobs", running)["status"] == ArchivedStatus.SUCCEEDED  # type: ignore[index]


def test_force_cancel_of_a_running_job_discards_the_workers_outcome(app, conn, dsn, capsys):
    running = app.enqueue("t", {})
    job = claim_one(conn, running, owner="host:9:feedbeef")

    code, out, err = run(capsys, "cancel", str(running), "--force", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert "while running on worker host:9:feedbeef" in out and "discarded" in out
    cancelled = row(conn, "archived_jobs", running)
    assert cancelled is not None
    assert (cancelled["status"], cancelled["worker"], cancelled["attempts"]) == (
        ArchivedStatus.CANCELLED,
        "host:9:feedbeef",
        1,
    )

    # The handler finishes later: the fence discards its outcome, whatever it is.
    assert succeed(conn, job, owner="host:9:feedbeef") == set()
    assert fail_for_good(conn, job, "ValueError: late", owner="host:9:feedbeef") == set()
    assert assert_one_home(conn, [running]) == {running: "archived_jobs"}
    assert row(conn, "archived_jobs", running)["status"] == ArchivedStatus.CANCELLED  # type: ignore[index]
    assert admin.job(dsn, running).status is JobStatus.CANCELLED


def test_cancelled_and_redriven_jobs_can_be_found_in_bulk_by_the_api(conn, dsn):
    ids = bury(conn, 3)
    assert admin.redrive(dsn, DeadFilter(ids=tuple(ids))) == 3
    for job_id in ids:
        assert admin.cancel(dsn, job_id).redrive_count == 1
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}
