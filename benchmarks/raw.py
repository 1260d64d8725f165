"""The raw-SQL references: the leanest psycopg code that does the same work as pgjobs, no framework.

Every pgjobs figure is printed beside one of these, so that the ratio holds on a noisy machine.
The consumers run as subprocesses, like pgjobs workers do::

    python -m benchmarks.raw process --dsn URL [--batch 100]
    python -m benchmarks.raw trip --dsn URL [--batch 100]
    python -m benchmarks.raw listen --dsn URL --file PATH
    python -m benchmarks.raw sleep --dsn URL [--concurrency 300] [--threads]
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
#: without a limit_key: the claim index's range, as pgjobs reads it.
CLAIM = """
UPDATE queued_jobs
SET attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_expires_at = now() + interval '5 minutes'
WHERE id = ANY(ARRAY(
    SELECT id FROM queued_jobs
    WHERE queue = %(queue)s AND lease_expires_at IS NULL AND limit_key IS NULL AND run_at <= now()
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
    parser.add_argument("mode", choices=["process", "trip", "listen", "sleep"])
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
    elif args.mode == "listen":
        listen(args.dsn, args.file)
    else:
        asyncio.run(sleep(args.dsn, args.concurrency, args.threads))


if __name__ == "__main__":
    main()
