"""Group rates, as the claim holds them (``JOB_CLAIM_LIMITED`` with ``pgjobs_group_starts``): at
most N starts of one group per period, a task's per (task, group) in every queue and a queue's
per (queue, group), in a sliding window; with group concurrency, ordered groups, throttled unique
keys and jobs without a group.

The claims are played by hand with the runtime's own statements; the clock is moved by moving the
recorded starts back (``age``), never by waiting. Two worker processes hold a rate in
tests/acceptance/test_group_rates_workers.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

from pgjobs import queries, queues
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.groups import GroupRows
from pgjobs.models import Job
from tests.integration.claiming.test_claim_groups import enqueue, finish, groups_of
from tests.support.factories import claim_limited, declared_task, run_service
from tests.support.helpers import scalar

RATED = declared_task("r.rated", group_rate="3/m")
FREE = declared_task("r.free")
ONE_RATED = declared_task("r.one", group_concurrency=1, group_rate="2/m")
ORDERED_RATED = declared_task("r.ordered", ordered=True, group_rate="2/m")


def age(conn: psycopg.Connection[Any], seconds: float) -> None:
    """The clock moves ``seconds`` on, as far as the group rates can tell: every recorded start
    is that much older."""
    conn.execute(
        "UPDATE pgjobs_group_starts SET started_at = started_at - %s * interval '1 second'",
        [seconds],
    )


def claim_all(conn: psycopg.Connection[Any], tasks: list[Any], **options: Any) -> list[Job]:
    """Claim (and finish) until a claim takes nothing: every job the limits let start now."""
    taken: list[Job] = []
    while True:
        jobs, _ = claim_limited(conn, tasks, limit=options.pop("limit", 10), **options)
        if not jobs:
            return taken
        finish(conn, jobs)
        taken += jobs


def test_a_tasks_group_rate_caps_each_groups_starts_per_period_and_leaves_ungrouped_jobs(conn):
    enqueue(conn, "r.rated", "a", 10)
    enqueue(conn, "r.rated", "b", 10)
    enqueue(conn, "r.rated", None, 5)
    enqueue(conn, "r.free", "a", 4)
    started = claim_all(conn, [RATED, FREE])
    assert Counter((j.task, j.group_key) for j in started) == {
        ("r.rated", "a"): 3,
        ("r.rated", "b"): 3,
        ("r.rated", None): 5,  # no group: not limited
        ("r.free", "a"): 4,  # another task's jobs of the group: not limited
    }
    _, status = claim_limited(conn, [RATED, FREE])
    # Held for about a minute: the worker is told when to claim again.
    assert status.retry_in is not None and 55 < status.retry_in <= 60
    age(conn, 61)
    assert groups_of(claim_all(conn, [RATED])) == {"a": 3, "b": 3}


def test_the_window_slides_a_start_leaves_it_one_period_after_it(conn):
    enqueue(conn, "r.rated", "a", 10)
    (first, second), _ = claim_limited(conn, [RATED], limit=2)
    finish(conn, [first, second])
    age(conn, 40)
    assert len(claim_all(conn, [RATED])) == 1  # 2 forty seconds ago: one more in this minute
    age(conn, 21)  # the first two are 61 s old, the third 21 s
    assert len(claim_all(conn, [RATED])) == 2
    age(conn, 39.5)  # the third is 60.5 s old, the last two 39.5 s
    assert len(claim_all(conn, [RATED])) == 1
    counts = scalar(conn, "SELECT sum(jobs) FROM pgjobs_group_starts")
    assert counts == 6


def test_a_queues_group_rate_holds_per_queue_and_is_set_and_cleared(dsn, conn):
    change = queues.limit(dsn, "east", group_rate="2/m")
    assert (change.queue.group_rate_jobs, change.queue.group_rate_seconds) == (2, 60.0)
    for queue in ("east", "west"):
        enqueue(conn, "r.free", "a", 4, queue=queue)
        enqueue(conn, "r.free", "b", 4, queue=queue)
    started = claim_all(conn, [FREE], queues=["east", "west"])
    assert Counter((j.queue, j.group_key) for j in started) == {
        ("east", "a"): 2,
        ("east", "b"): 2,
        ("west", "a"): 4,
        ("west", "b"): 4,
    }
    assert queues.limit(dsn, "east", group_rate=None).queue.group_rate_jobs is None
    assert groups_of(claim_all(conn, [FREE], queues=["east"])) == {"a": 2, "b": 2}


def test_a_tasks_group_rate_holds_across_queues(conn):
    for queue in ("east", "west"):
        enqueue(conn, "r.rated", "a", 3, queue=queue)
    started = claim_all(conn, [RATED], queues=["east", "west"])
    assert len(started) == 3
    assert claim_all(conn, [RATED], queues=["west"]) == []


def test_two_concurrent_claimers_start_no_more_than_the_rate(dsn, conn):
    enqueue(conn, "r.rated", "a", 10)
    with (
        psycopg.connect(dsn.url) as one,
        psycopg.connect(dsn.url) as other,
    ):
        # The first claim started the group's 3 and has not committed: the other one must not
        # count the group's starts as none.
        first, _ = claim_limited(one, [RATED])
        second, _ = claim_limited(other, [RATED])
        assert len(first) == 3 and second == []
        other.rollback()
        one.commit()
        # Committed since: its starts count.
        assert claim_limited(other, [RATED])[0] == []
        other.commit()
    started = "SELECT count(*) FROM queued_jobs WHERE started_at IS NOT NULL"
    assert scalar(conn, started) == 3


def test_group_concurrency_and_the_group_rate_both_hold(conn):
    enqueue(conn, "r.one", "a", 5)
    (job,), _ = claim_limited(conn, [ONE_RATED])
    assert claim_limited(conn, [ONE_RATED])[0] == []  # one running: concurrency
    finish(conn, [job])
    (job,), _ = claim_limited(conn, [ONE_RATED])
    finish(conn, [job])
    assert claim_limited(conn, [ONE_RATED])[0] == []  # none running, 2 started: the rate
    age(conn, 61)
    (job,), _ = claim_limited(conn, [ONE_RATED])
    assert claim_limited(conn, [ONE_RATED])[0] == []  # the rate allows one more: concurrency


def test_an_ordered_group_keeps_its_order_under_its_rate(conn):
    ids = enqueue(conn, "r.ordered", "a", 5)
    started = claim_all(conn, [ORDERED_RATED])
    assert [j.id for j in started] == ids[:2]
    age(conn, 61)
    assert [j.id for j in claim_all(conn, [ORDERED_RATED])] == ids[2:4]


def test_groups_held_by_their_rate_do_not_starve_the_other_groups(conn):
    """More groups held by their rate than a claim looks at, ahead in the turn order of a group
    that may start more: they go to the back of the turn order, and the group is reached."""
    for n in range(6):
        enqueue(conn, "r.rated", f"held-{n}", 5)
    enqueue(conn, "r.rated", "behind", 3)
    assert len(claim_all(conn, [RATED], limit=20)) == 3 * 6 + 3
    enqueue(conn, "r.rated", "behind", 2)
    conn.execute("DELETE FROM pgjobs_group_starts WHERE group_key = 'behind'")
    # The held groups' turn comes before the group behind them.
    conn.execute(
        "UPDATE pgjobs_group_states SET last_claim_at = CASE WHEN group_key = 'behind'"
        " THEN '2001-01-01'::timestamptz ELSE '2000-01-01'::timestamptz END"
    )
    taken = []
    for _ in range(4):  # each claim looks at two groups: the fourth reaches it
        jobs, _ = claim_limited(conn, [RATED], limit=2)
        taken += jobs
    assert groups_of(taken) == {"behind": 1}  # its share of the claim beside a held group


@pytest.mark.parametrize("value", ["10", "0/m", "10/0s", "10/2d", "ten/m", 10, -1])
def test_a_bad_group_rate_is_refused_in_one_line_naming_it(dsn: Dsn, conn, value):
    from pgjobs.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as task_refusal:
        declared_task("r.bad", group_rate=value)
    assert task_refusal.value.field == "group_rate"
    assert str(task_refusal.value).startswith("group_rate")
    assert "\n" not in str(task_refusal.value)
    with pytest.raises(ConfigurationError) as queue_refusal:
        queues.limit(dsn, "east", group_rate=value)
    assert queue_refusal.value.field == "group_rate"
    assert scalar(conn, "SELECT count(*) FROM pgjobs_queues") == 0


def test_a_throttled_unique_key_and_the_group_rate_both_hold(make_app, conn):
    """The throttle delays a key's next job a window after its last start; the group rate
    counts the starts of every key of the group."""
    app = make_app()
    task = app.task(name="r.throttled", throttle=3600, group_rate="2/m")(lambda **_: None)
    firsts = [app.enqueue("r.throttled", {}, unique_key=f"k{n}", group="a") for n in range(3)]
    started = claim_all(conn, [task])
    assert [j.id for j in started] == firsts[:2]  # the group rate: 2 of the 3 keys
    again = app.enqueue("r.throttled", {}, unique_key="k0", group="a")  # throttled an hour
    age(conn, 61)
    assert [j.id for j in claim_all(conn, [task])] == [firsts[2]]
    assert scalar(
        conn,
        "SELECT run_at > now() + interval '59 minutes' FROM queued_jobs WHERE id = %s",
        [again],
    )


def test_the_autoscalers_demand_counts_only_what_the_group_rates_leave(dsn, conn):
    queues.limit(dsn, "east", group_rate="2/m")
    enqueue(conn, "r.free", "a", 4, queue="east")
    enqueue(conn, "r.rated", "b", 5, queue="west")
    params = {
        "queues": ["east", "west"],
        "group_tasks": [],
        "group_limits": [],
        "group_rate_tasks": ["r.rated"],
        "group_rate_jobs": [3],
        "group_rate_seconds": [60.0],
        "ordered_tasks": [],
        "hold_tasks": [],
    }
    assert conn.execute(queries.JOB_DEMAND, params).fetchone() == (5,)  # 2 of a, 3 of b
    assert len(claim_all(conn, [RATED, FREE], queues=["east", "west"])) == 5
    assert conn.execute(queries.JOB_DEMAND, params).fetchone() == (0,)  # held until they age
    age(conn, 61)
    assert conn.execute(queries.JOB_DEMAND, params).fetchone() == (4,)


def test_the_maintenance_removes_starts_past_their_period_and_keeps_a_window(dsn, conn):
    enqueue(conn, "r.rated", "a", 5)
    finish(conn, claim_limited(conn, [RATED])[0])
    enqueue(conn, "r.rated", "b", 1)
    finish(conn, claim_limited(conn, [RATED])[0])
    conn.execute(
        "UPDATE pgjobs_group_starts SET started_at = now() - interval '61 seconds'"
        " WHERE group_key = 'a'"
    )
    conn.execute("DELETE FROM queued_jobs")  # their jobs are done: the group rows may go too
    service = GroupRows(["default"])
    service.idle = 0.0
    run_service(dsn, service)
    rows = conn.execute("SELECT group_key, jobs FROM pgjobs_group_starts").fetchall()
    assert rows == [("b", 1)]  # a's start left its window; b's holds it though b's rows went
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_states") == 0
    enqueue(conn, "r.rated", "b", 5)
    assert len(claim_all(conn, [RATED])) == 2  # b's window still counts its start
