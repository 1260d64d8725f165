"""enqueue -> claim -> archive: the happy path, by hand and through a real Worker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pgjobs import App, JobSpec
from pgjobs.completer.outcomes import Outcomes
from pgjobs.models import DeadReason
from pgjobs.text import result_json
from tests.support.factories import claim, counts, row, settle, work
from tests.support.helpers import assert_one_home


def test_enqueue_writes_a_ready_row_with_defaults(make_app, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.any", {"a": 1})

    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    assert queued["queue"] == "default"
    assert queued["task"] == "t.any"
    assert queued["payload"] == {"a": 1}
    assert (queued["priority"], queued["attempts"], queued["max_attempts"]) == (0, 0, 5)
    assert queued["lease_owner"] is None and queued["lease_expires_at"] is None
    assert queued["expires_at"] is None and queued["idempotency_key"] is None
    assert_one_home(conn, [job_id])


def test_claim_leases_and_uses_an_attempt_then_success_archives(make_app, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.any", {"a": 1})

    [job] = claim(conn, owner="worker-1", lease=60)
    assert job.id == job_id
    assert job.attempts == 1
    assert job.lease_owner == "worker-1"
    assert job.payload == {"a": 1}
    leased = row(conn, "queued_jobs", job_id)
    assert leased is not None and leased["lease_expires_at"] is not None
    assert claim(conn, owner="worker-2") == [], "a leased job must not be claimed twice"

    outcomes = Outcomes("worker-1")
    outcomes.succeed(job, result_json({"sum": 3}))
    assert settle(conn, outcomes) == {job_id}

    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert archived["status"] == "succeeded"
    assert archived["result"] == {"sum": 3}
    assert archived["worker"] == "worker-1"
    assert archived["attempts"] == 1
    assert archived["payload"] == {"a": 1}
    assert archived["created_at"] == job.created_at
    assert archived["finished_at"] >= archived["created_at"]
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_worker_runs_sync_and_async_handlers_and_archives_every_job(make_app, conn):
    app: App = make_app()
    seen: list[tuple[str, int]] = []

    @app.task(name="t.double")
    def double(n: int) -> int:
        seen.append(("sync", n))
        return n * 2

    @app.task(name="t.adouble")
    async def adouble(n: int) -> dict[str, int]:
        await asyncio.sleep(0)
        seen.append(("async", n))
        return {"n": n * 2}

    @app.task(name="t.nothing")
    def nothing() -> None:
        seen.append(("none", 0))

    @app.task(name="t.odd_result")
    def odd_result() -> datetime:
        return datetime(2030, 1, 2, tzinfo=UTC)

    ids = app.enqueue_many(
        [JobSpec("t.double", {"n": n}) for n in range(10)]
        + [JobSpec("t.adouble", {"n": n}) for n in range(10)]
        + [JobSpec("t.nothing"), JobSpec("t.odd_result")]
    )
    assert len(set(ids)) == 22

    assert work(app, concurrency=4) == 0

    assert sorted(seen) == sorted(
        [("sync", n) for n in range(10)] + [("async", n) for n in range(10)] + [("none", 0)]
    )
    where = assert_one_home(conn, ids)
    assert set(where.values()) == {"archived_jobs"}
    results = dict(
        conn.execute(
            "SELECT id, result FROM archived_jobs WHERE status = 'succeeded' AND attempts = 1"
        ).fetchall()
    )
    assert len(results) == 22
    assert [results[i] for i in ids[:10]] == [n * 2 for n in range(10)]
    assert [results[i] for i in ids[10:20]] == [{"n": n * 2} for n in range(10)]
    assert results[ids[20]] is None, "a handler returning None stores no result"
    assert results[ids[21]] == "2030-01-02 00:00:00+00:00", "non-JSON results are kept as text"


def test_invariant_holds_across_every_outcome(make_app, conn):
    """One job per destination: each id stays in exactly one table, and nothing is lost."""
    app: App = make_app(check_task_names=False)
    ids = app.enqueue_many([JobSpec("t.x", {"i": i}) for i in range(4)])
    jobs = {job.id: job for job in claim(conn, owner="w", limit=4)}
    assert set(jobs) == set(ids)

    outcomes = Outcomes("w")
    outcomes.succeed(jobs[ids[0]], None)
    outcomes.retry(jobs[ids[1]], 3600, "ValueError: later")
    outcomes.bury(
        jobs[ids[2]], DeadReason.EXHAUSTED, "ValueError: dead", "builtins.ValueError", "tb"
    )
    outcomes.release(jobs[ids[3]], refund=True)
    assert settle(conn, outcomes) == set(ids)

    assert assert_one_home(conn, ids) == {
        ids[0]: "archived_jobs",
        ids[1]: "queued_jobs",
        ids[2]: "dead_letter",
        ids[3]: "queued_jobs",
    }
    assert counts(conn) == {"queued_jobs": 2, "archived_jobs": 1, "dead_letter": 1}
    released = row(conn, "queued_jobs", ids[3])
    assert released is not None
    assert released["attempts"] == 0, "a job given back before it started gets its attempt back"
    assert released["lease_owner"] is None
