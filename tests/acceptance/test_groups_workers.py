"""Groups across four `pgjobs work` processes: a task's group concurrency is never exceeded in
any group, measured from the side table where every handler records when it starts and ends;
an ordered task runs each group's jobs one at a time in enqueue order; a worker killed with two
jobs of a group at its limit holds the group only until their leases end; a task's limit and
order hold across queues, with a worker per queue and with workers serving them all."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from pgjobs import JobSpec
from tests.acceptance.conftest import lease_owner_pattern
from tests.acceptance.test_limits_workers import most_at_once
from tests.acceptance.workload import GROUP_CONCURRENCY, SHORT_LEASE
from tests.support.helpers import assert_one_home, scalar, stop, wait_archived, wait_until

WORKERS = 4
GROUPS = 6
PER_GROUP = 15


def start_registered(conn: psycopg.Connection[Any], start_worker: Any, *extra: str) -> list[Any]:
    workers = [start_worker("--concurrency", "4", *extra) for _ in range(WORKERS)]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == WORKERS,
        timeout=60,
        what="four workers registered",
        procs=workers,
    )
    return workers


@pytest.mark.slow
def test_a_groups_concurrency_holds_across_four_worker_processes(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    workers = start_registered(conn, start_worker)
    # Keys g*100 + n: group g's jobs, enqueued group after group (the first group's are oldest).
    ids = app.enqueue_many(
        JobSpec("accept.grouped", {"key": g * 100 + n, "seconds": 0.05}, group=f"customer-{g}")
        for g in range(GROUPS)
        for n in range(PER_GROUP)
    )
    wait_archived(conn, len(ids), timeout=120, procs=workers)

    at_once = [most_at_once(conn, g * 100, g * 100 + PER_GROUP) for g in range(GROUPS)]
    assert max(at_once) == GROUP_CONCURRENCY, at_once  # reached, never passed
    # The groups ran side by side (they took turns), not one after another: more than the
    # group's limit ran at once overall.
    assert most_at_once(conn, 0, GROUPS * 100) > GROUP_CONCURRENCY
    assert scalar(conn, "SELECT count(DISTINCT worker_pid) FROM runs") >= 2
    assert scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done'") == len(ids)
    assert_one_home(conn, ids)
    assert stop(workers, timeout=20) == [0] * WORKERS


@pytest.mark.slow
def test_an_ordered_task_runs_each_groups_jobs_in_enqueue_order(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    workers = start_registered(conn, start_worker)
    # Interleaved groups, and priorities that would reorder them if priority counted.
    ids = app.enqueue_many(
        JobSpec("accept.in_order", {"key": g * 100 + n}, group=f"g{g}", priority=n % 3)
        for n in range(PER_GROUP)
        for g in range(GROUPS)
    )
    wait_archived(conn, len(ids), timeout=120, procs=workers)

    for g in range(GROUPS):
        keys = [
            r[0]
            for r in conn.execute(
                "SELECT key FROM runs WHERE phase = 'start' AND key >= %s AND key < %s ORDER BY at",
                [g * 100, g * 100 + PER_GROUP],
            )
        ]
        assert keys == sorted(keys) and len(keys) == PER_GROUP
        assert most_at_once(conn, g * 100, g * 100 + PER_GROUP) == 1
    assert_one_home(conn, ids)
    assert stop(workers, timeout=20) == [0] * WORKERS


@pytest.mark.slow
def test_a_killed_worker_holds_its_group_only_until_the_leases_end(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    victim = start_worker("--concurrency", "4", "--rescue-interval", "60")
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == 1,
        timeout=60,
        what="the victim registered",
        procs=[victim],
    )
    ids = app.enqueue_many(
        JobSpec(
            "accept.grouped_short_lease",
            {"key": n, "seconds": 30 if n < 2 else 0.1},
            group="tenant",
        )
        for n in range(6)
    )
    pattern = lease_owner_pattern(victim.pid)
    wait_until(
        lambda: (
            scalar(
                conn,
                "SELECT count(*) FROM runs WHERE phase = 'start' AND worker_pid = %s",
                [victim.pid],
            )
            == 2
        ),
        timeout=30,
        what="the victim to start the group's two slow jobs",
        procs=[victim],
    )
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    lease_end = scalar(
        conn, "SELECT max(lease_expires_at) FROM queued_jobs WHERE lease_owner LIKE %s", [pattern]
    )
    assert lease_end is not None
    # A new worker whose lease rescuer would not run for a minute: the group is released by the
    # claim itself when the two leases end, not by the rescuer, and not later.
    survivor = start_worker("--concurrency", "4", "--rescue-interval", "60")
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done' AND key >= 2") == 4,
        timeout=SHORT_LEASE + 20,
        what="the group's other jobs to run",
        procs=[survivor],
    )
    first_start = scalar(conn, "SELECT min(at) FROM runs WHERE phase = 'start' AND key >= 2")
    assert first_start >= lease_end  # held while the dead worker's leases held
    assert (first_start - lease_end).total_seconds() < 5  # and released when they ended
    assert stop([survivor], timeout=20) == [0]
    assert len(ids) == 6


@pytest.mark.slow
@pytest.mark.parametrize(
    "queues_per_worker",
    [(["east"], ["west"]), (["east", "west"], ["east", "west"])],
    ids=["a-worker-per-queue", "workers-of-both-queues"],
)
def test_a_tasks_group_limit_and_order_hold_across_queues(
    make_app, runs, start_worker, queues_per_worker
):
    conn = runs
    app = make_app()
    workers = []
    for queues in queues_per_worker:
        workers.append(start_worker("--concurrency", "4", *(f"--queue={q}" for q in queues)))
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == len(workers),
        timeout=60,
        what="the workers registered",
        procs=workers,
    )
    # Each group's jobs alternate between the queues: limited (keys g*100 + n) and ordered
    # (keys 1000 + g*100 + n).
    ids = app.enqueue_many(
        JobSpec(
            task,
            {"key": base + g * 100 + n, "seconds": seconds},
            group=f"customer-{g}",
            queue=("east", "west")[n % 2],
        )
        for task, base, seconds in (("accept.grouped", 0, 0.2), ("accept.in_order", 1000, 0.02))
        for n in range(PER_GROUP)
        for g in range(2)
    )
    wait_archived(conn, len(ids), timeout=120, procs=workers)

    for g in range(2):
        assert most_at_once(conn, g * 100, g * 100 + PER_GROUP) == GROUP_CONCURRENCY
        low, high = 1000 + g * 100, 1000 + g * 100 + PER_GROUP
        keys = [
            r[0]
            for r in conn.execute(
                "SELECT key FROM runs WHERE phase = 'start' AND key >= %s AND key < %s ORDER BY at",
                [low, high],
            )
        ]
        assert keys == list(range(low, high))
        assert most_at_once(conn, low, high) == 1
    assert_one_home(conn, ids)
    assert stop(workers, timeout=20) == [0] * len(workers)
