"""The raw-SQL references: the leanest psycopg code that does the same work as pgjobs, no framework.

Every pgjobs figure is printed beside one of these, so that the ratio holds on a noisy machine.
The consumers run as subprocesses, like pgjobs workers do::

    python -m benchmarks.raw process --dsn URL [--batch 100]
    python -m benchmarks.raw trip --dsn URL [--batch 100]
    python -m benchmarks.raw listen --dsn URL --file PATH
    python -m benchmarks.raw sleep --dsn URL [--concurrency 300] [--threads]
    python -m benchmarks.raw narrow --dsn URL [--batch 100]
    python -m benchmarks.raw grouped --dsn URL [--batch 32]

Two references. The first ones (``process``, ``trip``, ``listen``, ``sleep``, ``grouped``, the
enqueue functions) run on pgjobs' own tables (``grouped`` with one table of its own, a row per
group): they measure what pgjobs' code costs on pgjobs' schema.
The narrow ones (``NARROW_*``, ``narrow_*``) run on the narrowest tables that still hold a job,
in the schema ``narrow`` of the benchmark database: the gap to them is the price of pgjobs'
schema (its indexes, columns and partitions) as well as of its code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from benchmarks import QUEUE

#: Enqueue one job, in its own (autocommit) transaction.
INSERT_ONE = "INSERT INTO queued_jobs (queue, task, payload) VALUES (%s, %s, %s) RETURNING id"

#: Enqueue many jobs by COPY (ids, defaults and created_at filled in by the server).
COPY_MANY = "COPY queued_jobs (queue, task, payload) FROM STDIN"

#: Claim up to ``limit`` ready jobs with SKIP LOCKED and lease them (one attempt used). The jobs
#: without a limit_key or a group_key: the claim index's range, as pgjobs reads it (without
#: ``group_key IS NULL`` the index's predicate is not implied, and each claim sorts the queue).
CLAIM = """
UPDATE queued_jobs
SET attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_expires_at = now() + interval '5 minutes'
WHERE id = ANY(ARRAY(
    SELECT id FROM queued_jobs
    WHERE queue = %(queue)s AND lease_expires_at IS NULL AND limit_key IS NULL
      AND group_key IS NULL AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
))
RETURNING id, task, payload
"""

#: Move finished jobs to archived_jobs, in one statement.
ARCHIVE = """
WITH done AS (DELETE FROM queued_jobs WHERE id = ANY(%(ids)s) RETURNING *)
INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                           status, worker, created_at, expires_at, idempotency_key)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts,
       'succeeded', lease_owner, created_at, expires_at, idempotency_key
FROM done
"""


#: Archive the previous batch (``ids``) and claim the next one (as CLAIM), in one statement:
#: the worker's usual round trip, at its leanest.
ARCHIVE_AND_CLAIM = f"""
WITH done AS (DELETE FROM queued_jobs WHERE id = ANY(%(ids)s::bigint[]) RETURNING *),
archived AS (
    INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts,
                               max_attempts, status, worker, created_at, expires_at,
                               idempotency_key)
    SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts,
           'succeeded', lease_owner, created_at, expires_at, idempotency_key
    FROM done
    RETURNING id
),
claimed AS ({CLAIM})
SELECT id, task, payload FROM claimed
"""


def enqueue_one_by_one(conn: psycopg.Connection[Any], task: str, payloads: Iterable[Any]) -> None:
    """One autocommit INSERT per job (``conn`` must be autocommit)."""
    for payload in payloads:
        conn.execute(INSERT_ONE, (QUEUE, task, json.dumps(payload)), prepare=True).fetchone()


def enqueue_copy(conn: psycopg.Connection[Any], task: str, payloads: Iterable[Any]) -> None:
    """One COPY of all ``payloads`` in one transaction."""
    with conn.transaction(), conn.cursor() as cursor, cursor.copy(COPY_MANY) as copy:
        for payload in payloads:
            copy.write_row((QUEUE, task, json.dumps(payload)))


def process(dsn: str, batch: int) -> None:
    """Claim ``batch`` jobs, run them (no-ops), archive them; until no job is ready."""
    owner = f"raw:{os.getpid()}"
    claim = {"owner": owner, "queue": QUEUE, "limit": batch}
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = conn.execute(CLAIM, claim, prepare=True).fetchall()
            if not jobs:
                return
            ids = [job_id for job_id, _task, _payload in jobs]
            conn.execute(ARCHIVE, {"ids": ids}, prepare=True)


def trip(dsn: str, batch: int) -> None:
    """Claim ``batch`` jobs, run them (no-ops), and archive them with the claim of the next
    batch (``ARCHIVE_AND_CLAIM``): one round trip per batch; until no job is ready."""
    params: dict[str, Any] = {
        "owner": f"raw:{os.getpid()}",
        "queue": QUEUE,
        "limit": batch,
        "ids": [],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = conn.execute(ARCHIVE_AND_CLAIM, params, prepare=True).fetchall()
            if not jobs:
                return
            params["ids"] = [job_id for job_id, _task, _payload in jobs]


# -- the narrowest tables -------------------------------------------------------------------------

#: The narrow tables (``narrow_create``): a queue table with its primary key and ONE partial
#: index, the claim's; an archive of the same columns plus ``finished_at`` and ``status``, and no
#: index at all. Defaults fill what an enqueue does not send.
NARROW_DDL = """
CREATE SCHEMA IF NOT EXISTS narrow;
CREATE TABLE IF NOT EXISTS narrow.queued_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    attempts int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL DEFAULT 5,
    locked_until timestamptz,
    locked_by text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS queued_jobs_ready ON narrow.queued_jobs (queue, priority, run_at)
    WHERE locked_until IS NULL;
CREATE TABLE IF NOT EXISTS narrow.archived_jobs (
    id bigint NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL,
    attempts int NOT NULL,
    max_attempts int NOT NULL,
    locked_until timestamptz,
    locked_by text,
    created_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    status text NOT NULL
)
"""

#: Enqueue one job, in its own (autocommit) transaction.
NARROW_INSERT_ONE = "INSERT INTO narrow.queued_jobs (queue, payload) VALUES (%s, %s) RETURNING id"

#: Enqueue many jobs by COPY (ids and defaults filled in by the server).
NARROW_COPY = "COPY narrow.queued_jobs (queue, payload) FROM STDIN"

#: Enqueue many jobs in one INSERT of an array of payloads (no ids sent back, as by COPY).
NARROW_INSERT_MANY = """
INSERT INTO narrow.queued_jobs (queue, payload)
SELECT %(queue)s, payload::jsonb FROM unnest(%(payloads)s::text[]) AS payload
"""

#: Archive the previous batch (``ids``) and claim the next ``limit`` ready jobs, in one statement.
#: Lower priorities first, as the claim index is ordered.
NARROW_TRIP = """
WITH done AS (DELETE FROM narrow.queued_jobs WHERE id = ANY(%(ids)s::bigint[]) RETURNING *),
archived AS (
    INSERT INTO narrow.archived_jobs (id, queue, payload, priority, run_at, attempts,
                                      max_attempts, locked_until, locked_by, created_at,
                                      finished_at, status)
    SELECT id, queue, payload, priority, run_at, attempts, max_attempts, locked_until,
           locked_by, created_at, now(), 'succeeded'
    FROM done
),
claimed AS (
    UPDATE narrow.queued_jobs
    SET attempts = attempts + 1,
        locked_until = now() + interval '5 minutes',
        locked_by = %(owner)s
    WHERE id = ANY(ARRAY(
        SELECT id FROM narrow.queued_jobs
        WHERE queue = %(queue)s AND locked_until IS NULL AND run_at <= now()
        ORDER BY priority, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id, payload
)
SELECT id, payload FROM claimed
"""


def narrow_create(conn: psycopg.Connection[Any]) -> None:
    """Create the narrow tables if they are not there yet (``conn`` must be autocommit)."""
    conn.execute(NARROW_DDL)


def narrow_reset(conn: psycopg.Connection[Any]) -> None:
    """Empty the narrow tables (creating them first if needed)."""
    narrow_create(conn)
    conn.execute("TRUNCATE narrow.queued_jobs, narrow.archived_jobs")


def narrow_fill(conn: psycopg.Connection[Any], jobs: int) -> int:
    """Insert ``jobs`` ready jobs into the narrow queue (server-side) and vacuum; returns a
    marker: every job inserted from now on has a larger id."""
    row = conn.execute(
        "SELECT nextval(pg_get_serial_sequence('narrow.queued_jobs', 'id'))"
    ).fetchone()
    assert row is not None
    conn.execute(
        "INSERT INTO narrow.queued_jobs (queue, payload) "
        "SELECT %s, '{}'::jsonb FROM generate_series(1, %s)",
        (QUEUE, jobs),
    )
    conn.execute("VACUUM ANALYZE narrow.queued_jobs")
    return int(row[0])


def narrow_enqueue_one_by_one(conn: psycopg.Connection[Any], payloads: Iterable[Any]) -> None:
    """One autocommit INSERT per job into the narrow queue (``conn`` must be autocommit)."""
    for payload in payloads:
        conn.execute(NARROW_INSERT_ONE, (QUEUE, json.dumps(payload)), prepare=True).fetchone()


def narrow_enqueue_copy(conn: psycopg.Connection[Any], payloads: Iterable[Any]) -> None:
    """One COPY of all ``payloads`` into the narrow queue, in one transaction."""
    with conn.transaction(), conn.cursor() as cursor, cursor.copy(NARROW_COPY) as copy:
        for payload in payloads:
            copy.write_row((QUEUE, json.dumps(payload)))


def narrow_enqueue_unnest(conn: psycopg.Connection[Any], payloads: Iterable[Any]) -> None:
    """One INSERT … unnest of all ``payloads`` into the narrow queue (autocommit: one
    transaction)."""
    params = {"queue": QUEUE, "payloads": [json.dumps(payload) for payload in payloads]}
    conn.execute(NARROW_INSERT_MANY, params, prepare=True)


def narrow(dsn: str, batch: int) -> None:
    """The leanest loop on the narrow tables: one prepared statement per batch archives the
    previous batch and claims the next (``NARROW_TRIP``); until no job is ready."""
    params: dict[str, Any] = {
        "owner": f"narrow:{os.getpid()}",
        "queue": QUEUE,
        "limit": batch,
        "ids": [],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = conn.execute(NARROW_TRIP, params, prepare=True).fetchall()
            if not jobs:
                return
            params["ids"] = [job_id for job_id, _payload in jobs]


# -- grouped claiming at its leanest ------------------------------------------------------------

#: The grouped reference's one table: a row per group, whether one of its jobs runs, when one
#: was last claimed (its turn), how many of its jobs are still to claim. Its partial index holds
#: the groups a claim may take, in turn order: one index range gives a batch of groups.
GROUPED_DDL = """
CREATE SCHEMA IF NOT EXISTS rawgroups;
CREATE TABLE IF NOT EXISTS rawgroups.groups (
    group_key text PRIMARY KEY,
    ready int NOT NULL,
    running boolean NOT NULL DEFAULT false,
    claimed_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX IF NOT EXISTS groups_turn ON rawgroups.groups (claimed_at, group_key)
    WHERE NOT running AND ready > 0
"""

#: One row per group of the queue's ready grouped jobs (after a fill).
GROUPED_FILL = """
INSERT INTO rawgroups.groups (group_key, ready)
SELECT group_key, count(*) FROM queued_jobs
WHERE queue = %(queue)s AND group_key IS NOT NULL AND lease_expires_at IS NULL
GROUP BY group_key
"""

#: Archive the previous batch (``ids``: one job of each of its groups), free those groups, and
#: claim the next batch: the ``limit`` groups that run nothing and have jobs left, the one whose
#: last claim is oldest first, each locked (SKIP LOCKED) and marked running with the job of
#: its range that comes first; in one statement. At most one job of a group runs: a group is
#: taken only under its row's lock, while it runs nothing, and freed only by the archive of its
#: running job. A group freed here is not taken again by the same statement (its snapshot still
#: sees it running): the next trip may take it. The groups are freed before any is taken, so
#: that a statement waits for another's locks (taken while rechecking a group that was just
#: taken) only while it holds none of its own that the other waits for. A job's started_at is
#: the clock when its group was taken, after the lock: later than the finished_at of the
#: group's job before it. The job is locked too: a group taken after a recheck (freed since the
#: statement's snapshot) may have had its first job archived meanwhile, and the lock's recheck
#: passes over it to the group's next job.
GROUPED_TRIP = """
WITH done AS (DELETE FROM queued_jobs WHERE id = ANY(%(ids)s::bigint[]) RETURNING *),
archived AS (
    INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts,
                               max_attempts, status, worker, created_at, expires_at,
                               idempotency_key, started_at, group_key)
    SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts,
           'succeeded', lease_owner, created_at, expires_at, idempotency_key, started_at,
           group_key
    FROM done
),
freed AS (
    UPDATE rawgroups.groups g SET running = false
    WHERE g.group_key IN (SELECT group_key FROM done)
    RETURNING g.group_key
),
turns AS (
    SELECT group_key FROM rawgroups.groups
    WHERE NOT running AND ready > 0 AND (SELECT count(*) FROM freed) >= 0
    ORDER BY claimed_at, group_key
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT j.id, t.group_key FROM turns t
    CROSS JOIN LATERAL (
        SELECT id FROM queued_jobs
        WHERE queue = %(queue)s AND group_key = t.group_key
          AND lease_expires_at IS NULL AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) j
),
taken AS (
    UPDATE rawgroups.groups g SET running = true, claimed_at = now(), ready = g.ready - 1
    FROM picked p WHERE g.group_key = p.group_key
),
claimed AS (
    UPDATE queued_jobs
    SET attempts = attempts + 1,
        lease_owner = %(owner)s,
        lease_expires_at = now() + interval '5 minutes',
        started_at = clock_timestamp()
    WHERE id IN (SELECT id FROM picked)
    RETURNING id, task, payload
)
SELECT id, task, payload FROM claimed
"""

#: Whether some group still has jobs to claim (a trip that found nothing may have met only
#: groups running elsewhere).
GROUPED_LEFT = "SELECT EXISTS (SELECT 1 FROM rawgroups.groups WHERE ready > 0)"


def grouped_reset(conn: psycopg.Connection[Any]) -> None:
    """Create the grouped reference's table if needed and empty it (``conn``: autocommit)."""
    conn.execute(GROUPED_DDL)
    conn.execute("TRUNCATE rawgroups.groups")


def grouped_fill(conn: psycopg.Connection[Any]) -> None:
    """Write the groups' rows for the grouped jobs now ready in the queue, and vacuum."""
    conn.execute(GROUPED_FILL, {"queue": QUEUE})
    conn.execute("VACUUM ANALYZE rawgroups.groups")


def grouped(dsn: str, batch: int, owner: str | None = None) -> None:
    """Claim up to ``batch`` jobs, one per group, run them (no-ops), and archive them with the
    next claim (``GROUPED_TRIP``) as ``owner`` (default: raw:<pid>); until no group has a job
    left to claim."""
    params: dict[str, Any] = {
        "owner": owner or f"raw:{os.getpid()}",
        "queue": QUEUE,
        "limit": batch,
        "ids": [],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = conn.execute(GROUPED_TRIP, params, prepare=True).fetchall()
            params["ids"] = [job_id for job_id, _task, _payload in jobs]
            if not jobs:
                row = conn.execute(GROUPED_LEFT).fetchone()
                if not (row and row[0]):
                    return
                time.sleep(0.001)  # every group left runs elsewhere: one will be freed soon


# -- the other consumers on pgjobs' tables -----------------------------------------------------


def listen(dsn: str, path: str) -> None:
    """Wait for NOTIFY, claim what is ready, write "n time.time()" per job to ``path``, archive.

    Runs until killed. One connection LISTENs, another claims, as a lean LISTEN consumer would.
    """
    owner = f"raw:{os.getpid()}"
    claim = {"owner": owner, "queue": QUEUE, "limit": 100}
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as conn,
        open(path, "a") as out,
    ):
        listener.execute("LISTEN pgjobs")
        while True:
            for _ in listener.notifies(timeout=1.0, stop_after=1):
                pass  # woken by NOTIFY, or polling after a second without one
            while jobs := conn.execute(CLAIM, claim, prepare=True).fetchall():
                for _job_id, _task, payload in jobs:
                    out.write(f"{payload['n']} {time.time()!r}\n")
                out.flush()
                conn.execute(ARCHIVE, {"ids": [job[0] for job in jobs]}, prepare=True)


async def sleep(dsn: str, concurrency: int, threads: bool) -> None:
    """Claim ``concurrency`` sleeping jobs at a time and run them at once (on asyncio, or on a
    pool of ``concurrency`` threads), until no job is ready."""
    owner = f"raw:{os.getpid()}"
    claim = {"owner": owner, "queue": QUEUE, "limit": concurrency}
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(concurrency) if threads else None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = await (await conn.execute(CLAIM, claim, prepare=True)).fetchall()
            if not jobs:
                break
            if pool is not None:
                await asyncio.gather(
                    *(loop.run_in_executor(pool, time.sleep, job[2]["seconds"]) for job in jobs)
                )
            else:
                await asyncio.gather(*(asyncio.sleep(job[2]["seconds"]) for job in jobs))
            await conn.execute(ARCHIVE, {"ids": [job[0] for job in jobs]}, prepare=True)
    if pool is not None:
        pool.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.raw", description=__doc__)
    parser.add_argument("mode", choices=["process", "trip", "listen", "sleep", "narrow", "grouped"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--file")
    parser.add_argument("--concurrency", type=int, default=300)
    parser.add_argument("--threads", action="store_true")
    args = parser.parse_args()
    if args.mode == "process":
        process(args.dsn, args.batch)
    elif args.mode == "trip":
        trip(args.dsn, args.batch)
    elif args.mode == "narrow":
        narrow(args.dsn, args.batch)
    elif args.mode == "grouped":
        grouped(args.dsn, args.batch)
    elif args.mode == "listen":
        listen(args.dsn, args.file)
    else:
        asyncio.run(sleep(args.dsn, args.concurrency, args.threads))


if __name__ == "__main__":
    main()
