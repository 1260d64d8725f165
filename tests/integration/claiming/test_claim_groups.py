"""Groups, as the claim takes them (``JOB_CLAIM_LIMITED``'s group steps and the rows of
``pgjobs_group_states``): a group's concurrency (a task's and a queue's), turns between groups,
ordered groups (released or held by a dead job), and the plain claim handing groups over.

Each test plays the workers by hand with the runtime's own statements; the worker processes are
in tests/acceptance/test_groups_workers.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import queries
from pgjobs.completer import ClaimParams
from pgjobs.completer.outcomes import Outcomes
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.groups import GroupRows
from pgjobs.models import DeadReason, Job
from tests.integration.claiming.test_hot_path import generic_plan
from tests.support.factories import claim, claim_limited, declared_task, run_service, settle
from tests.support.helpers import scalar

PAIRS = declared_task("g.pairs", group_concurrency=2)
FREE = declared_task("g.free")
ORDERED = declared_task("g.ordered", ordered=True)
HOLDING = declared_task("g.holding", ordered="hold")
ONE = declared_task("g.one", group_concurrency=1)


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    yield
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE pgjobs_queues, pgjobs_limit_states, pgjobs_group_states, pgjobs_groups"
        )


def enqueue(
    conn: psycopg.Connection[Any],
    task: str,
    group: str | None,
    n: int,
    *,
    priority: int = 0,
    queue: str = "default",
) -> list[int]:
    """``n`` jobs of ``task`` in ``group``, written as an enqueue writes them (the job, and its
    group's row)."""
    ids = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (queue, task, group_key, priority)"
            " SELECT %s, %s, %s, %s FROM generate_series(1, %s) RETURNING id",
            [queue, task, group, priority, n],
        )
    ]
    if group is not None:
        conn.execute(
            "INSERT INTO pgjobs_group_states (queue, group_key) VALUES (%s, %s)"
            " ON CONFLICT (queue, group_key) DO UPDATE SET touched_at = clock_timestamp()",
            [queue, group],
        )
    return ids


def groups_of(jobs: list[Job]) -> Counter[str | None]:
    return Counter(job.group_key for job in jobs)


def finish(conn: psycopg.Connection[Any], jobs: list[Job]) -> None:
    outcomes = Outcomes("fake-worker")
    for job in jobs:
        outcomes.succeed(job, None)
    assert settle(conn, outcomes) == {job.id for job in jobs}


def test_a_tasks_group_concurrency_caps_each_groups_running_jobs(conn):
    enqueue(conn, "g.pairs", "a", 10)
    enqueue(conn, "g.pairs", "b", 10)
    jobs, _ = claim_limited(conn, [PAIRS], limit=20)
    assert groups_of(jobs) == {"a": 2, "b": 2}
    # At their limit: nothing more of either group, however many slots.
    again, _ = claim_limited(conn, [PAIRS], limit=20)
    assert again == []
    # One of a's jobs ends: exactly one more of a starts.
    finish(conn, [j for j in jobs if j.group_key == "a"][:1])
    third, _ = claim_limited(conn, [PAIRS], limit=20)
    assert groups_of(third) == {"a": 1}
    # The jobs held back are still ready, not moved anywhere.
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE lease_expires_at IS NULL") == 15


def test_a_queues_group_concurrency_caps_every_task_of_a_group(conn):
    conn.execute("INSERT INTO pgjobs_queues (name, group_concurrency) VALUES ('default', 1)")
    enqueue(conn, "g.free", "a", 5)
    enqueue(conn, "g.pairs", "a", 5)
    enqueue(conn, "g.free", "b", 5)
    jobs, _ = claim_limited(conn, [FREE, PAIRS], limit=20)
    assert groups_of(jobs) == {"a": 1, "b": 1}


def test_groups_take_turns_and_a_huge_group_does_not_starve_the_others(conn):
    enqueue(conn, "g.free", "huge", 2000)  # oldest, and by far the largest
    small = [enqueue(conn, "g.free", f"small-{i}", 1)[0] for i in range(12)]
    claimed: list[Job] = []
    for _ in range(4):
        jobs, _ = claim_limited(conn, [FREE], limit=4)
        claimed += jobs
    # Four claims of four: every small group's job (each group looked at gets a share of the
    # claim: a quarter while there are four or more), the huge group no more than its turns.
    assert set(small) <= {j.id for j in claimed}
    assert groups_of(claimed)["huge"] <= 3


def test_ungrouped_jobs_take_their_turn_beside_the_groups(conn):
    grouped = enqueue(conn, "g.free", "huge", 100)
    plain = enqueue(conn, "g.free", None, 3)
    jobs, _ = claim_limited(conn, [FREE], limit=4)
    ids = {j.id for j in jobs}
    assert set(plain) <= ids and len(ids & set(grouped)) == 1


def test_an_ordered_group_runs_one_job_at_a_time_in_enqueue_order_whatever_the_priority(conn):
    first = enqueue(conn, "g.ordered", "a", 1)
    later = enqueue(conn, "g.ordered", "a", 3, priority=10)  # higher priority, enqueued after
    other = enqueue(conn, "g.ordered", "b", 1)
    jobs, _ = claim_limited(conn, [ORDERED], limit=10)
    assert sorted(j.id for j in jobs) == sorted(first + other)
    # The head runs: the group is held.
    assert claim_limited(conn, [ORDERED], limit=10)[0] == []
    finish(conn, jobs)
    for expected in later:
        (job,), _ = claim_limited(conn, [ORDERED], limit=10)
        assert job.id == expected
        finish(conn, [job])


def test_a_retry_holds_an_ordered_group_and_a_dead_job_releases_it(conn):
    head, second = enqueue(conn, "g.ordered", "a", 2)
    (job,), _ = claim_limited(conn, [ORDERED], limit=10)
    assert job.id == head
    outcomes = Outcomes("fake-worker")
    outcomes.retry(job, 0.0, "boom")  # back in queued_jobs, ready again at once
    settle(conn, outcomes)
    (again,), _ = claim_limited(conn, [ORDERED], limit=10)
    assert again.id == head and again.attempts == 2  # not the second: order kept across retries
    outcomes = Outcomes("fake-worker")
    outcomes.bury(again, DeadReason.NON_RETRYABLE, "no", "ValueError")
    settle(conn, outcomes)
    (nxt,), _ = claim_limited(conn, [ORDERED], limit=10)
    assert nxt.id == second


def test_a_holding_ordered_group_waits_while_its_dead_job_is_in_dead_letter(conn):
    head, second = enqueue(conn, "g.holding", "a", 2)
    (job,), _ = claim_limited(conn, [HOLDING], limit=10)
    outcomes = Outcomes("fake-worker")
    outcomes.bury(job, DeadReason.NON_RETRYABLE, "no", "ValueError")
    settle(conn, outcomes)
    assert claim_limited(conn, [HOLDING], limit=10)[0] == []
    conn.execute("DELETE FROM dead_letter WHERE id = %s", [head])  # purged: released
    (nxt,), _ = claim_limited(conn, [HOLDING], limit=10)
    assert nxt.id == second


def test_the_plain_claim_leaves_groups_to_the_limited_claim_and_says_so(conn):
    plain = enqueue(conn, "g.free", None, 2)
    enqueue(conn, "g.free", "a", 2)
    params = ClaimParams("fake-worker", ["default"])
    rows = conn.execute(queries.JOB_CLAIM, params.bind(10)).fetchall()
    assert sorted(r[0] for r in rows if r[0] is not None) == plain
    assert rows[-1][0] is None and rows[-1][3] == {"queue_limits": True}
    assert claim(conn, limit=10) == []


def test_group_rows_follow_the_groups_that_hold_jobs(dsn, conn):
    enqueue(conn, "g.free", "busy", 1)
    enqueue(conn, "g.free", "idle", 1)
    conn.execute("DELETE FROM queued_jobs WHERE group_key = 'idle'")  # its jobs are done
    # A job whose group has no row (hand-written SQL): the next round writes the row.
    conn.execute("INSERT INTO queued_jobs (task, group_key) VALUES ('g.free', 'orphan')")
    service = GroupRows(["default"])
    service.idle = 0.0
    tidied = run_service(dsn, service)
    assert (tidied.removed, tidied.restored) == (1, 1)
    rows = conn.execute("SELECT group_key FROM pgjobs_group_states ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["busy", "orphan"]
    # The rows of every queue follow: the idle group's is gone with its last queue's row.
    rows = conn.execute("SELECT group_key FROM pgjobs_groups ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["busy", "orphan"]
    # A group seen recently keeps its row, even without jobs.
    conn.execute("DELETE FROM queued_jobs WHERE group_key = 'busy'")
    assert run_service(dsn, GroupRows(["default"])).removed == 0
    (orphan,) = [j for j in claim_limited(conn, [FREE], limit=10)[0] if j.group_key == "orphan"]
    assert orphan.task == "g.free"


def test_the_group_claims_generic_plan_probes_each_groups_range_never_the_whole_queue(conn):
    # One group holding a large backlog beside many small ones: a benchmark run once saw an
    # EXISTS test of a group's ready jobs planned as a scan of the queue's every ready job
    # (11 ms a claim at 50,000 jobs); the test is now a scalar subquery, never planned as a join.
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, group_key) SELECT 'default', 'g.pairs', 'whale' "
        "FROM generate_series(1, 50000)"
    )
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, group_key) SELECT 'default', 'g.pairs', 'g-' || i "
        "FROM generate_series(1, 1000) i, generate_series(1, 20)"
    )
    conn.execute(
        "INSERT INTO pgjobs_group_states (queue, group_key)"
        " SELECT DISTINCT queue, group_key FROM queued_jobs"
    )
    conn.execute("VACUUM ANALYZE queued_jobs")
    conn.execute("VACUUM ANALYZE pgjobs_group_states")
    params = ClaimParams.for_tasks("fake-worker", ["default"], [PAIRS, ORDERED]).bind(
        32, limited=True
    )
    params.update(ok_ids="{}", ok_attempts="{}", ok_results=None)
    plan = generic_plan(conn, queries.JOB_SUCCEED_AND_CLAIM_LIMITED, params)
    assert "Seq Scan on queued_jobs" not in plan, plan
    assert "Index Scan using ix_queued_jobs_group_ready on queued_jobs" in plan, plan


# A task's group limit and order hold per (task, group), whatever queues its jobs are in and
# whichever queues each worker serves (docs/guides/fairness.md); a queue's --group-concurrency
# holds per (queue, group).


@pytest.mark.parametrize("task", [PAIRS, ONE, ORDERED], ids=lambda t: t.name)
def test_a_tasks_group_limit_holds_across_queues_whichever_queues_a_worker_serves(conn, task):
    cap = 1 if task.ordered else task.group_concurrency
    for queue in ("east", "west"):
        enqueue(conn, task.name, "a", 3, queue=queue)
        enqueue(conn, task.name, f"only-{queue}", 1, queue=queue)
    # One worker per queue: the first takes up to the limit, the second none of the group.
    east, _ = claim_limited(conn, [task], queues=["east"], limit=10)
    west, _ = claim_limited(conn, [task], queues=["west"], limit=10)
    assert groups_of(east) == {"a": cap, "only-east": 1}
    assert groups_of(west) == {"only-west": 1}
    # One worker serving both: nothing more of the group either.
    both, _ = claim_limited(conn, [task], queues=["east", "west"], limit=10)
    assert groups_of(both)["a"] == 0
    # One of its jobs ends: one more starts, in whichever queue holds its next job.
    finish(conn, [j for j in east if j.group_key == "a"][:1])
    more, _ = claim_limited(conn, [task], queues=["west", "east"], limit=10)
    assert groups_of(more) == {"a": 1}
    running = "SELECT count(*) FROM queued_jobs WHERE group_key = 'a' AND lease_owner IS NOT NULL"
    assert scalar(conn, running) == cap


def test_an_ordered_groups_head_is_its_oldest_job_in_every_queue(conn):
    (first,) = enqueue(conn, "g.ordered", "a", 1, queue="east")
    (second,) = enqueue(conn, "g.ordered", "a", 1, queue="west")
    (third,) = enqueue(conn, "g.ordered", "a", 1, queue="east")
    # A worker of the west queue only: the group's oldest job waits in east, so nothing starts.
    assert claim_limited(conn, [ORDERED], queues=["west"])[0] == []
    (job,), _ = claim_limited(conn, [ORDERED], queues=["east"])
    assert job.id == first
    finish(conn, [job])
    # East's next job is not the group's next: west's is.
    assert claim_limited(conn, [ORDERED], queues=["east"])[0] == []
    (job,), _ = claim_limited(conn, [ORDERED], queues=["west", "east"])
    assert job.id == second
    assert claim_limited(conn, [ORDERED], queues=["east"])[0] == []
    finish(conn, [job])
    (job,), _ = claim_limited(conn, [ORDERED], queues=["east", "west"])
    assert job.id == third


def test_a_queues_group_concurrency_stays_per_queue(conn):
    conn.execute(
        "INSERT INTO pgjobs_queues (name, group_concurrency) VALUES ('east', 1), ('west', 1)"
    )
    for queue in ("east", "west"):
        enqueue(conn, "g.free", "a", 3, queue=queue)
    jobs, _ = claim_limited(conn, [FREE], queues=["east", "west"], limit=10)
    assert Counter(j.queue for j in jobs) == {"east": 1, "west": 1}


@pytest.mark.parametrize("task", [ONE, ORDERED], ids=lambda t: t.name)
def test_concurrent_claims_in_two_queues_start_one_job_of_a_limited_group(dsn, conn, task):
    for queue in ("east", "west"):
        enqueue(conn, task.name, "a", 2, queue=queue)
    with (
        psycopg.connect(dsn.url) as east_worker,
        psycopg.connect(dsn.url) as west_worker,
    ):
        # The east claim has started the group's job and not committed yet: the west claim,
        # meanwhile, must not count the group's running jobs as none.
        east, _ = claim_limited(east_worker, [task], queues=["east"])
        west, _ = claim_limited(west_worker, [task], queues=["west"])
        assert len(east) == 1 and west == []
        west_worker.rollback()
        east_worker.commit()
        # Committed since: the group's running job counts, in every queue.
        assert claim_limited(west_worker, [task], queues=["west"])[0] == []
        west_worker.commit()
    running = "SELECT count(*) FROM queued_jobs WHERE lease_owner IS NOT NULL"
    assert scalar(conn, running) == 1


@pytest.mark.parametrize("task", [ONE, ORDERED], ids=lambda t: t.name)
def test_a_force_cancelled_job_keeps_its_groups_place_until_its_handler_ends(dsn, conn, task):
    """`pgjobs cancel --force` archives a running job at once, but its handler may run on (a
    sync one cannot be stopped): its place in the group is kept until its worker ends the
    attempt's lease, or the lease runs out."""
    first, second, third = enqueue(conn, task.name, "a", 3)
    (job,), _ = claim_limited(conn, [task])
    assert job.id == first
    assert conn.execute(queries.JOB_CANCEL, {"id": first, "force": True}).fetchall()
    assert claim_limited(conn, [task], owner="other-worker")[0] == []

    def end_lease(owner: str, job: Job) -> list[int]:
        params = {"owner": owner, "ids": [job.id], "attempts": [job.attempts], "seconds": [0.0]}
        return [int(r[0]) for r in conn.execute(queries.JOB_EXTEND_LEASES, params)]

    assert end_lease("other-worker", job) == []  # only the cancelled attempt's worker may
    assert claim_limited(conn, [task], owner="other-worker")[0] == []
    assert end_lease("fake-worker", job) == [first]
    (nxt,), _ = claim_limited(conn, [task], owner="other-worker")
    assert nxt.id == second
    # A worker that never says (killed): the place is kept only while the lease runs.
    assert conn.execute(queries.JOB_CANCEL, {"id": second, "force": True}).fetchall()
    assert claim_limited(conn, [task])[0] == []
    conn.execute("UPDATE pgjobs_group_holds SET lease_expires_at = now() - interval '1 second'")
    (last,), _ = claim_limited(conn, [task])
    assert last.id == third
    run_service(dsn, GroupRows(["default"]))
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_holds") == 0
