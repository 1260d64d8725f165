"""Dead-letter triage, write side: `pgjobs dead redrive / purge` and ``pgjobs.admin``. Every
batch is one transaction, so an interruption between or inside batches loses and duplicates
nothing; the redrive record travels with the job through every later move."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pytest

from pgjobs import App, admin, queries
from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError, JobNotFound, QueryFailed
from pgjobs.models import ArchivedStatus, DeadReason
from tests.support.admin_factories import (
    bury,
    claim_one,
    fail_for_good,
    ids_in,
    succeed,
)
from tests.support.factories import counts, db_now, row, work
from tests.support.helpers import assert_one_home, assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def test_redrive_one_job_gives_fresh_attempts_and_records_the_redrive(conn, dsn, capsys):
    (job_id, other) = bury(conn, 2)
    conn.execute("UPDATE dead_letter SET run_at = now() - interval '1 day'")
    before = db_now(conn)

    code, out, err = run(capsys, "dead", "redrive", str(job_id), "--dsn", dsn.url)

    assert (code, err) == (0, "")
    assert "redrove 1 dead job(s) in 1 batch(es)" in out
    assert assert_one_home(conn, [job_id, other]) == {job_id: "queued_jobs", other: "dead_letter"}
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    assert queued["attempts"] == 0 and queued["max_attempts"] == 3
    assert queued["run_at"] >= before, "ready now, not at its old run_at"
    assert queued["lease_owner"] is None and queued["lease_expires_at"] is None
    assert queued["redrive_count"] == 1 and queued["redriven_at"] >= before
    assert queued["payload"] == {"n": 0}
    assert queued["last_error"] == "ValueError: image 0 is corrupt", "the last error is kept"


def test_the_redrive_record_travels_with_the_job_through_every_move(conn, dsn):
    (job_id,) = bury(conn, 1)
    assert admin.redrive(dsn, DeadFilter(ids=(job_id,))) == 1

    # It fails for good again: back in dead_letter, still counted as redriven once.
    job = claim_one(conn, job_id)
    assert fail_for_good(conn, job, "ValueError: image 0 is corrupt") == {job_id}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None and dead["redrive_count"] == 1 and dead["redriven_at"] is not None

    # Redriven a second time, it succeeds: the archive keeps the record.
    assert admin.redrive(dsn, DeadFilter(ids=(job_id,))) == 1
    job = claim_one(conn, job_id)
    assert succeed(conn, job) == {job_id}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["status"], archived["redrive_count"]) == (ArchivedStatus.SUCCEEDED, 2)
    assert archived["redriven_at"] >= dead["redriven_at"]


def test_rescue_and_expiry_carry_the_record_and_the_replay_link(conn, dsn):
    rescued, expired = bury(conn, 2)
    assert admin.redrive(dsn, DeadFilter(ids=(rescued, expired))) == 2
    conn.execute("UPDATE queued_jobs SET replay_of = 7, max_attempts = 1")
    conn.execute(
        "UPDATE queued_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", [expired]
    )
    claim_one(conn, rescued)
    conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [rescued],
    )

    assert conn.execute(queries.JOB_RESCUE_EXPIRED_LEASES, {"limit": 10}).fetchone() == (0, 1)
    assert conn.execute(queries.JOB_EXPIRE_MANY, {"limit": 10}).fetchone() == (1,)

    dead = row(conn, "dead_letter", rescued)
    gone = row(conn, "archived_jobs", expired)
    assert dead is not None and gone is not None
    assert (dead["reason"], dead["redrive_count"], dead["replay_of"]) == (
        DeadReason.LEASE_EXPIRED,
        1,
        7,
    )
    assert (gone["status"], gone["redrive_count"], gone["replay_of"]) == (
        ArchivedStatus.EXPIRED,
        1,
        7,
    )


def test_redrive_many_ids_and_the_worker_runs_them(make_app, conn, dsn, capsys):
    app: App = make_app()
    runs: list[int] = []

    @app.task(name="images.resize", max_attempts=1)
    def resize(n: int) -> None:
        runs.append(n)

    ids = bury(conn, 5)
    code, out, _ = run(capsys, "dead", "redrive", str(ids[0]), str(ids[3]), "--dsn", dsn.url)
    assert code == 0 and "redrove 2 " in out
    assert work(app) == 0
    assert sorted(runs) == [0, 3]
    where = assert_one_home(conn, ids)
    assert [where[i] for i in ids] == [
        "archived_jobs",
        "dead_letter",
        "dead_letter",
        "archived_jobs",
        "dead_letter",
    ]


def test_named_ids_must_all_be_dead_or_nothing_moves(make_app, conn, dsn, capsys):
    ids = bury(conn, 2)
    queued = make_app(check_task_names=False).enqueue("t", {})

    code, _, err = run(capsys, "dead", "redrive", str(ids[0]), str(queued), "--dsn", dsn.url)
    assert_one_line_error(code, err, "not in dead_letter", str(queued), "nothing was changed")
    code, _, err = run(capsys, "dead", "redrive", "424242", "--dsn", dsn.url)
    assert_one_line_error(code, err, "no job 424242")
    assert code == 1
    assert ids_in(conn, "dead_letter", ids) == set(ids)
    with pytest.raises(JobNotFound):
        admin.redrive(dsn, DeadFilter(ids=(ids[1], queued)))
    assert ids_in(conn, "dead_letter", ids) == set(ids)


def test_redrive_by_filter_and_fingerprint_with_dry_run_first(conn, dsn, capsys):
    outage = bury(conn, 30, task="sync.push", error=lambda n: f"ConnectionError: host 10.0.0.{n}")
    bug = bury(conn, 4, task="sync.push", error=lambda n: f"KeyError: 'field{n}'")
    other = bury(conn, 3, task="mail.send", error=lambda n: f"ConnectionError: host 10.0.0.{n}")
    (group,) = [g for g in admin.dead_groups(dsn) if g.count == 30]

    code, out, err = run(
        capsys, "dead", "redrive", "--fingerprint", group.fingerprint_id, "--task", "sync.push",
        "--dry-run", "--dsn", dsn.url,
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert "would redrive 30 dead job(s)" in out and "ConnectionError: host <n>" in out
    assert counts(conn)["dead_letter"] == 37, "a dry run changes nothing"

    code, out, _ = run(
        capsys, "dead", "redrive", "--fingerprint", group.fingerprint_id, "--task", "sync.push",
        "--batch-size", "7", "--dsn", dsn.url,
    )  # fmt: skip
    assert code == 0
    assert "redrove 30 dead job(s) in 5 batch(es)" in out
    where = assert_one_home(conn, outage + bug + other)
    assert {where[i] for i in outage} == {"queued_jobs"}
    assert {where[i] for i in bug + other} == {"dead_letter"}

    code, out, _ = run(capsys, "dead", "redrive", "--error", "keyerror", "--dsn", dsn.url)
    assert code == 0 and "redrove 4 " in out
    code, out, _ = run(capsys, "dead", "redrive", "--queue", "nope", "--dsn", dsn.url)
    assert code == 0 and "nothing to redrive" in out


def test_redrive_without_ids_or_filter_needs_all(conn, dsn, make_app, capsys):
    ids = bury(conn, 3)
    code, _, err = run(capsys, "dead", "redrive", "--dsn", dsn.url)
    assert_one_line_error(code, err, "--all")
    with pytest.raises(ConfigurationError, match="everything=True"):
        make_app().redrive()
    assert ids_in(conn, "dead_letter", ids) == set(ids)

    code, out, _ = run(capsys, "dead", "redrive", "--all", "--dsn", dsn.url)
    assert code == 0 and "redrove 3 " in out
    assert ids_in(conn, "queued_jobs", ids) == set(ids)


def test_batches_interrupted_between_transactions_lose_and_duplicate_nothing(conn, dsn):
    ids = bury(conn, 250)
    selection = admin.select_dead(dsn, DeadFilter(task="images.resize"))
    assert selection.count == 250

    batches = admin.redrive_batches(dsn, selection, batch_size=100)
    first = next(batches)
    batches.close()  # Ctrl-C between batches

    assert first == ids[:100]
    where = assert_one_home(conn, ids)
    assert {i for i in ids if where[i] == "queued_jobs"} == set(first)

    # Running the same command again moves the rest, once each.
    moved = [i for batch in admin.redrive_batches(dsn, selection, batch_size=100) for i in batch]
    assert sorted(moved) == ids[100:]
    assert set(assert_one_home(conn, ids).values()) == {"queued_jobs"}
    assert conn.execute("SELECT max(redrive_count) FROM queued_jobs").fetchone() == (1,)


class InterruptedConnection:
    """A caller's connection on which Ctrl-C arrives right after the ``n``-th statement ran,
    before its transaction commits."""

    def __init__(self, conn: psycopg.Connection[Any], n: int) -> None:
        self._conn = conn
        self._left = n

    def transaction(self) -> Any:
        return self._conn.transaction()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self._conn.execute(*args, **kwargs)
        self._left -= 1
        if self._left == 0:
            raise KeyboardInterrupt
        return cursor


def test_an_interruption_inside_a_batch_rolls_the_whole_batch_back(conn, dsn):
    ids = bury(conn, 25)
    selection = admin.select_dead(dsn, DeadFilter())
    target: Any = InterruptedConnection(conn, 2)

    done = []
    with pytest.raises(KeyboardInterrupt):
        for batch in admin.redrive_batches(target, selection, batch_size=10):
            done.extend(batch)

    assert done == ids[:10]
    where = assert_one_home(conn, ids)
    assert {i for i in ids if where[i] == "queued_jobs"} == set(ids[:10])
    assert admin.redrive(dsn, DeadFilter()) == 15
    assert set(assert_one_home(conn, ids).values()) == {"queued_jobs"}


def test_ctrl_c_during_a_cli_redrive_reports_what_moved_and_exits_130(
    conn, dsn, capsys, monkeypatch
):
    ids = bury(conn, 50)
    real = admin.redrive_batches

    def interrupted_after_two(*args: Any, **kwargs: Any) -> Any:
        batches = real(*args, **kwargs)
        for n, batch in enumerate(batches):
            yield batch
            if n == 1:
                raise KeyboardInterrupt

    monkeypatch.setattr(admin, "redrive_batches", interrupted_after_two)
    code, out, err = run(capsys, "dead", "redrive", "--all", "--batch-size", "10", "--dsn", dsn.url)

    assert code == 130
    assert_one_line_error(code, err, "interrupted", "20 of 50", "no job is lost or duplicated")
    where = assert_one_home(conn, ids)
    assert {i for i in ids if where[i] == "queued_jobs"} == set(ids[:20])

    monkeypatch.setattr(admin, "redrive_batches", real)
    code, out, _ = run(capsys, "dead", "redrive", "--all", "--dsn", dsn.url)
    assert code == 0 and "redrove 30 " in out
    assert set(assert_one_home(conn, ids).values()) == {"queued_jobs"}


def test_a_failing_batch_moves_none_of_its_jobs(conn, dsn):
    ids = bury(conn, 5)
    # The third dead job's idempotency key is taken by a queued job (written by hand, as enqueue
    # would never allow it): re-inserting it breaks the unique index and fails the batch.
    conn.execute("UPDATE dead_letter SET idempotency_key = 'k' WHERE id = %s", [ids[2]])
    conn.execute("INSERT INTO queued_jobs (task, idempotency_key) VALUES ('t', 'k')")
    holder = conn.execute("SELECT id FROM queued_jobs").fetchone()
    assert holder is not None

    with pytest.raises(QueryFailed):
        admin.redrive(dsn, DeadFilter(), batch_size=5)

    assert ids_in(conn, "dead_letter", ids) == set(ids)
    assert_one_home(conn, [*ids, holder[0]])


def test_a_job_that_dies_again_during_the_redrive_is_not_picked_up_twice(conn, dsn):
    first, second = bury(conn, 2)
    selection = admin.select_dead(dsn, DeadFilter())
    batches = admin.redrive_batches(dsn, selection, batch_size=1)
    assert next(batches) == [first]

    # The outage is not over: the redriven job fails for good again at once.
    job = claim_one(conn, first)
    assert fail_for_good(conn, job, "ValueError: image 0 is corrupt") == {first}

    assert list(batches) == [[second]]
    where = assert_one_home(conn, [first, second])
    assert where == {first: "dead_letter", second: "queued_jobs"}
    assert row(conn, "dead_letter", first)["redrive_count"] == 1  # type: ignore[index]


def test_app_redrive_takes_ids_or_filters(make_app, conn, dsn):
    app: App = make_app()
    ids = bury(conn, 4, task="a")
    others = bury(conn, 2, task="b")
    assert app.redrive(ids[0]) == 1
    assert app.redrive(task="a", batch_size=2) == 3
    assert app.redrive(everything=True) == 2
    assert set(assert_one_home(conn, ids + others).values()) == {"queued_jobs"}


def test_purge_asks_first_and_refuses_without_a_terminal(conn, dsn, capsys, monkeypatch):
    ids = bury(conn, 12, task="old")
    keep = bury(conn, 2, task="new")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    code, _, err = run(capsys, "dead", "purge", "--task", "old", "--dsn", dsn.url)
    assert_one_line_error(code, err, "refusing to purge 12 dead job(s)", "--yes")
    assert counts(conn)["dead_letter"] == 14

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    code, out, _ = run(capsys, "dead", "purge", "--task", "old", "--dsn", dsn.url)
    assert code == 1 and "Delete 12 dead job(s) for good?" in out and "nothing purged" in out
    assert counts(conn)["dead_letter"] == 14

    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    code, out, _ = run(
        capsys, "dead", "purge", "--task", "old", "--batch-size", "5", "--dsn", dsn.url
    )
    assert code == 0 and "purged 12 dead job(s) in 3 batch(es)" in out
    assert_one_home(conn, keep)
    assert ids_in(conn, "dead_letter", ids) == set()


def test_purge_with_yes_dry_run_and_ids(conn, dsn, capsys):
    ids = bury(conn, 3)
    code, out, _ = run(capsys, "dead", "purge", str(ids[0]), "--dry-run", "--dsn", dsn.url)
    assert code == 0 and "would purge 1 dead job(s)" in out
    code, out, _ = run(capsys, "dead", "purge", str(ids[0]), "--yes", "--dsn", dsn.url)
    assert code == 0 and "purged 1 " in out
    assert_one_home(conn, ids[1:])
    code, _, err = run(capsys, "dead", "purge", "--yes", "--dsn", dsn.url)
    assert_one_line_error(code, err, "--all")
    assert admin.purge(dsn, DeadFilter()) == 2
    assert counts(conn)["dead_letter"] == 0


def test_two_operators_redriving_the_same_jobs_move_each_once(conn, dsn):
    ids = bury(conn, 30)
    first = admin.select_dead(dsn, DeadFilter(task="images.resize"))
    second = admin.select_dead(dsn, DeadFilter(error="corrupt"))
    assert first.ids == second.ids == tuple(ids)

    mine = admin.redrive_batches(dsn, first, batch_size=10)
    theirs = admin.redrive_batches(dsn, second, batch_size=10)
    moved = next(mine) + next(theirs) + [i for batch in mine for i in batch]
    moved += [i for batch in theirs for i in batch]

    assert sorted(moved) == ids, "every job moved exactly once"
    assert set(assert_one_home(conn, ids).values()) == {"queued_jobs"}
    assert conn.execute("SELECT max(redrive_count) FROM queued_jobs").fetchone() == (1,)
