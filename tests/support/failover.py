"""The workload and the measures of the failover tests, whoever fails the primary over (the test's
own ``pg_ctl promote``, Patroni): a producer and two `pgjobs work` processes on a multi-host DSN,
an outage in the middle of the load, then what became of every job whose enqueue returned.

>>> result = fail_over_under_load(pair.dsn(), pair.url(), runs_file,
...                               connect_primary=pair.primary.connect, outage=crash_and_promote)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgjobs import App, PgjobsError
from tests.acceptance.failover_app import RUNS_FILE
from tests.support.helpers import (
    Proc,
    count,
    homes,
    pgjobs_env,
    pgjobs_process,
    run_pgjobs,
    scalar,
    wait_until,
)

APP = "tests.acceptance.failover_app:app"
#: Jobs finished before the outage: the load is well under way.
FINISHED_BEFORE_OUTAGE = 300
#: Seconds the producer goes on once processing has resumed.
PRODUCE_AFTER = 3.0
#: Every tenth job is of the at-most-once task.
ONCE_EVERY = 10

logger = logging.getLogger(__name__)


@dataclass
class Producer:
    """Enqueues one job after another on its own thread, through the multi-host DSN, recording
    (id, key) for every enqueue that returned; failed enqueues (the outage) are retried."""

    dsn: str
    returned: dict[int, int] = field(default_factory=dict)  # job id -> key of its payload
    failures: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        key = 0
        with App(self.dsn, check_task_names=False, pool_size=1) as app:
            while not self.stopping.is_set():
                key += 1
                task = "failover.once" if key % ONCE_EVERY == 0 else "failover.many"
                try:
                    job_id = app.enqueue(task, {"key": key})
                except PgjobsError:
                    self.failures += 1
                    time.sleep(0.05)
                    continue
                self.returned[job_id] = key
                time.sleep(0.002)


@contextlib.contextmanager
def producing(dsn: str) -> Iterator[Producer]:
    producer = Producer(dsn)
    thread = threading.Thread(target=producer.run, name="producer", daemon=True)
    thread.start()
    try:
        yield producer
    finally:
        producer.stopping.set()
        thread.join(30)


@dataclass
class Recovery:
    """What an outage reports: when it began and when a primary took writes again (epoch
    seconds, this machine's clock, which the servers share), and how to reach that primary."""

    started: float
    writable: float
    connect: Callable[[], psycopg.Connection[Any]]


@dataclass
class Failover:
    """What one failover did."""

    returned: dict[int, int]
    where: dict[int, str]
    keys: dict[int, int]
    tasks: dict[int, str]
    runs: Counter[tuple[str, int]]
    recovery: Recovery
    first_finish: float
    producer_failures: int

    @property
    def resume_seconds(self) -> float:
        """From the new primary taking writes to the first job a worker finished on it."""
        return self.first_finish - self.recovery.writable

    @property
    def rto_seconds(self) -> float:
        """From the start of the outage to the first job a worker finished on the new primary."""
        return self.first_finish - self.recovery.started

    @property
    def lost(self) -> list[int]:
        """Ids whose enqueue returned but that no table holds with the key they were given
        (the sequence of a promoted standby may hand out a lost id again, to another job)."""
        return sorted(i for i, key in self.returned.items() if self.keys.get(i) != key)

    def returned_in(self, table: str, task: str) -> list[int]:
        """Ids of ``task`` whose enqueue returned and that ``table`` holds."""
        return sorted(
            i for i in self.returned if self.where.get(i) == table and self.tasks.get(i) == task
        )

    def ran_twice(self, task: str) -> list[int]:
        return sorted(key for (name, key), n in self.runs.items() if name == task and n > 1)


def read_runs(path: Path) -> Counter[tuple[str, int]]:
    runs: Counter[tuple[str, int]] = Counter()
    for line in path.read_text().splitlines():
        task, key, _pid = line.split()
        runs[(task, int(key))] += 1
    return runs


def registered(conn: psycopg.Connection[Any]) -> int:
    """How many workers have registered themselves (each does once past its start)."""
    return int(scalar(conn, "SELECT count(*) FROM pgjobs_workers"))


def first_finish_after(conn: psycopg.Connection[Any], moment: float) -> float | None:
    """The moment (epoch) of the first job a worker finished after ``moment``, if any."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(finished_at)) FROM archived_jobs"
        " WHERE finished_at > to_timestamp(%s)",
        [moment],
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def fail_over_under_load(
    dsn: str,
    url: str,
    runs_file: Path,
    *,
    connect_primary: Callable[[], psycopg.Connection[Any]],
    outage: Callable[[], Recovery],
    describe: Callable[[], str] = str,
) -> Failover:
    """Migrate (through ``url``, the URL form of ``dsn``), start two workers and the producer on
    ``dsn``; once the load is under way, run ``outage`` (which fails the primary over and says
    when); wait for the workers to finish every job the new primary holds. ``describe`` adds the
    servers' state to a failure's message."""
    env = {**pgjobs_env(dsn), RUNS_FILE: str(runs_file)}
    migrated = run_pgjobs(env, "migrate", "--dsn", url)
    assert migrated.returncode == 0, migrated.stderr
    with contextlib.ExitStack() as stack:
        workers: list[Proc] = [
            stack.enter_context(
                pgjobs_process(
                    env, "work", "--app", APP, "--concurrency", "4", "--poll-interval", "0.2"
                )
            )
            for _ in range(2)
        ]
        producer = stack.enter_context(producing(dsn))
        with connect_primary() as conn:
            # Both workers past their start: one still starting when the primary stops exits
            # with "cannot reach the database" (its start-up check); the test is about running
            # workers riding out the failover.
            wait_until(
                lambda: (
                    count(conn, "archived_jobs") >= FINISHED_BEFORE_OUTAGE
                    and registered(conn) == len(workers)
                ),
                timeout=60,
                what=f"{FINISHED_BEFORE_OUTAGE} jobs finished and both workers registered",
                procs=workers,
            )
        recovery = outage()
        with recovery.connect() as conn:
            first_finish = wait_until(
                lambda: first_finish_after(conn, recovery.writable),
                timeout=60,
                what=lambda: f"a job finished on the new primary; {describe()}",
                procs=workers,
            )
            time.sleep(PRODUCE_AFTER)
            producer.stopping.set()
            wait_until(
                lambda: count(conn, "queued_jobs") == 0,
                timeout=60,
                what=lambda: (
                    "every job the new primary holds finished: "
                    + repr(
                        conn.execute(
                            "SELECT id, task, attempts, lease_owner, lease_expires_at, run_at, now()"
                            " FROM queued_jobs ORDER BY id LIMIT 10"
                        ).fetchall()
                    )
                ),
                procs=workers,  # fails at once if a worker exited
            )
            # The same two processes worked on after the outage: none exited, none restarted.
            after = {
                worker.pid: scalar(
                    conn,
                    "SELECT count(*) FROM archived_jobs WHERE worker LIKE %s"
                    " AND finished_at > to_timestamp(%s)",
                    [f"%:{worker.pid}:%", recovery.writable],
                )
                for worker in workers
            }
            assert all(after.values()), f"jobs each worker finished after the outage: {after}"
            where = homes(conn)  # asserts that no id is in two tables
            rows = conn.execute(
                "SELECT id, task, payload->>'key' FROM archived_jobs"
                " UNION ALL SELECT id, task, payload->>'key' FROM dead_letter"
                " UNION ALL SELECT id, task, payload->>'key' FROM queued_jobs"
            ).fetchall()
        assert [w.stop(timeout=30) for w in workers] == [0, 0]
    return Failover(
        dict(producer.returned),
        where,
        {job_id: int(key) for job_id, _, key in rows},
        {job_id: task for job_id, task, _ in rows},
        read_runs(runs_file),
        recovery,
        first_finish,
        producer.failures,
    )


def report(kind: str, result: Failover) -> str:
    """One line of figures, logged and printed (``pytest -s`` shows it)."""
    message = (
        f"{kind}: {len(result.returned)} enqueues returned, {len(result.lost)} of them lost "
        f"(RPO), {result.producer_failures} enqueues failed during the outage; writes again "
        f"{result.recovery.writable - result.recovery.started:.2f} s after the outage began, "
        f"processing {result.resume_seconds:.2f} s after that; RTO (outage to the first job "
        f"finished on the new primary) {result.rto_seconds:.2f} s; "
        f"at-least-once jobs run twice: {len(result.ran_twice('failover.many'))}, "
        f"at-most-once jobs run twice: {len(result.ran_twice('failover.once'))}; "
        f"dead-lettered: {sum(1 for w in result.where.values() if w == 'dead_letter')}"
    )
    logger.warning(message)
    print(message)
    return message
