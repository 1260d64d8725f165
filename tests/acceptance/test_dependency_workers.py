"""Dependencies across four `pgjobs work` processes: a fan-in graph (200 joins, each after 8
parts that end at the same instant on different workers) where every join runs exactly once and
only after its 8 parts succeeded, none is left waiting, and a worker killed with -9 mid-run
delays the joins of its parts until their leases end and they run again, nothing more."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, Ref
from tests.acceptance.dependency_app import DEP_RUNS_DDL
from tests.support.helpers import Proc, assert_one_home, scalar, stop, wait_archived, wait_until

APP = "tests.acceptance.dependency_app:app"
JOINS = 200
PARTS = 8


def graph() -> list[JobSpec]:
    """Each join listed right after its parts, named by their positions."""
    specs: list[JobSpec] = []
    for _ in range(JOINS):
        first = len(specs)
        specs += [JobSpec("dep.part", queue="dep_parts") for _ in range(PARTS)]
        specs.append(
            JobSpec("dep.join", queue="dep_joins", after=[Ref(first + n) for n in range(PARTS)])
        )
    return specs


@pytest.mark.slow
def test_a_fan_in_graph_on_four_workers_with_one_killed(
    make_app: Any, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    conn.execute(DEP_RUNS_DDL)
    app: App = make_app(check_task_names=False)

    def worker(*queues: str) -> Proc:
        args = [f"--queue={queue}" for queue in queues]
        return spawn(
            "work",
            "--app",
            APP,
            "--concurrency",
            "8",
            "--poll-interval",
            "0.2",
            "--rescue-interval",
            "0.5",
            *args,
        )

    # The victim runs parts only, so no join is ever cut short: a join that runs twice is a
    # release that happened twice.
    victim = worker("dep_parts")
    others = [worker("dep_parts", "dep_joins") for _ in range(3)]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == 4,
        timeout=60,
        what="four workers registered",
        procs=[victim, *others],
    )
    ids = app.enqueue_many(graph())
    joins = ids[PARTS :: PARTS + 1]
    assert len(joins) == JOINS
    wait_until(
        lambda: (
            scalar(
                conn,
                "SELECT count(*) FROM dep_runs WHERE phase = 'start' AND worker_pid = %s",
                [victim.pid],
            )
            >= 40
        ),
        timeout=60,
        what="the victim to be in the middle of its parts",
        procs=[victim],
        interval=0.01,
    )
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    wait_archived(conn, len(ids), timeout=180, procs=others)

    rows = conn.execute(
        """
        SELECT job_id, count(*) FILTER (WHERE phase = 'start'),
               count(*) FILTER (WHERE phase = 'done'), min(deps), min(met)
        FROM dep_runs WHERE job_id = ANY(%s) GROUP BY job_id
        """,
        [joins],
    ).fetchall()
    assert len(rows) == JOINS
    for job_id, starts, dones, deps, met in rows:
        assert (starts, dones) == (1, 1), f"join {job_id} ran {starts} time(s)"
        assert (deps, met) == (PARTS, PARTS), f"join {job_id} started with {met}/{deps} met"
    assert scalar(conn, "SELECT count(*) FROM archived_jobs WHERE status <> 'succeeded'") == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    assert scalar(conn, "SELECT count(*) FROM dead_letter") == 0
    # The kill cut parts short: they ran again on another worker, and their joins waited.
    cut = scalar(
        conn,
        """
        SELECT count(*) FROM dep_runs s
        WHERE s.phase = 'start' AND s.worker_pid = %s
          AND NOT EXISTS (SELECT 1 FROM dep_runs d
                          WHERE d.job_id = s.job_id AND d.phase = 'done' AND d.worker_pid = %s)
        """,
        [victim.pid, victim.pid],
    )
    assert cut >= 1
    # The parts of most joins ended at the same instant on more than one worker.
    spread = scalar(
        conn,
        """
        SELECT count(*) FROM (
            SELECT d.job_id FROM pgjobs_dependencies d
            JOIN dep_runs r ON r.job_id = d.depends_on AND r.phase = 'done'
            WHERE d.job_id = ANY(%s)
            GROUP BY d.job_id HAVING count(DISTINCT r.worker_pid) >= 2
        ) j
        """,
        [joins],
    )
    assert spread >= JOINS // 2, spread
    assert_one_home(conn, ids)
    assert stop(others, timeout=30) == [0] * 3


@pytest.mark.slow
def test_joins_enqueued_while_their_parts_end_are_released_once(make_app, conn, spawn):
    """The enqueue's lock: a join enqueued while its parts are ending on four workers still
    sees each end (the move waits for the enqueue's commit, or went first and is found)."""
    conn.execute(DEP_RUNS_DDL)
    app: App = make_app(check_task_names=False)
    workers = [
        spawn(
            "work",
            "--app",
            APP,
            "--concurrency",
            "8",
            "--poll-interval",
            "0.2",
            "--queue=dep_parts",
            "--queue=dep_joins",
        )
        for _ in range(4)
    ]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == 4,
        timeout=60,
        what="four workers registered",
        procs=workers,
    )
    parts = app.enqueue_many(JobSpec("dep.part", queue="dep_parts") for _ in range(JOINS * PARTS))
    joins = []
    for g in range(JOINS):
        # Each join after parts that the workers are running or about to end.
        joins.append(
            app.enqueue("dep.join", queue="dep_joins", after=parts[g * PARTS : (g + 1) * PARTS])
        )
    wait_archived(conn, len(parts) + len(joins), timeout=180, procs=workers)
    rows = conn.execute(
        "SELECT job_id, count(*), min(met) FROM dep_runs "
        "WHERE job_id = ANY(%s) AND phase = 'start' GROUP BY job_id",
        [joins],
    ).fetchall()
    assert sorted((r[1], r[2]) for r in rows) == [(1, PARTS)] * JOINS
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    assert_one_home(conn, [*parts, *joins])
    assert stop(workers, timeout=30) == [0] * 4
