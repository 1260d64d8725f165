"""Concurrency limits and rates, as the claim enforces them (``JOB_CLAIM_LIMITED`` and the rows
of ``pgjobs_limit_states``): per task and per queue, jobs held back stay ready, other tasks of the
queue are claimed past them, and a limit held by another claim is skipped, not waited for.

Each test plays the workers by hand with the runtime's own statements; the worker processes that
run limited tasks are in tests/acceptance/test_limits_workers.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import JobSpec, queries, queues
from pgjobs.completer import ClaimParams
from pgjobs.completer.outcomes import Outcomes
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.limits import LapsedLimits
from pgjobs.models import Job
from tests.integration.claiming.test_hot_path import trip
from tests.support.factories import claim, claim_limited, declared_task, run_service, settle
from tests.support.helpers import assert_one_home, scalar

SLOW = declared_task("t.slow", concurrency=3)
FAST = declared_task("t.fast")


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    yield
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgjobs_queues, pgjobs_limit_states")


def enqueue(app: Any, task_name: str, n: int, queue: str = "default") -> list[int]:
    return list(app.enqueue_many([JobSpec(task_name, {"n": i}, queue=queue) for i in range(n)]))


def tasks_of(jobs: list[Job]) -> Counter[str]:
    return Counter(job.task for job in jobs)


def held(conn: psycopg.Connection[Any], task_name: str) -> int:
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM queued_jobs WHERE limit_key = %s AND lease_expires_at IS NULL",
            [task_name],
        )
    )


def finish(conn: psycopg.Connection[Any], jobs: list[Job], owner: str = "fake-worker") -> None:
    outcomes = Outcomes(owner)
    for job in jobs:
        outcomes.succeed(job, None)
    assert settle(conn, outcomes) == {job.id for job in jobs}


def test_a_task_limit_caps_its_running_jobs_and_the_other_tasks_are_claimed(make_app, conn):
    app = make_app(check_task_names=False)
    slow = enqueue(app, "t.slow", 10)
    fast = enqueue(app, "t.fast", 5)

    jobs, status = claim_limited(conn, [SLOW, FAST], limit=20)

    assert tasks_of(jobs) == {"t.slow": 3, "t.fast": 5}
    # The slow jobs beyond the limit were met in the queue's range and held back: still ready.
    assert status.held == 7 and held(conn, "t.slow") == 7
    assert all(job.attempts == 1 for job in jobs)
    # At the limit: nothing more of t.slow, however many slots.
    fast += enqueue(app, "t.fast", 2)
    jobs2, status2 = claim_limited(conn, [SLOW, FAST], limit=20)
    assert tasks_of(jobs2) == {"t.fast": 2}
    assert status2.held == 0
    # One slow job ends: exactly one more starts, taken from the held-back ones, oldest first.
    finish(conn, [j for j in jobs if j.task == "t.slow"][:1])
    jobs3, _ = claim_limited(conn, [SLOW, FAST], limit=20)
    assert [j.id for j in jobs3] == [slow[3]]
    assert held(conn, "t.slow") == 6
    assert_one_home(conn, slow + fast)


def test_jobs_held_back_never_stand_in_front_of_the_queues_other_tasks(make_app, conn):
    app = make_app(check_task_names=False)
    slow = enqueue(app, "t.slow", 40)  # older: in front in the claim order
    fast = enqueue(app, "t.fast", 3)
    first, status = claim_limited(conn, [SLOW, FAST], limit=8)
    assert tasks_of(first) == {"t.slow": 3} and status.held == 5

    # Each claim holds back the slow jobs it meets (a batch at most), so the fast ones behind
    # are reached after a few claims; each claim says it held jobs back (claim again at once).
    claimed: list[Job] = []
    trips = 0
    while len(claimed) < 3:
        jobs, status = claim_limited(conn, [SLOW, FAST], limit=8)
        assert {j.task for j in jobs} <= {"t.fast"}
        assert status.held > 0 or jobs
        claimed += jobs
        trips += 1
        assert trips <= 6, "the fast jobs are reached within ceil(37 / 8) claims"
    assert sorted(j.id for j in claimed) == fast and held(conn, "t.slow") == 37

    # From now on the held-back jobs are out of the way: a new fast job is claimed at once.
    (newest,) = enqueue(app, "t.fast", 1)
    jobs, status = claim_limited(conn, [SLOW, FAST], limit=8)
    assert [j.id for j in jobs] == [newest] and status.held == 0
    assert_one_home(conn, slow + fast + [newest])


def test_a_claim_that_does_not_limit_the_task_passes_its_held_back_jobs_by(make_app, conn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.slow", 6)
    claim_limited(conn, [SLOW], limit=10)
    assert held(conn, "t.slow") == 3
    # JOB_CLAIM (a worker that limits nothing) reads the queue's range only.
    assert [j.task for j in claim(conn, limit=10)] == []


def test_the_jobs_a_claim_archives_no_longer_count_against_the_limit(dsn, make_app, conn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.slow", 5)
    params = ClaimParams.for_tasks("fake-worker", ["default"], [SLOW])
    running, _ = claim_limited(conn, [SLOW], limit=10)
    assert len(running) == 3
    outcomes = Outcomes("fake-worker")
    for job in running[:2]:
        outcomes.succeed(job, None)

    # One statement archives two and claims: they count no more, so two start.
    applied, _, claimed, status = trip(dsn, outcomes, limit=10, claim=params, limited=True)

    assert applied == {job.id for job in running[:2]}
    assert len(claimed) == 2 and status is not None and status.held == 0


def test_a_limit_another_claim_holds_is_skipped_not_waited_for(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.slow", 2)
    enqueue(app, "t.fast", 2)
    claim_limited(conn, [SLOW], limit=0)  # the limit's state exists from the first claim on
    with psycopg.connect(dsn.url) as other:  # a claim of another worker, in its transaction
        other.execute(
            "SELECT 1 FROM pgjobs_limit_states WHERE kind = 'task' AND name = 't.slow' FOR UPDATE"
        )
        jobs, status = claim_limited(conn, [SLOW, FAST], limit=10)
        assert tasks_of(jobs) == {"t.fast": 2}
        assert status.locked_out
        other.rollback()
    jobs, status = claim_limited(conn, [SLOW, FAST], limit=10)
    assert tasks_of(jobs) == {"t.slow": 2} and not status.locked_out


def test_a_claim_that_started_jobs_under_a_limit_records_it(make_app, conn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.slow", 2)
    claim_limited(conn, [SLOW], limit=0)  # creates the state
    state = "SELECT last_claim_at FROM pgjobs_limit_states WHERE kind = 'task' AND name = 't.slow'"
    assert scalar(conn, state) is None
    assert len(claim_limited(conn, [SLOW], limit=10)[0]) == 2
    stamp = scalar(
        conn,
        "SELECT last_claim_at FROM pgjobs_limit_states WHERE kind = 'task' AND name = 't.slow'",
    )
    assert stamp is not None


def test_a_rate_lets_a_bucketful_start_then_says_when_the_next_token_comes(make_app, conn):
    app = make_app(check_task_names=False)
    rated = declared_task("t.rated", rate="5/m")
    enqueue(app, "t.rated", 8)

    # The first claim under the rate creates its bucket (full), which the next claim can lock.
    jobs, status = claim_limited(conn, [rated], limit=10)
    assert jobs == [] and status.locked_out and status.held == 8
    jobs, status = claim_limited(conn, [rated], limit=10)
    assert len(jobs) == 5 and status.retry_in is None
    jobs2, status2 = claim_limited(conn, [rated], limit=10)
    assert jobs2 == []
    # An empty bucket refills at 5 a minute: the next token in about 12 seconds.
    assert status2.retry_in is not None and 11 < status2.retry_in <= 12
    assert held(conn, "t.rated") == 3  # held back, ready
    tokens = scalar(conn, "SELECT tokens FROM pgjobs_limit_states WHERE name = 't.rated'")
    assert 0 <= tokens < 0.1


def test_a_rate_counts_only_the_jobs_started(make_app, conn):
    app = make_app(check_task_names=False)
    rated = declared_task("t.rated", rate="10/h")
    enqueue(app, "t.rated", 2)
    claim_limited(conn, [rated], limit=10)  # creates the bucket
    jobs, _ = claim_limited(conn, [rated], limit=10)
    assert len(jobs) == 2
    tokens = scalar(conn, "SELECT tokens FROM pgjobs_limit_states WHERE name = 't.rated'")
    assert 7.99 < tokens <= 8.01


def test_a_queue_limit_holds_for_every_claim_and_a_claim_that_knows_none_skips_the_queue(
    make_app, conn, dsn
):
    app = make_app(check_task_names=False)
    enqueue(app, "t.fast", 4, queue="narrow")
    enqueue(app, "t.fast", 2, queue="wide")
    change = queues.limit(dsn, "narrow", concurrency=2)
    assert change.changed and change.queue.concurrency == 2 and change.queue.limited

    # A worker unaware of the limit claims the other queue only, and hears of the limit.
    params = ClaimParams("w1", ["narrow", "wide"])
    rows = conn.execute(queries.JOB_CLAIM, params.bind(10)).fetchall()
    assert sorted(r[1] for r in rows if r[0] is not None) == ["wide", "wide"]
    assert rows[-1][0] is None and rows[-1][3] == {"queue_limits": True}

    jobs, status = claim_limited(conn, [], queues=["narrow"], limit=10)
    assert len(jobs) == 2 and status.queue_limits
    assert claim_limited(conn, [], queues=["narrow"], limit=10)[0] == []
    finish(conn, jobs[:1])
    assert len(claim_limited(conn, [], queues=["narrow"], limit=10)[0]) == 1

    # Lifting the limit: the queue is claimed as any other again.
    assert queues.limit(dsn, "narrow", concurrency=None).changed
    assert [j.queue for j in claim(conn, queues=["narrow"], limit=10)] == ["narrow"]


def test_a_queue_rate_and_a_paused_queue(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.fast", 5, queue="metered")
    queues.limit(dsn, "metered", rate="2/h")
    jobs, status = claim_limited(conn, [], queues=["metered"], limit=10)
    assert len(jobs) == 2 and status.queue_limits
    jobs, status = claim_limited(conn, [], queues=["metered"], limit=10)
    assert jobs == [] and status.retry_in is not None and status.retry_in > 1000
    # A paused queue gives nothing to the limited claim either.
    queues.limit(dsn, "metered", rate=None)
    queues.pause(dsn, "metered")
    assert claim_limited(conn, [], queues=["metered"], limit=10)[0] == []
    queues.resume(dsn, "metered")
    assert len(claim_limited(conn, [], queues=["metered"], limit=10)[0]) == 3


def test_changing_a_queue_rate_starts_a_new_bucket(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.fast", 5, queue="metered")
    queues.limit(dsn, "metered", rate="1/h")
    assert len(claim_limited(conn, [], queues=["metered"], limit=10)[0]) == 1
    assert scalar(conn, "SELECT count(*) FROM pgjobs_limit_states") == 1
    change = queues.limit(dsn, "metered", rate="3/h")
    assert change.changed and (change.queue.rate_jobs, change.queue.rate_seconds) == (3, 3600.0)
    assert scalar(conn, "SELECT tokens FROM pgjobs_limit_states") == 3  # full again
    assert len(claim_limited(conn, [], queues=["metered"], limit=10)[0]) == 3
    # The same settings again change nothing (the bucket is not refilled).
    assert not queues.limit(dsn, "metered", rate="3/h").changed
    assert claim_limited(conn, [], queues=["metered"], limit=10)[0] == []
    # Removing the rate empties the bucket (the state stays, without tokens), and the queue is
    # claimed as any other again.
    assert queues.limit(dsn, "metered", rate=None).changed
    assert scalar(conn, "SELECT tokens FROM pgjobs_limit_states") is None
    assert len(claim(conn, queues=["metered"], limit=10)) == 1


def test_held_back_jobs_of_a_task_no_longer_limited_go_back_to_their_queue(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    enqueue(app, "t.slow", 6)
    claim_limited(conn, [SLOW], limit=10)
    assert held(conn, "t.slow") == 3

    # A worker whose code runs t.slow without a limit (a deploy removed it) gives them back.
    result = run_service(dsn, LapsedLimits(["default"], ["t.slow"]))
    assert result.released == 3 and held(conn, "t.slow") == 0
    assert len(claim(conn, limit=10)) == 3
