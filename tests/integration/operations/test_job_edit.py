"""Editing a queued job (``pgjobs.editing``): each field, the record of the edit, the payload
checked against the handler and its version, every refusal writing nothing, a job waiting for
its dependencies, the fence against a concurrent claim, and the record's end with the job."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, admin, editing
from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError, InvalidPayload, JobNotFound, JobStateConflict
from pgjobs.models import JobStatus
from tests.support.admin_factories import bury, claim_one, succeed
from tests.support.factories import claim, row
from tests.support.helpers import assert_one_home, count, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="billing.charge", version=2, upgrade={1: lambda p: p})
    def charge(order: int, cents: int) -> None:
        """A typed, versioned handler."""

    @app.task(name="plain")
    def plain(**kwargs: Any) -> None:
        """Takes anything."""

    return app


def _snapshot(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    found = row(conn, "queued_jobs", job_id)
    return found


def test_each_field_is_changed_and_the_edit_recorded(app, conn, dsn) -> None:
    job = app.enqueue("billing.charge", {"order": 1, "cents": 100}, tags=["a"])
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

    done = editing.edit(
        dsn,
        job,
        priority=7,
        run_at=at,
        payload={"order": 1, "cents": 250},
        max_attempts=9,
        tags=["b", "c"],
        by="ops@example.com",
        tasks=app.tasks,
    )

    stored = row(conn, "queued_jobs", job)
    assert stored is not None
    assert (stored["priority"], stored["run_at"], stored["max_attempts"]) == (7, at, 9)
    assert (stored["payload"], stored["tags"]) == ({"order": 1, "cents": 250}, ["b", "c"])
    assert stored["payload_version"] == 2
    assert done.job.status is JobStatus.SCHEDULED and done.job.priority == 7
    assert done.edit is not None and done.edit.edited_by == "ops@example.com"
    assert done.edit.changes == {
        "priority": {"old": 0, "new": 7},
        "run_at": {"old": done.edit.changes["run_at"]["old"], "new": at.isoformat()},
        "payload": {"old": {"order": 1, "cents": 100}, "new": {"order": 1, "cents": 250}},
        "max_attempts": {"old": 5, "new": 9},
        "tags": {"old": ["a"], "new": ["b", "c"]},
    }
    assert editing.edits(dsn, job) == (done.edit,)


def test_one_field_alone_and_tags_removed(app, conn, dsn) -> None:
    job = app.enqueue("plain", {}, tags=["x"])
    editing.edit(dsn, job, priority=-3)
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job]) == -3
    editing.edit(dsn, job, tags=[])
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [job]) is None
    editing.edit(dsn, job, run_in=0)
    assert app.job(job).status is JobStatus.READY
    (first, second, third) = editing.edits(dsn, job)
    assert first.changes == {"priority": {"old": 0, "new": -3}}
    assert second.changes == {"tags": {"old": ["x"], "new": None}}
    assert set(third.changes) == {"run_at"}
    # The database role, when no one is named.
    assert first.edited_by == scalar(conn, "SELECT current_user")


def test_an_edit_that_changes_nothing_records_nothing(app, conn, dsn) -> None:
    job = app.enqueue("plain", {"a": 1}, priority=4)
    done = editing.edit(dsn, job, priority=4, payload={"a": 1}, tasks=app.tasks)
    assert done.edit is None
    assert count(conn, "pgjobs_job_edits") == 0


def test_the_payload_is_checked_against_the_handler(app, conn, dsn) -> None:
    job = app.enqueue("billing.charge", {"order": 1, "cents": 100})
    before = _snapshot(conn, job)
    with pytest.raises(InvalidPayload) as wrong_type:
        editing.edit(dsn, job, payload={"order": 1, "cents": "ten"}, tasks=app.tasks)
    assert wrong_type.value.field == "payload.cents"
    with pytest.raises(InvalidPayload) as unknown_key:
        editing.edit(dsn, job, payload={"order": 1, "cents": 1, "x": 2}, tasks=app.tasks)
    assert "x" in str(unknown_key.value)
    with pytest.raises(InvalidPayload):
        editing.edit(dsn, job, payload={"order": "\x00"}, tasks=app.tasks)
    with pytest.raises(InvalidPayload):
        editing.edit(dsn, job, payload=[1, 2], tasks=app.tasks)  # type: ignore[arg-type]
    assert _snapshot(conn, job) == before
    assert count(conn, "pgjobs_job_edits") == 0


def test_a_new_payload_takes_the_tasks_version_and_without_the_app_keeps_the_jobs(
    app, conn, dsn
) -> None:
    job = app.enqueue("billing.charge", {"order": 1, "cents": 100})
    conn.execute("UPDATE queued_jobs SET payload_version = NULL WHERE id = %s", [job])
    editing.edit(dsn, job, payload={"order": 2, "cents": 5}, tasks=app.tasks)
    assert scalar(conn, "SELECT payload_version FROM queued_jobs WHERE id = %s", [job]) == 2

    conn.execute("UPDATE queued_jobs SET payload_version = 3 WHERE id = %s", [job])
    editing.edit(dsn, job, payload={"order": 3, "cents": 5})
    assert scalar(conn, "SELECT payload_version FROM queued_jobs WHERE id = %s", [job]) == 3


def test_a_task_the_app_does_not_register_is_refused(app, conn, dsn) -> None:
    other: App = App(dsn.url, check_task_names=False)
    try:
        job = other.enqueue("elsewhere", {"a": 1})
    finally:
        other.close()
    with pytest.raises(Exception, match="unknown task"):
        editing.edit(dsn, job, payload={"a": 2}, tasks=app.tasks)
    assert count(conn, "pgjobs_job_edits") == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, None),
        ({"priority": 40_000}, "priority"),
        ({"priority": True}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at"),
        ({"run_at": datetime(2030, 1, 1, tzinfo=UTC), "run_in": 5}, "run_in"),
        ({"run_in": -1}, "run_in"),
        ({"tags": "a"}, "tags"),
        ({"tags": [""]}, "tags[0]"),
        ({"by": "x" * 2000, "priority": 1}, "by"),
    ],
)
def test_bad_input_is_refused_naming_the_field(app, conn, dsn, options, field) -> None:
    job = app.enqueue("plain", {})
    before = _snapshot(conn, job)
    with pytest.raises(ConfigurationError) as refused:
        editing.edit(dsn, job, **options)
    assert refused.value.field == field
    assert "\n" not in str(refused.value)
    assert _snapshot(conn, job) == before and count(conn, "pgjobs_job_edits") == 0


def test_refusals_name_the_state_and_write_nothing(app, conn, dsn) -> None:
    running = app.enqueue("plain", {})
    claim_one(conn, running, owner="host:1:w")
    finished = app.enqueue("plain", {})
    succeed(conn, claim_one(conn, finished))
    (dead,) = bury(conn, 1)
    before = _snapshot(conn, running)

    with pytest.raises(JobStateConflict, match="running on worker host:1:w"):
        editing.edit(dsn, running, priority=1)
    with pytest.raises(JobStateConflict, match=r"succeeded \(in archived_jobs\)"):
        editing.edit(dsn, finished, priority=1)
    with pytest.raises(JobStateConflict, match=r"dead \(in dead_letter\).*redrive"):
        editing.edit(dsn, dead, priority=1)
    with pytest.raises(JobNotFound, match="no job 999999"):
        editing.edit(dsn, 999_999, priority=1)
    assert _snapshot(conn, running) == before
    assert count(conn, "pgjobs_job_edits") == 0
    assert_one_home(conn, [running, finished, dead])


def test_max_attempts_must_leave_an_attempt(app, conn, dsn) -> None:
    job = app.enqueue("plain", {}, max_attempts=5)
    conn.execute("UPDATE queued_jobs SET attempts = 3 WHERE id = %s", [job])
    with pytest.raises(ConfigurationError, match="at least 4") as refused:
        editing.edit(dsn, job, max_attempts=3)
    assert refused.value.field == "max_attempts"
    editing.edit(dsn, job, max_attempts=4)
    assert scalar(conn, "SELECT max_attempts FROM queued_jobs WHERE id = %s", [job]) == 4


def test_a_job_held_by_another_transaction_is_refused_at_once(app, conn, dsn) -> None:
    job = app.enqueue("plain", {})
    with psycopg.connect(dsn.url) as holder:
        holder.execute("SELECT 1 FROM queued_jobs WHERE id = %s FOR UPDATE", [job])
        with pytest.raises(JobStateConflict, match="held by another transaction"):
            editing.edit(dsn, job, priority=3)
        holder.rollback()
    assert count(conn, "pgjobs_job_edits") == 0
    editing.edit(dsn, job, priority=3)


def test_a_claim_in_flight_wins_and_the_edit_is_refused(app, conn, dsn) -> None:
    job = app.enqueue("plain", {"v": 1})
    with psycopg.connect(dsn.url) as worker:
        (claimed,) = claim(worker, limit=1)  # its transaction is still open
        with pytest.raises(JobStateConflict):
            editing.edit(dsn, job, payload={"v": 2})
        worker.commit()
    with pytest.raises(JobStateConflict, match="running"):
        editing.edit(dsn, job, payload={"v": 2})
    assert claimed.payload == {"v": 1}
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [job]) == {"v": 1}


def _race(worker: psycopg.Connection[Any], dsn: Any, job: int, queue: str) -> tuple[Any, Any]:
    """A claim of ``queue`` on ``worker`` and an edit of ``job``'s payload, started together:
    (the jobs claimed, the edit or its refusal)."""
    start = threading.Barrier(2)
    claimed: list[Any] = []
    outcome: list[Any] = []

    def claimer() -> None:
        start.wait()
        claimed.extend(claim(worker, queues=[queue], limit=1))

    def editor() -> None:
        start.wait()
        try:
            outcome.append(editing.edit(dsn, job, payload={"v": 1}))
        except JobStateConflict as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=claimer), threading.Thread(target=editor)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return claimed, outcome[0]


def test_an_edit_and_a_claim_racing_never_both_win(app, conn, dsn) -> None:
    wins = {"edit": 0, "claim": 0}
    with psycopg.connect(dsn.url, autocommit=True) as worker:
        for n in range(40):
            job = app.enqueue("plain", {"v": 0}, queue=f"race{n}")
            claimed, outcome = _race(worker, dsn, job, f"race{n}")
            stored = scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [job])
            recorded = scalar(
                conn, "SELECT count(*) FROM pgjobs_job_edits WHERE job_id = %s", [job]
            )
            if isinstance(outcome, editing.Edited):
                wins["edit"] += 1
                # The edit committed first: a claim that took the job took it edited.
                assert (stored, recorded) == ({"v": 1}, 1)
                assert all(j.payload == {"v": 1} for j in claimed)
            else:
                wins["claim"] += 1
                assert [j.id for j in claimed] == [job], outcome
                assert (stored, recorded, claimed[0].payload) == ({"v": 0}, 0, {"v": 0})
    assert sum(wins.values()) == 40


def test_a_waiting_jobs_run_time_is_kept_for_its_release(app, conn, dsn) -> None:
    first = app.enqueue("plain", {})
    waiting = app.enqueue("plain", {}, after=[first])
    at = datetime(2031, 5, 6, tzinfo=UTC)
    done = editing.edit(dsn, waiting, run_at=at, priority=2)
    assert done.job.status is JobStatus.WAITING
    assert scalar(conn, "SELECT run_at FROM pgjobs_waiting WHERE job_id = %s", [waiting]) == at
    assert scalar(conn, "SELECT run_at = 'infinity' FROM queued_jobs WHERE id = %s", [waiting])
    assert done.edit is not None and done.edit.changes["run_at"]["new"] == at.isoformat()

    succeed(conn, claim_one(conn, first))
    assert scalar(conn, "SELECT run_at FROM queued_jobs WHERE id = %s", [waiting]) == at


def test_the_record_follows_the_job_and_goes_when_it_is_purged_or_pruned(app, conn, dsn) -> None:
    job = app.enqueue("plain", {})
    editing.edit(dsn, job, priority=1, by="me")
    succeed(conn, claim_one(conn, job))
    assert [e.edited_by for e in editing.edits(dsn, job)] == ["me"]  # archived: still there

    (dead,) = bury(conn, 1)
    conn.execute(
        "INSERT INTO pgjobs_job_edits (job_id, edited_by, changes) VALUES (%s, 'x', '{}')", [dead]
    )
    admin.purge(dsn, DeadFilter(ids=(dead,)))
    assert editing.edits(dsn, dead) == ()

    conn.execute("DELETE FROM archived_jobs WHERE id = %s", [job])  # as a pruned partition
    assert editing.forget_gone(dsn) == 1
    assert editing.edits(dsn, job) == ()


def test_an_edited_job_runs_with_its_new_fields(app, conn, dsn) -> None:
    job = app.enqueue("billing.charge", {"order": 1, "cents": 100}, run_in=3600)
    editing.edit(dsn, job, payload={"order": 1, "cents": 7}, run_in=0, tasks=app.tasks)
    (taken,) = claim(conn, limit=1)
    assert (taken.id, taken.payload) == (job, {"order": 1, "cents": 7})
    assert taken.run_at <= datetime.now(UTC) + timedelta(seconds=5)


def test_app_edit_checks_the_payload_with_its_own_handlers(app, conn) -> None:
    job = app.enqueue("billing.charge", {"order": 1, "cents": 100})
    with pytest.raises(InvalidPayload):
        app.edit(job, payload={"order": 1, "cents": "x"})
    assert app.edit(job, priority=3, by="alice").priority == 3
    assert (
        scalar(conn, "SELECT edited_by FROM pgjobs_job_edits WHERE job_id = %s", [job]) == "alice"
    )
